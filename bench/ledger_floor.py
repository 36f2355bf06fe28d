#!/usr/bin/env python3
"""How much of a tiny SQLite period is the ledger's durable work itself?

The small case (bench/bench.py --only small) compares tidemark with the
hand-written pattern (bench/handwritten.py): on SQLite tidemark reaches
about 0.4x of its periods/s. This splits that gap in two by running a
third program on the same files, the *floor*: the hand-written pattern's
Python workers (same process pool, same connection settings, clock
started once they are connected), but doing per period exactly the SQL
tidemark's SQLite ledger and data plane run (copied from its statement
trace), on tidemark's own tables (made by `tidemark migrate` and a first
period):

  before the loop   BEGIN IMMEDIATE; create the first run row `running`
                    with its attempt row; COMMIT
  per period        does the period hold stored rows (the run-key index);
                    read the day's CSV;
                    BEGIN IMMEDIATE; the fence; insert the rows with their
                    lineage columns (two hashes each); the run row `done`;
                    the attempt row `done`; the next period's run row and
                    attempt row (the claim piggy-back); COMMIT

So floor / pattern is what tidemark's ledger and table shape cost with no
engine around them (attempt history, lease, the run rows' and rows'
indexes, lineage columns), and tidemark / floor is what the engine adds
(process start, planning, tasks, typing, hashing, the checks). Both
figures are ratios measured in the same run.

Two knobs change the floor only, to weigh designs before building them
(ADR 0022): `--skip` leaves parts of the ledger's work out (`attempts`:
the attempt history rows; `indexes`: the run rows' metrics, open and
running indexes and the attempts' finished index; `fence`; `probe`), and
`--group N` commits every N periods of a worker instead of each (a
shared commit; the write lock is then held while the next files are
read).

    python3 bench/ledger_floor.py            # 2,000 periods, 3 rounds
    python3 bench/ledger_floor.py --quick    # 500 periods, 1 round
    python3 bench/ledger_floor.py --group 16 --skip attempts
"""

import argparse
import csv
import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date, timedelta

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import multiprocessing  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
PIPELINE, SOURCE, EXPORT = "bench_orders", "files", "orders_daily"

# tidemark's statements, as its SQLite trace shows them (crates/load/src/ledger/sql.rs).
CREATE_RUNNING = (
    "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, status, attempt, run_id, "
    "lease_owner, lease_host, lease_pid, lease_expires_at, batches, rows_read, rows_inserted, rows_updated, "
    "rows_unchanged, rows_deleted, rows_rejected, rows_superseded, rows_expected, handler_version, started_at, "
    "provisional, fields_fingerprint, created_at, updated_at) "
    f"VALUES (?1, ?2, ?3, ?4, ?5, 'running', 1, ?6, ?7, ?8, ?9, "
    f"strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') + ?10 / 86400.0), 0, 0, 0, 0, 0, 0, 0, 0, NULL, ?11, {NOW}, "
    f"?12, ?13, {NOW}, {NOW}) "
    "ON CONFLICT (pipeline, source, export_type, period_start) DO NOTHING RETURNING id")
INSERT_ATTEMPT = (
    "INSERT INTO _tm_attempts (run_ref, attempt, run_id, worker, status, resumed, from_batch, started_at, queued_at) "
    f"VALUES (?1, ?2, ?3, ?4, 'running', NOT ?5, CASE WHEN ?5 THEN NULL ELSE ?6 END, {NOW}, "
    "CASE WHEN ?7 THEN (SELECT enqueued_at FROM _tm_runs WHERE id = ?1) END)")
HOLDS = ("SELECT EXISTS (SELECT 1 FROM orders WHERE _tm_source = ?1 AND _tm_export_type = ?2 "
         "AND _tm_period_start = ?3)")
FENCE = f"UPDATE _tm_runs SET updated_at = {NOW} WHERE id = ?1 AND attempt = ?2 AND status = 'running'"
ROWS = ("INSERT INTO orders (order_id, quantity, customer, amount, status, created_at, updated_at, note, "
        "_tm_source, _tm_export_type, _tm_period_start, _tm_run_id, _tm_row_hash, _tm_loaded_at, _tm_raw_hash) "
        f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NOW}, ?)")
RUN_DONE = (
    f"UPDATE _tm_runs SET status = 'done', result = json_set(?1, '$.finished_at', {NOW}), finished_at = {NOW}, "
    "checkpoint = NULL, lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL, "
    "failures = 0, not_before = NULL, rows_read = ?2, rows_inserted = ?3, rows_updated = ?4, rows_unchanged = ?5, "
    "rows_deleted = ?6, rows_rejected = ?7, rows_superseded = ?8, rows_expected = ?9 WHERE id = ?10 RETURNING result")
