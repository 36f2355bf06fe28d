#!/usr/bin/env python3
"""tidemark work-queue benchmark (PostgreSQL): the ledger as the queue.

    python3 bench/queue.py                 # 1,000 and 10,000 periods, 3 repeats
    python3 bench/queue.py --quick         # 300 periods, 1 repeat (development)

Needs a release build (`cargo build --release`) and PostgreSQL at
TIDEMARK_TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres);
every measurement runs in a fresh database that is dropped afterwards.

Measured in one invocation, at tidemark's defaults unless said:
  1. N small hourly periods (5 rows each, one CSV file per hour):
     - the queue: `backfill --enqueue`, then two `serve --no-schedule
       --workers 2 --drain` processes started together; the time until both
       have exited (every key done);
     - the baseline: one `backfill --concurrency 4` of the same periods into
       a fresh database;
     periods/s of each and the ratio queue / backfill (median of the repeats).
  2. Claim latency while workers are idle: two `serve` processes wait on an
     empty queue; keys are queued one at a time, 150 ms apart; latency is
     `started_at - enqueued_at` of each key (both by the database's clock).
  3. `backfill --enqueue` of 100,000 hourly periods: seconds.
  4. The queue at any backlog (`--backlog`, on SQLite and PostgreSQL):
     1,000 and then 250,000 pending hourly keys (`backfill --enqueue`,
     timed, its peak RSS measured); one `serve --no-schedule --workers 2`
     works the queue for 20 s; its rate is done keys per second between the
     first and the last `finished_at` (startup excluded). Printed: each
     rate and the ratio 250,000 / 1,000 (target >= 0.8). The periods have
     no file (`missing = "empty"`), so both backlogs do the same work per
     key and only the queue differs.

    python3 bench/queue.py --backlog       # only case 4, both databases
"""

import argparse
import os
import signal
import sqlite3
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "tidemark")
PG_URL = os.environ.get("TIDEMARK_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")

PIPELINE = """
name = "small"
export_type = "small_hourly"

[period]
granularity = "hour"
timezone = "UTC"

[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "data/{period.start:%Y/%m/%d/%H}.csv"
missing = "empty"

[fields]
id     = { type = "text", required = true }
amount = { type = "decimal" }

[load]
table = "small"
key = ["id"]
"""

# Far enough back that 100,000 hourly periods (11.4 years) are all closed.
START = datetime(2000, 1, 1)


def hours(n):
    return [START + timedelta(hours=i) for i in range(n)]


def label(at):
    return at.strftime("%Y-%m-%dT%H")


def make_workdir(n):
    work = tempfile.mkdtemp(prefix="tidemark-queue-bench-")
    os.makedirs(os.path.join(work, "pipelines"))
    with open(os.path.join(work, "pipelines", "small.toml"), "w") as f:
        f.write(PIPELINE)
    for at in hours(n):
        folder = os.path.join(work, "pipelines", "data", at.strftime("%Y/%m/%d"))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, at.strftime("%H") + ".csv"), "w") as f:
            f.write("id,amount\n")
            for i in range(5):
                f.write(f"{at:%Y%m%d%H}-{i},{i}.25\n")
    return work


