//! Every ledger statement, written once. Parameters are numbered (`$1`),
//! which PostgreSQL and SQLite both read; a statement with more than a few
//! is written with named placeholders (`$run_ref`) instead, numbered by the
//! struct of its parameters declared beside it ([`super::params`]). The few
//! fragments the databases spell differently come from [`Dialect`]. The
//! statements are built once per process and dialect.
//!
//! Times are the database's own clock on both backends, so hosts with
//! skewed clocks agree on leases. SQLite stores them as RFC 3339 text in
//! UTC with milliseconds (`2024-01-02T03:04:05.678Z`), which sorts and
//! compares as time.

use std::sync::OnceLock;
use std::time::Duration;

use super::driver::Dialect;
use super::params::{ledger_params, number};
use super::{AttemptStatus, Counts, RunStatus, StoredClass};

impl Dialect {
    /// The current time.
    pub(crate) fn now(self) -> &'static str {
        match self {
            Dialect::Postgres => "now()",
            Dialect::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        }
    }

    /// The current time plus `param` seconds (a float parameter).
    pub(crate) fn now_plus(self, param: &str) -> String {
        match self {
            Dialect::Postgres => format!("now() + make_interval(secs => {param})"),
            Dialect::Sqlite => {
                format!("strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') + {param} / 86400.0)")
            }
        }
    }

    /// The current time minus `param` seconds (a float parameter).
    pub(crate) fn now_minus_secs(self, param: &str) -> String {
        match self {
            Dialect::Postgres => format!("now() - make_interval(secs => {param})"),
            Dialect::Sqlite => {
                format!("strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') - {param} / 86400.0)")
            }
        }
    }

    /// The current time minus `param` minutes (an integer parameter).
    fn now_minus_minutes(self, param: &str) -> String {
        match self {
            Dialect::Postgres => format!("now() - make_interval(mins => CAST({param} AS INTEGER))"),
            Dialect::Sqlite => {
                format!("strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') - {param} / 1440.0)")
            }
        }
    }

    /// The database's current time plus the backoff of a key that has
    /// failed `failures` times before: one minute, doubling, at most a day.
    /// The database's clock, like every time the ledger stores: a worker
    /// whose clock is behind would otherwise store a back-off already over.
    fn backoff_from_now(self, failures: &str) -> String {
        match self {
            Dialect::Postgres => format!(
                "now() + make_interval(secs => LEAST(60 * power(2, LEAST({failures}, 11)), 86400))"
            ),
            Dialect::Sqlite => format!(
                "strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') + MIN(60 * (1 << MIN({failures}, 11)), 86400) / 86400.0)"
            ),
        }
    }

    /// A stored time or period start as an instant that compares correctly
    /// across UTC offsets (`2024-03-31T00:00:00+01:00` vs `+02:00`).
    pub(crate) fn instant(self, expr: &str) -> String {
        match self {
            Dialect::Postgres => format!("({expr})::timestamptz"),
            Dialect::Sqlite => format!("julianday({expr})"),
        }
    }

    /// The JSON object `param` with its `finished_at` set to the database's
    /// current time, as SQLite stores times (RFC 3339, UTC, milliseconds).
    fn with_finished_at(self, param: &str) -> String {
        match self {
            Dialect::Postgres => format!(
                "jsonb_set({param}::jsonb, '{{finished_at}}', \
                 to_jsonb(to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')))"
            ),
            Dialect::Sqlite => {
                format!("json_set({param}, '$.finished_at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))")
            }
        }
    }

    /// The `_tm_runs` rows (as `r`, with `columns`) of the run keys in the
    /// JSON array parameter `keys` (`[source, period start]` each) of
    /// pipeline `pipeline` and export type `export_type` (parameters): a
    /// `FROM` clause that looks every key up by the run key's unique index,
    /// whatever the planner knows. Left to choose, both databases scanned
    /// every row of the pipeline once per key or per statement when the
    /// ledger had grown since its statistics (a page of 10,000 keys against
    /// a million rows: minutes). SQLite keeps a `CROSS JOIN`'s left side as
    /// the outer loop; PostgreSQL runs a `LATERAL` subquery kept apart by
    /// `OFFSET 0` once per key.
    fn rows_of_keys(self, keys: &str, pipeline: &str, export_type: &str, columns: &str) -> String {
        match self {
            Dialect::Postgres => format!(
                "jsonb_array_elements({keys}::jsonb) AS k(value)
                 CROSS JOIN LATERAL (SELECT {columns} FROM _tm_runs
                     WHERE pipeline = {pipeline} AND export_type = {export_type}
                       AND source = (k.value->>0) AND period_start = (k.value->>1) OFFSET 0) AS r"
            ),
            Dialect::Sqlite => format!(
                "json_each({keys}) AS k CROSS JOIN _tm_runs AS r
                   ON r.pipeline = {pipeline} AND r.export_type = {export_type}
                  AND r.source = json_extract(k.value, '$[0]')
                  AND r.period_start = json_extract(k.value, '$[1]')"
            ),
        }
    }

    /// The elements of a JSON array parameter as rows, each named `k.value`.
    fn json_rows(self, param: &str) -> String {
        match self {
            Dialect::Postgres => format!("jsonb_array_elements({param}::jsonb) AS k(value)"),
            Dialect::Sqlite => format!("json_each({param}) AS k"),
        }
    }

    /// Element `i` of the JSON array `k.value` (a row of [`Dialect::json_rows`]), as text.
    fn json_element(self, i: usize) -> String {
        match self {
            Dialect::Postgres => format!("(k.value->>{i})"),
            Dialect::Sqlite => format!("json_extract(k.value, '$[{i}]')"),
        }
    }

    /// Holds the selected rows against claims (`FOR UPDATE`) until commit,
    /// but not against the heartbeat's or the batch's own non-key
    /// `UPDATE`s (`FOR NO KEY UPDATE`): PostgreSQL's `FOR KEY SHARE`
    /// conflicts only with `FOR UPDATE` and key changes. SQLite's
    /// transaction already holds the one write lock.
    fn key_share(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR KEY SHARE",
            Dialect::Sqlite => "",
        }
    }

    /// Reads the pending keys through the queue index, in rank order, so
    /// that a claim costs O(log n) in the backlog. SQLite's planner has no
    /// statistics to tell it that `status = 'pending' AND pipeline IN (...)`
    /// matches nearly every row: it chose an index on those columns and
    /// sorted the whole backlog for each claim (20 claims/s at 250,000
    /// pending against 2,100 at 1,000). `INDEXED BY` makes the plan part of
    /// the statement (SQLite refuses to run it otherwise, rather than slow
    /// down silently). PostgreSQL chooses the index from its statistics,
    /// refreshed after a large enqueue ([`Statements::analyze_runs`]).
    fn by_queue_index(self) -> &'static str {
        match self {
            Dialect::Postgres => "",
            Dialect::Sqlite => " INDEXED BY _tm_runs_queue",
        }
    }

    /// Locks the selected rows, skipping rows another transaction holds: a
    /// claim never waits behind another worker. SQLite has one writer, so
    /// its claim transaction already excludes every other.
    fn skip_locked(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        }
    }

    /// The larger of two values.
    fn greatest(self) -> &'static str {
        match self {
            Dialect::Postgres => "GREATEST",
            Dialect::Sqlite => "MAX",
        }
    }
}

