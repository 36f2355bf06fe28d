//! The run ledger: one row per run key in `_tm_runs`, the history of its
//! attempts in `_tm_attempts`, the keys seen by an unfinished run's batches
//! in `_tm_batches`.
//!
//! The *flow* of every ledger operation (claim, heartbeat, fence, batch
//! commit, finish, fail, restart) is written once, in [`flow`], against the
//! [`driver::Driver`] boundary; a backend supplies only its SQL dialect and
//! its type mapping ([`crate::sqlite::driver`], [`crate::postgres::driver`]),
//! the way River's `riverdriver` interface does. The states and their edges
//! are drawn in `docs/ledger.md`; [`RunStatus`] and [`AttemptStatus`] are the
//! same sets as the SQL `CHECK` constraints.

mod class;
pub(crate) mod driver;
pub(crate) mod flow;
pub(crate) mod grid;
pub(crate) mod history;
pub(crate) mod mark;
pub(crate) mod metrics;
pub(crate) mod notices;
pub(crate) mod params;
pub(crate) mod preview;
mod rules;
pub(crate) mod sql;
mod stale;
pub(crate) mod workers;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Serialize, Serializer};
use tidemark_core::{Hash128, KeySet};

pub use class::{StoredClass, UnknownClass};
pub use grid::GridRow;
pub use history::{AttemptEntry, History, RejectEntry, FIRST_REJECTS};
pub use mark::{HeldKey, Mark, MarkAs, Marked};
pub use metrics::{
    AttemptGroup, Freshness, LedgerMetrics, Observed, PeriodCount, QueueDepth, DURATION_BUCKETS,
    SETTLE_MARGIN_SECONDS, WAIT_BUCKETS,
};
pub use notices::{
    notify_target, Delivered, LineageEvent, NewNotice, NoticeKind, NoticeTargets, NotifyTarget,
    OutboxNotice, LINEAGE_TARGET,
};
pub use rules::process_is_gone;
pub use stale::stale_reason;
pub use workers::{HeldRun, WorkerEntry, WorkerInfo, WorkerKind, WorkerState};

/// The state of a run key (`_tm_runs.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStatus {
    /// Queued: not started, or interrupted and waiting to resume.
    Pending,
    /// An attempt holds the lease.
    Running,
    /// Finished; the canonical result is stored.
    Done,
    /// The last attempt failed permanently (or ran out of retries).
    Failed,
    /// Taken out of the queue by an operator before it ran.
    Cancelled,
}

impl RunStatus {
    /// Every state, in the order `docs/ledger.md` draws them.
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Done,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// The name stored in `_tm_runs.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Done => "done",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

/// The outcome of one attempt (`_tm_attempts.status`); `Running` while it
/// is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptStatus {
    /// Under way.
    Running,
    /// Ended with the run key done.
    Done,
    /// Ended with a permanent error, or out of retries.
    Failed,
    /// Its holder died or lost the lease; a later attempt took over.
    Lost,
    /// Stopped by a signal after its last committed batch; the run key went
    /// back to `pending` to be resumed.
    Interrupted,
}

impl AttemptStatus {
    /// Every state.
    pub const ALL: [AttemptStatus; 5] = [
        AttemptStatus::Running,
        AttemptStatus::Done,
        AttemptStatus::Failed,
        AttemptStatus::Lost,
        AttemptStatus::Interrupted,
    ];

    /// The name stored in `_tm_attempts.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Running => "running",
            AttemptStatus::Done => "done",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Lost => "lost",
            AttemptStatus::Interrupted => "interrupted",
        }
    }
}

/// A state name the ledger does not know (a newer tidemark wrote it, or the
/// row was edited by hand).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown ledger state {0:?}")]
pub struct UnknownState(pub String);

