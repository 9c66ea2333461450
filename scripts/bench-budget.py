#!/usr/bin/env python3
"""The default bench's time on more GPUs, from `peerlink bench --json` runs on a few (src/bench/budget.rs).

Each test's `wall_s` is divided by the places it measured (a matrix test: every ordered pair of the
run's GPUs; a per-GPU test: every GPU) and multiplied by its places on --gpus GPUs (56 ordered pairs
and 8 GPUs for 8). Start-up (the process's time outside the tests, from the `time` output in FILE's
`.time` twin when there is one: opening the backend, a stream and the kernels on each GPU) is
scaled by the GPUs. e2e-latency takes a sample on each CPU the measuring thread may run on (up to
64): its time is also scaled from the CPUs its notes say it visited to --cpus. One line per test and
run, then each run's total against --goal.

    scripts/bench-budget.py bench.json bench-2.json bench-3.json --gpus 8
"""

import argparse
import json
import pathlib
import re


def places(matrix, gpus):
    return gpus * (gpus - 1) if matrix else gpus


def process_seconds(path):
    """`real` of bash's `time` in PATH's `.time` twin (bench.json -> bench.time), if any."""
    twin = path.with_suffix(".time")
    if not twin.exists():
        return None
    found = re.search(r"real\s+(\d+)m([\d.]+)s", twin.read_text())
    return int(found.group(1)) * 60 + float(found.group(2)) if found else None


def cpu_scale(test, cpus):
    """For a test that takes a sample per CPU (its notes say `over N CPUs`): cpus / N; else 1."""
    visited = [int(m) for note in test.get("notes", []) for m in re.findall(r"over (\d+) CPUs", note)]
    return min(cpus, 64) / max(visited) if visited else 1.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=pathlib.Path)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=64, help="CPUs e2e-latency visits there (at most 64)")
    parser.add_argument("--goal", type=float, default=60.0, help="seconds (default 60)")
    args = parser.parse_args()
    worst = 0.0
    for path in args.files:
        doc = json.loads(path.read_text())
        measured = len(doc["devices"])
        total, inside = 0.0, 0.0
        print(f"{path.name}: {measured} GPUs measured, extrapolated to {args.gpus}")
        for test in doc["tests"]:
            matrix = "matrix" in test
            # One GPU measures a matrix test on itself: one place, as two would on each pair.
            here = max(places(matrix, measured), 1)
            there = places(matrix, args.gpus)
            scale = cpu_scale(test, args.cpus)
            seconds = test["wall_s"] / here * there * scale
            total += seconds
            inside += test["wall_s"]
            cpus = f" × {scale:.2f} (CPUs)" if scale != 1.0 else ""
            print(f"  {test['name']:24} {test['wall_s']:7.3f} s / {here} × {there:3}{cpus} = {seconds:6.1f} s")
        process = process_seconds(path)
        if process is not None:
            startup = max(process - inside, 0.0) / measured * args.gpus
            total += startup
            print(f"  {'start-up':24} {process - inside:7.3f} s / {measured} GPUs × {args.gpus:3} = {startup:6.1f} s")
        else:
            print("  start-up: no .time file beside it, not counted")
        verdict = "within" if total < args.goal else "OVER"
        print(f"  total on {args.gpus} GPUs: {total:.1f} s ({verdict} the {args.goal:.0f} s goal)")
        worst = max(worst, total)
    return 0 if worst < args.goal else 1


if __name__ == "__main__":
    raise SystemExit(main())
