#!/usr/bin/env python3
"""tidemark memory benchmark: HTTP pages within the memory budget (issue 24 item 3).

    python3 bench/memory.py            # every case at full size
    python3 bench/memory.py --quick    # the same cases, the legitimate page at 20 MiB

Needs a release build (`cargo build --release`); the destination is SQLite in a
temporary directory, the source a tiny HTTP server of this script's own
(http.server in a thread). Every case runs `tidemark run` at the default
settings (`load.memory_budget` 64 MiB) and reads the child's peak resident
memory (VmHWM from /proc, polled until it exits). Printed per case: peak RSS
in MiB, the outcome, and pass/fail against the bound of the issue (160 MiB:
the budget plus a fixed base).

Cases:
  endless-line     an endless chunked NDJSON body whose one record never ends
                   (fails at the line limit, load.memory_budget / 16)
  endless-records  an endless chunked NDJSON body of valid records (loads rows
                   until the page passes max_page_bytes, 256 MiB, then fails)
  gzip-bomb        300 MiB of zeros gzipped to a few hundred KiB
                   (Content-Encoding: gzip; fails at the line limit)
  ndjson-100MiB    a legitimate 100 MiB NDJSON page (20 MiB with --quick) of
                   200-byte records: must load every row
  file-100MiB      the same records as an NDJSON file source: the baseline
                   (no page at all); printed: the HTTP / file peak ratio
  json-4MiB        a JSON page just under its default limit (load.memory_budget
                   / 16) of small records ({"id", "pad"}: 40 bytes each), the
                   worst case for a page held whole: must load every row

    python3 bench/memory.py --bin /path/to/tidemark   # another build (before/after)

`run(quick)` returns [(case, peak_rss_mib, ok)] for a top-level bench script.
"""

import argparse
import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "tidemark")
BOUND_MIB = 160
DAY = "2024-02-01"
PAD = b"a" * 170

JSON_RECORD = b'{"id":"%d","pad":"aaaaaaaaaaaaaaaaaaaa"},'

PIPELINE = """
name = "big"
export_type = "t"

[period]
granularity = "day"

[[sources]]
id = "src"
{source}

[fields]
id = {{ type = "text", required = true }}
pad = {{ type = "text" }}

[load]
table = "big"
key = ["id"]

[retry]
max_attempts = 2
base_delay = "10ms"
"""


def record(i):
    return b'{"id":"%d","pad":"%s"}\n' % (i, PAD)


