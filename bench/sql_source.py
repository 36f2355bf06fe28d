#!/usr/bin/env python3
"""Databases as sources (issue 22): tidemark reading a PostgreSQL table by
daily windows, against the physical pipe and two peers, in one run.

    python3 bench/sql_source.py                # 1,000,000 rows over 20 days (about 10 minutes on 2 cores)
    python3 bench/sql_source.py --quick        # 100,000 rows, the same steps
    python3 bench/sql_source.py --only big     # one period of 5,000,000 rows: peak RSS
    python3 bench/sql_source.py --no-peers     # tidemark and the pipe only
    python3 bench/sql_source.py --no-peers --repeat 3   # medians of 3 rounds, each round's ratios

Every figure is a ratio to the pipe measured in the same run (rows/s are
this machine's disk, not tidemark's):

  pipe      `psql -c "\\copy (select ...) to stdout" | psql -c "\\copy orders from stdin"`
            into an empty table keyed like tidemark's (PostgreSQL), and the
            same stream into `sqlite3 .import` (SQLite): the physical floor;
            on PostgreSQL also into tidemark's table shape (its lineage
            columns, raw-record hash and run-key index), what the
            destination costs alone
  tidemark  `backfill` of the 20 days at default settings, then a forced
            re-sync of the unchanged source (rows written must be 0)
  sling     `sling run --mode incremental --primary-key id` (PyPI
            `sling-linux-amd64`; SLING_BINARY may name another binary)
  dlt       `sql_table` (its default SQLAlchemy backend) with
            `write_disposition = "merge"` on `id` (PyPI `dlt`, `sqlalchemy`,
            `psycopg2-binary`)

A peer that is not installed, or fails, is reported as such and the rest
runs. Needs a release build (`cargo build --release`), psql and sqlite3 on
PATH, GNU time at /usr/bin/time, and PostgreSQL at TIDEMARK_TEST_DATABASE_URL
(default postgres://postgres@127.0.0.1:5432/postgres); every database it
creates is dropped afterwards.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TIDEMARK_BENCH_BIN compares another build on the same data.
BIN = os.environ.get("TIDEMARK_BENCH_BIN") or os.path.join(ROOT, "target", "release", "tidemark")
PG_URL = os.environ.get("TIDEMARK_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
DAYS = 20
FIRST_DAY = "2026-01-01"
COLUMNS = "id, customer, total, status, created_at, note"

# The source table: what an application database holds. Rows are spread
# evenly over the days, ids in creation order.
SOURCE_TABLE = """
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer text NOT NULL,
    total numeric(12, 2) NOT NULL,
    status text NOT NULL,
    created_at timestamptz NOT NULL,
    note text
);
INSERT INTO orders
SELECT g,
       'customer-' || (g % 5000),
       round((g % 100000) / 7.0, 2),
       (ARRAY['new', 'paid', 'shipped', 'cancelled'])[1 + g % 4],
       timestamptz '{first} 00:00:00+00' + (g - 1) * (interval '{days} days' / {rows}),
       CASE WHEN g % 3 = 0 THEN NULL ELSE 'note ' || md5(g::text) END
FROM generate_series(1, {rows}) AS g;
CREATE INDEX orders_created_at_id ON orders (created_at, id);
ANALYZE orders;
"""

PIPE_PG_TABLE = ("CREATE TABLE orders (id bigint PRIMARY KEY, customer text, total numeric(12, 2), status text, "
                 "created_at timestamptz, note text)")
PIPE_SQLITE_TABLE = ("PRAGMA journal_mode=WAL; CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, "
                     "total TEXT, status TEXT, created_at TEXT, note TEXT);")

PIPELINE = """
name = "bench_sql"
export_type = "orders_daily"

[period]
granularity = "{granularity}"
timezone = "UTC"

[[sources]]
id = "shop_db"
transport = "sql"
url = "${{BENCH_SOURCE_URL}}"
query = \"\"\"
select id, customer, total, status, created_at, note
from orders
where created_at >= :period_start and created_at < :period_end
\"\"\"
resume_key = ["created_at", "id"]
time_columns = {{ created_at = "instant" }}

