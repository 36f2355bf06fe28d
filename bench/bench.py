#!/usr/bin/env python3
"""tidemark load benchmark: rows/s against a COPY / sqlite3 .import baseline
measured in the same run, rows actually written, and peak RSS.

    python3 bench/bench.py                  # 1,000,000 rows over 20 days, 3 repeats
    python3 bench/bench.py --rows 200000 --repeat 1
    python3 bench/bench.py --one-period     # also: 1,000,000 rows in one period (RSS)

Needs: a release build (`cargo build --release`), psql and sqlite3 on PATH,
and PostgreSQL at TIDEMARK_TEST_DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/postgres). Each PostgreSQL scenario runs in
a fresh database that is dropped afterwards.

Steps per repeat, on PostgreSQL:
  1. baseline: COPY of all files into an empty table with the same primary key
     (and, for reference, COPY of the same rows with tidemark's six lineage
     columns filled into tidemark's table shape: natural key UNIQUE plus the
     run-key index)
  2. tidemark first backfill of the periods into an empty database
  3. tidemark forced re-sync after 10% of rows changed, 2% deleted, 2% added
  4. tidemark forced re-sync of unchanged data
Every timed step starts after a PostgreSQL CHECKPOINT and an OS sync, so no
step pays for writing out the previous step's data.

and on SQLite: the sqlite3 .import baseline (WAL, one transaction; also into
tidemark's table shape), then 2-4.
"""

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import date, datetime, timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "tidemark")
PG_URL = os.environ.get("TIDEMARK_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
COLUMNS = "order_id,quantity,customer,amount,status,created_at,updated_at,note"

PIPELINE = """
name = "bench_orders"
export_type = "orders_daily"

[period]
granularity = "{granularity}"
timezone = "UTC"

[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "data/{{period.start:%Y-%m-%d}}/orders.csv"

[fields]
order_id   = {{ type = "text", required = true }}
quantity   = {{ type = "int" }}
customer   = {{ type = "text" }}
amount     = {{ type = "decimal" }}
status     = {{ type = "text" }}
created_at = {{ type = "timestamptz" }}
updated_at = {{ type = "timestamptz" }}
note       = {{ type = "text" }}

[load]
table = "orders"
key = ["order_id"]
on_missing = "delete"
max_delete_fraction = 0.5
batch_size = {batch_size}
"""


def gen_row(rng, key, day):
    created = datetime(day.year, day.month, day.day) + timedelta(seconds=rng.randrange(86400))
    updated = created + timedelta(seconds=rng.randrange(3600))
    return (
        key,
        str(rng.randint(1, 50)),
        f"customer-{rng.randint(1, 5000):05d}",
        f"{rng.randint(100, 9999999) / 100:.2f}",
        rng.choice(("new", "paid", "shipped", "cancelled")),
        created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        updated.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(40)),
    )


def write_day(folder, day, rows):
    path = os.path.join(folder, "data", day.isoformat())
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "orders.csv"), "w") as f:
        f.write(COLUMNS + "\n")
        for row in rows:
            f.write(",".join(row) + "\n")


# The lineage values tidemark stamps on every row, as a baseline loads them.
LINEAGE = "_tm_source,_tm_export_type,_tm_period_start,_tm_run_id,_tm_row_hash,_tm_loaded_at"


def write_wide_day(folder, day, rows):
    """The day's rows with tidemark's lineage columns appended (same widths),
    for the "same table shape" reference load."""
    stamp = (f",files,orders_daily,{day.isoformat()}T00:00:00+00:00,{uuid.uuid4().hex},"
             f"{{}},2026-01-01T00:00:00.000Z")
    with open(os.path.join(folder, "data", day.isoformat(), "wide.csv"), "w") as f:
        f.write(COLUMNS + "," + LINEAGE + "\n")
        for n, row in enumerate(rows):
            f.write(",".join(row) + stamp.format(f"{n:032x}") + "\n")


