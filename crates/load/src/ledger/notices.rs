//! The notices outbox (`_tm_notices`, migration 0011; docs/ledger.md
//! "Notices", ADR 0024).
//!
//! The invariant this module keeps: a notice row is inserted in the same
//! transaction as the ledger change that causes it, decided from the run
//! row as it was before that change, so a committed change always has its
//! notice and a rolled-back one never does. Delivery is another step
//! (the engine's deliverer), which claims, sends and records; nothing
//! here talks to a network.

use std::time::Duration;

use serde::Serialize;
use tidemark_core::{Error, ErrorClass};

use super::driver::{fetch_all, fetch_optional, Arg, Dialect, Driver, LedgerTx, Record};
use super::{Counts, Lease};

pub use tidemark_core::spec::NoticeKind;

/// The kind a failure with `error` is told as.
fn kind_of_failure(error: &Error) -> NoticeKind {
    match error {
        Error::DeletesRefused(_) => NoticeKind::GuardRefused,
        e if e.class() == ErrorClass::Incomplete => NoticeKind::Incomplete,
        _ => NoticeKind::Failed,
    }
}

/// An OpenLineage run event type, one per change of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineageEvent {
    /// An attempt started.
    Start,
    /// It ended done.
    Complete,
    /// It failed.
    Fail,
    /// It was interrupted, or lost to a takeover.
    Abort,
}

impl LineageEvent {
    /// OpenLineage's `eventType`, also the notice's `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            LineageEvent::Start => "START",
            LineageEvent::Complete => "COMPLETE",
            LineageEvent::Fail => "FAIL",
            LineageEvent::Abort => "ABORT",
        }
    }
}

/// The `target` of a lineage notice.
pub const LINEAGE_TARGET: &str = "lineage";

/// The `target` of the notices for `[[notify]]` entry `index`.
pub fn notify_target(index: usize) -> String {
    format!("notify:{index}")
}

/// One `[[notify]]` entry as the ledger needs it: its place in the file and
/// the kinds it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyTarget {
    /// Index of the entry in the pipeline file.
    pub index: usize,
    /// The kinds it is told.
    pub on: Vec<NoticeKind>,
}

/// Who is told about a pipeline's changes: which notice rows a change
/// writes. Empty (the default): nobody, and no row is written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoticeTargets {
    /// `[[notify]]` entries.
    pub notify: Vec<NotifyTarget>,
    /// `[lineage]` is set.
    pub lineage: bool,
}

impl NoticeTargets {
    /// Nobody is told anything.
    pub fn is_empty(&self) -> bool {
        self.notify.is_empty() && !self.lineage
    }

    /// The targets that want `kind`.
    pub fn wanting(&self, kind: NoticeKind) -> impl Iterator<Item = String> + '_ {
        self.notify
            .iter()
            .filter(move |t| t.on.contains(&kind))
            .map(|t| notify_target(t.index))
    }
}

/// A notice as the outbox holds it (what a deliverer claims and `status
/// --notices` lists).
#[derive(Debug, Clone, Serialize)]
pub struct OutboxNotice {
    /// The notice's id: the `Idempotency-Key` of every POST of it.
    pub id: String,
    /// `failed`, `recovered`, … or a lineage event type.
    pub kind: String,
    /// `notify:N` or `lineage`.
    pub target: String,
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// Export type.
    pub export_type: String,
    /// Period start (RFC 3339, the pipeline's offset).
    pub period_start: String,
    /// The attempt it belongs to (0 for `late` and `test`).
    pub attempt: i64,
    /// What it tells (never a secret).
    pub payload: serde_json::Value,
    /// `pending`, `sent` or `dead`.
    pub status: String,
    /// POSTs tried so far.
    pub attempts: i64,
    /// Why the last try failed.
    pub last_error: Option<String>,
    /// When it was written (the database's clock).
    pub created_at: String,
    /// When it was delivered.
    pub sent_at: Option<String>,
}

/// A notice not caused by a run's change (`late`, `test`), inserted on its
/// own; the UNIQUE key makes a second insert of the same one do nothing.
#[derive(Debug, Clone)]
pub struct NewNotice<'a> {
    /// The kind.
    pub kind: NoticeKind,
    /// `notify:N`.
    pub target: &'a str,
    /// Pipeline.
    pub pipeline: &'a str,
    /// Source id.
    pub source: &'a str,
    /// Export type.
    pub export_type: &'a str,
    /// Period start.
    pub period_start: &'a str,
    /// `late`: the due instant; with the run key, its identity.
    pub due_key: &'a str,
    /// What it tells.
    pub payload: &'a serde_json::Value,
}