[fields]
id         = {{ type = "int", required = true }}
customer   = {{ type = "text" }}
total      = {{ type = "decimal" }}
status     = {{ type = "text" }}
created_at = {{ type = "timestamptz" }}
note       = {{ type = "text" }}

[load]
table = "orders"
key = ["id"]
on_missing = "delete"
"""

DLT_SCRIPT = """
import sys, dlt
from dlt.sources.sql_database import sql_table
source_url, destination, target, workdir = sys.argv[1:5]
table = sql_table(credentials=source_url, table="orders")
table.apply_hints(primary_key="id", write_disposition="merge")
if destination == "postgres":
    dest, dataset = dlt.destinations.postgres(target), "bench"
else:
    # SQLite: another dataset than "main" would be a separate, attached file.
    dest, dataset = dlt.destinations.sqlalchemy(target), "main"
pipeline = dlt.pipeline(pipeline_name="bench_sql", destination=dest, dataset_name=dataset,
                        pipelines_dir=workdir)
info = pipeline.run(table)
print(info)
"""


def psql(url, sql):
    out = subprocess.run(["psql", url, "-qAtX", "-v", "ON_ERROR_STOP=1", "-c", sql], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"psql failed: {sql[:200]}\n{out.stderr}")
    return out.stdout.strip()


def fresh_pg(prefix):
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    psql(PG_URL, f"CREATE DATABASE {name}")
    return name, PG_URL.rsplit("/", 1)[0] + "/" + name


def drop_pg(name):
    psql(PG_URL, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def settle():
    """Each timed step starts with the previous step's pages written out."""
    subprocess.run(["psql", PG_URL, "-qAtX", "-c", "CHECKPOINT"], capture_output=True)
    os.sync()


def timed(cmd, env=None, cwd=None, shell=False):
    """Runs cmd under GNU time: (seconds, peak RSS in MiB, stdout), or None
    with the error printed when it fails."""
    settle()
    start = time.perf_counter()
    wrapped = ["/usr/bin/time", "-f", "%M", "-o", "/tmp/tm_bench_rss"] + (["bash", "-c", cmd] if shell else cmd)
    proc = subprocess.run(wrapped, capture_output=True, text=True, env=env, cwd=cwd)
    secs = time.perf_counter() - start
    if proc.returncode != 0:
        print(f"  failed ({proc.returncode}): {(cmd if shell else ' '.join(cmd))[:160]}\n"
              f"  {proc.stderr.strip()[-1500:]}", file=sys.stderr)
        return None
    with open("/tmp/tm_bench_rss") as f:
        rss = int(f.read().split()[-1]) / 1024
    return secs, rss, proc.stdout


def pg_count(url, table="orders"):
    return int(psql(url, f"SELECT count(*) FROM {table}"))


