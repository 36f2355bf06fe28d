#!/usr/bin/env python3
"""tidemark load benchmark: rows/s against a COPY / sqlite3 .import baseline
measured in the same run, rows actually written, and peak RSS, with
tidemark at its default settings and, for comparison, at --concurrency 2.

    python3 bench/bench.py                  # everything below, about 12 minutes on 2 cores
    python3 bench/bench.py --quick          # the same cases, small (about 2 minutes)
    python3 bench/bench.py --only days --repeat 3    # one case, medians of 3

Cases (--only days|period|small, default all):
  days    1,000,000 order rows over 20 daily files (the original case)
  period  one period of 4,000,000 rows, generated on the fly (not kept):
          first load, mutated re-sync, unchanged re-sync, peak RSS of each,
          and the unchanged re-sync's speed-up over the first load
          (importable: period_speedups(quick, backends))
  small   2,000 periods of 5 rows (day files): periods per second, against
          the hand-written pattern (bench/handwritten.py: claim + commit,
          upsert + done + commit, per period) at tidemark's default
          concurrency, in the same run; prints tidemark's ratio to it

Needs: a release build (`cargo build --release`), psql and sqlite3 on PATH,
GNU time at /usr/bin/time, psycopg 3 for the hand-written baseline
(`pip install "psycopg[binary]"`), and PostgreSQL at TIDEMARK_TEST_DATABASE_URL
(default postgres://postgres@127.0.0.1:5432/postgres). Each PostgreSQL
scenario runs in a fresh database that is dropped afterwards.

Steps of the days and period cases, on PostgreSQL:
  1. baseline: COPY of all files into an empty table with the same primary key
     (and, for the days case, COPY of the same rows with tidemark's six lineage
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
# TIDEMARK_BENCH_BIN compares another build (an A/B of two commits) on the
# same data; the default is this checkout's release build.
BIN = os.environ.get("TIDEMARK_BENCH_BIN") or os.path.join(ROOT, "target", "release", "tidemark")
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


# tidemark's settings each case runs with: its defaults (what a user who
# types the README's command gets), and --concurrency 2 for comparison.
SETTINGS = [("defaults", None), ("--concurrency 2", 2)]


def tidemark(folder, url, days, force, concurrency):
    cmd = [BIN, "--database-url", url, "backfill", os.path.join(folder, "bench.toml"),
           "--from", days[0].isoformat(), "--to", days[-1].isoformat()]
    if concurrency:
        cmd += ["--concurrency", str(concurrency)]
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


def fresh_target(folder, backend):
    """An empty destination: (pg database name or None, url, sqlite file)."""
    db = f"{folder}/tidemark.db"
    for f in (db, db + "-wal", db + "-shm"):
        if os.path.exists(f):
            os.remove(f)
    if backend == "postgres":
        name, url = fresh_pg()
        return name, url, db
    return None, f"sqlite://{db}", db


def tidemark_steps(folder, days, backend, concurrency, restore, mutate_files):
    """First backfill, mutated re-sync, unchanged re-sync into a fresh
    database: {step: (seconds, rss)} and {step: rows written}."""
    restore()
    name, url, db = fresh_target(folder, backend)
    snapshot = (lambda: pg_writes(url)) if name else (lambda: sqlite_state(db))
    results, writes = {}, {}
    try:
        before = (0, 0, 0) if name else (0, "")
        for step, force, prepare in [("first", False, None), ("mutated", True, mutate_files),
                                     ("unchanged", True, None)]:
            if prepare:
                prepare()
            results[step] = tidemark(folder, url, days, force, concurrency)
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


def days_scenario(folder, total, periods, batch_size, backend):
    """The days case, one repeat: baselines, then tidemark at each setting."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    data = generate(folder, total, periods, "day", batch_size)
    days = sorted(data)
    results = {}
    if backend == "postgres":
        results["baseline"] = (pg_baseline(folder, days, total), None)
        results["shape"] = (pg_baseline(folder, days, total, shape=True), None)
    else:
        results["baseline"] = (sqlite_baseline(folder, days, total), None)
        results["shape"] = (sqlite_baseline(folder, days, total, shape=True), None)
    writes = {}

    def restore():
        for day, rows in data.items():
            write_day(folder, day, rows)

    for label, concurrency in SETTINGS:
        steps, written = tidemark_steps(folder, days, backend, concurrency, restore,
                                        lambda: mutate(folder, data))
        for step, value in steps.items():
            results[(label, step)] = value
            writes[(label, step)] = written[step]
    return results, writes