def generate(folder, total, periods, granularity, batch_size):
    """Writes the CSVs and the pipeline; returns {day: [rows]}."""
    rng = random.Random(42)
    per = total // periods
    days = [date(2024, 1, 1) + timedelta(days=i) for i in range(periods)]
    data = {}
    for i, day in enumerate(days):
        data[day] = [gen_row(rng, f"ORD-{i:03d}-{n:08d}", day) for n in range(per)]
        write_day(folder, day, data[day])
        write_wide_day(folder, day, data[day])
    with open(os.path.join(folder, "bench.toml"), "w") as f:
        f.write(PIPELINE.format(granularity=granularity, batch_size=batch_size))
    return data


def mutate(folder, data):
    """10% changed, 2% deleted, 2% added, in every period."""
    rng = random.Random(7)
    for day, rows in data.items():
        new = []
        for row in rows:
            r = rng.random()
            if r < 0.02:
                continue  # deleted
            if r < 0.12:
                row = row[:3] + (f"{rng.randint(100, 9999999) / 100:.2f}", "refunded") + row[5:]
            new.append(row)
        for n in range(len(rows) // 50):
            new.append(gen_row(rng, f"NEW-{day:%Y%m%d}-{n:08d}", day))
        write_day(folder, day, new)


def settle():
    """Starts every timed step from the same state: the previous step's dirty
    pages written out (a PostgreSQL CHECKPOINT, then the OS's own), so no step
    pays for the one before it."""
    subprocess.run(["psql", PG_URL, "-qAtX", "-c", "CHECKPOINT"], capture_output=True)
    os.sync()


def timed(cmd, **kw):
    """Runs cmd; returns (seconds, peak RSS of the child in MiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    settle()
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return elapsed, max(rss, before) / 1024


def psql(url, sql):
    out = subprocess.run(["psql", url, "-qAtX", "-v", "ON_ERROR_STOP=1", "-c", sql], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"psql failed: {sql}\n{out.stderr}")
    return out.stdout.strip()


def fresh_pg():
    name = "tm_bench_" + uuid.uuid4().hex[:10]
    psql(PG_URL, f"CREATE DATABASE {name}")
    base = PG_URL.rsplit("/", 1)[0]
    return name, f"{base}/{name}"


def drop_pg(name):
    psql(PG_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_writes(url):
    time.sleep(1.2)  # let backends flush their statistics
    row = psql(url, "SELECT coalesce(sum(n_tup_ins),0), coalesce(sum(n_tup_upd),0), coalesce(sum(n_tup_del),0) "
                    "FROM pg_stat_user_tables WHERE relname = 'orders'")
    return tuple(int(x) for x in row.split("|")) if row else (0, 0, 0)


PG_PLAIN = ("CREATE TABLE orders (order_id text PRIMARY KEY, quantity bigint, customer text, amount numeric, "
            "status text, created_at timestamptz, updated_at timestamptz, note text)")
# The table tidemark creates for the bench pipeline: lineage columns, the
# natural key UNIQUE, and the run-key index.
PG_SHAPE = ("CREATE TABLE orders (order_id text, quantity bigint, customer text, amount numeric, status text, "
            "created_at timestamptz, updated_at timestamptz, note text, _tm_source text NOT NULL, "
            "_tm_export_type text NOT NULL, _tm_period_start timestamptz NOT NULL, _tm_run_id text NOT NULL, "
            "_tm_row_hash text NOT NULL, _tm_loaded_at timestamptz NOT NULL, UNIQUE (order_id)); "
            "CREATE INDEX ON orders (_tm_source, _tm_export_type, _tm_period_start)")


def pg_baseline(folder, days, total, shape=False):
    """psql \\copy of every file into an empty table: the plain keyed table,
    or (shape) tidemark's table shape with the lineage columns filled."""
    name, url = fresh_pg()
    try:
        psql(url, PG_SHAPE if shape else PG_PLAIN)
        file, columns = ("wide.csv", COLUMNS + "," + LINEAGE) if shape else ("orders.csv", COLUMNS)
        script = "".join(
            f"\\copy orders ({columns}) FROM '{folder}/data/{d.isoformat()}/{file}' WITH (FORMAT csv, HEADER true)\n"
            for d in days)
        path = os.path.join(folder, "copy.sql")
        with open(path, "w") as f:
            f.write(script)
        secs, _ = timed(["psql", url, "-qX", "-v", "ON_ERROR_STOP=1", "-f", path])
        count = int(psql(url, "SELECT count(*) FROM orders"))
        assert count == total, f"baseline loaded {count} rows, expected {total}"
        return secs
    finally:
        drop_pg(name)


SQLITE_PLAIN = ("CREATE TABLE orders (order_id TEXT PRIMARY KEY, quantity INTEGER, customer TEXT, amount TEXT, "
                "status TEXT, created_at TEXT, updated_at TEXT, note TEXT);")
SQLITE_SHAPE = ("CREATE TABLE orders (order_id TEXT, quantity INTEGER, customer TEXT, amount DECIMAL_TEXT, "
                "status TEXT, created_at TIMESTAMPTZ_TEXT, updated_at TIMESTAMPTZ_TEXT, note TEXT, _tm_source TEXT NOT NULL, "
                "_tm_export_type TEXT NOT NULL, _tm_period_start TEXT NOT NULL, _tm_run_id TEXT NOT NULL, "
                "_tm_row_hash TEXT NOT NULL, _tm_loaded_at TEXT NOT NULL, UNIQUE (order_id)); "
                "CREATE INDEX orders__tm_run_key ON orders (_tm_period_start);")


def sqlite_baseline(folder, days, total, shape=False):
    """sqlite3 .import of every file (WAL, one transaction): into the plain
    keyed table, or (shape) tidemark's table shape with lineage filled."""
    db = os.path.join(folder, "baseline.db")
    if os.path.exists(db):
        os.remove(db)
    file = "wide.csv" if shape else "orders.csv"
    script = ["PRAGMA journal_mode=WAL;", SQLITE_SHAPE if shape else SQLITE_PLAIN, "BEGIN;"]
    script += [f".import --csv --skip 1 {folder}/data/{d.isoformat()}/{file} orders" for d in days]
    script += ["COMMIT;"]
    path = os.path.join(folder, "import.sql")
    with open(path, "w") as f:
        f.write("\n".join(script) + "\n")
    settle()
    start = time.perf_counter()
    subprocess.run(["sqlite3", db], stdin=open(path), check=True, capture_output=True)
    secs = time.perf_counter() - start
    count = int(subprocess.run(["sqlite3", db, "SELECT count(*) FROM orders"], capture_output=True, text=True).stdout)
    assert count == total, f"sqlite baseline loaded {count} rows, expected {total}"
    os.remove(db)
    return secs


CONCURRENCY = 2


def tidemark(folder, url, days, force):
    cmd = [BIN, "--database-url", url, "backfill", os.path.join(folder, "bench.toml"),
           "--from", days[0].isoformat(), "--to", days[-1].isoformat(), "--concurrency", str(CONCURRENCY)]
    if force:
        cmd.append("--force")
    env = dict(os.environ, TIDEMARK_LOG="warn")
    settle()
    start = time.perf_counter()
    # GNU time reports this one process's peak RSS (RUSAGE_CHILDREN would keep the max of all).
    proc = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True, cwd=folder, env=env)
    secs = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"tidemark failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rss = int(proc.stderr.strip().splitlines()[-1]) / 1024
    return secs, rss