/// What a claim reads of a run row (the claim rules' snapshot,
/// `rules::Snapshot`, the run key and the counts a resumed attempt
/// continues from).
fn claim_columns(d: Dialect) -> String {
    format!(
        "id, pipeline, source, export_type, period_start, period_end, status, attempt, run_id, lease_owner,
         lease_host, lease_pid, lease_expires_at,
         CAST(CASE WHEN lease_expires_at > {now} THEN 1 ELSE 0 END AS BIGINT) AS lease_live,
         CAST(CASE WHEN provisional THEN 1 ELSE 0 END AS BIGINT) AS provisional,
         checkpoint, batches, result, handler_version, fields_fingerprint, {counts}",
        now = d.now(),
        counts = Counts::COLUMNS.join(", ")
    )
}

/// `$first, $first+1, ...`: `n` numbered parameters.
fn params(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

ledger_params! {
    /// The parameters of [`Statements::start_attempt`].
    StartAttempt<'a> {
        /// The new attempt's number.
        attempt: i64,
        /// The run id its rows are stamped with (kept when it resumes).
        run_id: &'a str,
        /// The lease owner (`host:pid:instance`).
        owner: &'a str,
        /// The holder's host.
        host: &'a str,
        /// The holder's process id.
        pid: i64,
        /// How long the lease lasts unless renewed.
        lease: Duration,
        /// The period starts over: the checkpoint is cleared and
        /// `started_at` set (a resumed attempt keeps both).
        fresh: bool,
        /// Batches the run has committed.
        batches: i64,
        /// The counts the attempt continues from.
        counts: Counts,
        /// The pipeline's handler version.
        handler_version: &'a str,
        /// The run row's id.
        run_ref: i64,
        /// The period is still open (`--allow-open`).
        provisional: bool,
        /// The `[fields]` fingerprint, fields new to the period marked.
        fingerprint: &'a str,
    }
}

ledger_params! {
    /// The parameters of [`Statements::insert_attempt`]: an attempt's
    /// history row, `running`.
    InsertAttempt<'a> {
        /// The run row's id.
        run_ref: i64,
        /// The attempt's number.
        attempt: i64,
        /// Its run id.
        run_id: &'a str,
        /// Its worker (the lease owner).
        owner: &'a str,
        /// It starts the period over (else it resumes, from `batches`).
        fresh: bool,
        /// The batches it continues from when it resumes.
        batches: i64,
        /// The key was claimed from the queue (`pending`): its
        /// `enqueued_at` becomes the attempt's `queued_at`.
        queued: bool,
    }
}

ledger_params! {
    /// The parameters of [`Statements::begin_attempt`]: those of
    /// [`Statements::start_attempt`] and whether the key was queued.
    BeginAttempt<'a> {
        /// The run row's new attempt.
        start: StartAttempt<'a>,
        /// The key was claimed from the queue (`pending`).
        queued: bool,
    }
}

ledger_params! {
    /// The parameters of [`Statements::create_running`]: a run key with no
    /// ledger row, created with its first attempt started.
    CreateRunning<'a> {
        /// Pipeline of the run key.
        pipeline: &'a str,
        /// Source of the run key.
        source: &'a str,
        /// Export type of the run key.
        export_type: &'a str,
        /// Period start of the run key.
        period_start: &'a str,
        /// Period end.
        period_end: &'a str,
        /// The first attempt's run id.
        run_id: &'a str,
        /// The lease owner (`host:pid:instance`).
        owner: &'a str,
        /// The holder's host.
        host: &'a str,
        /// The holder's process id.
        pid: i64,
        /// How long the lease lasts unless renewed.
        lease: Duration,
        /// The pipeline's handler version.
        handler_version: &'a str,
        /// The period is still open (`--allow-open`).
        provisional: bool,
        /// The `[fields]` fingerprint.
        fingerprint: &'a str,
    }
}

ledger_params! {
    /// The parameters of [`Statements::end_attempt`].
    EndAttempt<'a> {
        /// How the attempt ended.
        status: AttemptStatus,
        /// Its final counts.
        counts: Counts,
        /// Its failure's class, if it failed.
        class: Option<StoredClass>,
        /// Its failure's message, if it failed.
        message: Option<&'a str>,
        /// The run row's id.
        run_ref: i64,
        /// The attempt's number.
        attempt: i64,
    }
}

ledger_params! {
    /// The parameters of [`Statements::save_progress`].
    SaveProgress<'a> {
        /// The checkpoint to resume from, or NULL to keep the stored one.
        checkpoint: Option<&'a serde_json::Value>,
        /// Batches committed (the stored number only grows).
        batches: i64,
        /// The run's counts so far.
        counts: Counts,
        /// The run row's id.
        run_ref: i64,
    }
}