STEP_LABELS = {"first": "first backfill", "mutated": "re-sync, 10%/2%/2% changed",
               "unchanged": "re-sync, unchanged"}


def report(title, runs, total, baseline_name, settings, shape=True):
    print(f"\n== {title}: {total:,} rows, median of {len(runs)} run(s) ==")
    med = {step: statistics.median(r[0][step][0] for r in runs) for step in runs[0][0]}
    spread = {step: (min(r[0][step][0] for r in runs), max(r[0][step][0] for r in runs)) for step in runs[0][0]}
    base = total / med["baseline"]
    print(f"{'step':<56} {'seconds':>8} {'rows/s':>10} {'x baseline':>10} {'peak RSS':>10}  rows written")

    def line(label, key):
        secs = med[key]
        rss = max((r[0][key][1] or 0) for r in runs)
        written = runs[-1][1].get(key, "")
        lo, hi = spread[key]
        noise = f" ({lo:.2f}-{hi:.2f})" if len(runs) > 1 else ""
        print(f"{label:<56} {secs:>8.2f} {total / secs:>10,.0f} {total / secs / base:>10.2f} "
              f"{(f'{rss:.0f} MiB' if rss else '-'):>10}  {written}{noise}")

    line(baseline_name, "baseline")
    if shape:
        line("  same, into tidemark's table shape", "shape")
    for label, _ in settings:
        for step, name in STEP_LABELS.items():
            line(f"tidemark {name} [{label}]", (label, step))
        first, unchanged = med[(label, "first")], med[(label, "unchanged")]
        print(f"  [{label}] unchanged re-sync vs first backfill: {first / unchanged:.2f}x faster"
              + (f"; first backfill vs the baseline tool on tidemark's table shape: {med['shape'] / first:.2f}x"
                 if shape else ""))


# The one-period case streams its rows: millions of them do not fit in
# this script's memory, and the mutated version is the same rows with the
# same mutation rule as mutate(), generated again rather than read back.
NOTES = "abcdefghijklmnopqrstuvwxyz " * 4