/// The run row as it was before a change, read inside its transaction.
pub(crate) struct Before {
    pipeline: String,
    source: String,
    export_type: String,
    period_start: String,
    period_end: String,
    failures: i64,
    run_id: Option<String>,
    /// The class of the key's latest failed attempt, if any.
    previous_class: Option<String>,
}

/// Reads the run row (and the key's latest failed attempt's class) inside
/// the change's transaction; `None` when nobody is told.
pub(crate) async fn before<D: Driver>(
    tx: &mut D::Tx,
    lease: &Lease,
) -> Result<Option<Before>, Error> {
    if lease.notices.is_empty() {
        return Ok(None);
    }
    let run = [Arg::Int(lease.run_ref)];
    let Some(row) = fetch_optional(
        tx,
        "SELECT pipeline, source, export_type, period_start, period_end, failures, run_id
         FROM _tm_runs WHERE id = $1",
        &run,
    )
    .await?
    else {
        return Ok(None);
    };
    let previous = fetch_optional(
        tx,
        "SELECT error_class FROM _tm_attempts
         WHERE run_ref = $1 AND attempt < $2 AND status = 'failed'
         ORDER BY attempt DESC LIMIT 1",
        &[Arg::Int(lease.run_ref), Arg::Int(lease.attempt)],
    )
    .await?;
    Ok(Some(Before {
        pipeline: row.text("pipeline")?,
        source: row.text("source")?,
        export_type: row.text("export_type")?,
        period_start: row.text("period_start")?,
        period_end: row.text("period_end")?,
        failures: row.int("failures")?,
        run_id: row.opt_text("run_id")?,
        previous_class: previous
            .map(|r| r.opt_text("error_class"))
            .transpose()?
            .flatten(),
    }))
}

/// What one change tells, with the run key it belongs to.
struct Told<'a> {
    before: &'a Before,
    lease: &'a Lease,
    counts: &'a Counts,
    error: Option<&'a Error>,
}

impl Told<'_> {
    /// The body every notice and event of this change is built from.
    fn payload(&self) -> serde_json::Value {
        let b = self.before;
        serde_json::json!({
            "pipeline": b.pipeline,
            "source": b.source,
            "export_type": b.export_type,
            "period_start": b.period_start,
            "period_end": b.period_end,
            "attempt": self.lease.attempt,
            "run_id": self.lease.run_id,
            "worker": self.lease.owner,
            "error_class": self.error.map(|e| e.class().as_str()),
            "error_message": self.error.map(ToString::to_string),
            "counts": counts_json(self.counts),
        })
    }
}

fn counts_json(c: &Counts) -> serde_json::Value {
    serde_json::json!({
        "rows_read": c.rows_read,
        "rows_inserted": c.rows_inserted,
        "rows_updated": c.rows_updated,
        "rows_unchanged": c.rows_unchanged,
        "rows_deleted": c.rows_deleted,
        "rows_rejected": c.rows_rejected,
        "rows_expected": c.rows_expected,
    })
}

/// The notices of a failed attempt (the run row was `running` with
/// `before.failures` earlier failures): `failed` (or `incomplete`,
/// `guard_refused`) when it is the first since done or its class differs
/// from the previous failure's; a lineage `FAIL` always.
pub(crate) async fn failed<D: Driver>(
    tx: &mut D::Tx,
    before: &Before,
    lease: &Lease,
    counts: &Counts,
    error: &Error,
) -> Result<(), Error> {
    let class = error.class().as_str();
    let changed = before.failures == 0 || before.previous_class.as_deref() != Some(class);
    let told = Told {
        before,
        lease,
        counts,
        error: Some(error),
    };
    let kind = changed.then(|| kind_of_failure(error));
    tell::<D>(tx, &told, kind, LineageEvent::Fail).await
}

/// The notices of a finished attempt: `recovered` when the key had failed
/// since it was last done; a lineage `COMPLETE` always.
pub(crate) async fn done<D: Driver>(
    tx: &mut D::Tx,
    before: &Before,
    lease: &Lease,
    counts: &Counts,
) -> Result<(), Error> {
    let told = Told {
        before,
        lease,
        counts,
        error: None,
    };
    let kind = (before.failures > 0).then_some(NoticeKind::Recovered);
    tell::<D>(tx, &told, kind, LineageEvent::Complete).await
}

