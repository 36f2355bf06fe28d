//! Issue 19, the queue's claims: a claimed key keeps its identity and its
//! provisional state, a key the pipeline cannot run leaves the queue, an
//! interrupted key is claimable at once, and back-offs are the database's
//! clock. Real processes, real signals, both databases.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{backend_tests, Backend, Env, FifoWriter, Out, BIN};

backend_tests! {
    interrupted_provisional_key_starts_over_once_due: interrupted_provisional_key_starts_over_once_due_sqlite, interrupted_provisional_key_starts_over_once_due_postgres;
    queue_continues_a_provisional_key_while_open_and_never_runs_other_open_keys: queue_continues_a_provisional_key_while_open_and_never_runs_other_open_keys_sqlite, queue_continues_a_provisional_key_while_open_and_never_runs_other_open_keys_postgres;
    queued_key_never_runs_under_a_changed_export_type: queued_key_never_runs_under_a_changed_export_type_sqlite, queued_key_never_runs_under_a_changed_export_type_postgres;
    crashed_key_is_not_taken_over_under_a_changed_export_type: crashed_key_is_not_taken_over_under_a_changed_export_type_sqlite, crashed_key_is_not_taken_over_under_a_changed_export_type_postgres;
    queued_day_is_not_run_as_an_hour_after_a_granularity_change: queued_day_is_not_run_as_an_hour_after_a_granularity_change_sqlite, queued_day_is_not_run_as_an_hour_after_a_granularity_change_postgres;
    unrunnable_queued_key_fails_once_and_the_queue_moves_on: unrunnable_queued_key_fails_once_and_the_queue_moves_on_sqlite, unrunnable_queued_key_fails_once_and_the_queue_moves_on_postgres;
    interrupted_key_is_claimable_despite_an_earlier_backoff: interrupted_key_is_claimable_despite_an_earlier_backoff_sqlite, interrupted_key_is_claimable_despite_an_earlier_backoff_postgres;
    backoff_is_the_database_clock_not_tidemark_now: backoff_is_the_database_clock_not_tidemark_now_sqlite, backoff_is_the_database_clock_not_tidemark_now_postgres;
}

/// PostgreSQL only: SQLite has no clock of its own (its `'now'` is the C
/// library's time in the process that uses the file), so a process whose
/// clock is faked fakes the database's too; processes sharing a SQLite file
/// share a host and its clock.
#[tokio::test]
async fn backoff_of_a_worker_whose_clock_is_behind_holds_postgres() {
    backoff_of_a_worker_whose_clock_is_behind_holds(Backend::Postgres).await;
}

/// Rows of a day file.
const ROWS: usize = 20;

/// The base pipeline of the issue: `p`, daily UTC periods from `start`,
/// CSV files `data/DAY.csv` for each source of `sources`, five rows a batch.
fn base_pipeline(env: &Env, start: &str, export_type: &str, sources: &[&str]) {
    let sources: String = sources
        .iter()
        .map(|id| {
            format!(
                "[[sources]]\nid = \"{id}\"\ntransport = \"file\"\nformat = \"csv\"\npath = \"../data/{id}/{{period.start:%Y-%m-%d}}.csv\"\n\n"
            )
        })
        .collect();
    env.write(
        "pipelines/p.toml",
        &format!(
            r#"name = "p"
export_type = "{export_type}"
version = "1"

[period]
granularity = "day"
start = "{start}"

{sources}[fields]
id = {{ type = "text", required = true }}
v = {{ type = "int" }}

[load]
table = "p"
key = ["id"]
batch_size = 5

[retry]
max_attempts = 2
base_delay = "10ms"
max_delay = "50ms"
"#
        ),
    );
}

fn day_text(day: &str, from: usize, to: usize, header: bool) -> String {
    let mut text = if header {
        "id,v\n".to_string()
    } else {
        String::new()
    };
    for i in from..to {
        text.push_str(&format!("{day}-{i:03},{i}\n"));
    }
    text
}

