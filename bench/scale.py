#!/usr/bin/env python3
"""tidemark at scale (issue 24), in one run, at default settings:

    python3 bench/scale.py            # about 5 minutes on 2 cores
    python3 bench/scale.py --quick    # smaller sizes, about 2 minutes
    python3 bench/scale.py --only small --only queue

  small   periods/s of 2,000 periods of 5 rows against the hand-written
          pattern (bench/handwritten.py) at the same concurrency, both
          databases: the ratio (target >= 0.8)
  queue   `serve` keys/s with 250,000 pending against 1,000 pending, both
          databases: the ratio (target >= 0.8), and the enqueue's seconds
          and peak RSS (targets < 10 s, < 160 MiB)
  memory  peak RSS of an endless HTTP body, a 300 MiB gzip bomb and a
          100 MiB NDJSON page (target <= 160 MiB; the first two must fail)
  period  one period of 4,000,000 rows: the unchanged re-sync's speed-up
          over the first load, both databases (target >= 2)

Every figure is a ratio measured in this run (absolute rates are the
disk's, and do not travel between machines). Each case is also its own
script (bench/bench.py, bench/queue.py, bench/memory.py) with more detail.
Needs what those need: a release build, psql, sqlite3, GNU time,
PostgreSQL at TIDEMARK_TEST_DATABASE_URL and psycopg 3.
"""

import argparse
import importlib.util
import os
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
# Python puts a script's folder first on sys.path, where bench/queue.py
# would shadow the standard library's `queue` (multiprocessing needs it).
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != BENCH]
BACKENDS = ("postgres", "sqlite")


def load(name, file=None):
    """bench/<file or name>.py as the module `name` (bench/ stays off
    sys.path: its queue.py would shadow the standard library's)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{file or name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def verdict(ok):
    return "met" if ok else "NOT met"


def small(quick):
    ratios = load("bench").small_ratios(quick=quick, backends=BACKENDS)
    return [(f"small periods, {b}: tidemark / hand-written", f"{r:.2f}x", ">= 0.8x", r >= 0.8)
            for b, r in ratios.items()]


def queue(quick):
    large, results = load("queue_bench", "queue").backlog_ratios(quick=quick, backends=BACKENDS)
    lines = []
    for backend, (ratio, took, mib) in results.items():
        lines.append((f"queue, {backend}: rate at {large:,} / at 1,000 pending", f"{ratio:.2f}x", ">= 0.8x",
                      ratio >= 0.8))
        lines.append((f"queue, {backend}: enqueue {large:,} keys", f"{took:.1f} s, {mib:.0f} MiB",
                      "< 10 s, < 160 MiB", took < 10 and mib < 160))
    return lines


def memory(quick):
    return [(f"memory: {case}", f"{rss:.0f} MiB", "<= 160 MiB", ok)
            for case, rss, ok in load("memory").run(quick)]


def period(quick):
    speedups = load("bench").period_speedups(quick, BACKENDS)
    return [(f"one period, {b}: unchanged re-sync / first load", f"{s[2]:.2f}x", ">= 2x", s[2] >= 2)
            for b, s in speedups.items()]


CASES = {"small": small, "queue": queue, "memory": memory, "period": period}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for development")
    ap.add_argument("--only", choices=list(CASES), action="append", help="these cases only (repeatable)")
    args = ap.parse_args()
    started = time.perf_counter()
    lines = []
    for name in args.only or list(CASES):
        print(f"\n#### {name}", flush=True)
        lines += CASES[name](args.quick)
    print(f"\n== issue 24 targets{' (--quick sizes)' if args.quick else ''}, at default settings ==")
    width = max(len(line[0]) for line in lines)
    for what, figure, target, ok in lines:
        print(f"{what:<{width}}  {figure:>16}  target {target:<18} {verdict(ok)}")
    print(f"(took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