def gzip_bomb(mib):
    """`mib` MiB of zeros, gzip-compressed (a few hundred KiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(mib)]
    parts.append(packer.flush())
    return b"".join(parts)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cases = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        case = self.cases.get(self.path.split("?")[0])
        try:
            case(self)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def chunked(self, chunks):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")

    def whole(self, body, headers=()):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def endless_line(h):
    chunk = b"a" * (64 << 10)
    h.chunked(itertools.chain([b'{"id":"1","pad":"'], itertools.repeat(chunk, 1 << 16)))  # 4 GiB at most


def endless_records(h):
    lines = b"".join(record(i) for i in range(64))
    h.chunked(lines.replace(b'"id":"', b'"id":"%d-' % n) for n in range(1 << 22))


def serve(cases):
    Handler.cases = cases
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def peak_rss_kib(proc):
    peak = 0
    while proc.poll() is None:
        try:
            with open("/proc/%d/status" % proc.pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.005)
    return peak


def json_page(limit):
    """A JSON array of small records, just under `limit` bytes."""
    count = (limit - 2) // len(JSON_RECORD % 10**7)
    return b"[" + b"".join(JSON_RECORD % (10**7 + i) for i in range(count)).rstrip(b",") + b"]", count


def run_case(base, path, expect_ok, fmt="ndjson"):
    """Runs the pipeline against base+path (or, when `path` is a file, that
    file) in a fresh directory: (peak MiB, ok, detail)."""
    work = tempfile.mkdtemp(prefix="tidemark-mem-")
    try:
        os.makedirs(os.path.join(work, "pipelines"))
        with open(os.path.join(work, "pipelines", "big.toml"), "w") as f:
            if os.path.isfile(path):
                source = 'transport = "file"\nformat = "%s"\npath = "%s"' % (fmt, path)
            else:
                source = 'transport = "http"\nformat = "%s"\nurl = "%s"' % (fmt, base + path)
            f.write(PIPELINE.format(source=source))
        db = os.path.join(work, "t.db")
        started = time.monotonic()
        proc = subprocess.Popen(
            [BIN, "--database-url", "sqlite://" + db, "run", "big", "--period", DAY],
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        drained = []
        reader = threading.Thread(target=lambda: drained.append(proc.stderr.read()))
        reader.start()
        peak = peak_rss_kib(proc)
        reader.join()
        elapsed = time.monotonic() - started
        stderr = drained[0].decode(errors="replace") if drained else ""
        rows = 0
        if os.path.exists(db):
            with sqlite3.connect(db) as conn:
                try:
                    rows = conn.execute("SELECT COUNT(*) FROM big").fetchone()[0]
                except sqlite3.Error:
                    rows = 0
        if expect_ok:
            outcome = proc.returncode == 0
            detail = "exit %d, %d rows, %.1f s" % (proc.returncode, rows, elapsed)
        else:
            if "has a line longer than" in stderr:
                limit = "the line limit"
            elif "the page is larger than" in stderr:
                limit = "max_page_bytes"
            else:
                limit = None
            outcome = proc.returncode == 1 and limit is not None
            detail = "exit %d at %s, %d rows committed before, %.1f s" % (
                proc.returncode,
                limit or "? (%s)" % stderr.strip().splitlines()[-1:],
                rows,
                elapsed,
            )
        mib = peak / 1024
        return mib, outcome and mib <= BOUND_MIB, detail
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(quick):
    """[(case, peak_rss_mib, ok)], each case at tidemark's defaults."""
    if not os.path.exists(BIN):
        sys.exit("no %s: run `cargo build --release` first" % BIN)
    legit_mib = 20 if quick else 100
    legit_lines = (legit_mib << 20) // len(record(0)) + 1
    legit = b"".join(record(i) for i in range(legit_lines))
    bomb = gzip_bomb(300)
    json_body, json_rows = json_page(4 << 20)
    cases = {
        "/endless-line": endless_line,
        "/endless-records": endless_records,
        "/gzip-bomb": lambda h: h.whole(bomb, [("Content-Encoding", "gzip")]),
        "/ndjson": lambda h: h.whole(legit),
        "/json": lambda h: h.whole(json_body),
    }
    server = serve(cases)
    base = "http://127.0.0.1:%d" % server.server_address[1]
    data = tempfile.mkdtemp(prefix="tidemark-mem-data-")
    legit_file = os.path.join(data, "page.ndjson")
    with open(legit_file, "wb") as f:
        f.write(legit)
    plan = [
        ("endless-line", "/endless-line", False),
        ("endless-records", "/endless-records", False),
        ("gzip-bomb (%d KiB of 300 MiB)" % (len(bomb) >> 10), "/gzip-bomb", False),
        ("ndjson-%dMiB (%d rows)" % (legit_mib, legit_lines), "/ndjson", True),
        ("file-%dMiB (baseline)" % legit_mib, legit_file, True),
        ("json-4MiB (%d rows)" % json_rows, "/json", True, "json"),
    ]
    results = []
    try:
        for name, path, expect_ok, *fmt in plan:
            mib, ok, detail = run_case(base, path, expect_ok, *fmt)
            print("  %-34s peak RSS %6.1f MiB  %s  (%s)" % (name, mib, "pass" if ok else "FAIL", detail))
            results.append((name, round(mib, 1), ok))
    finally:
        server.shutdown()
        shutil.rmtree(data, ignore_errors=True)
    page, file = results[3][1], results[4][1]
    print("  the %d MiB page over HTTP / as a file: %.2fx peak RSS" % (legit_mib, page / file))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the legitimate page at 20 MiB")
    parser.add_argument("--bin", help="the tidemark binary (default target/release/tidemark)")
    args = parser.parse_args()
    if args.bin:
        global BIN
        BIN = os.path.abspath(args.bin)
    print("HTTP pages at defaults (load.memory_budget 64 MiB), bound %d MiB peak RSS:" % BOUND_MIB)
    results = run(args.quick)
    sys.exit(0 if all(ok for _, _, ok in results) else 1)


if __name__ == "__main__":
    main()