macro_rules! state_text {
    ($ty:ident) => {
        impl FromStr for $ty {
            type Err = UnknownState;
            fn from_str(text: &str) -> Result<Self, UnknownState> {
                $ty::ALL
                    .into_iter()
                    .find(|s| s.as_str() == text)
                    .ok_or_else(|| UnknownState(text.to_string()))
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}
state_text!(RunStatus);
state_text!(AttemptStatus);

/// Who runs an attempt. A holder on the same host whose process is gone is
/// provably dead, so its lease can be taken over without waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerId {
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Unique per process start.
    pub instance: String,
}

impl WorkerId {
    /// `host:pid:instance`, stored as the lease owner.
    pub fn owner(&self) -> String {
        format!("{}:{}:{}", self.host, self.pid, self.instance)
    }
}

/// What a claim needs to know.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Re-run even when done; start from scratch.
    pub force: bool,
    /// The pipeline's handler version.
    pub handler_version: String,
    /// The fingerprint of the pipeline's `[fields]`
    /// ([`tidemark_core::FieldsFingerprint`]), recorded with the attempt.
    pub fields_fingerprint: String,
    /// The period is still open (`--allow-open`): a done run is recorded
    /// as provisional, for `sync` to re-run once the period is due.
    pub provisional: bool,
    /// This worker.
    pub worker: WorkerId,
    /// Lease length; renewed by heartbeats.
    pub lease_ttl: Duration,
    /// Who is told about the key's changes (the pipeline's `[[notify]]`
    /// and `[lineage]`); carried into the lease.
    pub notices: NoticeTargets,
}

/// The right to commit batches for one run key, fenced by the attempt number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Ledger row id.
    pub run_ref: i64,
    /// Attempt number: every write checks the ledger still holds it.
    pub attempt: i64,
    /// Run id stamped on written rows; kept when an attempt resumes, new when
    /// the period starts over.
    pub run_id: String,
    /// Lease owner string.
    pub owner: String,
    /// Who is told about the attempt's changes: each change's transaction
    /// writes their notices.
    pub notices: NoticeTargets,
}

/// Which period starts `status` reads: an inclusive range of instants
/// (RFC 3339 texts), either end open. Compared as instants, not as text, so
/// the two 02:00 hours of a DST fall-back day are both in and in order.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartRange<'a> {
    /// The earliest period start, if any.
    pub from: Option<&'a str>,
    /// The latest period start, if any.
    pub to: Option<&'a str>,
}

/// Row counts of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Records read from the source.
    pub rows_read: u64,
    /// Rows inserted.
    pub rows_inserted: u64,
    /// Rows updated (changed values, or taken over from another run key).
    pub rows_updated: u64,
    /// Rows already present with the same values: not written.
    pub rows_unchanged: u64,
    /// Rows deleted or soft-deleted by reconciliation.
    pub rows_deleted: u64,
    /// Records rejected (within `max_rejects`).
    pub rows_rejected: u64,
    /// Rows read whose natural key a later period holds: left as they are,
    /// never reverted (the ownership rule, ADR 0006).
    pub rows_superseded: u64,
    /// The total of records the source declared for the period
    /// (`expect_count`), once known; `None` (NULL) when it declares none.
    pub rows_expected: Option<u64>,
}

impl Counts {
    /// The ledger's count columns (and the counts' names in a run's
    /// result and in `status --json`), in the order of `Counts::values`.
    pub const COLUMNS: [&'static str; 8] = [
        "rows_read",
        "rows_inserted",
        "rows_updated",
        "rows_unchanged",
        "rows_deleted",
        "rows_rejected",
        "rows_superseded",
        "rows_expected",
    ];

    /// The counts in [`Counts::COLUMNS`] order, as the databases' signed
    /// integers (no count reaches 2^63); only `rows_expected` is ever NULL.
    pub(crate) fn values(&self) -> [Option<i64>; 8] {
        let int = |n: u64| Some(i64::try_from(n).unwrap_or(i64::MAX));
        [
            int(self.rows_read),
            int(self.rows_inserted),
            int(self.rows_updated),
            int(self.rows_unchanged),
            int(self.rows_deleted),
            int(self.rows_rejected),
            int(self.rows_superseded),
            self.rows_expected.and_then(int),
        ]
    }

    /// Counts from values in [`Counts::COLUMNS`] order; a negative value
    /// (never written by tidemark) or a NULL counter reads as 0.
    pub(crate) fn from_values(values: [Option<i64>; 8]) -> Counts {
        let [read, inserted, updated, unchanged, deleted, rejected, superseded, expected] =
            values.map(|n| n.and_then(|n| u64::try_from(n).ok()));
        Counts {
            rows_read: read.unwrap_or(0),
            rows_inserted: inserted.unwrap_or(0),
            rows_updated: updated.unwrap_or(0),
            rows_unchanged: unchanged.unwrap_or(0),
            rows_deleted: deleted.unwrap_or(0),
            rows_rejected: rejected.unwrap_or(0),
            rows_superseded: superseded.unwrap_or(0),
            rows_expected: expected,
        }
    }
}

/// The claim of the run key a worker runs next, made inside the write
/// transaction that finishes its current period (the claim piggy-back, ADR
/// 0022): one commit per period instead of two. The claim is the one
/// [`crate::Store::claim`] makes (same statements, same rules, same lease),
/// only its transaction is shared; if that transaction does not commit,
/// nothing was claimed.
#[derive(Debug, Clone)]
pub struct NextClaim {
    /// The run key to claim.
    pub key: tidemark_core::RunKey,
    /// Its claim, as the worker would send it on its own.
    pub request: ClaimRequest,
}