def write_period(path, rows, mutated):
    rng = random.Random(42)
    change = random.Random(7)
    statuses = ("new", "paid", "shipped", "cancelled")
    with open(path, "w", buffering=1 << 20) as f:
        f.write(COLUMNS + "\n")
        out = []

        def emit(key, x):
            t = x % 86400
            u = (t + (x >> 20) % 3600) % 86400
            amount = ((x >> 24) % 9999900 + 100) / 100
            status = statuses[(x >> 40) & 3]
            if mutated and change.random() < 0.10 / 0.98:
                amount, status = ((x >> 44) % 9999900 + 100) / 100, "refunded"
            o = (x >> 30) % 60
            out.append(f"{key},{(x >> 8) % 50 + 1},customer-{(x >> 12) % 5000 + 1:05d},{amount:.2f},{status},"
                       f"2024-01-01T{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}Z,"
                       f"2024-01-01T{u // 3600:02d}:{u // 60 % 60:02d}:{u % 60:02d}Z,{NOTES[o:o + 40]}\n")
            if len(out) >= 20000:
                f.write("".join(out))
                out.clear()

        for n in range(rows):
            x = rng.getrandbits(64)
            if mutated and x % 50 == 7:
                continue  # 2% deleted
            emit(f"ORD-{n:09d}", x)
        if mutated:
            for n in range(rows // 50):
                emit(f"NEW-{n:09d}", rng.getrandbits(64))  # 2% added
        f.write("".join(out))


def period_files(folder, rows, batch_size):
    """Writes the period's export in both versions once (for every
    backend); the pipeline reads whichever `orders.csv` links to."""
    shutil.rmtree(folder, ignore_errors=True)
    day = date(2024, 1, 1)
    os.makedirs(os.path.join(folder, "data", day.isoformat()))
    with open(os.path.join(folder, "bench.toml"), "w") as f:
        f.write(PIPELINE.format(granularity="day", batch_size=batch_size))
    versions = [os.path.join(folder, f"orders.v{v}.csv") for v in (1, 2)]
    for path, mutated in zip(versions, (False, True)):
        write_period(path, rows, mutated)
    return day, versions


def use_version(folder, day, version):
    link = os.path.join(folder, "data", day.isoformat(), "orders.csv")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(version, link)


def period_scenario(folder, rows, backend, day, versions):
    """One period of `rows` rows: baseline, then tidemark at its defaults."""
    use_version(folder, day, versions[0])
    results = {"baseline": ((pg_baseline if backend == "postgres" else sqlite_baseline)(folder, [day], rows), None)}
    steps, written = tidemark_steps(folder, [day], backend, None,
                                    lambda: use_version(folder, day, versions[0]),
                                    lambda: use_version(folder, day, versions[1]))
    writes = {}
    for step, value in steps.items():
        results[("defaults", step)] = value
        writes[("defaults", step)] = written[step]
    return results, writes


def period_speedups(quick, backends, rows=None, folder=None, batch_size=10_000, runs=None):
    """The one-period case on each backend: {backend: (first load seconds,
    unchanged re-sync seconds, speed-up, peak RSS MiB of tidemark's steps)},
    from one run each (4,000,000 rows, or 1,000,000 with `quick`). `runs`,
    if given, receives each backend's full results for report()."""
    rows = rows or (1_000_000 if quick else 4_000_000)
    folder = folder or os.path.join(ROOT, "bench", "data-period")
    # Two versions of the export, the baseline's table, then tidemark's
    # table and WAL: about 1.1 KB of disk a row at the peak. A full disk
    # takes PostgreSQL down for everyone on the machine: refuse first.
    need = rows * 1100
    free = shutil.disk_usage(os.path.dirname(folder)).free
    if free < need:
        sys.exit(f"the one-period case of {rows:,} rows needs about {need / 2**30:.1f} GiB of free disk, "
                 f"{free / 2**30:.1f} GiB are free: pass --period-rows N or free some space")
    speedups = {}
    try:
        day, versions = period_files(folder, rows, batch_size)
        for backend in backends:
            results, writes = period_scenario(folder, rows, backend, day, versions)
            first = results[("defaults", "first")][0]
            unchanged = results[("defaults", "unchanged")][0]
            rss = max(value[1] for key, value in results.items() if key != "baseline")
            speedups[backend] = (first, unchanged, first / unchanged, rss)
            if runs is not None:
                runs[backend] = (results, writes)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return speedups


def load_module(name):
    """bench/<name>.py as a module, without putting bench/ on sys.path
    (bench/queue.py would shadow the standard library's `queue`)."""
    import importlib.util
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the worker processes find its functions by name
    spec.loader.exec_module(module)
    return module


def default_concurrency(backend):
    """tidemark's default periods at once (crates/cli/cli.rs `concurrency`),
    which the hand-written baseline gets as its pool size."""
    cores = os.cpu_count() or 2
    return min(max(cores, 2), 4) if backend == "sqlite" else min(max(2 * cores, 2), 8)


def handwritten(folder, url, days, workers):
    """The hand-written pattern (bench/handwritten.py) on the same files:
    seconds for all periods, checked for every row loaded."""
    hw = load_module("handwritten")
    settle()
    secs, rows = hw.run(folder, url, days[0], days[-1], workers)
    assert rows == 5 * len(days), f"the hand-written pattern loaded {rows} rows, expected {5 * len(days)}"
    return secs


def small_scenario(folder, periods, backend):
    """`periods` day files of 5 rows: the hand-written pattern at tidemark's
    default concurrency, then a first backfill per setting."""
    shutil.rmtree(folder, ignore_errors=True)
    rng = random.Random(3)
    days = [date(2020, 1, 1) + timedelta(days=i) for i in range(periods)]
    for i, day in enumerate(days):
        write_day(folder, day, [gen_row(rng, f"S-{i:05d}-{n}", day) for n in range(5)])
    with open(os.path.join(folder, "bench.toml"), "w") as f:
        f.write(PIPELINE.format(granularity="day", batch_size=10_000))
    results = {}
    name, url, _ = fresh_target(folder, backend)
    try:
        results["handwritten"] = (handwritten(folder, url, days, default_concurrency(backend)), None)
    finally:
        if name:
            drop_pg(name)
    for label, concurrency in SETTINGS:
        name, url, _ = fresh_target(folder, backend)
        try:
            # The ledger exists before the clock starts, as the baseline's
            # tables do: a scheduled sync finds it in place.
            subprocess.run([BIN, "--database-url", url, "migrate"], check=True, capture_output=True)
            results[label] = tidemark(folder, url, days, False, concurrency)
        finally:
            if name:
                drop_pg(name)
    shutil.rmtree(folder, ignore_errors=True)
    return results


def small_report(backend, periods, runs):
    """Prints the small case; returns tidemark's ratio to the hand-written
    pattern at defaults (periods/s over periods/s, medians)."""
    print(f"\n== {backend}: {periods:,} periods of 5 rows, first backfill, median of {len(runs)} ==")
    base = statistics.median(r["handwritten"][0] for r in runs)
    print(f"hand-written pattern [{default_concurrency(backend)} workers]: {base:.2f} s, "
          f"{periods / base:,.0f} periods/s")
    ratios = {}
    for label, _ in SETTINGS:
        secs = statistics.median(r[label][0] for r in runs)
        rss = max(r[label][1] for r in runs)
        ratios[label] = base / secs
        print(f"tidemark [{label}]: {secs:.2f} s, {periods / secs:,.0f} periods/s, peak RSS {rss:.0f} MiB, "
              f"{base / secs:.2f}x the hand-written pattern")
    return ratios["defaults"]


def small_ratios(quick=False, backends=("postgres", "sqlite"), repeat=1, folder=None):
    """{backend: tidemark's periods/s at defaults over the hand-written
    pattern's}, for a caller such as bench/scale.py."""
    periods = 500 if quick else 2_000
    folder = folder or os.path.join(ROOT, "bench", "data-small")
    return {backend: small_report(backend, periods, [small_scenario(folder, periods, backend)
                                                     for _ in range(repeat)])
            for backend in backends}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="small sizes for development: 200,000 rows over 20 days, one period of 1,000,000, 500 small periods")
    ap.add_argument("--only", choices=["days", "period", "small"], action="append",
                    help="run only these cases (repeatable; default all)")
    ap.add_argument("--rows", type=int, help="rows of the days case (default 1,000,000)")
    ap.add_argument("--periods", type=int, default=20)
    ap.add_argument("--period-rows", type=int, help="rows of the one-period case (default 4,000,000)")
    ap.add_argument("--small-periods", type=int, help="periods of the small case (default 2,000)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the days and small cases (medians)")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench", "data"))
    args = ap.parse_args()
    rows = args.rows or (200_000 if args.quick else 1_000_000)
    period_rows = args.period_rows or (1_000_000 if args.quick else 4_000_000)
    small = args.small_periods or (500 if args.quick else 2_000)
    cases = args.only or ["days", "period", "small"]
    if not os.path.exists(BIN):
        sys.exit("build first: cargo build --release")
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    started = time.perf_counter()
    baseline = {"postgres": "COPY baseline (psql \\copy)", "sqlite": "sqlite3 .import baseline"}
    period_runs, speedups = {}, {}
    if "period" in cases:
        speedups = period_speedups(args.quick, backends, period_rows, args.dir + "-period",
                                   args.batch_size, period_runs)
    for backend in backends:
        if "days" in cases:
            runs = [days_scenario(args.dir, rows, args.periods, args.batch_size, backend)
                    for _ in range(args.repeat)]
            report(f"{backend}, {args.periods} daily periods", runs, rows, baseline[backend], SETTINGS)
        if "period" in cases:
            report(f"{backend}, one period", [period_runs[backend]], period_rows, baseline[backend],
                   SETTINGS[:1], shape=False)
            first, unchanged, speedup, rss = speedups[backend]
            print(f"{backend}: unchanged re-sync vs first load: {speedup:.2f}x "
                  f"({first:.2f} s / {unchanged:.2f} s, peak RSS {rss:.0f} MiB)")
        if "small" in cases:
            small_report(backend, small, [small_scenario(args.dir, small, backend) for _ in range(args.repeat)])
    print(f"\n(bench took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
