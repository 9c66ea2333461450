#!/usr/bin/env python3
"""Prints a `peerlink bench --json` document made PCT percent faster (default 10): every bandwidth
times 1 + PCT/100, every time times 1 - PCT/100, in its cells, matrices and per-GPU values alike.

A healthy host checked against it (`peerlink check --baseline`) must fail, naming every test and
pair: the evidence that the check can fail (issue 15). tests/cli_check.rs doctors its baselines the
same way on the simulator.

    python3 scripts/faster-baseline.py bench.json [PCT] > bench-faster.json
"""
import json
import sys


def scaled(value, factor):
    return None if value is None else value * factor


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    pct = float(sys.argv[2]) if len(sys.argv) == 3 else 10.0
    with open(sys.argv[1], encoding="utf-8") as f:
        doc = json.load(f)
    for test in doc["tests"]:
        factor = 1 + pct / 100 if test["unit"] == "GB/s" else 1 - pct / 100
        for cell in test["cells"]:
            cell["value"] *= factor
            if cell.get("total") is not None:
                cell["total"] *= factor
        for key in ("matrix", "total_matrix"):
            if test.get(key) is not None:
                test[key] = [[scaled(v, factor) for v in row] for row in test[key]]
        if test.get("values") is not None:
            test["values"] = [scaled(v, factor) for v in test["values"]]
    json.dump(doc, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