/// A claimed attempt.
#[derive(Debug, Clone)]
pub struct ClaimedRun {
    /// The lease to fence writes with.
    pub lease: Lease,
    /// Where to continue reading, when resuming a crashed attempt.
    pub resume: Option<serde_json::Value>,
    /// Counts of the batches already committed by this run.
    pub counts: Counts,
    /// Batches already committed by this run.
    pub batches: i64,
    /// Natural keys the committed batches of this run saw without writing
    /// them (their rows were unchanged). Keys a batch wrote are known from
    /// the table itself: those rows carry this run's id.
    pub seen: KeySet,
    /// Fields new to this period: the ledger saw the period before they
    /// were in `[fields]`, so its export may lack their columns (read them
    /// as declared `added`; see `tidemark_core::fingerprint`).
    pub new_fields: Vec<String>,
}

/// The outcome of a claim.
#[derive(Debug, Clone)]
pub enum Claim {
    /// Done already; the stored canonical result.
    Done(serde_json::Value),
    /// Another live attempt holds the lease.
    Held {
        /// Its owner.
        owner: String,
        /// When its lease runs out unless renewed.
        expires_at: String,
    },
    /// This worker holds the run key now.
    Claimed(Box<ClaimedRun>),
}

/// A pipeline a queue worker can run: claims take only its keys, and the
/// attempt records its handler version.
#[derive(Debug, Clone)]
pub struct QueuePipeline {
    /// Pipeline name.
    pub name: String,
    /// Its handler `version`.
    pub handler_version: String,
    /// The fingerprint of its `[fields]`.
    pub fields_fingerprint: String,
    /// Its periods ending at or before this instant are due (the clock
    /// that decides what is due, `TIDEMARK_NOW`-aware, minus `period.lag`).
    /// A queued key of a period still open is claimed only to continue a
    /// provisional attempt (one that `--allow-open` started).
    pub due_before: chrono::DateTime<chrono::Utc>,
    /// Who is told about its keys' changes.
    pub notices: NoticeTargets,
}

impl QueuePipeline {
    /// Whether a period ending at `period_end` (RFC 3339) is due. A text
    /// that is not a time is taken as due: the worker then finds the key
    /// unrunnable and fails it with the reason, rather than never
    /// claiming it.
    pub(crate) fn is_due(&self, period_end: &str) -> bool {
        chrono::DateTime::parse_from_rfc3339(period_end).map_or(true, |end| end <= self.due_before)
    }
}

/// A key claimed from the work queue, with the identity its row holds.
#[derive(Debug, Clone)]
pub struct QueuedRun {
    /// Pipeline name.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// Export type.
    pub export_type: String,
    /// Period start as stored (RFC 3339).
    pub period_start: String,
    /// Period end as stored (RFC 3339): with the start, the period the key
    /// was queued for (a changed granularity keeps some starts, not ends).
    pub period_end: String,
    /// The claimed attempt is provisional: its period is still open, and it
    /// continues a provisional attempt (`--allow-open`).
    pub provisional: bool,
    /// The claimed attempt.
    pub run: ClaimedRun,
}

/// Who put a key into the queue (`_tm_runs.enqueued_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueuedBy {
    /// A `serve` scheduler at a fire of the pipeline's schedule.
    Schedule,
    /// `backfill --enqueue`.
    Backfill,
    /// An operator's command otherwise (an interrupted `run`).
    Operator,
}

impl EnqueuedBy {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            EnqueuedBy::Schedule => "schedule",
            EnqueuedBy::Backfill => "backfill",
            EnqueuedBy::Operator => "operator",
        }
    }
}

/// One run key to queue.
#[derive(Debug, Clone)]
pub struct QueueKey {
    /// Source id.
    pub source: String,
    /// Period start, RFC 3339.
    pub period_start: String,
    /// Period end, RFC 3339.
    pub period_end: String,
}

/// Keys of one pipeline to put into the work queue.
#[derive(Debug, Clone)]
pub struct Enqueue<'a> {
    /// Pipeline name.
    pub pipeline: &'a str,
    /// Export type.
    pub export_type: &'a str,
    /// The keys.
    pub keys: &'a [QueueKey],
    /// Claim order: each point is one minute of head start.
    pub priority: i64,
    /// Who queues them.
    pub by: EnqueuedBy,
    /// Existing keys in these states go back to `pending` (fresh); keys in
    /// other states (pending, running, ...) are left as they are.
    pub requeue: &'a [RunStatus],
    /// The scheduler: a failed key is re-queued only once its `not_before`
    /// has passed by the database's clock. `false`: an operator, at once.
    pub respect_backoff: bool,
}