ledger_params! {
    /// The parameters of [`Statements::finish_run`].
    FinishRun<'a> {
        /// The canonical result (its `finished_at` is set by the database).
        result: &'a serde_json::Value,
        /// The final counts.
        counts: Counts,
        /// The run row's id.
        run_ref: i64,
    }
}

ledger_params! {
    /// The parameters of [`Statements::finish_done`].
    FinishDone<'a> {
        /// The canonical result (its `finished_at` is set by the database).
        result: &'a serde_json::Value,
        /// The final counts (the run row's and the attempt's).
        counts: Counts,
        /// The run row's id.
        run_ref: i64,
        /// The attempt that finished.
        attempt: i64,
    }
}

ledger_params! {
    /// The parameters of [`Statements::mark_run`].
    MarkRun<'a> {
        /// The mark's attempt number (the row's + 1).
        attempt: i64,
        /// A new run id (no row carries it: nothing was loaded).
        run_id: &'a str,
        /// The canonical result (its `finished_at` is set by the database).
        result: &'a serde_json::Value,
        /// The pipeline's handler version.
        handler_version: &'a str,
        /// The pipeline's `[fields]` fingerprint.
        fingerprint: &'a str,
        /// `done` or `skipped`.
        marked: &'a str,
        /// The operator's note.
        note: &'a str,
        /// The run row's id.
        run_ref: i64,
    }
}

ledger_params! {
    /// The parameters of [`Statements::insert_reject`].
    InsertReject<'a> {
        /// Pipeline of the run key.
        pipeline: &'a str,
        /// Source of the run key.
        source: &'a str,
        /// Export type of the run key.
        export_type: &'a str,
        /// Period start of the run key.
        period_start: &'a str,
        /// The run that read the record.
        run_id: &'a str,
        /// Where in the source the record is.
        location: &'a str,
        /// The field at fault, if one.
        field: Option<&'a str>,
        /// Its raw value, if one.
        value: Option<&'a str>,
        /// Why the record was rejected.
        reason: &'a str,
        /// The record as read.
        record: &'a serde_json::Value,
    }
}

ledger_params! {
    /// The parameters of [`Statements::enqueue_new`].
    EnqueueNew<'a> {
        /// Pipeline of the keys.
        pipeline: &'a str,
        /// Export type of the keys.
        export_type: &'a str,
        /// Claim order: each point is one minute of head start.
        priority: i64,
        /// Who queues them (`schedule`, `backfill`, `operator`).
        enqueued_by: &'a str,
        /// The keys, a JSON array of `[source, period start, period end]`.
        keys: &'a serde_json::Value,
    }
}

ledger_params! {
    /// The parameters of [`Statements::requeue`].
    Requeue<'a> {
        /// Pipeline of the keys.
        pipeline: &'a str,
        /// Export type of the keys.
        export_type: &'a str,
        /// Claim order: each point is one minute of head start.
        priority: i64,
        /// Who queues them (`schedule`, `backfill`, `operator`).
        enqueued_by: &'a str,
        /// A failed key waits for its `not_before` (the scheduler), or not
        /// (an operator: at once).
        respect_backoff: bool,
        /// The keys, a JSON array of `[source, period start]`.
        keys: &'a serde_json::Value,
    }
}

