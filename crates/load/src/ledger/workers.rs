//! Workers in the ledger (`_tm_workers`, migration 10): every `serve` and
//! every command that claims run keys records itself, renews `last_seen`
//! while it runs and notes a graceful end. A worker not stopped whose
//! `last_seen` is older than its own lease length is `dead`, judged by the
//! database's clock, so a peer killed with SIGKILL is seen dead by every
//! reader on every host (what a process cannot report about itself).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use tidemark_core::Error;

use super::driver::{Arg, Dialect, Driver, LedgerTx, Record};
use super::{RunStatus, WorkerId};

/// What kind of process a worker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerKind {
    /// A long-running `tidemark serve`.
    Serve,
    /// A command (`run`, `backfill`, `sync`) that claims keys itself.
    Cli,
}

impl WorkerKind {
    /// The name stored in `_tm_workers.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerKind::Serve => "serve",
            WorkerKind::Cli => "cli",
        }
    }
}

/// A worker as it records itself.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// Its identity; `owner()` is the row's key.
    pub id: WorkerId,
    /// The tidemark version it runs.
    pub version: String,
    /// `serve` or a command.
    pub kind: WorkerKind,
    /// Keys it may run at once.
    pub slots: u32,
    /// Its lease length: silent longer than this, it is dead.
    pub lease_ttl: Duration,
    /// How often it renews `last_seen`.
    pub heartbeat: Duration,
}

/// A worker's state, as every view judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Seen within its lease length.
    Live,
    /// Silent past its lease length without a graceful end.
    Dead,
    /// Ended gracefully.
    Stopped,
}

impl WorkerState {
    /// Every state.
    pub const ALL: [WorkerState; 3] = [WorkerState::Live, WorkerState::Dead, WorkerState::Stopped];

    /// The state's name (the view's `state` column).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Live => "live",
            WorkerState::Dead => "dead",
            WorkerState::Stopped => "stopped",
        }
    }

    fn parse(text: &str) -> WorkerState {
        match text {
            "stopped" => WorkerState::Stopped,
            "dead" => WorkerState::Dead,
            _ => WorkerState::Live,
        }
    }
}

/// A run key a worker holds the lease of now.
#[derive(Debug, Clone, Serialize)]
pub struct HeldRun {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// Period start (RFC 3339).
    pub period_start: String,
}

/// One worker the ledger knows (`tidemark_v1_workers`).
#[derive(Debug, Clone, Serialize)]
pub struct WorkerEntry {
    /// `host:pid:instance`, as attempts and leases name it.
    pub worker: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: i64,
    /// tidemark version.
    pub version: String,
    /// `serve` or `cli`.
    pub kind: String,
    /// Worker slots.
    pub slots: i64,
    /// Its lease length in milliseconds.
    pub lease_ttl_ms: i64,
    /// When it started (the database's clock).
    pub started_at: String,
    /// When it was last seen.
    pub last_seen: String,
    /// `last_seen` as Unix seconds.
    pub last_seen_unix: f64,
    /// When it ended gracefully.
    pub stopped_at: Option<String>,
    /// Live, dead or stopped.
    pub state: WorkerState,
    /// The run keys it holds the lease of.
    pub holds: Vec<HeldRun>,
}

/// Unix seconds of a stored time or RFC 3339 text, as a float.
pub(crate) fn unix_seconds(d: Dialect, expr: &str) -> String {
    match d {
        Dialect::Postgres => {
            format!("CAST(extract(epoch FROM ({expr})::timestamptz) AS DOUBLE PRECISION)")
        }
        Dialect::Sqlite => format!("((julianday({expr}) - 2440587.5) * 86400.0)"),
    }
}

fn register_sql(d: Dialect) -> String {
    let now = d.now();
    format!(
        "INSERT INTO _tm_workers (worker, host, pid, version, kind, slots, lease_ttl_ms, heartbeat_ms,
                                  started_at, last_seen, stopped_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {now}, {now}, NULL)
         ON CONFLICT (worker) DO UPDATE SET last_seen = {now}, stopped_at = NULL,
                slots = excluded.slots, kind = excluded.kind"
    )
}

/// Records `info` (again: a row pruned while the worker slept comes back).
pub(crate) async fn register<D: Driver>(driver: &D, info: &WorkerInfo) -> Result<(), Error> {
    let owner = info.id.owner();
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let mut tx = driver.begin().await?;
    tx.execute(
        &register_sql(D::DIALECT),
        &[
            Arg::Text(&owner),
            Arg::Text(&info.id.host),
            Arg::Int(i64::from(info.id.pid)),
            Arg::Text(&info.version),
            Arg::Text(info.kind.as_str()),
            Arg::Int(i64::from(info.slots)),
            Arg::Int(ms(info.lease_ttl)),
            Arg::Int(ms(info.heartbeat)),
        ],
    )
    .await?;
    tx.commit().await
}

