"""Code-interpreter sandbox: runs model-written Python, isolated by the operating system.

Layout: an HTTP server (`app`, `pool`) holds a bounded queue and N pre-warmed `worker`
processes; each worker has imported numpy, sympy and the rest of the allowed stack once,
and forks one `child` per request that locks itself down and runs the snippet.

Threat model. Every snippet is assumed hostile and optimised to find anything that pays.

Isolated (enforced by the kernel, not by Python):
  * Processes: a seccomp filter denies fork/vfork/clone-without-CLONE_THREAD/execve/
    execveat, so a snippet is one process (threads allowed, bounded by RLIMIT_NPROC on a
    per-slot uid). At the wall-clock limit, or when stdout/stderr pass the cap, the
    worker SIGKILLs the child's process group; nothing can have escaped it.
  * Network: each worker lives in its own network namespace holding only a loopback
    device that is down, and the filter also denies socket(), socketpair(), connect()...
    No Redis, no search service, no sandbox server, no outside address, no Unix sockets.
  * Filesystem: each worker pivot_roots into a tmpfs showing /usr, /lib*, the Python
    prefix and the virtualenv's site-packages read-only, four /dev nodes, an empty /etc,
    and a 32 MiB noexec /tmp (the working directory) that is replaced by a fresh tmpfs
    after every request. There is no /proc, /sys, /home, /root content, project source
    (so no server code or config), and no host /tmp. Mounts are private to the worker.
  * Identity: the snippet runs as uid/gid base+slot, base = 2,000,000 + 256 x port by
    default, so no two sandboxes on a host share one (no passwd entry, no groups), with
    no_new_privs, not dumpable, no capabilities; mount/unshare/setns/ptrace/bpf/keyctl/
    perf_event_open/io_uring/module and clock calls are denied by the filter as well.
  * Secrets and other requests: workers start with a scrubbed environment (nothing from
    the server's, so no API keys or service URLs); each request is a fresh fork, so
    monkeypatching builtins, modules or atexit cannot reach the next request.
  * Resources: RLIMIT_AS (worker baseline + memory_mb), CPU (timeout + 1 s), FSIZE,
    NOFILE, NPROC, CORE=0, MEMLOCK=0; a bounded queue answers 429 instead of piling up;
    a worker that stops answering is killed and replaced.
  * Exit tricks: `exit(0)`, `sys.exit`, `os._exit(0)` are reported as status "error"
    with a SystemExit reason, never as success.

Not isolated:
  * Kernel bugs in the calls the filter still allows (read, write, mmap, futex, ...): a
    kernel exploit escapes. Use a VM or gVisor for a stronger boundary.
  * CPU contention: snippets share the machine's cores with each other and with the
    server; a busy snippet slows its neighbours until its deadline (no cgroup quota).
  * Total memory: each snippet is bounded (RLIMIT_AS), the sum is not: size --workers and
    --max-memory-mb so that workers x (worker size + max) fits in RAM (no cgroup limit).
  * Information the kernel shows every process: uname, CPU flags, time, free memory via
    sysinfo(). Public Python and library files under the mounted prefixes are readable.
  * Python state inside one request (a snippet can rewrite its own report on fd 3; it
    changes only its own outcome, which printing could fake just as well).
  * The import allow-list (`policy`) is a courtesy that gives clear errors, not a
    boundary: numpy and sympy hand out os/ctypes/subprocess, and those fail at the OS.

Privileges: the server must run as root and be allowed to create namespaces and mounts
(it probes this at start). Otherwise it refuses to start, saying why and what is lost,
unless `--allow-degraded` is given: then only seccomp (which still blocks sockets and new
processes), rlimits, the scrubbed environment and a per-worker scratch directory remain,
with no read-only view and no network namespace; snippets keep the server's uid unless it
is root, in which case they still drop to the slot uid.

Departures from the anchors: TAPO's server blocks modules inside Docker; SandboxFusion
runs a fresh interpreter per request with no isolation by default. Here the import list
is advisory, the OS is the boundary, and the interpreter is reused through fork. The
`Dockerfile.code` image is an optional outer layer; nothing here depends on it.
Linux x86_64/aarch64 only (raw syscall numbers for pivot_root).
"""
