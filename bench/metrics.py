#!/usr/bin/env python3
"""tidemark /metrics benchmark: the scrape cost over a large ledger.

    python3 bench/metrics.py                  # 50 pipelines x 10,000 periods, both databases
    python3 bench/metrics.py --quick          # 5 pipelines x 1,000 periods (development)
    python3 bench/metrics.py --backend sqlite --requests 500

Needs a release build (`cargo build --release`) and, for PostgreSQL, the
server at TIDEMARK_TEST_DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/postgres) with `psql` on the PATH. Every
run makes a fresh work folder and a fresh SQLite file or PostgreSQL
database (dropped afterwards), so it can be run again at will.

What it does, per database:
  1. `tidemark migrate`, then fills the ledger with SQL (running 500,000
     periods through tidemark would measure the loader, not the scrape):
     PIPELINES pipelines x PERIODS daily run keys each, most `done` with one
     attempt, one in 997 `failed` after a `lost` and a `failed` attempt, the
     last 20 of each pipeline `pending` in the queue; half the attempts
     claimed from the queue (a `queued_at`). Then (VACUUM) ANALYZE, as
     autovacuum would.
  2. Starts `serve --no-schedule --listen` over PIPELINES pipeline files
     (so every family is zero-filled for each) and GETs /metrics REQUESTS
     times in a row, after 3 warm-up requests:
     - `--metrics-max-age 0s`: every scrape reads the ledger (the cost of
       the queries themselves);
     - the default (`10s`): what a scraper sees with the cache (refreshed
       in the background while scrapes come).
     p50 / p99 / max of the wall time of each GET, in milliseconds, and the
     time of the first scrape after start (it reads the whole attempt
     history once; later ones read only the attempts that ended since).
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TIDEMARK_BENCH_BIN", os.path.join(ROOT, "target", "release", "tidemark"))
PG_URL = os.environ.get("TIDEMARK_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")

PIPELINE = """
name = "{name}"
export_type = "t"

[period]
granularity = "day"
timezone = "UTC"
start = "2000-01-01"

[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "data/{{period.start:%Y-%m-%d}}.csv"
missing = "empty"

[fields]
id = {{ type = "text", required = true }}

[load]
table = "{name}"
key = ["id"]
"""

RUN_COLUMNS = """pipeline, source, export_type, period_start, period_end, status, attempt, run_id,
    batches, rows_read, rows_inserted, rows_updated, rows_unchanged, rows_deleted, rows_rejected,
    error_class, started_at, finished_at, created_at, updated_at, enqueued_at, queue_rank"""

ATTEMPT_COLUMNS = """run_ref, attempt, run_id, worker, status, rows_read, rows_inserted,
    rows_updated, rows_unchanged, rows_deleted, rows_rejected, error_class, started_at,
    finished_at, queued_at"""

SQLITE_FILL = """
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {periods} - 1),
     p(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM p WHERE j < {pipelines} - 1),
     k AS (SELECT j, i,
                  CASE WHEN i >= {periods} - 20 THEN 'pending'
                       WHEN i % 997 = 0 THEN 'failed' ELSE 'done' END AS status,
                  strftime('%Y-%m-%dT%H:%M:%fZ', '2025-01-01', '+' || i || ' minutes') AS t
           FROM p CROSS JOIN n)
INSERT INTO _tm_runs ({run_columns})
SELECT printf('p%02d', j), 's', 't',
       strftime('%Y-%m-%dT%H:%M:%S+00:00', '2000-01-01', '+' || i || ' days'),
       strftime('%Y-%m-%dT%H:%M:%S+00:00', '2000-01-01', '+' || (i + 1) || ' days'),
       status,
       CASE status WHEN 'pending' THEN 0 WHEN 'failed' THEN 2 ELSE 1 END,
       lower(hex(randomblob(16))), 1, 100, 90, 5, 4, 1, i % 3,
       CASE status WHEN 'failed' THEN 'source' END,
       CASE WHEN status <> 'pending' THEN t END,
       CASE WHEN status <> 'pending' THEN strftime('%Y-%m-%dT%H:%M:%fZ', julianday(t) + (i % 600) / 86400.0) END,
       t, t,
       CASE WHEN status = 'pending' OR i % 2 = 0 THEN strftime('%Y-%m-%dT%H:%M:%fZ', julianday(t) - (i % 90) / 86400.0) END,
       CASE WHEN status = 'pending' THEN t END
FROM k;
INSERT INTO _tm_attempts ({attempt_columns})
SELECT id, 1, run_id, 'bench-host:1:0000abcd', CASE status WHEN 'failed' THEN 'lost' ELSE 'done' END,
       rows_read, rows_inserted, rows_updated, rows_unchanged, rows_deleted, rows_rejected,
       NULL, started_at, finished_at,
       CASE WHEN enqueued_at IS NOT NULL THEN enqueued_at END
FROM _tm_runs WHERE status IN ('done', 'failed');
INSERT INTO _tm_attempts ({attempt_columns})
SELECT id, 2, run_id, 'bench-host:2:0000beef', 'failed',
       rows_read, rows_inserted, rows_updated, rows_unchanged, rows_deleted, rows_rejected,
       'source', started_at, finished_at, NULL