def sqlite_count(db, table="orders"):
    out = subprocess.run(["sqlite3", db, f"SELECT count(*) FROM {table}"], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def pg_writes(url, table="orders"):
    """Rows inserted, updated and deleted in `table` so far (the statistics
    collector's counters, flushed after a short wait)."""
    time.sleep(1.2)
    row = psql(url, "SELECT coalesce(sum(n_tup_ins),0) + coalesce(sum(n_tup_upd),0) + coalesce(sum(n_tup_del),0) "
                    f"FROM pg_stat_user_tables WHERE relname = '{table}'")
    return int(row or 0)


def sqlite_changes(db):
    """Rows whose _tm_loaded_at changed plus the row count: a cheap
    fingerprint of what a re-sync wrote."""
    out = subprocess.run(["sqlite3", db, "SELECT count(*) || '|' || coalesce(max(_tm_loaded_at), '') FROM orders"],
                         capture_output=True, text=True)
    return out.stdout.strip()


def make_source(rows, days):
    name, url = fresh_pg("tm_srcbench")
    print(f"source: {rows:,} rows over {days} day(s) in {name} ...", flush=True)
    psql(url, SOURCE_TABLE.format(first=FIRST_DAY, days=days, rows=rows))
    return name, url


# tidemark's own table shape: the six lineage columns (NOT NULL, as it
# creates them), the raw-record hash and its index on the run key, filled by
# the source's SELECT with what tidemark would write (the hashes as 32 hex
# digits, a run id of 26 characters). The pipe into it shows what the
# destination's shape costs on its own, apart from tidemark.
SHAPED_PG_TABLE = (
    "CREATE TABLE orders (id bigint, customer text, total numeric(12, 2), status text, created_at timestamptz, "
    "note text, _tm_source text NOT NULL, _tm_export_type text NOT NULL, _tm_period_start timestamptz NOT NULL, "
    "_tm_run_id text NOT NULL, _tm_row_hash text NOT NULL, _tm_loaded_at timestamptz NOT NULL, _tm_raw_hash text, "
    "UNIQUE (id)); "
    "CREATE INDEX orders_run_key ON orders (_tm_source, _tm_export_type, _tm_period_start)")
SHAPED_COLUMNS = (COLUMNS + ", 'shop_db', 'orders_daily', date_trunc('day', created_at), "
                  "'01JBENCHRUNID0000000000000', md5(id::text || customer || total::text), now(), "
                  "md5(customer || id::text)")


def pipe_pg(source_url, rows, table=PIPE_PG_TABLE, columns=COLUMNS):
    name, url = fresh_pg("tm_pipebench")
    try:
        psql(url, table)
        cmd = (f"psql '{source_url}' -qX -c \"\\copy (select {columns} from orders) to stdout\" | "
               f"psql '{url}' -qX -v ON_ERROR_STOP=1 -c \"\\copy orders from stdin\"")
        result = timed(cmd, shell=True)
        assert result and pg_count(url) == rows, "the pipe into PostgreSQL did not load every row"
        return result[0]
    finally:
        drop_pg(name)


def pipe_sqlite(source_url, rows, work):
    db = os.path.join(work, "pipe.db")
    subprocess.run(["sqlite3", db, PIPE_SQLITE_TABLE], check=True, capture_output=True)
    cmd = (f"psql '{source_url}' -qX -c \"\\copy (select {COLUMNS} from orders) to stdout with (format csv)\" | "
           f"sqlite3 '{db}' '.import --csv /dev/stdin orders'")
    result = timed(cmd, shell=True)
    assert result and sqlite_count(db) == rows, "the pipe into SQLite did not load every row"
    os.remove(db)
    return result[0]


def tidemark_run(work, target, source_url, days, force):
    cmd = [BIN, "--database-url", target, "backfill", os.path.join(work, "bench.toml"),
           "--from", FIRST_DAY, "--to", day_after(FIRST_DAY, days - 1)]
    if force:
        cmd.append("--force")
    env = dict(os.environ, TIDEMARK_LOG="warn", BENCH_SOURCE_URL=source_url)
    result = timed(cmd, env=env, cwd=work)
    if result is None:
        sys.exit("tidemark failed; see above")
    return result[0], result[1]


def day_after(first, n):
    import datetime
    return (datetime.date.fromisoformat(first) + datetime.timedelta(days=n)).isoformat()


def tidemark_case(work, backend, source_url, rows, days, granularity="day"):
    """First load then unchanged re-sync: (first s, first RSS, re-sync s,
    re-sync RSS, rows the re-sync wrote)."""
    with open(os.path.join(work, "bench.toml"), "w") as f:
        f.write(PIPELINE.format(granularity=granularity))
    if backend == "postgres":
        name, target = fresh_pg("tm_dstbench")
    else:
        db = os.path.join(work, "tidemark.db")
        target = f"sqlite://{db}"
    try:
        first, first_rss = tidemark_run(work, target, source_url, days, force=False)
        if backend == "postgres":
            loaded, before = pg_count(target), pg_writes(target)
        else:
            loaded, before = sqlite_count(db), sqlite_changes(db)
        assert loaded == rows, f"tidemark loaded {loaded} rows into {backend}, expected {rows}"
        again, again_rss = tidemark_run(work, target, source_url, days, force=True)
        if backend == "postgres":
            written = pg_writes(target) - before
        else:
            written = 0 if sqlite_changes(db) == before else "some"
        return first, first_rss, again, again_rss, written
    finally:
        if backend == "postgres":
            drop_pg(name)
        else:
            for path in glob.glob(os.path.join(work, "tidemark.db*")):
                os.remove(path)


def sling_binary():
    if os.environ.get("SLING_BINARY"):
        return os.environ["SLING_BINARY"]
    try:
        import sling_linux_amd64  # noqa: F401  (the binary ships inside the wheel)
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(sling_linux_amd64.__file__), "bin", "sling-linux-amd64")
    return path if os.access(path, os.X_OK) else None


