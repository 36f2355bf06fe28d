//! Issue 19, item 9: planning streams through periods and ledger rows in
//! bounded memory (ADR 0014). An hourly pipeline from 1900 has a million
//! due periods; `sync --dry-run`, `serve`'s first fire, `backfill
//! --enqueue`, and `sync` itself once the ledger holds a
//! million rows, each stay under the same peak RSS. Before, each held every
//! period, every ledger row and every planned key at once (219 MB for
//! 236,000 periods; a million took about a gigabyte).
//!
//! The peak is measured for real: the child's `VmHWM` (the kernel's high
//! water mark of its resident set), polled every few milliseconds until it
//! exits. The steps are chosen to plan a million keys without running one
//! (an empty ledger, queued keys, cancelled keys), so the test costs the
//! planning alone.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{backend_tests, Backend, Env, BIN};

backend_tests! {
    planning_a_million_periods_stays_under_the_memory_budget: planning_a_million_periods_stays_under_the_memory_budget_sqlite, planning_a_million_periods_stays_under_the_memory_budget_postgres;
}

/// Due hourly periods at [`NOW`]: 1900-01-01T00 through 2014-01-29T15.
const PERIODS: i64 = 1_000_000;
/// The instant a million hours after 1900-01-01T00:00Z (`lag = "0s"`).
const NOW: &str = "2014-01-29T16:00:00Z";
const LAST: &str = "2014-01-29T15";

/// The peak RSS every planning command must stay under. The project's
/// process budget is 160 MiB; these commands measured 40-75 MiB (debug
/// build, both databases), about a page of planned keys over the process's
/// baseline. A command that held one small value per key (100 bytes) would
/// need about 100 MiB more at a million keys and fail here.
const BUDGET_KIB: u64 = 128 * 1024;

/// How long one planning command may take in a loaded debug build.
const TIMEOUT: Duration = Duration::from_secs(600);

fn hourly_pipeline(env: &Env) {
    env.write(
        "pipelines/h.toml",
        r#"name = "h"
export_type = "h"
[period]
granularity = "hour"
timezone = "UTC"
start = "1900-01-01"
lag = "0s"
[schedule]
every = "1h"
[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "data/{period.start:%Y-%m-%dT%H}.csv"
[fields]
id = { type = "text", required = true }
[load]
table = "h"
key = ["id"]
"#,
    );
}

/// One finished command: exit code, output, peak RSS and time.
struct Measured {
    code: Option<i32>,
    stdout: PathBuf,
    stderr: String,
    peak_kib: u64,
    elapsed: Duration,
}

impl Measured {
    #[track_caller]
    fn expect(&self, code: i32, what: &str) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "{what}: exit code\n--- stderr:\n{}",
            self.stderr
        );
        eprintln!(
            "{what}: peak RSS {} MiB, {:.1} s",
            self.peak_kib / 1024,
            self.elapsed.as_secs_f64()
        );
        assert!(
            self.peak_kib < BUDGET_KIB,
            "{what}: peak RSS {} KiB is over the budget of {BUDGET_KIB} KiB",
            self.peak_kib
        );
        self
    }

    /// The last line of stdout (a summary).
    fn last_line(&self) -> String {
        let text = fs::read_to_string(&self.stdout).expect("stdout file");
        text.lines().last().unwrap_or_default().to_string()
    }
}

/// The kernel's high-water mark of a process's resident set, in KiB.
fn vm_hwm(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Runs `tidemark ARGS` at [`NOW`] with stdout to a file, polling its peak
/// RSS until it exits; `until` (when given) is logged text after which it
/// is sent SIGTERM (for `serve`).
fn measure(env: &Env, name: &str, args: &[&str], until: Option<&str>) -> Measured {
    let stdout = env.path(format!("{name}.stdout"));
    let stderr = env.path(format!("{name}.stderr"));
    let mut child = Command::new(BIN)
        .current_dir(env.dir.path())
        .arg("--database-url")
        .arg(env.db.url())
        .args(args)
        .env("TIDEMARK_NOW", NOW)
        .env("TIDEMARK_LOG", "info")
        .env_remove("TIDEMARK_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout).expect("stdout file"))
        .stderr(fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
    let started = Instant::now();
    let pid = child.id();
    let mut peak = 0;
    let mut signalled = false;
    let status = loop {
        if let Some(kib) = vm_hwm(pid) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if let (Some(text), false) = (until, signalled) {
            if read(&stderr).contains(text) {
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(pid.to_string())
                    .status();
                signalled = true;
            }
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`tidemark {}` did not finish within {TIMEOUT:?}",
                args.join(" ")
            );
        }
        thread::sleep(Duration::from_millis(5));
    };
    Measured {
        code: status.code(),
        stdout,
        stderr: read(&stderr),
        peak_kib: peak,
        elapsed: started.elapsed(),
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// A million due hourly periods: `sync --dry-run` on an empty ledger,
/// `serve`'s first fire queuing them all, `backfill --enqueue` over the
/// million queued keys (re-queuing the few the worker failed), then with
/// every key cancelled `sync` (nothing due, after reading a million ledger
/// rows): each plans every key under the budget; outputs and counts are
/// those of the whole plan. (`backfill --only ...` plans through the same
/// page reads and job stream as `sync`; at a million keys it would add
/// about 100 s of debug build.)
async fn planning_a_million_periods_stays_under_the_memory_budget(backend: Backend) {
    let env = Env::new(backend).await;
    hourly_pipeline(&env);
    env.tidemark(&["migrate"]).expect_code(0, "migrate");

    let dry = measure(&env, "dry", &["sync", "h", "--dry-run"], None);
    dry.expect(0, "sync --dry-run, empty ledger");
    assert_eq!(
        dry.last_line(),
        format!("dry run: {PERIODS} run key(s): {PERIODS} run, 0 resume, 0 re-run, 0 skip, 0 held; nothing was read or written")
    );

    let serve = measure(
        &env,
        "serve",
        &["serve", "--workers", "1"],
        Some("queued due periods"),
    );
    serve.expect(0, "serve, first fire");
    assert!(
        serve.stderr.contains(&format!("queued={PERIODS}")),
        "{}",
        serve.stderr
    );
    assert_eq!(env.db.count("FROM _tm_runs").await, PERIODS);

    // The keys the worker of `serve` took before it stopped failed (the
    // files do not exist): the enqueue puts them back into the queue.
    let queued = env.db.count("FROM _tm_runs WHERE status = 'failed'").await;
    let enqueue = measure(
        &env,
        "enqueue",
        &[
            "backfill",
            "h",
            "--from",
            "1900-01-01T00",
            "--to",
            LAST,
            "--enqueue",
        ],
        None,
    );
    enqueue.expect(0, "backfill --enqueue, a million keys queued or run");
    assert_eq!(
        enqueue.last_line(),
        format!(
            "queued {queued} run key(s) of pipeline h at priority 0; {} left as they were (already queued, running or done)",
            PERIODS - queued
        )
    );

    env.tidemark(&["cancel", "h"]).expect_code(0, "cancel");
    let sync = measure(&env, "sync", &["sync", "h"], None);
    sync.expect(0, "sync, a million cancelled keys");
    assert_eq!(
        sync.last_line(),
        "nothing due: every period up to now is done"
    );

    assert_eq!(
        env.db
            .count("FROM _tm_runs WHERE status = 'cancelled'")
            .await,
        PERIODS,
        "nothing ran"
    );
}