/// The ledger's statements in one dialect.
pub(crate) struct Statements {
    /// Creates the run key's row unless it exists. `$1..$5`: pipeline,
    /// source, export type, period start, period end.
    pub insert_run: String,
    /// Creates the run key's row unless it exists, already `running` with
    /// its first attempt started (the values [`Statements::start_attempt`]
    /// would set on a new row), and returns its `id`: a row comes back only
    /// when this transaction created it, locked by that insert, so the
    /// first claim of a key needs no [`Statements::lock_run`], no
    /// `start_attempt` and no claim rules (a key without a row can only be
    /// started fresh). Binds [`CreateRunning`]. On SQLite the attempt's
    /// history row follows ([`Statements::insert_attempt`]).
    pub create_running: String,
    /// PostgreSQL: [`Statements::create_running`] and the attempt's history
    /// row in one statement (a data-modifying `WITH`), returning `id` only
    /// when the row was created. Binds [`CreateRunning`].
    pub create_running_logged: Option<String>,
    /// Reads and locks the run key's row, or returns nothing when another
    /// transaction holds it (PostgreSQL: a claim never waits behind a
    /// batch). `$1..$4`: the run key.
    pub lock_run: String,
    /// The rows of some run keys of a pipeline and export type, with what
    /// a claim would read of them, without locking (planning, dry runs).
    /// `$1` pipeline, `$2` export type, `$3` the keys as a JSON array of
    /// `[source, period start]`: one indexed lookup per key.
    pub key_rows: String,
    /// The starts of a source's done rows, latest instant first (`sync`'s
    /// lookback); marked rows (`tidemark mark`) are not among them: no
    /// lookback re-reads a period an operator recorded as loaded elsewhere
    /// or empty. `$1` pipeline, `$2` export type, `$3` source, `$4` limit,
    /// `$5` offset.
    pub done_starts: String,
    /// Reads the run key's row without locking it (who holds it, when
    /// [`Statements::lock_run`] skipped it). `$1..$4`: the run key.
    pub read_run: String,
    /// `$1`: run ref. Marks a crashed attempt lost.
    pub lose_running_attempts: String,
    /// `$1`: run ref, `$2`: run id.
    pub select_seen: String,
    /// `$1`: run ref.
    pub delete_batches: String,
    /// Starts an attempt on the run row: binds [`StartAttempt`].
    pub start_attempt: String,
    /// The attempt's history row, `running`: binds [`InsertAttempt`].
    pub insert_attempt: String,
    /// PostgreSQL: [`Statements::start_attempt`] and the attempt's history
    /// row in one statement (a data-modifying `WITH`), a round trip less
    /// for every claim of an existing row. Binds [`BeginAttempt`]. SQLite
    /// runs the two.
    pub begin_attempt: Option<String>,
    /// `$1` lease seconds, `$2` run ref, `$3` attempt.
    pub heartbeat: String,
    /// Bounds the heartbeat transaction's row-lock waits: `$1`
    /// milliseconds (PostgreSQL's `lock_timeout`, for this transaction).
    pub heartbeat_patience: Option<String>,
    /// `$1` run ref, `$2` attempt. The first statement of every write
    /// transaction of an attempt.
    pub fence: String,
    /// `$1` class, `$2` message, `$3` run ref, `$4` attempt, `$5` rows
    /// expected (or NULL). The back-off counts from the database's clock.
    pub fail_run: String,
    /// Ends an attempt's history row: binds [`EndAttempt`].
    pub end_attempt: String,
    /// `$1` new run id, `$2` run ref.
    pub restart_run: String,
    /// `$1` new run id, `$2` run ref, `$3` attempt.
    pub restart_attempt: String,
    /// A committed batch's checkpoint and counts: binds [`SaveProgress`].
    pub save_progress: String,
    /// Marks the run done: binds [`FinishRun`]. Returns the stored result.
    pub finish_run: String,
    /// [`Statements::finish_run`] and [`Statements::end_attempt`] (status
    /// `done`) in one statement, a round trip less for every period
    /// (PostgreSQL: a data-modifying `WITH`): binds [`FinishDone`].
    /// SQLite runs the two.
    pub finish_done: Option<String>,
    /// `$1` run ref, `$2` run id, `$3` batch number, `$4` key hashes.
    pub insert_batch_keys: String,
    /// Records a run key `done` without a run (`tidemark mark`): binds
    /// [`MarkRun`]. Everything a finished run sets, with zero counts, and
    /// no lease, checkpoint, error or back-off.
    pub mark_run: String,
    /// The attempt of a mark: `done` at once, zero counts. `$1` run ref,
    /// `$2` attempt, `$3` run id, `$4` worker, `$5` marked, `$6` note.
    pub insert_mark_attempt: String,
    /// Keeps a rejected record: binds [`InsertReject`].
    pub insert_reject: String,
    /// `$1` pipeline, `$2` period start or NULL.
    pub status: String,
    /// A run key's attempts, oldest first. `$1..$4`: the run key.
    pub attempts: String,
    /// A run's first rejected records. `$1..$4`: the run key, `$5` run
    /// id, `$6` limit.
    pub rejects: String,
    /// How many records a run rejected (`n`). `$1..$4`: the run key, `$5`
    /// run id.
    pub reject_count: String,
    /// `$1` age in seconds (from the database's clock, which stamped them).
    pub prune_attempts: String,
    /// `$1` age in seconds.
    pub prune_rejects: String,
    /// `$1` run ref, `$2` attempt, `$3` message: back to `pending` with the
    /// lease released and the checkpoint kept.
    pub interrupt_run: String,
    /// Wakes idle workers of every process: PostgreSQL's NOTIFY on
    /// [`QUEUE_CHANNEL`], delivered when the transaction commits. SQLite
    /// workers poll.
    pub notify_queue: Option<String>,
    /// Refreshes the planner's statistics of `_tm_runs` after a large
    /// enqueue (PostgreSQL). A ledger that grew from nothing has none, and
    /// without them the planner sorts every pending key on each claim
    /// instead of reading the queue index: 17 ms a claim at 10,000 pending
    /// keys, growing with the queue (measured; ADR 0011).
    pub analyze_runs: Option<String>,
    dialect: Dialect,
}

/// The PostgreSQL channel queue workers LISTEN on.
pub(crate) const QUEUE_CHANNEL: &str = "tidemark_queue";