FROM _tm_runs WHERE status = 'failed';
ANALYZE;
"""

PG_FILL = """
INSERT INTO _tm_runs ({run_columns})
SELECT format('p%s', lpad(j::text, 2, '0')), 's', 't',
       to_char(timestamp '2000-01-01' + i * interval '1 day', 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'),
       to_char(timestamp '2000-01-01' + (i + 1) * interval '1 day', 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'),
       status,
       CASE status WHEN 'pending' THEN 0 WHEN 'failed' THEN 2 ELSE 1 END,
       md5(random()::text || i || '/' || j), 1, 100, 90, 5, 4, 1, i % 3,
       CASE status WHEN 'failed' THEN 'source' END,
       CASE WHEN status <> 'pending' THEN t END,
       CASE WHEN status <> 'pending' THEN t + (i % 600) * interval '1 second' END,
       t, t,
       CASE WHEN status = 'pending' OR i % 2 = 0 THEN t - (i % 90) * interval '1 second' END,
       CASE WHEN status = 'pending' THEN t END
FROM (SELECT j, i,
             CASE WHEN i >= {periods} - 20 THEN 'pending'
                  WHEN i % 997 = 0 THEN 'failed' ELSE 'done' END AS status,
             timestamptz '2025-01-01 00:00:00+00' + i * interval '1 minute' AS t
      FROM generate_series(0, {pipelines} - 1) AS j, generate_series(0, {periods} - 1) AS i) AS k;
INSERT INTO _tm_attempts ({attempt_columns})
SELECT id, 1, run_id, 'bench-host:1:0000abcd', CASE status WHEN 'failed' THEN 'lost' ELSE 'done' END,
       rows_read, rows_inserted, rows_updated, rows_unchanged, rows_deleted, rows_rejected,
       NULL, started_at, finished_at, enqueued_at
FROM _tm_runs WHERE status IN ('done', 'failed');
INSERT INTO _tm_attempts ({attempt_columns})
SELECT id, 2, run_id, 'bench-host:2:0000beef', 'failed',
       rows_read, rows_inserted, rows_updated, rows_unchanged, rows_deleted, rows_rejected,
       'source', started_at, finished_at, NULL
FROM _tm_runs WHERE status = 'failed';
VACUUM ANALYZE _tm_runs;
VACUUM ANALYZE _tm_attempts;
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.status, answer.read()


def tidemark(work, url, *args):
    subprocess.run([BIN, "--database-url", url, *args], cwd=work, check=True,
                   stdout=subprocess.DEVNULL)


def fill(backend, url, db_path, pipelines, periods):
    params = dict(pipelines=pipelines, periods=periods, run_columns=RUN_COLUMNS,
                  attempt_columns=ATTEMPT_COLUMNS)
    if backend == "sqlite":
        subprocess.run(["sqlite3", db_path], input=SQLITE_FILL.format(**params), text=True,
                       check=True)
    else:
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", url],
                       input=PG_FILL.format(**params), text=True, check=True)


def scrape(work, url, max_age, requests):
    port = free_port()
    serve = subprocess.Popen(
        [BIN, "--database-url", url, "serve", "--no-schedule", "--workers", "1",
         "--listen", f"127.0.0.1:{port}", "--metrics-max-age", max_age],
        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if get(base + "/readyz", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("serve did not become ready in 60 s")
            time.sleep(0.1)
        first = None
        for _ in range(3):
            started = time.perf_counter()
            status, body = get(base + "/metrics", timeout=300)
            first = first or (time.perf_counter() - started) * 1000
            assert status == 200 and b"tidemark_periods" in body, body[:200]
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            status, body = get(base + "/metrics")
            times.append((time.perf_counter() - started) * 1000)
            assert status == 200
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        return times, series, len(body), first
    finally:
        serve.terminate()
        serve.wait(timeout=60)


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_backend(backend, pipelines, periods, requests):
    work = tempfile.mkdtemp(prefix="tidemark-metrics-bench-")
    os.makedirs(os.path.join(work, "pipelines"))
    for j in range(pipelines):
        name = f"p{j:02d}"
        with open(os.path.join(work, "pipelines", f"{name}.toml"), "w") as f:
            f.write(PIPELINE.format(name=name))
    db_name = None
    db_path = os.path.join(work, "ledger.db")
    if backend == "sqlite":
        url = f"sqlite://{db_path}"
    else:
        db_name = "tm_metrics_bench_" + uuid.uuid4().hex[:12]
        subprocess.run(["psql", "-q", PG_URL, "-c", f"CREATE DATABASE {db_name}"], check=True)
        url = PG_URL.rsplit("/", 1)[0] + "/" + db_name
    try:
        tidemark(work, url, "migrate")
        started = time.time()
        fill(backend, url, db_path, pipelines, periods)
        print(f"  {backend}: ledger of {pipelines * periods:,} run keys filled in "
              f"{time.time() - started:.0f} s", flush=True)
        for max_age in ["0s", "10s"]:
            times, series, size, first = scrape(work, url, max_age, requests)
            print(f"  {backend:8} --metrics-max-age {max_age:3}: p50 {quantile(times, 0.5):7.1f} ms"
                  f"   p99 {quantile(times, 0.99):7.1f} ms   max {max(times):7.1f} ms"
                  f"   mean {statistics.mean(times):6.1f} ms   ({requests} GETs, {series} series,"
                  f" {size // 1024} KiB; the first scrape, which counts every attempt once:"
                  f" {first:.0f} ms)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if db_name:
            subprocess.run(["psql", "-q", PG_URL, "-c", f"DROP DATABASE IF EXISTS {db_name}"],
                           check=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 pipelines x 1,000 periods")
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--periods", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    if args.quick:
        args.pipelines, args.periods, args.requests = 5, 1000, 50
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: cargo build --release")
    print(f"/metrics over {args.pipelines} pipelines x {args.periods:,} periods", flush=True)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        run_backend(backend, args.pipelines, args.periods, args.requests)


if __name__ == "__main__":
    main()
