"""Code-interpreter sandbox: runs model-written Python, isolated by the operating system.

Layout: an HTTP server (`app`, `sandbox.http_limits`, `pool`) holds a bounded queue and N pre-warmed
`worker` processes; each worker has imported numpy, sympy and the rest of the allowed stack
once, entered its jail, and forked a `zygote` before its first request; the zygote forks
one `child` per request, which reads its own job, locks itself down and runs the snippet.

Threat model. Every snippet is assumed hostile and optimised to find anything that pays,
including channels to other requests (in a group rollout, one sample copying another's
answer is a reward hack). The unit of isolation is the request: nothing it does outlives
it, and nothing of one request is reachable from another.

Isolated (enforced by the kernel, not by Python):
  * Processes and lifetime: each snippet is pid 1 of a PID namespace of its own, nested in
    its worker's, whose pid 1 is the zygote. It sees no other process (getppid() is 0,
    kill(-1) finds nobody) and its pid is always 1. The seccomp filter refuses fork/vfork/
    execve/clone-without-CLONE_THREAD, so a snippet is one process (threads allowed, bounded
    by RLIMIT_NPROC on a per-slot uid). The kernel kills a namespace with its first
    process, so: the snippet's threads die with it; every snippet of a worker dies with its
    zygote; the zygote dies with its worker (parent-death signal, root throughout); the
    worker with the server. The snippet's own parent-death signal is armed after its uid
    change (the kernel clears it on one) and checked. At the wall-clock limit or over the
    output cap the worker SIGKILLs the child through its pidfd; a child not gone 5 s later
    is reported, its worker retires, and `/health` counts it (`unreaped`). The pool waits
    for a killed worker's zygote (a pidfd) before it reuses the slot's uid.
  * Other requests: the zygote is forked before the worker touches any request and never
    receives one (it gets descriptor numbers; each child reads its job from a memfd only it
    holds; exit statuses pass through a C buffer that is zeroed again), so a snippet's
    memory holds no frame, object or freed buffer of another request. Random generators a
    child would inherit (numpy's global one, sympy's) are reseeded by each child before it
    locks down, and `random` reseeds itself in each child: from fresh entropy, or all three from
    the request's own `seed` (the same code and seed print the same thing: a trainer's runs repeat;
    the seed is the request's, so it carries nothing between requests). Every worker hashes strings
    with one fixed key (`PYTHONHASHSEED=0`): constant, not state, so no channel, and a set of
    words prints in the same order on every worker and start. The private /tmp is replaced by a
    fresh tmpfs unless its free inode and block counts and its directory times are exactly
    those of a fresh one (no name is exempt), which also resets its inode numbers; it has no
    access times, and O_TMPFILE (an inode no directory shows) is refused. Monkeypatching builtins, modules or atexit
    dies with the child.
  * Secrets: workers start with a scrubbed environment (nothing from the server's, so no
    API keys or service URLs), and the zygote and children close every inherited
    descriptor but their own (a snippet holds exactly fds 0-3).
  * Network: each worker lives in its own network namespace holding only a loopback device
    that is down, and the filter also denies socket(), socketpair(), connect()...
    No Redis, no search service, no sandbox server, no outside address, no Unix sockets.
  * Filesystem: each worker pivot_roots into a tmpfs showing /usr, /lib*, the Python
    prefix and the virtualenv's site-packages read-only, four /dev nodes, an empty /etc,
    and a 32 MiB, 4096-inode noexec /tmp (the working directory). There is no /proc, /sys,
    /home, /root content, project source (so no server code or config), and no host /tmp.
    Mounts are private to the worker. A Python installation under /tmp is bound back
    read-only, below root-owned mode-0755 directories.
  * Identity: the snippet runs as uid/gid base+slot, base = 2,000,000 + 256 x port by
    default, so no two sandboxes on a host share one (no passwd entry, no groups), with
    no_new_privs, not dumpable, no capabilities.
  * Kernel surface: the filter is an allow-list (`seccomp`, measured on the real workloads
    by `syscall_census`); everything else answers ENOSYS or EPERM. Out, among others:
    mount/unshare/setns/ptrace/process_vm_*, bpf, keyctl, perf_event_open, userfaultfd,
    io_setup and io_uring_* (host-wide aio quota), inotify/fanotify (what other workers'
    snippets open in the shared site-packages), listmount/statmount (the mount table),
    sync/syncfs, xattr setters, file locks and dnotify on the shared read-only files, sysinfo
    (the host's free memory), setuid and friends, clock setting, foreign syscall ABIs.
  * The page cache: every worker maps the same read-only files, so their cached pages are
    one cache. No call tells a snippet whether a page is resident without reading it, and
    none evicts one: mincore, cachestat, fadvise (DONTNEED evicts, WILLNEED loads) and
    readahead are denied; preadv2/pwritev2 run only with the flags that shape a write
    (RWF_NOWAIT, which fails on a page that is not resident, and RWF_DONTCACHE, a read that
    leaves no page behind, answer ENOSYS, which glibc reports as EOPNOTSUPP); madvise refuses COLD and PAGEOUT (push file
    pages out), MERGEABLE (KSM shares equal pages between processes) and COLLAPSE. So a
    snippet cannot reset a page to watch a concurrent snippet load it (fadvise + RWF_NOWAIT
    did exactly that). What remains of the channel is timing; see below.
  * Memory: RLIMIT_AS (zygote baseline + memory_mb) bounds anonymous and mapped memory; /tmp
    is size-limited; memfd_create, which RLIMIT_AS does not count, is denied. Where a cgroup
    v2 is delegated to the service (`--cgroup PATH` on a cgroup2 filesystem, or its own writable cgroup with memory
    and pids available and no other process in it; see `sandbox.code.cgroup`), each worker
    slot also gets a cgroup of its own, made by the service and removed at shutdown: its
    memory.max is set to the request's memory_mb before each snippet, which moves itself in
    before any of its code runs, so every page it charges (anonymous, tmpfs, page cache) is
    bounded, and pids.max caps its tasks; memfd stays denied anyway. `/health` reports
    `memory_limit.mode` ("cgroup2" or "rlimit+memfd-denied"), the cgroup and why. On hosts
    with cgroup v1 or nothing delegated (these CI machines) no cgroup is created or touched.
    Also CPU (timeout + 1 s; the kernel ends a
    pid-1 snippet at the hard limit, reported as a timeout), FSIZE, NOFILE 64, NPROC 32,
    CORE 0, MEMLOCK 0.
  * The server's own cost per request is bounded before work is done (`app`,
    `sandbox.http_limits`, `files`): bodies over 1 MiB are 413 however they are sent, request heads must arrive
    within 10 s and 64 KiB, bodies within 30 s (408), non-finite numbers are 422, `files`
    and `fetch_files` are bounded in count, depth and bytes and deduplicated by normalised
    path; a bounded queue answers 429. A worker that cannot serve cleanly (a descriptor
    left open, a /tmp it cannot restore, memory past its bound, a lost zygote, an unreaped
    child) or stops answering is replaced, and `/health` counts replacements by reason.
  * Exit tricks: `exit(0)`, `sys.exit`, `os._exit(0)` are reported as status "error"
    with a SystemExit reason, never as success.

Not isolated:
  * Kernel bugs in the calls the filter still allows (read, write, mmap, futex, ...): a
    kernel exploit escapes. Use a VM or gVisor for a stronger boundary.
  * CPU contention: snippets share the machine's cores with each other and with the
    server; a busy snippet slows its neighbours until its deadline (no cgroup quota). Timing
    (how long a neighbour's snippet delays yours) is a noisy channel between concurrent
    requests of different workers.
  * Total memory: each snippet is bounded, the sum is not: size --workers and
    --max-memory-mb so that workers x (worker size + max) fits in RAM (the slot cgroups, where
    there are any, bound snippets, not workers or the server).
    Kernel memory for a snippet's pipes and threads is bounded only by NOFILE and NPROC.
  * Information the kernel shows every process: uname, CPU flags, time. Public Python and
    library files under the mounted prefixes are readable.
  * Timing channels between concurrent snippets. Accepted, because closing them takes a
    machine per snippet (own cores, own caches, own page cache: a VM), not a filter, and
    each carries only what a sender chooses to send, slowly and with noise; no snippet
    reads another's data through them. A group rollout would have to learn a sender and
    a receiver at once, and sending earns the sender nothing. They are:
    - page-cache residency by time (a cached read takes microseconds, one from disk far
      longer; getrusage's fault and block-input counts say the same). One-shot: the probe loads the
      page it tests and no snippet can evict it, so a page tells whether anyone read it since
      the host last reclaimed it. Two colluding snippets could still pass a bit per
      readahead window of files nobody reads (one reads, the other times). The same holds
      between consecutive requests: what one imported stays cached for the next;
    - host memory pressure: without a slot cgroup, a snippet allocating up to its limit can
      make the kernel reclaim page cache host-wide (a coarse eviction); sizing workers x
      (worker + max) within RAM, as required above, leaves no such pressure;
    - shared CPU caches, memory bandwidth and DRAM (a snippet can run native code through
      ctypes and mmap, so prime+probe on the last-level cache and flush+reload on lines of
      the shared library pages are possible), and the scheduler and clock frequency (how
      long a neighbour's snippet delays yours: CPU contention, above).
  * Whether the previous request on a worker changed /tmp: if it did, the next one finds a
    freshly mounted /tmp (new times), if not, the same empty one (remounting every time
    would close this one-bit signal at ~0.4 ms of wall time per request).
  * Python state inside one request (a snippet can rewrite its own report on fd 3; it
    changes only its own outcome, which printing could fake just as well).
  * The import allow-list (`policy`) is a courtesy that gives clear errors, not a
    boundary: numpy and sympy hand out os/ctypes/subprocess, and those fail at the OS.

Privileges: the server must run as root and be allowed to create namespaces and mounts
(it probes this at start). Otherwise it refuses to start, saying why and what is lost,
unless `--allow-degraded` is given: then only seccomp (which still blocks sockets and new
processes), rlimits, the scrubbed environment and a per-worker scratch directory remain,
with no read-only view, no network or PID namespace; snippets keep the server's uid unless it
is root, in which case they still drop to the slot uid.

Departures from the anchors: TAPO's server blocks modules inside Docker; SandboxFusion
runs a fresh interpreter per request with no isolation by default; nsjail and isolate give
each run a PID namespace and a cgroup. Here the import list is advisory, the OS is the
boundary, each run gets a PID namespace and a process forked from a request-free zygote
(the warm interpreter is reused without reusing any request's state), and memory is
bounded by rlimits plus the refusal of what rlimits cannot count, and by a per-slot cgroup
only where one is delegated to the service. The
`Dockerfile.code` image is an optional outer layer; nothing here depends on it.
Linux x86_64/aarch64 only (raw syscall numbers for pivot_root).
"""