ATTEMPT_DONE = (
    "UPDATE _tm_attempts SET status = ?1, rows_read = ?2, rows_inserted = ?3, rows_updated = ?4, "
    "rows_unchanged = ?5, rows_deleted = ?6, rows_rejected = ?7, rows_superseded = ?8, rows_expected = ?9, "
    f"error_class = ?10, error_message = ?11, finished_at = {NOW} WHERE run_ref = ?12 AND attempt = ?13")


def bench_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench", os.path.join(ROOT, "bench", "bench.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module
    spec.loader.exec_module(module)
    return module


_conn = None
_skip = frozenset()
_group = 1


def _connect(db, skip, group):
    global _conn, _skip, _group
    _skip, _group = skip, group
    import sqlite3
    _conn = sqlite3.connect(db, isolation_level=None, timeout=60)
    for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "cache_size = -16384", "foreign_keys = ON"):
        _conn.execute(f"PRAGMA {pragma}")


def _claim(day, end, worker):
    run_id = os.urandom(16).hex()
    row = _conn.execute(CREATE_RUNNING, (PIPELINE, SOURCE, EXPORT, day, end, run_id, worker, "floor",
                                          os.getpid(), 30.0, "1", False, "fields")).fetchone()
    if "attempts" not in _skip:
        _conn.execute(INSERT_ATTEMPT, (row[0], 1, run_id, worker, True, 0, False))
    return row[0], run_id


def _worker(args):
    """One worker's periods, in order, each finishing transaction claiming the next."""
    folder, days = args
    worker = f"floor:{os.getpid()}"
    stamp = lambda d: f"{d}T00:00:00Z"  # noqa: E731
    end = lambda d: f"{date.fromisoformat(d) + timedelta(days=1)}T00:00:00Z"  # noqa: E731
    loaded = 0
    _conn.execute("BEGIN IMMEDIATE")
    run_ref, run_id = _claim(stamp(days[0]), end(days[0]), worker)
    _conn.execute("COMMIT")
    for i, day in enumerate(days):
        if "probe" not in _skip:
            _conn.execute(HOLDS, (SOURCE, EXPORT, stamp(day))).fetchone()
        with open(os.path.join(folder, "data", day, "orders.csv"), newline="") as f:
            reader = csv.reader(f)
            next(reader)
            rows = []
            for record in reader:
                raw = "\x1f".join(record).encode()
                rows.append(tuple(None if v == "" else v for v in record)
                            + (SOURCE, EXPORT, stamp(day), run_id, hashlib.md5(raw + b"t").hexdigest(),
                               hashlib.md5(raw).hexdigest()))
        if i % _group == 0:
            _conn.execute("BEGIN IMMEDIATE")
        if "fence" not in _skip:
            _conn.execute(FENCE, (run_ref, 1))
        _conn.executemany(ROWS, rows)
        counts = (len(rows), len(rows), 0, 0, 0, 0, 0, None)
        result = f'{{"pipeline":"{PIPELINE}","period_start":"{stamp(day)}","attempts":1,"rows_read":{len(rows)}}}'
        _conn.execute(RUN_DONE, (result,) + counts + (run_ref,)).fetchone()
        if "attempts" not in _skip:
            _conn.execute(ATTEMPT_DONE, ("done",) + counts + (None, None, run_ref, 1))
        if i + 1 < len(days):
            run_ref, run_id = _claim(stamp(days[i + 1]), end(days[i + 1]), worker)
        if i % _group == _group - 1 or i + 1 == len(days):
            _conn.execute("COMMIT")
        loaded += len(rows)
    return loaded


def floor(bench, folder, db, days, workers, skip, group):
    """The floor on `days` into `db` (tidemark's schema): seconds."""
    names = [d.isoformat() for d in days]
    shares = [(folder, names[i::workers]) for i in range(workers)]
    with multiprocessing.Pool(workers, initializer=_connect, initargs=(db, skip, group)) as pool:
        pool.map(int, range(workers))  # every worker connected before the clock starts
        bench.settle()
        start = time.perf_counter()
        rows = sum(pool.map(_worker, shares, chunksize=1))
        secs = time.perf_counter() - start
    assert rows == 5 * len(days), f"the floor loaded {rows} rows, expected {5 * len(days)}"
    import sqlite3
    c = sqlite3.connect(db)
    done = c.execute("SELECT count(*) FROM _tm_runs WHERE status = 'done'").fetchone()[0]
    stored = c.execute("SELECT count(*) FROM orders").fetchone()[0]
    c.close()
    assert (done, stored) == (len(days), 5 * len(days)), f"the floor's ledger: {done} done, {stored} rows"
    return secs