def sling_case(work, backend, source_url, rows):
    binary = sling_binary()
    if binary is None:
        return "not installed (pip install sling-linux-amd64)"
    if backend == "postgres":
        name, target = fresh_pg("tm_slingbench")
        obj = "public.orders"
    else:
        db = os.path.join(work, "sling.db")
        target, obj = f"sqlite://{db}", "main.orders"
    env = dict(os.environ, SLING_HOME_DIR=os.path.join(work, "sling-home"), SLING_DISABLE_TELEMETRY="true",
               DO_NOT_TRACK="1")
    try:
        cmd = [binary, "run", "--src-conn", source_url, "--src-stream", f"select {COLUMNS} from orders",
               "--tgt-conn", target, "--tgt-object", obj, "--mode", "incremental", "--primary-key", "id"]
        result = timed(cmd, env=env, cwd=work)
        if result is None:
            return "failed (see above)"
        count = pg_count(target) if backend == "postgres" else sqlite_count(db, "orders")
        if count != rows:
            return f"loaded {count} rows, expected {rows}"
        return result[0], result[1]
    finally:
        if backend == "postgres":
            drop_pg(name)
        else:
            for path in glob.glob(os.path.join(work, "sling.db*")):
                os.remove(path)


def dlt_case(work, backend, source_url, rows):
    try:
        import dlt  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        return "not installed (pip install dlt sqlalchemy psycopg2-binary)"
    script = os.path.join(work, "dlt_run.py")
    with open(script, "w") as f:
        f.write(DLT_SCRIPT)
    dlt_dir = os.path.join(work, "dlt")
    shutil.rmtree(dlt_dir, ignore_errors=True)
    if backend == "postgres":
        name, target = fresh_pg("tm_dltbench")
        # dlt insists on a password; the test server's trust auth ignores it.
        target = target.replace("postgres://postgres@", "postgresql://postgres:unused@", 1)
    else:
        db = os.path.join(work, "dlt.db")
        target = f"sqlite:///{db}"
    env = dict(os.environ, RUNTIME__LOG_LEVEL="WARNING", RUNTIME__DLTHUB_TELEMETRY="false")
    try:
        # SQLAlchemy knows PostgreSQL only as postgresql://.
        alchemy = source_url.replace("postgres://", "postgresql://", 1)
        result = timed([sys.executable, script, alchemy, backend, target, dlt_dir], env=env, cwd=work)
        if result is None:
            return "failed (see above)"
        if backend == "postgres":
            count = pg_count(target, "bench.orders")
        else:
            count = sqlite_count(db)
        if count != rows:
            return f"loaded {count} rows, expected {rows}"
        return result[0], result[1]
    finally:
        if backend == "postgres":
            drop_pg(name)
        else:
            for path in glob.glob(os.path.join(work, "dlt*.db*")):
                os.remove(path)


def line(name, secs, rss, pipe, rows):
    return f"  {name:<34} {secs:8.2f} s  {rows / secs:>10,.0f} rows/s  {pipe / secs:5.2f}x pipe  peak RSS {rss:6.1f} MiB"


def days_case(rows, backends, peers, work, repeat=1):
    """The 20 daily periods. With `repeat` > 1 the pipe(s) and tidemark run
    that many rounds, alternating; each ratio is of its own round (the pipe
    varies by a quarter between rounds on a busy machine), the median is
    printed with every round's value, and peak RSS is the largest seen.
    The peers run once."""
    source, source_url = make_source(rows, DAYS)
    try:
        for backend in backends:
            print(f"\n{backend} destination, {rows:,} rows over {DAYS} daily periods (defaults"
                  + (f", {repeat} rounds" if repeat > 1 else "") + "):", flush=True)
            rounds = [days_round(work, backend, source_url, rows) for _ in range(repeat)]
            report_rounds(rounds, backend, rows)
            if peers:
                pipe = rounds[-1]["pipe"]
                first = rounds[-1]["first"]
                for name, case in (("sling", sling_case), ("dlt sql_table", dlt_case)):
                    result = case(work, backend, source_url, rows)
                    if isinstance(result, str):
                        print(f"  {name:<34} {result}")
                    else:
                        print(line(name, result[0], result[1], pipe, rows)
                              + f"  (tidemark's first load is {result[0] / first:.2f}x as fast)")
    finally:
        drop_pg(source)