/// One ledger row as `status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerEntry {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// Export type.
    pub export_type: String,
    /// Period start (RFC 3339).
    pub period_start: String,
    /// Period end (RFC 3339).
    pub period_end: String,
    /// The run key's state.
    pub status: RunStatus,
    /// Attempts so far.
    pub attempts: i64,
    /// Run id of the latest attempt.
    pub run_id: Option<String>,
    /// Counts.
    #[serde(flatten)]
    pub counts: Counts,
    /// Why the last attempt ended without `done`: the class of its
    /// failure, or `interrupted`.
    pub error_class: Option<StoredClass>,
    /// Error message of the last failure.
    pub error_message: Option<String>,
    /// When the latest run started.
    pub started_at: Option<String>,
    /// When it finished.
    pub finished_at: Option<String>,
    /// Handler version of the latest run.
    pub handler_version: Option<String>,
    /// Done by a run that started while its period was still open
    /// (`--allow-open`); `sync` re-runs it once it is due.
    pub provisional: bool,
    /// Done under another handler version or other `[fields]` than the
    /// pipeline's current ones (derived; see [`LedgerEntry::judge_staleness`]).
    pub stale: bool,
    /// What differs, when stale: `version 2 -> 3`, `fields changed: + note`.
    pub stale_reason: Option<String>,
    /// The `[fields]` fingerprint of the latest run (compared, not shown).
    #[serde(skip)]
    pub fields_fingerprint: Option<String>,
    /// Lease owner while running.
    pub lease_owner: Option<String>,
    /// Lease expiry while running.
    pub lease_expires_at: Option<String>,
    /// Claim order in the work queue (each point: a minute of head start).
    pub priority: i64,
    /// When a failed key may run again (its backoff), if it failed.
    pub not_before: Option<String>,
    /// Its `not_before` has not passed yet by the database's clock (the
    /// clock that stored it), whatever `TIDEMARK_NOW` says.
    #[serde(skip)]
    pub backing_off: bool,
    /// Who queued the key last: schedule, backfill or operator.
    pub enqueued_by: Option<String>,
    /// A `done` key recorded by `tidemark mark` rather than a run: `done`
    /// (loaded by another tool) or `skipped` (deliberately empty).
    pub marked: Option<String>,
    /// The operator's note of that mark.
    pub mark_note: Option<String>,
}

/// Decodes a `_tm_batches.key_hashes` blob.
pub(crate) fn decode_hashes(blob: &[u8], into: &mut KeySet) {
    for chunk in blob.chunks_exact(16) {
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(chunk);
        into.insert(Hash128(u128::from_be_bytes(bytes)));
    }
}

/// Encodes hashes for `_tm_batches.key_hashes`.
pub(crate) fn encode_hashes<'a>(hashes: impl Iterator<Item = &'a Hash128>) -> Vec<u8> {
    hashes.flat_map(|h| h.to_bytes()).collect()
}

/// A new run id: a UUID v4 in its 32-hex-digit form.
pub(crate) fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip_through_blobs() {
        let hashes = [Hash128(1), Hash128(u128::MAX), Hash128(0xabc)];
        let blob = encode_hashes(hashes.iter());
        let mut set = KeySet::default();
        decode_hashes(&blob, &mut set);
        assert_eq!(set, hashes.into_iter().collect());
    }

    #[test]
    fn states_round_trip_through_their_names() {
        for status in RunStatus::ALL {
            assert_eq!(status.as_str().parse::<RunStatus>(), Ok(status));
        }
        for status in AttemptStatus::ALL {
            assert_eq!(status.as_str().parse::<AttemptStatus>(), Ok(status));
        }
        assert!("paused".parse::<RunStatus>().is_err());
    }

    #[test]
    fn counts_round_trip_through_their_columns() {
        let counts = Counts {
            rows_read: 6,
            rows_inserted: 1,
            rows_updated: 2,
            rows_unchanged: 3,
            rows_deleted: 4,
            rows_rejected: 5,
            rows_superseded: 7,
            rows_expected: Some(8),
        };
        assert_eq!(Counts::from_values(counts.values()), counts);
        let unknown = Counts {
            rows_expected: None,
            ..counts
        };
        assert_eq!(Counts::from_values(unknown.values()), unknown);
        assert_eq!(unknown.values()[7], None, "NULL, not 0");
    }
}
