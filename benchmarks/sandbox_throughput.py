"""Code sandbox throughput: our service (full isolation, through HTTP) vs a fresh `python -c` per request.

For a trivial snippet and a sympy snippet, at client concurrency 1, 8 and 64, it measures
requests/s and p50/p99 latency of `POST /run` on a freshly started `python -m sandbox.code`,
and of the baseline that SandboxFusion-style runners use (one new interpreter per request,
here without any isolation, which only flatters the baseline). Every answer is checked.

The load generator is a minimal HTTP/1.1 keep-alive client on asyncio (one connection per
concurrent request): on 2 cores a heavier client (httpx) would take CPU from the server
being measured. Both sides share the same machine, so figures depend on its other load.

    python -m benchmarks.sandbox_throughput [--workers 2] [--seconds 3] [--ref GIT_REF] [--quick]   (repository root)

With `--ref` (say `--ref main`), the sandbox of that git revision (its `sandbox/` tree, unpacked
into a temporary directory) runs as a second server next to this one, and every point is
measured on both, alternately, in the same run: `ref` holds its figures and `vs_ref` the
ratios this / ref, so a change is judged under the same load.

The last line is one JSON object; `ratio` = ours / baseline requests/s for the sympy snippet
at concurrency 8, `ratio_by_concurrency` gives all three. Because other jobs may share the
cores, it also reports the service's CPU per request (server + workers + snippet processes)
and `trivial_rps_cpu_bound_estimate` = cores / that: the rate the same work would reach with
the cores to itself (an upper bound: it leaves out the load generator).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks import harness
from pipeline.services.processes import ServiceProcess, free_port, python_service

SNIPPETS = {
    "trivial": ("print(6 * 7)", "42\n"),
    "sympy": (
        "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 5*x + 6, x), sp.factor(x**4 - 1))",
        "[2, 3] (x - 1)*(x + 1)*(x**2 + 1)\n",
    ),
}
CONCURRENCY = (1, 8, 64)
# Baseline request counts per concurrency (a fresh interpreter with sympy costs ~0.4-0.6 s of CPU).
BASELINE_REQUESTS = {"trivial": {1: 20, 8: 48, 64: 128}, "sympy": {1: 4, 8: 16, 64: 64}}
HEADLINE = 8  # the concurrency of the headline figures
QUICK = {"seconds": 0.2, "concurrency": [HEADLINE], "baseline_share": 0.125}


class HttpConnection:
    """Just enough HTTP/1.1 for JSON POSTs on a keep-alive connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> HttpConnection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post_json(self, path: str, body: bytes) -> tuple[int, dict]:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        header_block = await self.reader.readuntil(b"\r\n\r\n")
        lines = header_block.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        return status, json.loads(await self.reader.readexactly(length))

    def close(self) -> None:
        self.writer.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _figures(latencies_s: list[float], elapsed_s: float, failures: int) -> dict:
    return {
        "requests": len(latencies_s), "failures": failures, "rps": round(len(latencies_s) / elapsed_s, 1),
        "p50_ms": round(_percentile(latencies_s, 0.50) * 1000, 2), "p99_ms": round(_percentile(latencies_s, 0.99) * 1000, 2),
    }