def days_round(work, backend, source_url, rows):
    """One round: the pipe(s), then tidemark's first load and re-sync."""
    round_ = {"pipe": pipe_pg(source_url, rows) if backend == "postgres" else pipe_sqlite(source_url, rows, work)}
    first, first_rss, again, again_rss, written = tidemark_case(work, backend, source_url, rows, DAYS)
    round_.update(first=first, first_rss=first_rss, again=again, again_rss=again_rss, written=written)
    if backend == "postgres":
        round_["shaped"] = pipe_pg(source_url, rows, SHAPED_PG_TABLE, SHAPED_COLUMNS)
    return round_


def report_rounds(rounds, backend, rows):
    import statistics

    def median(key):
        return statistics.median(r[key] for r in rounds)

    def each(ratio):
        values = [ratio(r) for r in rounds]
        return "" if len(values) == 1 else "  (rounds: " + ", ".join(f"{v:.2f}x" for v in values) + ")"

    pipe = median("pipe")
    first, again = median("first"), median("again")
    first_rss = max(r["first_rss"] for r in rounds)
    again_rss = max(r["again_rss"] for r in rounds)
    print(f"  {'pipe (psql | ' + ('psql' if backend == 'postgres' else 'sqlite3') + ')':<34} {pipe:8.2f} s  "
          f"{rows / pipe:>10,.0f} rows/s  1.00x pipe")
    if backend == "postgres":
        shaped = median("shaped")
        print(f"  {'pipe into tidemark table shape':<34} {shaped:8.2f} s  {rows / shaped:>10,.0f} rows/s  "
              f"{pipe / shaped:5.2f}x pipe  (tidemark's first load is "
              f"{statistics.median(r['shaped'] / r['first'] for r in rounds):.2f}x as fast)"
              + each(lambda r: r["shaped"] / r["first"]))
    print(line("tidemark first load", first, first_rss, pipe, rows)
          + each(lambda r: r["pipe"] / r["first"]))
    written = ", ".join(str(r["written"]) for r in rounds)
    print(line("tidemark unchanged re-sync", again, again_rss, pipe, rows)
          + f"  wrote {written} rows, {statistics.median(r['first'] / r['again'] for r in rounds):.2f}x "
          "faster than the first load" + each(lambda r: r["first"] / r["again"]))


def big_case(rows, backends, work):
    """One period holding every row: the peak RSS of a large window."""
    source, source_url = make_source(rows, 1)
    try:
        for backend in backends:
            first, first_rss, again, again_rss, written = tidemark_case(work, backend, source_url, rows, 1)
            print(f"\n{backend} destination, one period of {rows:,} rows (defaults):")
            print(f"  first load {first:.1f} s, peak RSS {first_rss:.0f} MiB; unchanged re-sync {again:.1f} s, "
                  f"peak RSS {again_rss:.0f} MiB, wrote {written} rows ({first / again:.2f}x)")
    finally:
        drop_pg(source)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100,000 rows (big: 500,000)")
    parser.add_argument("--only", choices=["days", "big"], help="one case (default: days)")
    parser.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--no-peers", action="store_true", help="skip sling and dlt")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of the pipe(s) and tidemark (days case): medians and each round's ratio")
    args = parser.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"no release build at {BIN}: run `cargo build --release` first")
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    work = tempfile.mkdtemp(prefix="tm_sqlbench_")
    try:
        if args.only == "big":
            big_case(500_000 if args.quick else 5_000_000, backends, work)
        else:
            days_case(100_000 if args.quick else 1_000_000, backends, not args.no_peers, work, max(args.repeat, 1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