fn write_day(env: &Env, source: &str, day: &str) {
    env.write(
        format!("data/{source}/{day}.csv"),
        &day_text(day, 0, ROWS, true),
    );
}

/// A tidemark process with extra environment variables (and optionally
/// under a wrapper such as `faketime`), output to files.
struct Proc {
    child: Child,
    stderr: PathBuf,
    stdout: PathBuf,
    started: Instant,
}

fn spawn(env: &Env, wrapper: &[&str], vars: &[(&str, &str)], args: &[&str]) -> Proc {
    let n = format!("{}", rand_suffix());
    let stdout = env.path(format!("q-{n}.stdout"));
    let stderr = env.path(format!("q-{n}.stderr"));
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut cmd = Command::new(program);
            cmd.args(rest).arg(BIN);
            cmd
        }
        None => Command::new(BIN),
    };
    cmd.current_dir(env.dir.path())
        .arg("--database-url")
        .arg(env.db.url())
        .args(args);
    for inherited in [
        "TIDEMARK_LOG",
        "TIDEMARK_DATABASE_URL",
        "TIDEMARK_NOW",
        "RUST_LOG",
    ] {
        cmd.env_remove(inherited);
    }
    cmd.envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout).expect("stdout file"))
        .stderr(fs::File::create(&stderr).expect("stderr file"));
    let child = cmd.spawn().unwrap_or_else(|e| {
        panic!("start {wrapper:?} tidemark (scripts/test-setup.sh installs faketime): {e}")
    });
    Proc {
        child,
        stderr,
        stdout,
        started: Instant::now(),
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

impl Proc {
    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{name}");
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn wait_for_stderr(&self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.stderr().contains(text) {
            assert!(
                Instant::now() < deadline,
                "did not log {text:?} in {timeout:?}\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit; kills it after `timeout` and returns `None`.
    fn finish(mut self, timeout: Duration) -> (Option<Out>, Proc) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let out = Out {
                    code: status.code(),
                    stdout: fs::read_to_string(&self.stdout).unwrap_or_default(),
                    stderr: self.stderr(),
                    elapsed: self.started.elapsed(),
                };
                return (Some(out), self);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return (None, self);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit, panicking (with the output) after `timeout`.
    #[track_caller]
    fn done(self, timeout: Duration, what: &str) -> Out {
        match self.finish(timeout) {
            (Some(out), _) => out,
            (None, proc) => panic!(
                "{what}: did not finish within {timeout:?}\n--- stderr (last 3000 bytes):\n{}",
                tail(&proc.stderr(), 3000)
            ),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(text: &str, n: usize) -> &str {
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

fn tidemark_env(env: &Env, vars: &[(&str, &str)], args: &[&str]) -> Out {
    spawn(env, &[], vars, args).done(Duration::from_secs(60), &args.join(" "))
}

/// `backfill p --from FROM --to TO --enqueue` (and `extra`), at `vars`.
fn enqueue(env: &Env, vars: &[(&str, &str)], (from, to): (&str, &str), extra: &[&str]) {
    let mut args = vec!["backfill", "p", "--from", from, "--to", to, "--enqueue"];
    args.extend_from_slice(extra);
    tidemark_env(env, vars, &args).expect_code(0, "backfill --enqueue");
}

/// `serve --no-schedule --drain` (and `extra`), at `vars`: it must end,
/// with exit 0, within 30 s.
fn drain(env: &Env, vars: &[(&str, &str)], extra: &[&str]) -> Out {
    let mut args = vec![
        "serve",
        "--no-schedule",
        "--drain",
        "--poll-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    let out = spawn(env, &[], vars, &args).done(Duration::from_secs(30), "serve --drain ends");
    out.expect_code(0, "serve --drain");
    out
}

/// The key failed once, class `config`, with a back-off, and its message
/// contains `named` (what changed).
async fn assert_config_failure(env: &Env, (source, day): (&str, &str), named: &str, out: &Out) {
    let columns = [
        "status",
        "error_class",
        "attempt",
        "not_before",
        "error_message",
    ];
    let row = run_row(env, source, day, &columns).await;
    assert_eq!(
        (row[0].as_deref(), row[1].as_deref(), row[2].as_deref()),
        (Some("failed"), Some("config"), Some("1")),
        "{source} {day}: failed once, as a configuration error\n{}",
        tail(&out.stderr, 3000)
    );
    assert!(row[3].is_some(), "with the failure back-off: {row:?}");
    let message = row[4].clone().unwrap_or_default();
    assert!(message.contains(named), "names {named}: {message}");
}

/// Rows of table `p` matching `filter` (none when it does not exist).
async fn loaded(env: &Env, filter: &str) -> i64 {
    if env.db.table_exists("p").await {
        env.db.count(&format!("FROM p WHERE {filter}")).await
    } else {
        0
    }
}

/// One row of `_tm_runs` as text, by column.
async fn run_row(env: &Env, source: &str, day: &str, columns: &[&str]) -> Vec<Option<String>> {
    let start = format!("{day}T00:00:00+00:00");
    let rows = env
        .db
        .select(
            columns,
            &format!(
                "FROM _tm_runs WHERE source = '{source}' AND {}",
                instant_is(env, "period_start", &start)
            ),
        )
        .await;
    assert_eq!(rows.len(), 1, "one ledger row for {source} {day}: {rows:?}");
    rows.into_iter().next().unwrap()
}

/// `(status, resumed, run_id)` of every attempt of the key, in order.
async fn attempts(env: &Env, source: &str, day: &str) -> Vec<(String, bool, String)> {
    let start = format!("{day}T00:00:00+00:00");
    env.db
        .select(
            &["a.status", "a.resumed", "a.run_id"],
            &format!(
                "FROM _tm_attempts a JOIN _tm_runs r ON r.id = a.run_ref
                 WHERE r.source = '{source}' AND {} ORDER BY a.attempt",
                instant_is(env, "r.period_start", &start)
            ),
        )
        .await
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap_or_default(),
                is_true(r[1].as_deref().unwrap_or("")),
                r[2].clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// `column` holds the instant `rfc3339` (SQLite stores UTC as `Z`).
fn instant_is(env: &Env, column: &str, rfc3339: &str) -> String {
    match env.backend() {
        Backend::Sqlite => format!("julianday({column}) = julianday('{rfc3339}')"),
        Backend::Postgres => env.db.instant_is(column, rfc3339),
    }
}

fn is_true(text: &str) -> bool {
    matches!(text, "1" | "true" | "t")
}

/// Waits until the key has committed `batches` batches.
async fn wait_for_batches(env: &Env, source: &str, day: &str, batches: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if env.db.table_exists("_tm_runs").await {
            let start = format!("{day}T00:00:00+00:00");
            let rows = env
                .db
                .select(
                    &["batches"],
                    &format!(
                        "FROM _tm_runs WHERE source = '{source}' AND {}",
                        instant_is(env, "period_start", &start)
                    ),
                )
                .await;
            if rows.first().and_then(|r| r[0].as_deref()) == Some(&batches.to_string()) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{batches} batches not committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `day` of source `a` through a FIFO with `vars` and `run_args`
/// (after `run p --period DAY`), commits three batches of five rows, and
/// stops the run with SIGTERM: the key is `pending`, interrupted, with a
/// checkpoint. Then the day file is made whole (20 rows).
async fn interrupt_a_run(env: &Env, day: &str, vars: &[(&str, &str)], run_args: &[&str]) -> Out {
    let path = env.path(format!("data/a/{day}.csv"));
    let fifo = FifoWriter::create(&path);
    let mut args = vec!["run", "p", "--period", day];
    args.extend_from_slice(run_args);
    let run = spawn(env, &[], vars, &args);
    fifo.write(&day_text(day, 0, 12, true));
    wait_for_batches(env, "a", day, 2).await;
    run.signal("TERM");
    run.wait_for_stderr("stopping", Duration::from_secs(10));
    fifo.write(&day_text(day, 12, 15, false));
    let out = run.done(Duration::from_secs(25), "the interrupted run");
    out.expect_code(0, "a first SIGTERM exits 0");
    drop(fifo);
    let _ = fs::remove_file(&path);
    write_day(env, "a", day);
    let row = run_row(env, "a", day, &["status", "error_class", "batches"]).await;
    assert_eq!(
        (row[0].as_deref(), row[1].as_deref(), row[2].as_deref()),
        (Some("pending"), Some("interrupted"), Some("3")),
        "handed back with three batches\n{out}"
    );
    out
}

const OPEN_DAY1: (&str, &str) = ("TIDEMARK_NOW", "2024-01-01T12:00:00Z");

// ---------------------------------------------------------------------------
// Item 1: provisional state across every resume path
// ---------------------------------------------------------------------------

/// An attempt `run --allow-open` started while the day was open, stopped by
/// SIGTERM, and continued once the day is due, by the queue or by `sync`:
/// it starts over (a new run id, every row read again), is not provisional,
/// and is never a resume of rows read while the period was open.
async fn interrupted_provisional_key_starts_over_once_due(backend: Backend) {
    for resume_by in ["serve", "sync"] {
        let env = Env::new(backend).await;
        base_pipeline(&env, "2024-01-01", "t", &["a"]);
        env.tidemark(&["migrate"]).expect_code(0, "migrate");
        interrupt_a_run(&env, "2024-01-01", &[OPEN_DAY1], &["--allow-open"]).await;
        let row = run_row(&env, "a", "2024-01-01", &["provisional"]).await;
        assert!(is_true(row[0].as_deref().unwrap_or("")), "provisional");

        let out = match resume_by {
            "serve" => tidemark_env(&env, &[], &["serve", "--no-schedule", "--drain"]),
            // Day 1 is due, day 2 not yet: sync plans day 1 only.
            _ => tidemark_env(
                &env,
                &[("TIDEMARK_NOW", "2024-01-02T01:00:00Z")],
                &["sync", "p"],
            ),
        };
        out.expect_code(0, resume_by);
        let row = run_row(
            &env,
            "a",
            "2024-01-01",
            &["status", "provisional", "attempt", "rows_read"],
        )
        .await;
        assert_eq!(row[0].as_deref(), Some("done"), "{resume_by}\n{out}");
        assert!(
            !is_true(row[1].as_deref().unwrap_or("")),
            "{resume_by}: done once due is final\n{out}"
        );
        assert_eq!(row[2].as_deref(), Some("2"));
        assert_eq!(
            row[3].as_deref(),
            Some("20"),
            "{resume_by}: read whole\n{out}"
        );
        let history = attempts(&env, "a", "2024-01-01").await;
        assert_eq!(history.len(), 2, "{history:?}");
        assert_eq!(history[0].0, "interrupted");
        assert!(
            !history[1].1,
            "{resume_by}: a provisional attempt is not continued once due: {history:?}"
        );
        assert_ne!(history[0].2, history[1].2, "a new run id: {history:?}");
        // Unchanged rows are not rewritten (they keep the run id that wrote
        // them); the period holds the whole file.
        assert_eq!(
            env.db.count("FROM p WHERE id LIKE '2024-01-01-%'").await,
            i64::try_from(ROWS).unwrap(),
            "{resume_by}"
        );
    }
}

/// While the day is still open the queue continues the provisional attempt
/// (it stays provisional, `sync` re-runs it once due); a key queued without
/// `--allow-open` whose period is open by the worker's clock is not run,
/// and `--drain` still ends.
async fn queue_continues_a_provisional_key_while_open_and_never_runs_other_open_keys(
    backend: Backend,
) {
    let env = Env::new(backend).await;
    base_pipeline(&env, "2024-01-01", "t", &["a"]);
    write_day(&env, "a", "2024-01-02");
    // Day 2 is queued by an operator whose clock says it is due.
    let due = [("TIDEMARK_NOW", "2024-01-03T01:00:00Z")];
    enqueue(&env, &due, ("2024-01-02", "2024-01-02"), &[]);
    interrupt_a_run(&env, "2024-01-01", &[OPEN_DAY1], &["--allow-open"]).await;

    // A worker whose clock says 2024-01-01T13:00: day 1 and day 2 are open.
    let out = drain(&env, &[("TIDEMARK_NOW", "2024-01-01T13:00:00Z")], &[]);
    let day1 = run_row(
        &env,
        "a",
        "2024-01-01",
        &["status", "provisional", "rows_read"],
    )
    .await;
    assert_eq!(day1[0].as_deref(), Some("done"), "{out}");
    assert!(
        is_true(day1[1].as_deref().unwrap_or("")),
        "done while open: provisional\n{out}"
    );
    assert_eq!(day1[2].as_deref(), Some("20"));
    let history = attempts(&env, "a", "2024-01-01").await;
    assert!(history[1].1, "continued while open: {history:?}");
    let day2 = run_row(&env, "a", "2024-01-02", &["status", "attempt"]).await;
    assert_eq!(
        (day2[0].as_deref(), day2[1].as_deref()),
        (Some("pending"), Some("0")),
        "an open period queued without --allow-open is not run\n{out}"
    );
    assert_eq!(loaded(&env, "id LIKE '2024-01-02-%'").await, 0);
}

// ---------------------------------------------------------------------------
// Item 2: a queued key keeps its identity
// ---------------------------------------------------------------------------

/// Two days queued under export type `t`; the file then says `t2`. The
/// queue runs neither under `t2` rows with `t`'s run ids: each fails as a
/// configuration error naming both export types, and nothing is loaded.
async fn queued_key_never_runs_under_a_changed_export_type(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, "2024-01-01", "t", &["a"]);
    let days = ["2024-01-01", "2024-01-02"];
    for day in days {
        write_day(&env, "a", day);
    }
    enqueue(&env, &[], (days[0], days[1]), &[]);
    base_pipeline(&env, "2024-01-01", "t2", &["a"]);
    let out = drain(&env, &[], &[]);
    let changed = "export type \"t\", the pipeline now has \"t2\"";
    for day in days {
        assert_config_failure(&env, ("a", day), changed, &out).await;
        let row = run_row(&env, "a", day, &["export_type"]).await;
        assert_eq!(row[0].as_deref(), Some("t"));
    }
    let all = loaded(&env, "1 = 1").await;
    assert_eq!(all, 0, "no row under a run id of another run key");
    // The new export type's keys run as usual.
    env.tidemark(&["backfill", "p", "--from", days[0], "--to", days[1]])
        .expect_code(0, "backfill t2");
    let both = 2 * i64::try_from(ROWS).unwrap();
    assert_eq!(loaded(&env, "_tm_export_type = 't2'").await, both);
}

/// A `run` killed with SIGKILL mid-period leaves its key running; the
/// export type then changes. The worker that takes the crashed key over
/// (its holder is provably dead) fails it as a configuration error instead
/// of continuing `t`'s run id with `t2` rows.
async fn crashed_key_is_not_taken_over_under_a_changed_export_type(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, "2024-01-01", "t", &["a"]);
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let day = "2024-01-01";
    let path = env.path(format!("data/a/{day}.csv"));
    let fifo = FifoWriter::create(&path);
    let mut run = spawn(&env, &[], &[], &["run", "p", "--period", day]);
    fifo.write(&day_text(day, 0, 12, true));
    wait_for_batches(&env, "a", day, 2).await;
    run.child.kill().expect("SIGKILL");
    run.child.wait().expect("reap");
    drop(fifo);
    let _ = fs::remove_file(&path);
    write_day(&env, "a", day);
    let row = run_row(&env, "a", day, &["status"]).await;
    assert_eq!(row[0].as_deref(), Some("running"), "crashed");

    base_pipeline(&env, "2024-01-01", "t2", &["a"]);
    let out = drain(&env, &[], &[]);
    // Attempt 2, the takeover's, failed at once.
    let row = run_row(
        &env,
        "a",
        day,
        &["status", "error_class", "attempt", "error_message"],
    )
    .await;
    assert_eq!(
        (row[0].as_deref(), row[1].as_deref(), row[2].as_deref()),
        (Some("failed"), Some("config"), Some("2")),
        "{}",
        tail(&out.stderr, 3000)
    );
    assert!(
        row[3].as_deref().unwrap_or("").contains("\"t2\""),
        "{row:?}"
    );
    let t2 = loaded(&env, "_tm_export_type = 't2'").await;
    assert_eq!(t2, 0, "no t2 row under t's run id");
}

/// A day queued, then the pipeline's granularity becomes `hour`: a day's
/// start is also an hour's start, but not its end. The queued day fails as
/// a configuration error; nothing runs as an hour under a day's ledger row.
async fn queued_day_is_not_run_as_an_hour_after_a_granularity_change(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, "2024-01-01", "t", &["a"]);
    write_day(&env, "a", "2024-01-01");
    enqueue(&env, &[], ("2024-01-01", "2024-01-01"), &[]);
    env.set_option("p", "period", "granularity", "\"hour\"");
    let out = drain(&env, &[], &[]);
    assert_config_failure(&env, ("a", "2024-01-01"), "granularity", &out).await;
    assert_eq!(loaded(&env, "1 = 1").await, 0);
}

// ---------------------------------------------------------------------------
// Item 3: a key the pipeline cannot run leaves the queue
// ---------------------------------------------------------------------------

/// Keys queued for sources `b` then `a`; `b` is removed from the file. One
/// worker fails each of `b`'s keys once (class `config`, the source named,
/// a back-off), runs `a`'s, and `--drain` ends.
async fn unrunnable_queued_key_fails_once_and_the_queue_moves_on(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, "2024-01-01", "t", &["a", "b"]);
    let days = ["2024-01-01", "2024-01-02", "2024-01-03"];
    for day in days {
        write_day(&env, "a", day);
    }
    for (source, priority) in [("b", "10"), ("a", "0")] {
        let extra = ["--source", source, "--priority", priority];
        enqueue(&env, &[], (days[0], days[2]), &extra);
    }
    base_pipeline(&env, "2024-01-01", "t", &["a"]);
    let out = drain(&env, &[], &["--workers", "1"]);
    for day in days {
        assert_config_failure(&env, ("b", day), "no source \"b\"", &out).await;
        let a = run_row(&env, "a", day, &["status"]).await;
        assert_eq!(a[0].as_deref(), Some("done"), "a {day}");
    }
    let attempts = env.db.count("FROM _tm_attempts").await;
    assert_eq!(attempts, 6, "one attempt per key, no loop");
}

// ---------------------------------------------------------------------------
// Item 5: back-off belongs to failures
// ---------------------------------------------------------------------------

/// A day fails (no file: a back-off), then a run of it is interrupted: the
/// key is claimable at once, and `serve --drain` runs it and ends.
async fn interrupted_key_is_claimable_despite_an_earlier_backoff(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, "2024-01-01", "t", &["a"]);
    let failed = env.tidemark(&["run", "p", "--period", "2024-01-01"]);
    assert_eq!(failed.code, Some(1), "the missing file fails\n{failed}");
    let row = run_row(&env, "a", "2024-01-01", &["status", "not_before"]).await;
    assert_eq!(row[0].as_deref(), Some("failed"));
    assert!(row[1].is_some(), "a back-off");
    interrupt_a_run(&env, "2024-01-01", &[], &[]).await;
    let row = run_row(&env, "a", "2024-01-01", &["not_before"]).await;
    assert_eq!(row[0], None, "an interruption is no failure: no back-off");

    drain(&env, &[], &[]);
    let row = run_row(&env, "a", "2024-01-01", &["status", "rows_read"]).await;
    assert_eq!(
        (row[0].as_deref(), row[1].as_deref()),
        (Some("done"), Some("20"))
    );
}

// ---------------------------------------------------------------------------
// Item 8: every stored time is the database's clock
// ---------------------------------------------------------------------------

/// `TIDEMARK_NOW` moves what is due, not the back-off: a failure recorded
/// by a process told it is 2024 backs off from the database's now, and a
/// `sync` told it is five minutes later still leaves the key alone.
async fn backoff_is_the_database_clock_not_tidemark_now(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, "2024-01-01", "t", &["a"]);
    let at = [("TIDEMARK_NOW", "2024-01-02T01:00:00Z")];
    let failed = tidemark_env(&env, &at, &["sync", "p"]);
    assert_eq!(failed.code, Some(1), "no file: failed\n{failed}");
    let waits = env
        .db
        .count(&format!(
            "FROM _tm_runs WHERE status = 'failed' AND {}",
            backoff_ahead_of_db_now(&env)
        ))
        .await;
    assert_eq!(waits, 1, "not_before is the database's now plus a minute");
    write_day(&env, "a", "2024-01-01");
    let later = [("TIDEMARK_NOW", "2024-01-02T01:05:00Z")];
    let again = tidemark_env(&env, &later, &["sync", "p"]);
    again.expect_code(0, "sync within the back-off");
    let row = run_row(&env, "a", "2024-01-01", &["status", "attempt"]).await;
    assert_eq!(
        (row[0].as_deref(), row[1].as_deref()),
        (Some("failed"), Some("1")),
        "left alone within its back-off\n{again}"
    );
}

/// `not_before` lies between 30 s and 2 min after the database's now.
fn backoff_ahead_of_db_now(env: &Env) -> String {
    match env.backend() {
        Backend::Postgres => "not_before BETWEEN now() + interval '30 seconds' AND now() + interval '2 minutes'".to_string(),
        Backend::Sqlite => "julianday(not_before) BETWEEN julianday('now') + 30/86400.0 AND julianday('now') + 120/86400.0".to_string(),
    }
}

/// A worker whose clock is two hours behind (`faketime -f -2h`) fails a
/// day: its back-off is counted from the database's clock, so the next
/// `sync` (on a true clock) leaves the key alone until it has passed.
async fn backoff_of_a_worker_whose_clock_is_behind_holds(backend: Backend) {
    let env = Env::new(backend).await;
    let start = (chrono::Utc::now() - chrono::Duration::days(3))
        .format("%Y-%m-%d")
        .to_string();
    base_pipeline(&env, &start, "t", &["a"]);
    let behind = spawn(
        &env,
        &["faketime", "-f", "-2h"],
        &[],
        &["sync", "p", "--source", "a"],
    )
    .done(Duration::from_secs(60), "sync under faketime");
    assert_eq!(behind.code, Some(1), "no files: failed\n{behind}");
    let failed = env.db.count("FROM _tm_runs WHERE status = 'failed'").await;
    assert!(failed >= 2, "{behind}");
    let ahead = env
        .db
        .count(&format!(
            "FROM _tm_runs WHERE status = 'failed' AND {}",
            backoff_ahead_of_db_now(&env)
        ))
        .await;
    assert_eq!(
        ahead, failed,
        "every back-off is ahead of the database's now"
    );
    write_day(&env, "a", &start);
    let again = env.tidemark(&["sync", "p"]);
    let row = run_row(&env, "a", &start, &["status", "attempt"]).await;
    assert_eq!(
        (row[0].as_deref(), row[1].as_deref()),
        (Some("failed"), Some("1")),
        "not re-run within its back-off\n{again}"
    );
}