SKIPPABLE_INDEXES = ("_tm_runs_metrics", "_tm_runs_open", "_tm_runs_running", "_tm_attempts_finished")


def schema_db(bench, folder, path, skip=frozenset()):
    """A database with tidemark's ledger and table, and nothing in them:
    `migrate`, one period loaded by tidemark (which creates its table),
    then emptied."""
    for f in (path, path + "-wal", path + "-shm"):
        if os.path.exists(f):
            os.remove(f)
    url = f"sqlite://{path}"
    toml = os.path.join(folder, "bench.toml")
    subprocess.run([bench.BIN, "--database-url", url, "migrate"], check=True, capture_output=True)
    subprocess.run([bench.BIN, "--database-url", url, "run", toml, "--period", "2019-12-31"],
                   capture_output=True, cwd=folder)
    import sqlite3
    c = sqlite3.connect(path, isolation_level=None)
    for table in ("orders", "_tm_attempts", "_tm_runs", "_tm_notices"):
        c.execute(f"DELETE FROM {table}")
    if "indexes" in skip:
        for index in SKIPPABLE_INDEXES:
            c.execute(f"DROP INDEX {index}")
    c.execute("VACUUM")
    c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="500 periods, one round")
    ap.add_argument("--periods", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--skip", default="", help="comma-separated: attempts, indexes, fence, probe (the floor only)")
    ap.add_argument("--group", type=int, default=1, help="periods per commit (the floor only; default 1)")
    args = ap.parse_args()
    skip = frozenset(filter(None, args.skip.split(",")))
    unknown = skip - {"attempts", "indexes", "fence", "probe"}
    if unknown or args.group < 1:
        sys.exit(f"--skip takes attempts, indexes, fence, probe (not {', '.join(sorted(unknown))}); --group >= 1")
    periods = args.periods or (500 if args.quick else 2_000)
    rounds = args.rounds or (1 if args.quick else 3)
    bench = bench_module()
    folder = os.path.join(ROOT, "bench", "data-floor")
    shutil.rmtree(folder, ignore_errors=True)
    rng = random.Random(3)
    days = [date(2020, 1, 1) + timedelta(days=i) for i in range(periods)]
    for i, day in enumerate(days):
        bench.write_day(folder, day, [bench.gen_row(rng, f"S-{i:05d}-{n}", day) for n in range(5)])
    bench.write_day(folder, date(2019, 12, 31), [bench.gen_row(rng, "S-first", date(2019, 12, 31))])
    with open(os.path.join(folder, "bench.toml"), "w") as f:
        f.write(bench.PIPELINE.format(granularity="day", batch_size=10_000))
    workers = bench.default_concurrency("sqlite")
    db = os.path.join(folder, "tidemark.db")
    runs = []
    for r in range(rounds):
        _, url, _ = bench.fresh_target(folder, "sqlite")
        pattern = bench.handwritten(folder, url, days, workers)
        schema_db(bench, folder, db, skip)
        floor_secs = floor(bench, folder, db, days, workers, skip, args.group)
        schema_db(bench, folder, db)
        tidemark_secs, _ = bench.tidemark(folder, f"sqlite://{db}", days, False, None)
        runs.append((pattern, floor_secs, tidemark_secs))
        print(f"round {r + 1}: pattern {pattern:.2f} s, floor {floor_secs:.2f} s, tidemark {tidemark_secs:.2f} s",
              flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    pattern, floor_secs, tidemark_secs = (statistics.median(x) for x in zip(*runs))
    shape = (f", the floor skipping {', '.join(sorted(skip))}" if skip else "") + \
        (f", the floor committing every {args.group} periods" if args.group > 1 else "")
    print(f"\n== sqlite: {periods:,} periods of 5 rows, {workers} workers, median of {rounds}{shape} ==")
    print(f"the floor (tidemark's SQL in Python) / the hand-written pattern: {pattern / floor_secs:.2f}x")
    print(f"tidemark at defaults / the hand-written pattern: {pattern / tidemark_secs:.2f}x")
    print(f"tidemark at defaults / the floor: {floor_secs / tidemark_secs:.2f}x")


if __name__ == "__main__":
    main()