impl Statements {
    /// The statements of `dialect`, built on first use.
    pub(crate) fn of(dialect: Dialect) -> &'static Statements {
        static POSTGRES: OnceLock<Statements> = OnceLock::new();
        static SQLITE: OnceLock<Statements> = OnceLock::new();
        let cell = match dialect {
            Dialect::Postgres => &POSTGRES,
            Dialect::Sqlite => &SQLITE,
        };
        cell.get_or_init(|| Statements::build(dialect))
    }

    fn build(d: Dialect) -> Statements {
        let now = d.now();
        let run_key = "pipeline = $1 AND source = $2 AND export_type = $3 AND period_start = $4";
        let claim_columns = claim_columns(d);
        // Every count column set to its named placeholder (`rows_read =
        // $rows_read`): a parameter struct's `counts` field.
        let count_sets = Counts::COLUMNS
            .iter()
            .map(|c| format!("{c} = ${c}"))
            .collect::<Vec<_>>()
            .join(", ");
        // Every count column at its value of no run: 0, `rows_expected` NULL.
        let zero_values = Counts::default()
            .values()
            .iter()
            .map(|v| v.map_or("NULL".to_string(), |n| n.to_string()))
            .collect::<Vec<_>>();
        let zero_counts = Counts::COLUMNS
            .iter()
            .zip(&zero_values)
            .map(|(c, v)| format!("{c} = {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let zero_values = zero_values.join(", ");
        let running = RunStatus::Running.as_str();
        let attempt_running = AttemptStatus::Running.as_str();
        let release =
            "lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL";
        // `done` with the final counts, on the run row and on an attempt's
        // (whose status, class and message are given): written once for
        // `finish_run`, `end_attempt` and PostgreSQL's `finish_done`.
        let finish_run = format!(
            "UPDATE _tm_runs SET status = '{}', result = {}, finished_at = {now},
                    checkpoint = NULL, {release}, failures = 0, not_before = NULL, {count_sets}
             WHERE id = $run_ref
             RETURNING result",
            RunStatus::Done.as_str(),
            d.with_finished_at("$result"),
        );
        let end_attempt = |status: &str, class: &str, message: &str| {
            format!(
                "UPDATE _tm_attempts SET status = {status}, {count_sets}, error_class = {class},
                        error_message = {message}, finished_at = {now}
                 WHERE run_ref = $run_ref AND attempt = $attempt"
            )
        };
        let insert_run = format!(
            "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, {now}, {now})
             ON CONFLICT (pipeline, source, export_type, period_start) DO NOTHING"
        );
        // The attempt's history row, `running`, from `values` (a `VALUES`
        // list or a `SELECT`): written once for `insert_attempt`,
        // `begin_attempt` and `create_running_logged`.
        let attempt_row = |values: &str| {
            format!(
                "INSERT INTO _tm_attempts (run_ref, attempt, run_id, worker, status, resumed, from_batch, started_at,
                                           queued_at)
                 {values}"
            )
        };
        let attempt_values = format!(
            "VALUES ($run_ref, $attempt, $run_id, $owner, '{attempt_running}', NOT $fresh,
                     CASE WHEN $fresh THEN NULL ELSE $batches END, {now},
                     CASE WHEN $queued THEN (SELECT enqueued_at FROM _tm_runs WHERE id = $run_ref) END)"
        );
        let start_attempt = format!(
            "UPDATE _tm_runs SET status = '{running}', attempt = $attempt, run_id = $run_id,
                    lease_owner = $owner, lease_host = $host, lease_pid = $pid,
                    lease_expires_at = {lease},
                    checkpoint = CASE WHEN $fresh THEN NULL ELSE checkpoint END,
                    batches = $batches, {count_sets},
                    error_class = NULL, error_message = NULL, result = NULL,
                    handler_version = $handler_version,
                    started_at = CASE WHEN $fresh THEN {now} ELSE started_at END,
                    finished_at = NULL, updated_at = {now}, provisional = $provisional,
                    fields_fingerprint = $fingerprint, marked = NULL, mark_note = NULL
             WHERE id = $run_ref",
            lease = d.now_plus("$lease"),
        );
        // A new row as `start_attempt` leaves one it found `pending` with no
        // attempt: attempt 1, fresh, zero counts, the lease taken.
        let create_running = format!(
            "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, status, attempt,
                                   run_id, lease_owner, lease_host, lease_pid, lease_expires_at, batches,
                                   {counts}, handler_version, started_at, provisional, fields_fingerprint,
                                   created_at, updated_at)
             VALUES ($pipeline, $source, $export_type, $period_start, $period_end, '{running}', 1,
                     $run_id, $owner, $host, $pid, {lease}, 0,
                     {zero_values}, $handler_version, {now}, $provisional, $fingerprint,
                     {now}, {now})
             ON CONFLICT (pipeline, source, export_type, period_start) DO NOTHING
             RETURNING id",
            counts = Counts::COLUMNS.join(", "),
            lease = d.now_plus("$lease"),
        );
        Statements {
            create_running: number(&create_running, &CreateRunning::names()),
            create_running_logged: match d {
                Dialect::Postgres => Some(number(
                    &format!(
                        "WITH run AS ({create_running}) {} RETURNING run_ref AS id",
                        attempt_row(&format!(
                            "SELECT id, 1, $run_id, $owner, '{attempt_running}', FALSE, CAST(NULL AS BIGINT),
                                    {now}, CAST(NULL AS TIMESTAMPTZ)
                             FROM run"
                        )),
                    ),
                    &CreateRunning::names(),
                )),
                Dialect::Sqlite => None,
            },
            insert_run,
            lock_run: format!(
                "SELECT {claim_columns} FROM _tm_runs WHERE {run_key}{}",
                d.skip_locked()
            ),
            key_rows: format!(
                "SELECT r.*, CAST(CASE WHEN r.lease_expires_at > {now} THEN 1 ELSE 0 END AS BIGINT) AS lease_live,
                        CAST(CASE WHEN r.not_before > {now} THEN 1 ELSE 0 END AS BIGINT) AS backing_off
                 FROM {}",
                d.rows_of_keys("$3", "$1", "$2", "*"),
            ),
            done_starts: format!(
                "SELECT period_start FROM _tm_runs
                 WHERE pipeline = $1 AND export_type = $2 AND source = $3 AND status = '{}'
                   AND marked IS NULL
                 ORDER BY {} DESC, period_start DESC LIMIT $4 OFFSET $5",
                RunStatus::Done.as_str(),
                d.instant("period_start"),
            ),
            read_run: format!("SELECT {claim_columns} FROM _tm_runs WHERE {run_key}"),
            lose_running_attempts: format!(
                "UPDATE _tm_attempts SET status = '{}', finished_at = {now}
                 WHERE run_ref = $1 AND status = '{attempt_running}'",
                AttemptStatus::Lost.as_str()
            ),
            select_seen: "SELECT key_hashes FROM _tm_batches WHERE run_ref = $1 AND run_id = $2"
                .to_string(),
            delete_batches: "DELETE FROM _tm_batches WHERE run_ref = $1".to_string(),
            start_attempt: number(&start_attempt, &StartAttempt::names()),
            insert_attempt: number(&attempt_row(&attempt_values), &InsertAttempt::names()),
            begin_attempt: match d {
                Dialect::Postgres => Some(number(
                    &format!(
                        "WITH history AS ({}) {start_attempt}",
                        attempt_row(&attempt_values)
                    ),
                    &BeginAttempt::names(),
                )),
                Dialect::Sqlite => None,
            },
            heartbeat: format!(
                "UPDATE _tm_runs SET lease_expires_at = {}
                 WHERE id = $2 AND attempt = $3 AND status = '{running}'",
                d.now_plus("$1")
            ),
            heartbeat_patience: match d {
                Dialect::Postgres => {
                    Some("SELECT set_config('lock_timeout', $1, true)".to_string())
                }
                Dialect::Sqlite => None,
            },
            fence: match d {
                // A row lock that claims wait for (or skip) but the
                // heartbeat does not: see `Dialect::key_share`. Under READ
                // COMMITTED a fence that waited for a takeover's commit
                // re-reads the new row version, finds `attempt` changed
                // and returns nothing.
                Dialect::Postgres => format!(
                    "SELECT id FROM _tm_runs
                     WHERE id = $1 AND attempt = $2 AND status = '{running}'{}",
                    d.key_share()
                ),
                Dialect::Sqlite => format!(
                    "UPDATE _tm_runs SET updated_at = {now}
                     WHERE id = $1 AND attempt = $2 AND status = '{running}'"
                ),
            },
            fail_run: format!(
                "UPDATE _tm_runs SET status = '{}', error_class = $1, error_message = $2, finished_at = {now},
                        {release}, failures = failures + 1, not_before = {}, updated_at = {now},
                        rows_expected = $5
                 WHERE id = $3 AND attempt = $4 AND status = '{running}'",
                RunStatus::Failed.as_str(),
                d.backoff_from_now("failures"),
            ),
            end_attempt: number(
                &end_attempt("$status", "$class", "$message"),
                &EndAttempt::names(),
            ),
            restart_run: format!(
                "UPDATE _tm_runs SET checkpoint = NULL, batches = 0, {}, run_id = $1 WHERE id = $2",
                Counts::COLUMNS
                    .iter()
                    .zip(Counts::default().values())
                    .map(|(c, v)| format!("{c} = {}", v.map_or("NULL".to_string(), |n| n.to_string())))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            restart_attempt:
                "UPDATE _tm_attempts SET run_id = $1 WHERE run_ref = $2 AND attempt = $3".to_string(),
            save_progress: number(
                &format!(
                    "UPDATE _tm_runs SET checkpoint = COALESCE($checkpoint, checkpoint),
                            batches = {}(batches, $batches), {count_sets}
                     WHERE id = $run_ref",
                    d.greatest(),
                ),
                &SaveProgress::names(),
            ),
            // The final counts go with `done`, in the same statement; the
            // result's `finished_at` is the database's clock, as the column.
            finish_run: number(&finish_run, &FinishRun::names()),
            finish_done: match d {
                Dialect::Postgres => Some(number(
                    &format!(
                        "WITH attempt AS ({}) {finish_run}",
                        end_attempt(&format!("'{}'", AttemptStatus::Done.as_str()), "NULL", "NULL"),
                    ),
                    &FinishDone::names(),
                )),
                Dialect::Sqlite => None,
            },
            mark_run: number(
                &format!(
                    "UPDATE _tm_runs SET status = '{}', attempt = $attempt, run_id = $run_id, {release},
                            checkpoint = NULL, batches = 0, {zero_counts},
                            error_class = NULL, error_message = NULL, result = {},
                            handler_version = $handler_version, fields_fingerprint = $fingerprint,
                            provisional = FALSE, started_at = {now}, finished_at = {now}, updated_at = {now},
                            failures = 0, not_before = NULL, marked = $marked, mark_note = $note
                     WHERE id = $run_ref",
                    RunStatus::Done.as_str(),
                    d.with_finished_at("$result"),
                ),
                &MarkRun::names(),
            ),
            insert_mark_attempt: format!(
                "INSERT INTO _tm_attempts (run_ref, attempt, run_id, worker, status, resumed, from_batch,
                                           {counts}, started_at, finished_at, marked, mark_note)
                 VALUES ($1, $2, $3, $4, '{}', FALSE, NULL, {zero_values}, {now}, {now}, $5, $6)",
                AttemptStatus::Done.as_str(),
                counts = Counts::COLUMNS.join(", "),
            ),
            insert_batch_keys:
                "INSERT INTO _tm_batches (run_ref, run_id, batch_no, key_hashes) VALUES ($1, $2, $3, $4)"
                    .to_string(),
            insert_reject: number(
                &format!(
                    "INSERT INTO _tm_rejects (pipeline, source, export_type, period_start, run_id,
                                              location, field, value, reason, record, created_at)
                     VALUES ($pipeline, $source, $export_type, $period_start, $run_id,
                             $location, $field, $value, $reason, $record, {now})"
                ),
                &InsertReject::names(),
            ),
            // Compared and ordered as instants: the text of a period start
            // carries its local offset, so text order puts the second
            // 02:00 of a DST fall-back day before the first.
            status: format!(
                "SELECT *, CAST(CASE WHEN not_before > {now} THEN 1 ELSE 0 END AS BIGINT) AS backing_off
                 FROM _tm_runs WHERE pipeline = $1
                   AND ($2 IS NULL OR {start} >= {from}) AND ($3 IS NULL OR {start} <= {to})
                 ORDER BY {start}, source, export_type",
                start = d.instant("period_start"),
                from = d.instant("$2"),
                to = d.instant("$3"),
            ),
            attempts: format!(
                "SELECT a.attempt, a.run_id, a.worker, a.status,
                        CAST(CASE WHEN a.resumed THEN 1 ELSE 0 END AS BIGINT) AS resumed, a.from_batch,
                        a.rows_read, a.rows_inserted, a.rows_updated, a.rows_deleted, a.rows_rejected,
                        a.error_class, a.error_message, a.started_at, a.finished_at,
                        a.marked, a.mark_note
                 FROM _tm_attempts a JOIN _tm_runs r ON r.id = a.run_ref
                 WHERE r.{} ORDER BY a.attempt",
                run_key.replace(" AND ", " AND r.")
            ),
            rejects: format!(
                "SELECT location, field, value, reason FROM _tm_rejects
                 WHERE {run_key} AND run_id = $5 ORDER BY id LIMIT $6"
            ),
            reject_count: format!(
                "SELECT COUNT(*) AS n FROM _tm_rejects WHERE {run_key} AND run_id = $5"
            ),
            prune_attempts: format!(
                "DELETE FROM _tm_attempts WHERE finished_at IS NOT NULL AND finished_at < {}",
                d.now_minus_secs("$1")
            ),
            prune_rejects: format!(
                "DELETE FROM _tm_rejects WHERE created_at < {}",
                d.now_minus_secs("$1")
            ),
            interrupt_run: format!(
                "UPDATE _tm_runs SET status = '{}', error_class = '{}', error_message = $3, {release},
                        not_before = NULL, enqueued_at = COALESCE(enqueued_at, {now}), queue_rank = COALESCE(queue_rank, {now}),
                        enqueued_by = COALESCE(enqueued_by, 'operator'), updated_at = {now}
                 WHERE id = $1 AND attempt = $2 AND status = '{running}'",
                RunStatus::Pending.as_str(),
                StoredClass::Interrupted.as_str(),
            ),
            analyze_runs: match d {
                Dialect::Postgres => Some("ANALYZE _tm_runs".to_string()),
                Dialect::Sqlite => None,
            },
            notify_queue: match d {
                Dialect::Postgres => Some(format!("SELECT pg_notify('{QUEUE_CHANNEL}', '')")),
                Dialect::Sqlite => None,
            },
            dialect: d,
        }
    }

    /// The first claimable key of the queue among `pipelines` pipelines
    /// (`$1..$n`, with their due cut-offs `$n+1..$2n`): `pending`, and due
    /// or continuing a provisional attempt ([`Statements::claimable`]), by
    /// rank. A pending key is claimable at once: the back-off belongs to
    /// failed keys, which re-enter the queue only once it has passed.
    pub(crate) fn queue_next(&self, pipelines: usize) -> String {
        self.queue_head(pipelines, self.dialect.skip_locked())
    }

    /// [`Statements::queue_next`] without taking a lock: whether anything
    /// pending is claimable, for a draining worker.
    pub(crate) fn queue_peek(&self, pipelines: usize) -> String {
        self.queue_head(pipelines, "")
    }

    /// The first claimable pending key by rank, read through the queue
    /// index ([`Dialect::by_queue_index`]), then `lock`.
    fn queue_head(&self, pipelines: usize, lock: &str) -> String {
        let d = self.dialect;
        format!(
            "SELECT {} FROM _tm_runs{}
             WHERE status = '{}' AND pipeline IN ({}) AND {}
             ORDER BY queue_rank LIMIT 1{lock}",
            claim_columns(d),
            d.by_queue_index(),
            RunStatus::Pending.as_str(),
            params(1, pipelines),
            self.claimable(1, pipelines),
        )
    }

    /// The queue's open-period rule in SQL: the key's period is due (its
    /// end at or before its pipeline's cut-off: pipeline names from
    /// `$first`, cut-offs right after them), or its last attempt was
    /// provisional (`--allow-open`), which a claim continues, provisional.
    /// The same rule as [`super::QueuePipeline::is_due`] in `claim_next`.
    fn claimable(&self, first: usize, pipelines: usize) -> String {
        let d = self.dialect;
        let cutoffs: String = (0..pipelines)
            .map(|i| {
                format!(
                    " WHEN ${} THEN {}",
                    first + i,
                    d.instant(&format!("${}", first + pipelines + i))
                )
            })
            .collect();
        format!(
            "(provisional OR {} <= CASE pipeline{cutoffs} END)",
            d.instant("period_end")
        )
    }

    /// Running keys among `pipelines` (`$2..`) that a worker on host `$1` may
    /// be able to take over: the lease has expired, or the holder ran on
    /// this host (the claim rules then check whether it is alive). Read
    /// without a lock: most are live holders on this host, whose rows a
    /// lock would make their own batch commits wait for.
    pub(crate) fn takeover_candidates(&self, pipelines: usize) -> String {
        let d = self.dialect;
        format!(
            "SELECT {} FROM _tm_runs
             WHERE status = '{}' AND (lease_expires_at IS NULL OR lease_expires_at <= {} OR lease_host = $1)
               AND pipeline IN ({})
             ORDER BY lease_expires_at LIMIT 16",
            claim_columns(d),
            RunStatus::Running.as_str(),
            d.now(),
            params(2, pipelines),
        )
    }

    /// A running key (`$1`, its id) that the claim rules found takeable,
    /// locked and read again, unless another claim holds it.
    pub(crate) fn lock_running(&self) -> String {
        let d = self.dialect;
        format!(
            "SELECT {} FROM _tm_runs WHERE id = $1 AND status = '{}'{}",
            claim_columns(d),
            RunStatus::Running.as_str(),
            d.skip_locked()
        )
    }

    /// Inserts run keys as `pending`, skipping keys that exist: binds
    /// [`EnqueueNew`]. The keys are one JSON parameter however many they
    /// are, so a chunk of thousands is one short statement for the database
    /// to parse.
    pub(crate) fn enqueue_new(&self) -> String {
        let d = self.dialect;
        let now = d.now();
        let sql = format!(
            "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, status, priority,
                                   enqueued_at, enqueued_by, queue_rank, created_at, updated_at)
             SELECT $pipeline, {}, $export_type, {}, {}, '{}', $priority, {now}, $enqueued_by, {},
                    {now}, {now}
             FROM {} WHERE true
             ON CONFLICT (pipeline, source, export_type, period_start) DO NOTHING",
            d.json_element(0),
            d.json_element(1),
            d.json_element(2),
            RunStatus::Pending.as_str(),
            d.now_minus_minutes("$priority"),
            d.json_rows("$keys"),
        );
        number(&sql, &EnqueueNew::names())
    }

    /// Puts existing keys in `states` back into the queue, fresh (no
    /// checkpoint): binds [`Requeue`]. A failed key waits for its
    /// `not_before` by the database's clock when `respect_backoff`. The
    /// keys are looked up one by one by index ([`Dialect::rows_of_keys`]: an
    /// `UPDATE ... FROM` scanned every row of the pipeline once per key on
    /// SQLite, and per statement on PostgreSQL with stale statistics).
    pub(crate) fn requeue(&self, states: &[RunStatus]) -> String {
        let d = self.dialect;
        let now = d.now();
        let states: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
        let sql = format!(
            "UPDATE _tm_runs SET status = '{}', priority = $priority, enqueued_at = {now},
                    enqueued_by = $enqueued_by, queue_rank = {}, checkpoint = NULL, not_before = NULL,
                    marked = NULL, mark_note = NULL, updated_at = {now}
             WHERE _tm_runs.id IN (SELECT r.id FROM {})
               AND _tm_runs.status IN ({})
               AND (NOT $respect_backoff OR _tm_runs.not_before IS NULL
                    OR _tm_runs.not_before <= {now})",
            RunStatus::Pending.as_str(),
            d.now_minus_minutes("$priority"),
            d.rows_of_keys("$keys", "$pipeline", "$export_type", "id"),
            states.join(", "),
        );
        number(&sql, &Requeue::names())
    }

    /// Takes `pending` keys of pipeline `$1` out of the queue, optionally
    /// only source `$2` and periods starting from `$3` to `$4` (instants).
    pub(crate) fn cancel(&self) -> String {
        let d = self.dialect;
        format!(
            "UPDATE _tm_runs SET status = '{}', updated_at = {}
             WHERE pipeline = $1 AND status = '{}' AND ($2 IS NULL OR source = $2)
               AND ($3 IS NULL OR {} >= {}) AND ($4 IS NULL OR {} <= {})",
            RunStatus::Cancelled.as_str(),
            d.now(),
            RunStatus::Pending.as_str(),
            d.instant("period_start"),
            d.instant("$3"),
            d.instant("period_start"),
            d.instant("$4"),
        )
    }

    /// Running keys left for a draining worker of `pipelines` (`$2..`) on
    /// host `$1`: those whose lease has expired or whose holder ran on this
    /// host (maybe dead, maybe of a period still open: the worker checks,
    /// with the claim's rules). Pending keys are [`Statements::queue_peek`]'s:
    /// one indexed row, where reading every pending key cost O(backlog).
    pub(crate) fn running_leftovers(&self, pipelines: usize) -> String {
        let d = self.dialect;
        format!(
            "SELECT pipeline, period_end, lease_host, lease_pid,
                    CAST(CASE WHEN lease_expires_at > {now} THEN 1 ELSE 0 END AS BIGINT) AS lease_live,
                    CAST(CASE WHEN provisional THEN 1 ELSE 0 END AS BIGINT) AS provisional
             FROM _tm_runs
             WHERE status = '{}' AND (lease_expires_at IS NULL OR lease_expires_at <= {now} OR lease_host = $1)
               AND pipeline IN ({})",
            RunStatus::Running.as_str(),
            params(2, pipelines),
            now = d.now(),
        )
    }

    /// The database's plan of `sql`, as rows of text.
    pub(crate) fn explain(&self, sql: &str) -> String {
        match self.dialect {
            Dialect::Postgres => format!("EXPLAIN {sql}"),
            Dialect::Sqlite => format!("EXPLAIN QUERY PLAN {sql}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$n` a statement uses is numbered from 1 without gaps, so the
    /// flow's argument lists line up on both databases.
    #[test]
    fn parameters_are_numbered_without_gaps() {
        for dialect in [Dialect::Postgres, Dialect::Sqlite] {
            let s = Statements::of(dialect);
            for sql in [
                &s.insert_run,
                &s.lock_run,
                &s.key_rows,
                &s.done_starts,
                &s.start_attempt,
                &s.insert_attempt,
                &s.create_running,
                &s.end_attempt,
                &s.save_progress,
                &s.finish_run,
                &s.mark_run,
                &s.insert_mark_attempt,
                &s.heartbeat,
                &s.insert_reject,
                &s.fail_run,
                &s.queue_next(3),
                &s.takeover_candidates(2),
                &s.enqueue_new(),
                &s.requeue(&[RunStatus::Failed]),
                &s.cancel(),
                &s.running_leftovers(1),
                &s.queue_peek(2),
            ]
            .into_iter()
            .chain(s.finish_done.as_ref())
            .chain(s.begin_attempt.as_ref())
            .chain(s.create_running_logged.as_ref())
            {
                let mut used: Vec<usize> = sql
                    .match_indices('$')
                    .filter_map(|(i, _)| {
                        let digits: String = sql[i + 1..]
                            .chars()
                            .take_while(char::is_ascii_digit)
                            .collect();
                        digits.parse().ok()
                    })
                    .collect();
                used.sort_unstable();
                used.dedup();
                assert_eq!(used, (1..=used.len()).collect::<Vec<_>>(), "{sql}");
            }
        }
    }

    /// A statement written with named placeholders uses every parameter of
    /// its struct: a field the text forgot would shift nothing (the numbers
    /// follow the struct) but bind a value nobody reads.
    #[test]
    fn named_statements_use_every_parameter_of_their_struct() {
        for dialect in [Dialect::Postgres, Dialect::Sqlite] {
            let s = Statements::of(dialect);
            for (sql, params) in [
                (&s.start_attempt, StartAttempt::names().len()),
                (&s.insert_attempt, InsertAttempt::names().len()),
                (&s.create_running, CreateRunning::names().len()),
                (&s.end_attempt, EndAttempt::names().len()),
                (&s.save_progress, SaveProgress::names().len()),
                (&s.finish_run, FinishRun::names().len()),
                (&s.mark_run, MarkRun::names().len()),
                (&s.insert_reject, InsertReject::names().len()),
                (&s.enqueue_new(), EnqueueNew::names().len()),
                (&s.requeue(&[RunStatus::Failed]), Requeue::names().len()),
            ]
            .into_iter()
            .chain(
                s.finish_done
                    .as_ref()
                    .map(|sql| (sql, FinishDone::names().len())),
            )
            .chain(
                s.begin_attempt
                    .as_ref()
                    .map(|sql| (sql, BeginAttempt::names().len())),
            )
            .chain(
                s.create_running_logged
                    .as_ref()
                    .map(|sql| (sql, CreateRunning::names().len())),
            ) {
                let highest = (1..=params).rev().find(|n| {
                    sql.match_indices(&format!("${n}"))
                        .any(|(i, m)| !sql[i + m.len()..].starts_with(|c: char| c.is_ascii_digit()))
                });
                assert_eq!(highest, Some(params), "{sql}");
            }
        }
    }
}