/// A lineage event of an attempt's start or stop (`START`, `ABORT`).
pub(crate) async fn attempt_event<D: Driver>(
    tx: &mut D::Tx,
    before: &Before,
    lease: &Lease,
    counts: &Counts,
    event: LineageEvent,
) -> Result<(), Error> {
    let told = Told {
        before,
        lease,
        counts,
        error: None,
    };
    tell::<D>(tx, &told, None, event).await
}

/// Writes the notice of `kind` (when the change is news) for every target
/// that wants it, then the lineage `event`: one payload for all of them.
async fn tell<D: Driver>(
    tx: &mut D::Tx,
    told: &Told<'_>,
    kind: Option<NoticeKind>,
    event: LineageEvent,
) -> Result<(), Error> {
    let payload = told.payload();
    if let Some(kind) = kind {
        for target in told.lease.notices.wanting(kind) {
            insert::<D>(tx, told, kind.as_str(), &target, &payload).await?;
        }
    }
    lineage::<D>(tx, told, event, &payload).await
}

async fn lineage<D: Driver>(
    tx: &mut D::Tx,
    told: &Told<'_>,
    event: LineageEvent,
    payload: &serde_json::Value,
) -> Result<(), Error> {
    if !told.lease.notices.lineage {
        return Ok(());
    }
    let mut payload = payload.clone();
    if let Some(previous) = &told.before.run_id {
        payload["previous_run_id"] = serde_json::Value::String(previous.clone());
    }
    insert::<D>(tx, told, event.as_str(), LINEAGE_TARGET, &payload).await
}

const INSERT: &str = "INSERT INTO _tm_notices
    (id, kind, target, pipeline, source, export_type, period_start, attempt, due_key, payload)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT DO NOTHING";

async fn insert<D: Driver>(
    tx: &mut D::Tx,
    told: &Told<'_>,
    kind: &str,
    target: &str,
    payload: &serde_json::Value,
) -> Result<(), Error> {
    let b = told.before;
    let id = uuid::Uuid::new_v4().to_string();
    tx.execute(
        INSERT,
        &[
            Arg::Text(&id),
            Arg::Text(kind),
            Arg::Text(target),
            Arg::Text(&b.pipeline),
            Arg::Text(&b.source),
            Arg::Text(&b.export_type),
            Arg::Text(&b.period_start),
            Arg::Int(told.lease.attempt),
            Arg::Text(""),
            Arg::Json(Some(payload)),
        ],
    )
    .await?;
    Ok(())
}

/// Inserts a notice not caused by a run's change; `false` when the same
/// one (run key, kind, target, due instant) is there already.
pub(crate) async fn insert_new<D: Driver>(driver: &D, new: &NewNotice<'_>) -> Result<bool, Error> {
    let id = uuid::Uuid::new_v4().to_string();
    let mut tx = driver.begin().await?;
    let inserted = tx
        .execute(
            INSERT,
            &[
                Arg::Text(&id),
                Arg::Text(new.kind.as_str()),
                Arg::Text(new.target),
                Arg::Text(new.pipeline),
                Arg::Text(new.source),
                Arg::Text(new.export_type),
                Arg::Text(new.period_start),
                Arg::Int(0),
                Arg::Text(new.due_key),
                Arg::Json(Some(new.payload)),
            ],
        )
        .await?;
    tx.commit().await?;
    Ok(inserted == 1)
}

const COLUMNS: &str = "id, kind, target, pipeline, source, export_type, period_start, attempt,
    payload, status, attempts, last_error, created_at, sent_at";

fn notice_of(row: &Record) -> Result<OutboxNotice, Error> {
    Ok(OutboxNotice {
        id: row.text("id")?,
        kind: row.text("kind")?,
        target: row.text("target")?,
        pipeline: row.text("pipeline")?,
        source: row.text("source")?,
        export_type: row.text("export_type")?,
        period_start: row.text("period_start")?,
        attempt: row.int("attempt")?,
        payload: row.json("payload")?.unwrap_or_default(),
        status: row.text("status")?,
        attempts: row.int("attempts")?,
        last_error: row.opt_text("last_error")?,
        created_at: row.text("created_at")?,
        sent_at: row.opt_text("sent_at")?,
    })
}

/// The pipelines parameter of the deliverer's claim: a JSON array of names.
fn pipelines_in(d: Dialect, param: &str) -> String {
    match d {
        Dialect::Postgres => {
            format!("pipeline IN (SELECT jsonb_array_elements_text({param}::jsonb))")
        }
        Dialect::Sqlite => format!("pipeline IN (SELECT value FROM json_each({param}))"),
    }
}

