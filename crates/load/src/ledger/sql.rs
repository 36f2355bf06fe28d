//! Every ledger statement, written once. Parameters are numbered (`$1`),
//! which PostgreSQL and SQLite both read; the few fragments the databases
//! spell differently come from [`Dialect`]. The statements are built once
//! per process and dialect.
//!
//! Times are the database's own clock on both backends, so hosts with
//! skewed clocks agree on leases. SQLite stores them as RFC 3339 text in
//! UTC with milliseconds (`2024-01-02T03:04:05.678Z`), which sorts and
//! compares as time.

use std::sync::OnceLock;

use super::driver::Dialect;
use super::{AttemptStatus, Counts, RunStatus};

impl Dialect {
    /// The current time.
    fn now(self) -> &'static str {
        match self {
            Dialect::Postgres => "now()",
            Dialect::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        }
    }

    /// The current time plus `param` seconds (a float parameter).
    fn now_plus(self, param: &str) -> String {
        match self {
            Dialect::Postgres => format!("now() + make_interval(secs => {param})"),
            Dialect::Sqlite => {
                format!("strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') + {param} / 86400.0)")
            }
        }
    }

    /// Locks the selected rows until commit. SQLite's transaction already
    /// holds the one write lock.
    fn for_update(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR UPDATE",
            Dialect::Sqlite => "",
        }
    }

    /// A time bound as a parameter, as the column type wants it.
    fn time_param(self, param: &str) -> String {
        match self {
            Dialect::Postgres => format!("{param}::timestamptz"),
            Dialect::Sqlite => param.to_string(),
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

/// The ledger's statements in one dialect.
pub(crate) struct Statements {
    /// Creates the run key's row unless it exists. `$1..$5`: pipeline,
    /// source, export type, period start, period end.
    pub insert_run: String,
    /// Reads and locks the run key's row. `$1..$4`: the run key.
    pub lock_run: String,
    /// What a claim would read, for every run key of a pipeline and export
    /// type, without locking (dry runs). `$1` pipeline, `$2` export type.
    pub preview_runs: String,
    /// `$1`: run ref. Marks a crashed attempt lost.
    pub lose_running_attempts: String,
    /// `$1`: run ref, `$2`: run id.
    pub select_seen: String,
    /// `$1`: run ref.
    pub delete_batches: String,
    /// Starts an attempt on the run row. `$1` attempt, `$2` run id, `$3`
    /// owner, `$4` host, `$5` pid, `$6` lease seconds, `$7` fresh start,
    /// `$8` batches, `$9..$14` counts, `$15` handler version, `$16` run ref,
    /// `$17` provisional, `$18` fields fingerprint.
    pub start_attempt: String,
    /// `$1` run ref, `$2` attempt, `$3` run id, `$4` worker, `$5` resumed.
    pub insert_attempt: String,
    /// `$1` lease seconds, `$2` run ref, `$3` attempt.
    pub heartbeat: String,
    /// `$1` run ref, `$2` attempt. The first statement of every write
    /// transaction of an attempt.
    pub fence: String,
    /// `$1` class, `$2` message, `$3` run ref, `$4` attempt.
    pub fail_run: String,
    /// `$1` status, `$2..$7` counts, `$8` class, `$9` message, `$10` run
    /// ref, `$11` attempt.
    pub end_attempt: String,
    /// `$1` new run id, `$2` run ref.
    pub restart_run: String,
    /// `$1` new run id, `$2` run ref, `$3` attempt.
    pub restart_attempt: String,
    /// `$1` checkpoint (or NULL to keep it), `$2` batches, `$3..$8` counts,
    /// `$9` run ref.
    pub save_progress: String,
    /// `$1` result, `$2` run ref.
    pub finish_run: String,
    /// `$1` run ref, `$2` run id, `$3` batch number, `$4` key hashes.
    pub insert_batch_keys: String,
    /// `$1..$5` pipeline, source, export type, period start, run id; `$6`
    /// location, `$7` field, `$8` value, `$9` reason, `$10` record.
    pub insert_reject: String,
    /// `$1` pipeline, `$2` period start or NULL.
    pub status: String,
    /// `$1` cut-off time.
    pub prune_attempts: String,
    /// `$1` cut-off time.
    pub prune_rejects: String,
}

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
        let counts = Counts::COLUMNS.join(", ");
        let count_sets = |first: usize| -> String {
            Counts::COLUMNS
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c} = ${}", first + i))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let running = RunStatus::Running.as_str();
        let attempt_running = AttemptStatus::Running.as_str();
        let release =
            "lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL";
        // What the claim rules read of a run row (`rules::Snapshot`).
        let claim_columns = format!(
            "id, status, attempt, run_id, lease_owner, lease_host, lease_pid, lease_expires_at,
                        CAST(CASE WHEN lease_expires_at > {now} THEN 1 ELSE 0 END AS BIGINT) AS lease_live,
                        checkpoint, batches, result, handler_version, fields_fingerprint, {counts}"
        );
        Statements {
            insert_run: format!(
                "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, {now}, {now})
                 ON CONFLICT (pipeline, source, export_type, period_start) DO NOTHING"
            ),
            lock_run: format!(
                "SELECT {claim_columns}
                 FROM _tm_runs WHERE {run_key}{}",
                d.for_update()
            ),
            preview_runs: format!(
                "SELECT source, period_start, finished_at, error_class, {claim_columns}
                 FROM _tm_runs WHERE pipeline = $1 AND export_type = $2"
            ),
            lose_running_attempts: format!(
                "UPDATE _tm_attempts SET status = '{}', finished_at = {now}
                 WHERE run_ref = $1 AND status = '{attempt_running}'",
                AttemptStatus::Lost.as_str()
            ),
            select_seen: "SELECT key_hashes FROM _tm_batches WHERE run_ref = $1 AND run_id = $2"
                .to_string(),
            delete_batches: "DELETE FROM _tm_batches WHERE run_ref = $1".to_string(),
            start_attempt: format!(
                "UPDATE _tm_runs SET status = '{running}', attempt = $1, run_id = $2, lease_owner = $3,
                        lease_host = $4, lease_pid = $5, lease_expires_at = {lease},
                        checkpoint = CASE WHEN $7 THEN NULL ELSE checkpoint END, batches = $8, {sets},
                        error_class = NULL, error_message = NULL, result = NULL, handler_version = $15,
                        started_at = CASE WHEN $7 THEN {now} ELSE started_at END, finished_at = NULL,
                        updated_at = {now}, provisional = $17, fields_fingerprint = $18
                 WHERE id = $16",
                lease = d.now_plus("$6"),
                sets = count_sets(9),
            ),
            insert_attempt: format!(
                "INSERT INTO _tm_attempts (run_ref, attempt, run_id, worker, status, resumed, started_at)
                 VALUES ($1, $2, $3, $4, '{attempt_running}', $5, {now})"
            ),
            heartbeat: format!(
                "UPDATE _tm_runs SET lease_expires_at = {}
                 WHERE id = $2 AND attempt = $3 AND status = '{running}'",
                d.now_plus("$1")
            ),
            fence: format!(
                "UPDATE _tm_runs SET updated_at = {now}
                 WHERE id = $1 AND attempt = $2 AND status = '{running}'"
            ),
            fail_run: format!(
                "UPDATE _tm_runs SET status = '{}', error_class = $1, error_message = $2, finished_at = {now},
                        {release}, updated_at = {now}
                 WHERE id = $3 AND attempt = $4 AND status = '{running}'",
                RunStatus::Failed.as_str()
            ),
            end_attempt: format!(
                "UPDATE _tm_attempts SET status = $1, {}, error_class = $8, error_message = $9,
                        finished_at = {now}
                 WHERE run_ref = $10 AND attempt = $11",
                count_sets(2)
            ),
            restart_run: format!(
                "UPDATE _tm_runs SET checkpoint = NULL, batches = 0, {}, run_id = $1 WHERE id = $2",
                Counts::COLUMNS.map(|c| format!("{c} = 0")).join(", ")
            ),
            restart_attempt:
                "UPDATE _tm_attempts SET run_id = $1 WHERE run_ref = $2 AND attempt = $3".to_string(),
            save_progress: format!(
                "UPDATE _tm_runs SET checkpoint = COALESCE($1, checkpoint), batches = {}(batches, $2), {}
                 WHERE id = $9",
                d.greatest(),
                count_sets(3)
            ),
            finish_run: format!(
                "UPDATE _tm_runs SET status = '{}', result = $1, finished_at = {now}, checkpoint = NULL, {release}
                 WHERE id = $2",
                RunStatus::Done.as_str()
            ),
            insert_batch_keys:
                "INSERT INTO _tm_batches (run_ref, run_id, batch_no, key_hashes) VALUES ($1, $2, $3, $4)"
                    .to_string(),
            insert_reject: format!(
                "INSERT INTO _tm_rejects (pipeline, source, export_type, period_start, run_id, location, field,
                                          value, reason, record, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, {now})"
            ),
            status: "SELECT * FROM _tm_runs WHERE pipeline = $1 AND ($2 IS NULL OR period_start = $2)
                     ORDER BY period_start, source, export_type"
                .to_string(),
            prune_attempts: format!(
                "DELETE FROM _tm_attempts WHERE finished_at IS NOT NULL AND finished_at < {}",
                d.time_param("$1")
            ),
            prune_rejects: format!(
                "DELETE FROM _tm_rejects WHERE created_at < {}",
                d.time_param("$1")
            ),
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
                &s.preview_runs,
                &s.start_attempt,
                &s.end_attempt,
                &s.save_progress,
                &s.insert_reject,
                &s.fail_run,
            ] {
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
}
