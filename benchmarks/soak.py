"""Long soak of `vspec serve demo` (the adaptive controller on SmolLM2) against a target-only server.

The short form runs in CI (tests/test_soak.py, a tiny model); this is the long one, on the demo model,
with its numbers in docs/benchmarks.md ("Soak"). Traffic: Poisson arrivals, greedy and sampled,
streamed and not, 10% of clients hanging up mid-stream, a few invalid requests
(vspec_cli/benchlib/soak.py). Checks: every valid request completed, greedy answers equal the
target-only server's, invalid requests got a 4xx, the server still answers, memory stopped growing,
no process left behind. Prints one JSON document; exit 1 if a check failed.

    .venv/bin/python benchmarks/soak.py [--requests 1000] [--rate 3] [--max-tokens 24] [--out bench-out/soak]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from vspec_cli.benchlib import soak
from vspec_cli.benchlib.serve_driver import Server, free_port
from vspec_cli.workloads import CHAT_QUESTIONS, code_prompts, copy_passages


def start(name: str, args: list[str], out: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "vspec_cli", "serve", *args, "--port", str(port)]
    server = Server(name, argv, {}, port, out / f"{name}.log", out / f"run-{name}")
    server.start()
    return server


def descendants(server: Server) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(server.proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=3.0, help="requests per second (Poisson)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("bench-out/soak"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = list(CHAT_QUESTIONS) + list(copy_passages()[0][:16]) + list(code_prompts()[0][:16])

    adaptive = start("adaptive", ["demo", "--adaptive-trace", str((args.out / "trace.jsonl").resolve())], args.out)
    reference = start("target-only", ["demo", "--no-speculation"], args.out)
    started = time.time()
    try:
        adaptive.wait_ready()
        reference.wait_ready()
        seen = descendants(adaptive)
        config = soak.SoakConfig(requests=args.requests, rate=args.rate, max_tokens=args.max_tokens)
        result = soak.run_soak(adaptive.base_url, "demo", prompts, config, memory=soak.tree_memory(adaptive.proc.pid))
        expected = soak.greedy_reference(reference.base_url, "demo", result["requests"], config)
        verdict = soak.judge(result["requests"], expected)
        with urllib.request.urlopen(adaptive.base_url + "/health", timeout=10) as response:
            healthy = response.status == 200
        metrics = urllib.request.urlopen(adaptive.base_url + "/metrics", timeout=10).read().decode()
        switches = sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("vspec_gamma_switches"))
        seen |= descendants(adaptive)
    finally:
        adaptive.stop()
        reference.stop()
    left = [pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    growth = soak.memory_growth(result["memory"])
    problems = list(verdict.problems)
    if not healthy:
        problems.append("the server did not answer /health after the soak")
    if left:
        problems.append(f"processes left after stop: {left}")
    report = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
              "wall_s": round(time.time() - started, 1), "config": config.__dict__, "counts": verdict.counts,
              "k_switches": switches, "memory": growth, "memory_samples": result["memory"], "problems": problems}
    (args.out / "soak.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "memory_samples"}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