def sqlite_state(db):
    """SQLite keeps no per-table write counters: rows written by a step are
    the rows whose _tm_loaded_at is newer than before it, plus rows gone."""
    out = subprocess.run(["sqlite3", db, "SELECT count(*), coalesce(max(_tm_loaded_at), '') FROM orders"],
                         capture_output=True, text=True).stdout.strip()
    count, newest = out.split("|")
    return int(count), newest


def sqlite_written(db, before):
    count_before, newest_before = before
    out = subprocess.run(["sqlite3", db, f"SELECT count(*) FROM orders WHERE _tm_loaded_at > '{newest_before}'"],
                         capture_output=True, text=True).stdout.strip()
    count_after, _ = sqlite_state(db)
    return f"{int(out)} rows inserted or updated, net {count_after - count_before:+d} rows"


def scenario(folder, total, periods, granularity, batch_size, backend):
    """One repeat: returns {step: (seconds, rss)} and written-row counts."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    data = generate(folder, total, periods, granularity, batch_size)
    days = sorted(data)
    results = {}
    if backend == "postgres":
        results["baseline"] = (pg_baseline(folder, days, total), None)
        results["shape"] = (pg_baseline(folder, days, total, shape=True), None)
        name, url = fresh_pg()
    else:
        results["baseline"] = (sqlite_baseline(folder, days, total), None)
        results["shape"] = (sqlite_baseline(folder, days, total, shape=True), None)
        name, url = None, f"sqlite://{folder}/tidemark.db"
    db = f"{folder}/tidemark.db"
    snapshot = (lambda: pg_writes(url)) if name else (lambda: sqlite_state(db))
    try:
        writes = {}
        steps = [("first", False, None), ("mutated", True, lambda: mutate(folder, data)), ("unchanged", True, None)]
        before = (0, 0, 0) if name else (0, "")
        for step, force, prepare in steps:
            if prepare:
                prepare()
            results[step] = tidemark(folder, url, days, force=force)
            if name:
                after = snapshot()
                writes[step] = "ins/upd/del = " + "/".join(str(a - b) for a, b in zip(after, before))
                before = after
            else:
                writes[step] = sqlite_written(db, before)
                before = snapshot()
        return results, writes
    finally:
        if name:
            drop_pg(name)


def report(backend, runs, total, baseline_name):
    print(f"\n== {backend}: {total:,} rows, median of {len(runs)} run(s), tidemark --concurrency {CONCURRENCY} ==")
    med = {step: statistics.median(r[0][step][0] for r in runs) for step in runs[0][0]}
    base = total / med["baseline"]
    print(f"{'step':<34} {'seconds':>8} {'rows/s':>10} {'x baseline':>10} {'peak RSS':>10}  rows written (pg_stat_user_tables / _tm_loaded_at)")
    labels = {"baseline": baseline_name, "shape": "  same, into tidemark's table shape",
              "first": "tidemark first backfill",
              "mutated": "tidemark re-sync, 10%/2%/2% changed", "unchanged": "tidemark re-sync, unchanged"}
    for step, label in labels.items():
        secs = med[step]
        rss = max((r[0][step][1] or 0) for r in runs)
        written = runs[-1][1].get(step, "")
        print(f"{label:<34} {secs:>8.2f} {total / secs:>10,.0f} {total / secs / base:>10.2f} "
              f"{(f'{rss:.0f} MiB' if rss else '-'):>10}  {written}")
    print(f"unchanged re-sync vs first backfill: {med['first'] / med['unchanged']:.2f}x faster")
    print(f"first backfill vs the baseline tool loading tidemark's table shape: "
          f"{med['shape'] / med['first']:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--periods", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="runs per backend (0: only --one-period)")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    ap.add_argument("--one-period", action="store_true", help="also load all rows as one period (RSS check)")
    ap.add_argument("--concurrency", type=int, default=2, help="periods at once (default 2: one per core)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench", "data"))
    args = ap.parse_args()
    global CONCURRENCY
    CONCURRENCY = args.concurrency
    if not os.path.exists(BIN):
        sys.exit("build first: cargo build --release")
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    for backend in backends if args.repeat > 0 else []:  # --repeat 0: only --one-period
        runs = [scenario(args.dir, args.rows, args.periods, "day", args.batch_size, backend)
                for _ in range(args.repeat)]
        report(backend, runs, args.rows, "COPY baseline (psql \\copy)" if backend == "postgres"
               else "sqlite3 .import baseline")
    if args.one_period:
        for backend in backends:
            runs = [scenario(args.dir, args.rows, 1, "day", args.batch_size, backend)]
            report(f"{backend}, one period of {args.rows:,} rows", runs, args.rows,
                   "COPY baseline" if backend == "postgres" else "sqlite3 .import baseline")


if __name__ == "__main__":
    main()
