"""`python -m sandbox.code --host 127.0.0.1 --port PORT [--workers N]`: run the code sandbox.

Must run as root, allowed to create namespaces (see the threat model in `sandbox.code`).
Otherwise it refuses to start and says what would be lost; `--allow-degraded` runs anyway with seccomp and
rlimits only, and `/health` then reports `"isolation": "degraded"`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import uvicorn

from sandbox.code import cgroup
from sandbox.code.app import ServerSettings, create_app
from sandbox.code.jail import isolation_unavailable_reason
from sandbox.http_limits import bounded_protocol
from sandbox.code.pool import PoolSettings

UID_RANGE_START = 2_000_000  # above any system or login uid; no passwd entries needed
NOT_ISOLATED_MESSAGE = (
    "sandbox.code: this server must run as root (effective uid 0, allowed to create namespaces and "
    "mounts) to isolate snippets: it creates a "
    "network namespace (no network), a mount namespace with a read-only root and a private /tmp, and "
    "switches each snippet to an unprivileged uid. Without root all of that is lost and snippets could "
    "read every file this user can read and write where it can write; only seccomp (no processes, no "
    "sockets) and rlimits would remain. Run it as root, or pass --allow-degraded to accept that."
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sandbox.code", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on (default loopback only).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="Pre-warmed worker processes.")
    parser.add_argument("--queue-size", type=int, default=256, help="Waiting requests before answering 429.")
    parser.add_argument("--max-timeout-s", type=float, default=10.0, help="Cap on a request's timeout_s.")
    parser.add_argument("--max-memory-mb", type=int, default=2048, help="Cap on a request's memory_mb.")
    parser.add_argument("--output-limit-kib", type=int, default=64, help="Cap on stdout and on stderr.")
    parser.add_argument("--tmp-size-mib", type=int, default=32, help="Size of each snippet's private /tmp.")
    parser.add_argument("--header-timeout-s", type=float, default=10.0,
                        help="Close a connection whose request head has not arrived within this (slowloris).")
    parser.add_argument("--body-timeout-s", type=float, default=30.0, help="Answer 408 to a body slower than this.")
    parser.add_argument("--uid-base", type=int, default=None,
                        help="Worker slot i runs snippets as uid base+i (default: derived from the port, so "
                             "two sandboxes on one host never share a uid).")
    parser.add_argument("--cgroup", default=None,
                        help="A cgroup v2 directory delegated to this service (empty of processes); each worker "
                             "slot gets a child cgroup bounding its snippet's memory (memory.max) and tasks. "
                             "Default: the service's own cgroup if it is a writable v2 one, else rlimits only.")
    parser.add_argument("--allow-degraded", action="store_true", help="Start without root (much weaker isolation).")
    args = parser.parse_args(argv)
    if args.uid_base is None:
        # Distinct per port: a snippet's kill(-1) and RLIMIT_NPROC reach only its own uid, which
        # must not be shared with another sandbox's snippets.
        args.uid_base = UID_RANGE_START + args.port * 256
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be between 1 and 65535, got {args.port}")
    if not 1 <= args.workers <= 256:
        parser.error(f"--workers must be between 1 and 256, got {args.workers}")
    if args.queue_size < 1 or args.output_limit_kib < 1 or args.tmp_size_mib < 1:
        parser.error("--queue-size, --output-limit-kib and --tmp-size-mib must be positive")
    if not (0 < args.header_timeout_s < 3600 and 0 < args.body_timeout_s < 3600):
        parser.error("--header-timeout-s and --body-timeout-s must be between 0 and 3600 seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    reason = isolation_unavailable_reason()
    isolated = reason is None
    if not isolated and not args.allow_degraded:
        print(f"{NOT_ISOLATED_MESSAGE} (here: {reason})", file=sys.stderr)
        return 2
    if not isolated:
        logging.getLogger("sandbox.code").warning("DEGRADED ISOLATION (%s): %s", reason, NOT_ISOLATED_MESSAGE)
    delegation, cgroup_reason = cgroup.detect(args.cgroup)
    if args.cgroup and delegation is None:
        print(f"sandbox.code: {cgroup_reason}", file=sys.stderr)
        return 2
    logging.getLogger("sandbox.code").info("memory limits: %s (%s)",
                                           "cgroup2" if delegation else "rlimit+memfd-denied", cgroup_reason)
    pool = PoolSettings(
        workers=args.workers, queue_size=args.queue_size, isolated=isolated, uid_base=args.uid_base,
        tmp_size_mib=args.tmp_size_mib, output_limit_bytes=args.output_limit_kib * 1024,
        cgroup=delegation, cgroup_reason=cgroup_reason,
    )
    app = create_app(ServerSettings(pool, args.max_timeout_s, args.max_memory_mb, args.body_timeout_s))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, lifespan="on",
                http=bounded_protocol(args.header_timeout_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
