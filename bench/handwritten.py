#!/usr/bin/env python3
"""The hand-written pattern tidemark's small-period case is compared with.

What a backend team writes instead of tidemark, the seed article's pattern:
a pool of worker processes, one database connection each, and per period

  1. claim a row in `task_runs` with INSERT ... ON CONFLICT ... RETURNING,
     then COMMIT (a done period is not claimed again);
  2. read the day's CSV;
  3. upsert its rows on the natural key and mark the task row done, then
     COMMIT.

Two durable commits per period, as tidemark's runs need at least. SQLite
runs with tidemark's settings (WAL, synchronous = NORMAL, 8 KiB pages, a
busy timeout, BEGIN IMMEDIATE so concurrent writers wait instead of
failing); PostgreSQL with the server's `synchronous_commit`, through
psycopg 3 (`pip install "psycopg[binary]"`).

    python3 bench/handwritten.py --folder DIR --url sqlite:///tmp/x.db \\
        --from 2020-01-01 --to 2025-06-22 --workers 4

DIR holds data/YYYY-MM-DD/orders.csv, as the small case of bench/bench.py
writes them. Prints the seconds the periods took (after the schema exists
and the workers are connected) and the rows loaded.
"""

import argparse
import csv
import os
import sys
import time
from datetime import date, timedelta

# bench/queue.py would shadow the standard library's `queue`, which
# multiprocessing imports: never look for modules beside this file.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import multiprocessing  # noqa: E402

SOURCE = "files"

TASKS = ("CREATE TABLE IF NOT EXISTS task_runs (id {serial}, source TEXT NOT NULL, period TEXT NOT NULL, "
         "status TEXT NOT NULL, attempt INTEGER NOT NULL, started_at TEXT NOT NULL, finished_at TEXT, "
         "rows_loaded INTEGER, UNIQUE (source, period))")
ORDERS = ("CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, quantity BIGINT, customer TEXT, "
          "amount {decimal}, status TEXT, created_at {time}, updated_at {time}, note TEXT)")
CLAIM = ("INSERT INTO task_runs (source, period, status, attempt, started_at) VALUES ({p}, {p}, 'running', 1, {now}) "
         "ON CONFLICT (source, period) DO UPDATE SET status = 'running', attempt = task_runs.attempt + 1, "
         "started_at = excluded.started_at WHERE task_runs.status <> 'done' RETURNING id")
UPSERT = ("INSERT INTO orders (order_id, quantity, customer, amount, status, created_at, updated_at, note) "
          "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (order_id) DO UPDATE SET "
          "quantity = excluded.quantity, customer = excluded.customer, amount = excluded.amount, "
          "status = excluded.status, created_at = excluded.created_at, updated_at = excluded.updated_at, "
          "note = excluded.note")
DONE = "UPDATE task_runs SET status = 'done', finished_at = {now}, rows_loaded = {p} WHERE id = {p}"


class Sqlite:
    """One SQLite connection with tidemark's settings."""

    def __init__(self, url):
        import sqlite3
        self.conn = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None, timeout=60)
        for pragma in ("page_size = 8192", "journal_mode = WAL", "synchronous = NORMAL", "cache_size = -16384"):
            self.conn.execute(f"PRAGMA {pragma}")
        self.sql = {name: text.format(p="?", now="strftime('%Y-%m-%dT%H:%M:%fZ')")
                    for name, text in (("claim", CLAIM), ("upsert", UPSERT), ("done", DONE))}

    def schema(self):
        self.conn.execute(TASKS.format(serial="INTEGER PRIMARY KEY"))
        self.conn.execute(ORDERS.format(decimal="TEXT", time="TEXT"))

    def begin(self):
        self.conn.execute("BEGIN IMMEDIATE")

    def execute(self, name, args):
        return self.conn.execute(self.sql[name], args)

    def executemany(self, name, rows):
        self.conn.executemany(self.sql[name], rows)

    def commit(self):
        self.conn.execute("COMMIT")


class Postgres:
    """One PostgreSQL connection (psycopg 3)."""

    def __init__(self, url):
        import psycopg
        self.conn = psycopg.connect(url)
        self.sql = {name: text.format(p="%s", now="now()::text")
                    for name, text in (("claim", CLAIM), ("upsert", UPSERT), ("done", DONE))}

    def schema(self):
        self.conn.execute(TASKS.format(serial="BIGSERIAL PRIMARY KEY"))
        self.conn.execute(ORDERS.format(decimal="NUMERIC", time="TIMESTAMPTZ"))
        self.conn.commit()

    def begin(self):
        pass  # psycopg opens a transaction at the first statement

    def execute(self, name, args):
        return self.conn.execute(self.sql[name], args)

    def executemany(self, name, rows):
        self.conn.cursor().executemany(self.sql[name], rows)

    def commit(self):
        self.conn.commit()


def connect(url):
    return Sqlite(url) if url.startswith("sqlite:") else Postgres(url)


_db = None


def _connect_worker(url):
    global _db
    _db = connect(url)


def load_day(args):
    """One period: claim, read, upsert + done. Rows loaded (0 if done)."""
    folder, day = args
    _db.begin()
    claimed = _db.execute("claim", (SOURCE, day)).fetchone()
    _db.commit()
    if claimed is None:
        return 0
    with open(os.path.join(folder, "data", day, "orders.csv"), newline="") as f:
        reader = csv.reader(f)
        next(reader)
        rows = [tuple(None if v == "" else v for v in row) for row in reader]
    _db.begin()
    _db.executemany("upsert", rows)
    _db.execute("done", (len(rows), claimed[0]))
    _db.commit()
    return len(rows)


def run(folder, url, first, last, workers):
    """Loads every day from first to last: (seconds, rows loaded)."""
    connect(url).schema()
    days = []
    while first <= last:
        days.append(first.isoformat())
        first += timedelta(days=1)
    with multiprocessing.Pool(workers, initializer=_connect_worker, initargs=(url,)) as pool:
        pool.map(int, range(workers))  # every worker connected before the clock starts
        start = time.perf_counter()
        rows = sum(pool.imap_unordered(load_day, [(folder, d) for d in days], chunksize=1))
        secs = time.perf_counter() - start
    return secs, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", required=True)
    ap.add_argument("--url", required=True, help="sqlite:///path or postgres://...")
    ap.add_argument("--from", dest="first", required=True, type=date.fromisoformat)
    ap.add_argument("--to", dest="last", required=True, type=date.fromisoformat)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    secs, rows = run(args.folder, args.url, args.first, args.last, args.workers)
    print(f"{secs:.3f} s, {rows} rows")


if __name__ == "__main__":
    main()
