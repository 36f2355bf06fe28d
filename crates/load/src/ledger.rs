//! Ledger types shared by every backend.
//!
//! States of a run key (drawn in docs/ledger.md):
//!
//! ```text
//!   (none) ──claim──▶ running ──finish──▶ done ──claim --force──▶ running
//!                      │  ▲                                 
//!                 fail │  │ claim (lease expired or holder dead: resume)
//!                      ▼  │
//!                     failed ──claim──▶ running (fresh start)
//! ```
//!
//! `pending` exists for rows created but not yet claimed.

use std::time::Duration;

use serde::Serialize;
use tidemark_core::Hash128;
use tidemark_core::KeySet;

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
    /// This worker.
    pub worker: WorkerId,
    /// Lease length; renewed by heartbeats.
    pub lease_ttl: Duration,
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
}

impl Counts {
    /// The counters in ledger column order (`rows_read`, `rows_inserted`,
    /// `rows_updated`, `rows_unchanged`, `rows_deleted`, `rows_rejected`),
    /// as the databases' signed integers (no count reaches 2^63).
    fn columns(&self) -> [i64; 6] {
        [
            self.rows_read,
            self.rows_inserted,
            self.rows_updated,
            self.rows_unchanged,
            self.rows_deleted,
            self.rows_rejected,
        ]
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// `.bind_counts(&counts)`: a run's six counters as a query's next six
/// parameters, in ledger column order, on either database.
pub(crate) trait BindCounts {
    fn bind_counts(self, counts: &Counts) -> Self;
}

impl<'q, DB> BindCounts for sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    fn bind_counts(self, counts: &Counts) -> Self {
        counts
            .columns()
            .into_iter()
            .fold(self, |query, n| query.bind(n))
    }
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
    /// pending, running, done or failed.
    pub status: String,
    /// Attempts so far.
    pub attempts: i64,
    /// Run id of the latest attempt.
    pub run_id: Option<String>,
    /// Counts.
    #[serde(flatten)]
    pub counts: Counts,
    /// Error class of the last failure.
    pub error_class: Option<String>,
    /// Error message of the last failure.
    pub error_message: Option<String>,
    /// When the latest run started.
    pub started_at: Option<String>,
    /// When it finished.
    pub finished_at: Option<String>,
    /// Handler version of the latest run.
    pub handler_version: Option<String>,
    /// Lease owner while running.
    pub lease_owner: Option<String>,
    /// Lease expiry while running.
    pub lease_expires_at: Option<String>,
}

/// The ledger row of a run key as a claim sees it, locked.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub status: String,
    pub run_id: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_host: Option<String>,
    pub lease_pid: Option<i64>,
    pub lease_expires_at: Option<String>,
    /// Whether the lease has not yet expired (by the database's clock).
    pub lease_live: bool,
    pub checkpoint: Option<serde_json::Value>,
    pub result: Option<serde_json::Value>,
}

/// What a claim does with the row it locked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Report the stored result.
    Done(serde_json::Value),
    /// Leave it to its live holder.
    Held { owner: String, expires_at: String },
    /// Take it: resume `(checkpoint, run_id)` of a crashed attempt, or start fresh.
    Take {
        resume: Option<(serde_json::Value, String)>,
        /// A crashed attempt's history row must be marked lost.
        previous_lost: bool,
    },
}

/// The claim rules, shared by every backend:
/// - done and not forced: report the stored result;
/// - running with a live lease whose holder is not provably dead: held;
/// - running otherwise (crashed): take over and resume from its checkpoint
///   unless forced;
/// - pending, failed, or forced: take it and start the period fresh (rows
///   already committed stay; unchanged ones are not rewritten).
pub(crate) fn decide(row: Snapshot, request: &ClaimRequest) -> Decision {
    if row.status == "done" && !request.force {
        return Decision::Done(row.result.unwrap_or_default());
    }
    if row.status != "running" {
        return Decision::Take {
            resume: None,
            previous_lost: false,
        };
    }
    if row.lease_live && !holder_is_dead(row.lease_host.as_deref(), row.lease_pid, &request.worker)
    {
        return Decision::Held {
            owner: row.lease_owner.unwrap_or_default(),
            expires_at: row.lease_expires_at.unwrap_or_default(),
        };
    }
    let resume = match (request.force, row.checkpoint, row.run_id) {
        (false, Some(cp), Some(run_id)) => Some((cp, run_id)),
        _ => None,
    };
    Decision::Take {
        resume,
        previous_lost: true,
    }
}

/// Reads the six count columns of a `_tm_runs` row, on either backend.
pub(crate) fn counts_of<R>(row: &R) -> Counts
where
    R: sqlx::Row,
    for<'n> &'n str: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let get = |name: &str| {
        row.try_get::<i64, _>(name)
            .ok()
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0)
    };
    Counts {
        rows_read: get("rows_read"),
        rows_inserted: get("rows_inserted"),
        rows_updated: get("rows_updated"),
        rows_unchanged: get("rows_unchanged"),
        rows_deleted: get("rows_deleted"),
        rows_rejected: get("rows_rejected"),
    }
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

/// Whether a lease holder on this host is provably dead: same host, and
/// no process with its pid exists.
pub(crate) fn holder_is_dead(
    holder_host: Option<&str>,
    holder_pid: Option<i64>,
    me: &WorkerId,
) -> bool {
    match (holder_host, holder_pid) {
        (Some(host), Some(pid)) if host == me.host => {
            pid != i64::from(me.pid) && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        }
        _ => false,
    }
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
    fn only_gone_processes_on_this_host_are_dead() {
        let me = WorkerId {
            host: "h1".into(),
            pid: std::process::id(),
            instance: "x".into(),
        };
        assert!(holder_is_dead(Some("h1"), Some(i64::from(u32::MAX)), &me));
        assert!(!holder_is_dead(Some("h1"), Some(1), &me)); // pid 1 always exists
        assert!(!holder_is_dead(Some("h2"), Some(i64::from(u32::MAX)), &me));
        assert!(!holder_is_dead(Some("h1"), Some(i64::from(me.pid)), &me));
    }
}