class Database:
    """A fresh PostgreSQL database, dropped on exit."""

    def __init__(self):
        self.name = "tm_qbench_" + uuid.uuid4().hex[:12]
        self.url = PG_URL.rsplit("/", 1)[0] + "/" + self.name

    def __enter__(self):
        psql(PG_URL, f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *exc):
        psql(PG_URL, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def psql(url, sql):
    out = subprocess.run(["psql", url, "-Atqc", sql], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def tidemark(work, url, *args, background=False):
    cmd = [BIN, "--database-url", url, *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    if background:
        # stderr to a file, not a pipe: a pipe nobody reads while waiting for
        # another process fills up (64 KiB of log lines) and blocks the
        # process on its next log line, which then loses its lease.
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
        proc.log = log
        return proc
    out = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tidemark {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return out


def range_args(n):
    last = hours(n)[-1]
    return ["--from", label(START), "--to", label(last)]


def check_done(url, n):
    done = int(psql(url, "SELECT count(*) FROM _tm_runs WHERE status = 'done'"))
    rows = int(psql(url, "SELECT count(*) FROM small"))
    attempts = int(psql(url, "SELECT count(*) FROM _tm_attempts"))
    if (done, rows, attempts) != (n, 5 * n, n):
        sys.exit(f"expected {n} done keys, {5 * n} rows, {n} attempts; got {done}, {rows}, {attempts}")


def queue_run(work, n):
    with Database() as db:
        tidemark(work, db.url, "migrate")
        tidemark(work, db.url, "backfill", "small", *range_args(n), "--enqueue")
        started = time.monotonic()
        servers = [
            tidemark(work, db.url, "serve", "--no-schedule", "--workers", "2", "--drain", background=True)
            for _ in range(2)
        ]
        for server in servers:
            server.wait()
        took = time.monotonic() - started
        for server in servers:
            if server.returncode != 0:
                server.log.seek(0)
                sys.exit(f"serve exited {server.returncode}:\n{server.log.read()[-2000:]}")
        check_done(db.url, n)
        # Both processes must have worked, or this measured one of them.
        shares = psql(db.url, "SELECT count(*) FROM _tm_attempts GROUP BY split_part(worker, ':', 2) ORDER BY 1")
        shares = [int(x) for x in shares.split()]
        if len(shares) != 2:
            sys.exit(f"expected attempts by two processes, got {shares}")
        return took


def backfill_run(work, n):
    with Database() as db:
        tidemark(work, db.url, "migrate")
        started = time.monotonic()
        tidemark(work, db.url, "backfill", "small", *range_args(n), "--concurrency", "4")
        took = time.monotonic() - started
        check_done(db.url, n)
        return took


def claim_latency(work, keys):
    with Database() as db:
        tidemark(work, db.url, "migrate")
        servers = [
            tidemark(work, db.url, "serve", "--no-schedule", "--workers", "2", background=True)
            for _ in range(2)
        ]
        time.sleep(1.5)  # both listening, the queue empty
        for at in hours(keys):
            tidemark(work, db.url, "backfill", "small", "--from", label(at), "--to", label(at), "--enqueue")
            time.sleep(0.15)
        deadline = time.monotonic() + 60
        while int(psql(db.url, "SELECT count(*) FROM _tm_runs WHERE status = 'done'")) < keys:
            if time.monotonic() > deadline:
                sys.exit("the queued keys were not all done within 60 s")
            time.sleep(0.1)
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
        rows = psql(
            db.url,
            "SELECT EXTRACT(EPOCH FROM (a.started_at - r.enqueued_at)) * 1000 FROM _tm_runs r "
            "JOIN _tm_attempts a ON a.run_ref = r.id AND a.attempt = 1",
        )
        return sorted(float(x) for x in rows.split())


def enqueue_time(work, n):
    with Database() as db:
        tidemark(work, db.url, "migrate")
        started = time.monotonic()
        out = tidemark(work, db.url, "backfill", "small", *range_args(n), "--enqueue")
        took = time.monotonic() - started
        queued = int(psql(db.url, "SELECT count(*) FROM _tm_runs WHERE status = 'pending'"))
        if queued != n:
            sys.exit(f"expected {n} pending keys, got {queued}: {out.stdout}")
        return took


# Case 4: the backlog. 250,000 hours from 1990 end in 2018: all due.
BACKLOG_START = datetime(1990, 1, 1)
BACKLOG_PIPELINE = PIPELINE  # missing = "empty": a period without its file is empty


def measured(cmd, cwd):
    """Runs `cmd`; returns (seconds, peak RSS in MiB), polling VmHWM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.01)
    took = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.read()[-2000:]}")
    return took, peak / 1024


class SqliteFile:
    """A fresh SQLite ledger file in the work folder."""

    def __init__(self, work):
        self.path = os.path.join(work, f"queue-{uuid.uuid4().hex[:8]}.db")
        self.url = f"sqlite://{self.path}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for suffix in ("", "-wal", "-shm", "-tidemark-reserve"):
            try:
                os.remove(self.path + suffix)
            except OSError:
                pass

    def scalar(self, sql):
        with sqlite3.connect(self.path) as db:
            return db.execute(sql).fetchone()[0]


def backlog_rate(work, backend, n, window):
    """Enqueue `n` keys, work the queue for `window` seconds: (enqueue s,
    enqueue MiB, done keys, keys/s between first and last finish)."""
    last = BACKLOG_START + timedelta(hours=n - 1)
    ctx = Database() if backend == "postgres" else SqliteFile(work)
    with ctx as db:
        tidemark(work, db.url, "migrate")
        took, mib = measured(
            [BIN, "--database-url", db.url, "backfill", "small", "--from", label(BACKLOG_START),
             "--to", label(last), "--enqueue"],
            work,
        )
        server = tidemark(work, db.url, "serve", "--no-schedule", "--workers", "2", background=True)
        time.sleep(window)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        if backend == "postgres":
            done = int(psql(db.url, "SELECT count(*) FROM _tm_runs WHERE status = 'done'"))
            span = float(psql(db.url, "SELECT COALESCE(EXTRACT(EPOCH FROM max(finished_at) - min(finished_at)), 0) "
                                      "FROM _tm_runs WHERE status = 'done'"))
        else:
            done = db.scalar("SELECT count(*) FROM _tm_runs WHERE status = 'done'")
            span = db.scalar("SELECT COALESCE((julianday(max(finished_at)) - julianday(min(finished_at))) * 86400, 0) "
                             "FROM _tm_runs WHERE status = 'done'")
        rate = (done - 1) / span if done > 1 and span > 0 else 0.0
        return took, mib, done, rate


def backlog(work, backends, small, large, window):
    """Prints case 4; returns {backend: (ratio, enqueue s, enqueue MiB) of
    the large backlog}."""
    print(f"{'database':>9} {'pending':>8} {'enqueue s':>10} {'enqueue MiB':>12} {'done':>6} {'keys/s':>8}")
    results = {}
    for backend in backends:
        rates = {}
        for n in (small, large):
            took, mib, done, rate = backlog_rate(work, backend, n, window)
            rates[n] = rate
            print(f"{backend:>9} {n:>8,} {took:>10.2f} {mib:>12.0f} {done:>6} {rate:>8.1f}")
        ratio = rates[large] / rates[small] if rates[small] else 0.0
        print(f"{backend:>9}: rate at {large:,} pending / rate at {small:,} pending = {ratio:.2f}x (target >= 0.8)")
        results[backend] = (ratio, took, mib)
    return results


def backlog_ratios(quick=False, backends=("sqlite", "postgres"), sizes=None, window=None):
    """Case 4, also for a caller such as bench/scale.py: 1,000 against
    250,000 pending keys, 20 s each (quick: 1,000 against 50,000, 10 s).
    Returns (the large backlog, {backend: (ratio, enqueue s, enqueue MiB)})."""
    small, large = sizes or ((1_000, 50_000) if quick else (1_000, 250_000))
    window = window or (10.0 if quick else 20.0)
    work = tempfile.mkdtemp(prefix="tidemark-queue-bench-")
    try:
        os.makedirs(os.path.join(work, "pipelines"))
        with open(os.path.join(work, "pipelines", "small.toml"), "w") as f:
            f.write(BACKLOG_PIPELINE)
        return large, backlog(work, list(backends), small, large, window)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def percentile(values, p):
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="numbers of periods (comma-separated; empty: skip the throughput case)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-keys", type=int, default=40)
    parser.add_argument("--enqueue", type=int, default=100_000, help="periods for the enqueue timing")
    parser.add_argument("--quick", action="store_true", help="300 periods, 1 repeat, 10 latency keys, 10,000 enqueued")
    parser.add_argument("--backlog", action="store_true", help="only case 4: the queue rate at 1,000 and 250,000 pending")
    parser.add_argument("--backlog-sizes", default="1000,250000", help="the small and the large backlog")
    parser.add_argument("--backlog-window", type=float, default=20.0, help="seconds of work per backlog")
    parser.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both", help="databases of case 4")
    args = parser.parse_args()
    if args.backlog:
        if not os.path.exists(BIN):
            sys.exit(f"{BIN} missing: run `cargo build --release` first")
        sizes = tuple(int(x) for x in args.backlog_sizes.split(","))
        backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
        backlog_ratios(backends=backends, sizes=sizes, window=args.backlog_window)
        return
    if args.quick:
        args.sizes, args.repeat, args.latency_keys, args.enqueue = "300", 1, 10, 10_000
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} missing: run `cargo build --release` first")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    work = make_workdir(max(sizes + [args.latency_keys]))
    try:
        print(f"{'periods':>8} {'queue s':>9} {'queue/s':>9} {'backfill s':>11} {'backfill/s':>11} {'ratio':>6}")
        for n in sizes:
            queue = [queue_run(work, n) for _ in range(args.repeat)]
            backfill = [backfill_run(work, n) for _ in range(args.repeat)]
            q, b = statistics.median(queue), statistics.median(backfill)
            print(
                f"{n:>8} {q:>9.2f} {n / q:>9.0f} {b:>11.2f} {n / b:>11.0f} {b / q:>6.2f}"
                f"   (queue runs {', '.join(f'{t:.2f}' for t in queue)}; backfill {', '.join(f'{t:.2f}' for t in backfill)})"
            )
        latencies = claim_latency(work, args.latency_keys)
        print(
            f"claim latency, idle workers, {len(latencies)} keys: p50 {percentile(latencies, 50):.0f} ms, "
            f"p99 {percentile(latencies, 99):.0f} ms, max {max(latencies):.0f} ms"
        )
        runs = [enqueue_time(work, args.enqueue) for _ in range(args.repeat)]
        print(
            f"backfill --enqueue of {args.enqueue:,} hourly periods: median {statistics.median(runs):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in runs)})"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