/// Renews `last_seen`; `false` when the worker has no live row (pruned, or
/// marked stopped): the caller registers again.
pub(crate) async fn heartbeat<D: Driver>(driver: &D, id: &WorkerId) -> Result<bool, Error> {
    let sql = format!(
        "UPDATE _tm_workers SET last_seen = {} WHERE worker = $1 AND stopped_at IS NULL",
        D::DIALECT.now()
    );
    let mut tx = driver.begin().await?;
    let changed = tx.execute(&sql, &[Arg::Text(&id.owner())]).await?;
    tx.commit().await?;
    Ok(changed > 0)
}

/// Notes a graceful end.
pub(crate) async fn stopped<D: Driver>(driver: &D, id: &WorkerId) -> Result<(), Error> {
    let now = D::DIALECT.now();
    let sql =
        format!("UPDATE _tm_workers SET stopped_at = {now}, last_seen = {now} WHERE worker = $1");
    let mut tx = driver.begin().await?;
    tx.execute(&sql, &[Arg::Text(&id.owner())]).await?;
    tx.commit().await
}

/// Deletes workers not seen for longer than `age` seconds (`prune`), inside
/// the caller's transaction.
pub(crate) async fn prune<T: LedgerTx>(tx: &mut T, d: Dialect, age: Arg<'_>) -> Result<u64, Error> {
    let sql = format!(
        "DELETE FROM _tm_workers WHERE last_seen < {}",
        d.now_minus_secs("$1")
    );
    tx.execute(&sql, &[age]).await
}

/// Every worker the ledger knows, the most recently seen first, with the
/// run keys each holds.
pub(crate) async fn workers<D: Driver>(driver: &D) -> Result<Vec<WorkerEntry>, Error> {
    let d = D::DIALECT;
    let list = format!(
        "SELECT worker, host, pid, version, kind, slots, lease_ttl_ms, started_at, last_seen,
                {last_seen_unix} AS last_seen_unix, stopped_at, state
         FROM tidemark_v1_workers ORDER BY last_seen DESC, worker",
        last_seen_unix = unix_seconds(d, "last_seen"),
    );
    // No ORDER BY: sorted here, so SQLite reads the few running keys from
    // their partial index instead of walking another index for the order.
    let held = format!(
        "SELECT lease_owner, pipeline, source, period_start FROM _tm_runs
         WHERE status = '{}' AND lease_owner IS NOT NULL",
        RunStatus::Running.as_str()
    );
    let mut tx = driver.begin_read().await?;
    let mut entries = Vec::new();
    tx.fetch_each(&list, &[], |row| {
        entries.push(entry_of(&row)?);
        Ok(())
    })
    .await?;
    let mut holds: HashMap<String, Vec<HeldRun>> = HashMap::new();
    tx.fetch_each(&held, &[], |row| {
        holds
            .entry(row.text("lease_owner")?)
            .or_default()
            .push(HeldRun {
                pipeline: row.text("pipeline")?,
                source: row.text("source")?,
                period_start: row.text("period_start")?,
            });
        Ok(())
    })
    .await?;
    tx.commit().await?;
    for entry in &mut entries {
        let mut held = holds.remove(&entry.worker).unwrap_or_default();
        held.sort_by(|a, b| {
            (&a.pipeline, &a.source, &a.period_start).cmp(&(
                &b.pipeline,
                &b.source,
                &b.period_start,
            ))
        });
        entry.holds = held;
    }
    Ok(entries)
}

fn entry_of(row: &Record) -> Result<WorkerEntry, Error> {
    Ok(WorkerEntry {
        worker: row.text("worker")?,
        host: row.text("host")?,
        pid: row.int("pid")?,
        version: row.text("version")?,
        kind: row.text("kind")?,
        slots: row.int("slots")?,
        lease_ttl_ms: row.int("lease_ttl_ms")?,
        started_at: row.text("started_at")?,
        last_seen: row.text("last_seen")?,
        last_seen_unix: row.float("last_seen_unix")?,
        stopped_at: row.opt_text("stopped_at")?,
        state: WorkerState::parse(&row.text("state")?),
        holds: Vec::new(),
    })
}