def service_cpu_seconds(pid: int) -> float:
    """CPU used so far by the server, its workers and their reaped snippet processes."""
    server = psutil.Process(pid)
    total = 0.0
    for process in (server, *server.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


async def measure_service(port: int, server_pid: int, code: str, expected: str, concurrency: int, seconds: float) -> dict:
    body = json.dumps({"code": code, "timeout_s": 10}).encode()
    connections = [await HttpConnection.open(port) for _ in range(concurrency)]
    latencies: list[float] = []
    failures = 0
    warmup_end = time.perf_counter() + 0.5
    stop = warmup_end + seconds
    cpu_at_start = None

    async def client(connection: HttpConnection) -> None:
        nonlocal failures, cpu_at_start
        while (now := time.perf_counter()) < stop:
            status, answer = await connection.post_json("/run", body)
            if now >= warmup_end:
                if cpu_at_start is None:
                    cpu_at_start = service_cpu_seconds(server_pid)
                latencies.append(time.perf_counter() - now)
                failures += status != 200 or answer.get("status") != "ok" or answer.get("stdout") != expected

    await asyncio.gather(*(client(c) for c in connections))
    elapsed = time.perf_counter() - warmup_end
    cpu_used = service_cpu_seconds(server_pid) - (cpu_at_start or 0.0)
    for connection in connections:
        connection.close()
    # CPU per request is what the machine's load distorts least: 1000 / it ~ requests/s per idle core.
    return {**_figures(latencies, elapsed, failures), "cpu_ms_per_request": round(cpu_used / max(1, len(latencies)) * 1000, 2)}


async def measure_baseline(code: str, expected: str, concurrency: int, total: int) -> dict:
    latencies: list[float] = []
    failures = 0
    remaining = total

    async def client() -> None:
        nonlocal failures, remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            stdout, _ = await process.communicate()
            latencies.append(time.perf_counter() - started)
            failures += process.returncode != 0 or stdout.decode() != expected

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return _figures(latencies, time.perf_counter() - began, failures)


async def run_all(servers: dict[str, tuple[int, int]], args: argparse.Namespace) -> dict:
    """`servers`: label -> (port, pid); the first label is "ours", the rest are compared with it."""
    results: dict = {}
    for name, (code, expected) in SNIPPETS.items():
        for concurrency in args.concurrency:
            point = {label: await measure_service(port, pid, code, expected, concurrency, args.seconds)
                     for label, (port, pid) in servers.items()}
            requests = max(1, round(BASELINE_REQUESTS[name][concurrency] * args.baseline_share))
            base = await measure_baseline(code, expected, concurrency, requests)
            ours = point["ours"]
            results[f"{name}_c{concurrency}"] = {**point, "baseline": base, "ratio": round(ours["rps"] / base["rps"], 1)}
            if "ref" in point:
                results[f"{name}_c{concurrency}"]["vs_ref"] = {
                    "rps": round(ours["rps"] / point["ref"]["rps"], 2),
                    "cpu_ms_per_request": round(ours["cpu_ms_per_request"] / point["ref"]["cpu_ms_per_request"], 2)}
            for label, figures in point.items():
                print(f"{name:8s} c={concurrency:<3d} {label:4s} {figures['rps']:7.1f} req/s p50 {figures['p50_ms']:7.2f} ms "
                      f"p99 {figures['p99_ms']:7.2f} ms cpu {figures['cpu_ms_per_request']:5.2f} ms/req fail {figures['failures']}",
                      flush=True)
            print(f"{name:8s} c={concurrency:<3d} baseline {base['rps']:6.1f} req/s p50 {base['p50_ms']:8.2f} ms "
                  f"p99 {base['p99_ms']:8.2f} ms fail {base['failures']}", flush=True)
    return results


def ref_service(ref: str, port: int, workers: int, scratch: Path) -> ServiceProcess:
    """The sandbox server of git revision `ref`, from its own unpacked source tree."""
    tree = scratch / "ref-tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", ref, "sandbox"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    launcher = (f"import sys, runpy; sys.path.insert(0, {str(tree)!r}); "
                "runpy.run_module('sandbox.code', run_name='__main__', alter_sys=True)")
    command = [sys.executable, "-c", launcher, "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    return ServiceProcess("sandbox-ref", command, port, scratch / "sandbox-ref.log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0, help="Measured seconds per (snippet, concurrency) for our service.")
    parser.add_argument("--ref", default=None, help="Also measure the sandbox of this git revision, in the same run.")
    parser.add_argument("--concurrency", type=int, nargs="+", choices=CONCURRENCY, default=list(CONCURRENCY),
                        help=f"client concurrencies measured (the headline figures are at {HEADLINE})")
    parser.add_argument("--baseline-share", type=float, default=1.0,
                        help="the share of the baseline's request counts run (at least one request a point)")
    args = harness.parse(parser, argv, QUICK)
    if HEADLINE not in args.concurrency:
        parser.error(f"--concurrency must include {HEADLINE}: the headline figures are measured there")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    port = free_port()
    with tempfile.TemporaryDirectory() as logs:
        load_before = os.getloadavg()[0]
        with python_service("sandbox", "sandbox.code", ["--workers", str(args.workers)], port, Path(logs)) as service:
            servers = {"ours": (port, service.process.pid)}
            if args.ref is None:
                results = asyncio.run(run_all(servers, args))
            else:
                ref_port = free_port()
                with ref_service(args.ref, ref_port, args.workers, Path(logs)) as ref:
                    servers["ref"] = (ref_port, ref.process.pid)
                    results = asyncio.run(run_all(servers, args))
        load_after = os.getloadavg()[0]
    trivial8 = results["trivial_c8"]["ours"]
    summary = {
        "workers": args.workers, "ref": args.ref,
        "load_average_1min": [round(load_before, 2), round(load_after, 2)], "cores": os.cpu_count(),
        "trivial_c8_rps": trivial8["rps"], "trivial_c8_p99_ms": trivial8["p99_ms"],
        "trivial_c8_cpu_ms_per_request": trivial8["cpu_ms_per_request"],
        "trivial_rps_cpu_bound_estimate": round(1000 / trivial8["cpu_ms_per_request"] * (os.cpu_count() or 1), 1),
        "sympy_c8_rps": results["sympy_c8"]["ours"]["rps"],
        "ratio": results["sympy_c8"]["ratio"],
        "ratio_by_concurrency": {c: results[f"sympy_c{c}"]["ratio"] for c in args.concurrency},
        "goal_trivial_300rps_p99_50ms": trivial8["rps"] >= 300 and trivial8["p99_ms"] < 50,
        "goal_ratio_20": results["sympy_c8"]["ratio"] >= 20,
        "failures": sum(r["ours"]["failures"] + r["baseline"]["failures"] + r.get("ref", {}).get("failures", 0)
                        for r in results.values()),
        "results": results,
        "median_ours_p50_ms": statistics.median(r["ours"]["p50_ms"] for r in results.values()),
    }
    if args.ref is not None:
        ref8 = results["trivial_c8"]["ref"]
        summary.update({"ref_trivial_c8_rps": ref8["rps"], "ref_trivial_c8_p99_ms": ref8["p99_ms"],
                        "ref_trivial_c8_cpu_ms_per_request": ref8["cpu_ms_per_request"],
                        "ref_sympy_c8_rps": results["sympy_c8"]["ref"]["rps"],
                        "vs_ref_by_point": {k: r["vs_ref"] for k, r in results.items()}})
    harness.last_line(dict(sorted(summary.items())), args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