/// Claims the oldest pending notice of `pipelines` whose back-off is over
/// and that no live deliverer holds: leased to `owner` for `lease`, its
/// `attempts` counted up. On PostgreSQL a notice another claim holds is
/// skipped, never waited for.
pub(crate) async fn claim<D: Driver>(
    driver: &D,
    owner: &str,
    pipelines: &[String],
    lease: Duration,
) -> Result<Option<OutboxNotice>, Error> {
    let d = D::DIALECT;
    let now = d.now();
    let lock = match d {
        Dialect::Postgres => "FOR UPDATE SKIP LOCKED",
        Dialect::Sqlite => "",
    };
    let sql = format!(
        "UPDATE _tm_notices SET claimed_by = $1, lease_until = {until}, attempts = attempts + 1
         WHERE id = (SELECT id FROM _tm_notices
                     WHERE status = 'pending' AND not_before <= {now}
                       AND (lease_until IS NULL OR lease_until < {now})
                       AND {pipelines}
                     ORDER BY created_at, id LIMIT 1 {lock})
         RETURNING {COLUMNS}",
        until = d.now_plus("$2"),
        pipelines = pipelines_in(d, "$3"),
    );
    let names = serde_json::json!(pipelines);
    let mut tx = driver.begin().await?;
    let row = fetch_optional(
        &mut tx,
        &sql,
        &[
            Arg::Text(owner),
            Arg::Float(lease.as_secs_f64()),
            Arg::Json(Some(&names)),
        ],
    )
    .await?;
    tx.commit().await?;
    row.as_ref().map(notice_of).transpose()
}

/// How a delivery try ended.
#[derive(Debug, Clone)]
pub enum Delivered<'a> {
    /// The receiver took it (2xx).
    Sent,
    /// Try again after this long; the error says why.
    Retry(Duration, &'a str),
    /// No more tries; the error says why.
    Dead(&'a str),
}

/// Records how a claimed notice's try ended; only while `owner` still holds
/// it (a deliverer whose lease ran out changes nothing).
pub(crate) async fn record<D: Driver>(
    driver: &D,
    id: &str,
    owner: &str,
    outcome: &Delivered<'_>,
) -> Result<(), Error> {
    let d = D::DIALECT;
    let now = d.now();
    let release = "claimed_by = NULL, lease_until = NULL";
    let guard = "WHERE id = $1 AND claimed_by = $2 AND status = 'pending'";
    let mut tx = driver.begin().await?;
    match outcome {
        Delivered::Sent => {
            let sql = format!(
                "UPDATE _tm_notices SET status = 'sent', sent_at = {now}, last_error = NULL, {release} {guard}"
            );
            tx.execute(&sql, &[Arg::Text(id), Arg::Text(owner)]).await?
        }
        Delivered::Retry(after, why) => {
            let sql = format!(
                "UPDATE _tm_notices SET not_before = {}, last_error = $4, {release} {guard}",
                d.now_plus("$3")
            );
            let args = [
                Arg::Text(id),
                Arg::Text(owner),
                Arg::Float(after.as_secs_f64()),
                Arg::Text(why),
            ];
            tx.execute(&sql, &args).await?
        }
        Delivered::Dead(why) => {
            let sql = format!(
                "UPDATE _tm_notices SET status = 'dead', last_error = $3, {release} {guard}"
            );
            tx.execute(&sql, &[Arg::Text(id), Arg::Text(owner), Arg::Text(why)])
                .await?
        }
    };
    tx.commit().await
}

/// The notices of `pipeline` (one period start, if given), oldest first.
pub(crate) async fn list<D: Driver>(
    driver: &D,
    pipeline: &str,
    period_start: Option<&str>,
) -> Result<Vec<OutboxNotice>, Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM _tm_notices
         WHERE pipeline = $1 AND ($2 IS NULL OR period_start = $2)
         ORDER BY created_at, id"
    );
    let mut tx = driver.begin_read().await?;
    let rows = fetch_all(
        &mut tx,
        &sql,
        &[Arg::Text(pipeline), Arg::OptText(period_start)],
    )
    .await?;
    tx.commit().await?;
    rows.iter().map(notice_of).collect()
}

/// Deletes `sent` notices created more than `age_secs` ago; how many.
pub(crate) async fn prune<T: LedgerTx>(
    tx: &mut T,
    d: Dialect,
    age_secs: f64,
) -> Result<u64, Error> {
    let sql = format!(
        "DELETE FROM _tm_notices WHERE status = 'sent' AND created_at < {}",
        d.now_minus_secs("$1")
    );
    tx.execute(&sql, &[Arg::Float(age_secs)]).await
}
