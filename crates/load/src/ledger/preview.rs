//! The ledger rows planning reads, a page of run keys at a time, and what a
//! claim would do with each, found without locking or writing anything:
//! the answer of a dry run. A row carries what `status` shows of it and the
//! columns a claim locks, and its preview applies the same claim rules
//! ([`super::rules::decide`]) to them, so a dry run cannot disagree with the
//! claim that follows it unless the ledger changes in between.
//!
//! Rows are read by key (one indexed lookup each, the keys of a page sent
//! as one JSON parameter), never the whole ledger at once: planning a range
//! of a million periods holds one page of rows (ADR 0014).

use tidemark_core::Error;

use super::driver::{Arg, Driver, LedgerTx, Record};
use super::flow::{entry_of, snapshot};
use super::rules::{decide, Decision, Snapshot};
use super::sql::Statements;
use super::{ClaimRequest, LedgerEntry, RunStatus, StoredClass};

/// What claiming one run key would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preview {
    /// No ledger row yet: the claim creates it and runs the period.
    New,
    /// Done and not forced: the stored result is reported, nothing runs.
    Done {
        /// When it finished.
        finished_at: Option<String>,
    },
    /// Another live attempt holds it.
    Held {
        /// Its owner.
        owner: String,
        /// When its lease runs out unless renewed.
        expires_at: String,
    },
    /// A stopped attempt is taken over and continued after its committed
    /// batches.
    Resume {
        /// Batches already committed.
        batches: i64,
    },
    /// Taken and run from the start.
    Fresh {
        /// The state it is taken from.
        from: RunStatus,
        /// The error class of the last failure (or `interrupted`), if any.
        error_class: Option<StoredClass>,
    },
}

/// One run key's ledger row as planning reads it: what `status` shows, and
/// what a claim would see of it (as of the read).
#[derive(Debug, Clone)]
pub struct KeyRow {
    /// The row as `status` shows it (not yet judged stale).
    pub entry: LedgerEntry,
    snapshot: Snapshot,
    batches: i64,
}

impl KeyRow {
    /// What a claim with `request` would do with this row.
    pub fn preview(&self, request: &ClaimRequest) -> Preview {
        match decide(self.snapshot.clone(), request) {
            Decision::Done(_) => Preview::Done {
                finished_at: self.entry.finished_at.clone(),
            },
            Decision::Held { owner, expires_at } => Preview::Held { owner, expires_at },
            Decision::Take {
                resume: Some(_), ..
            } => Preview::Resume {
                batches: self.batches,
            },
            Decision::Take { resume: None, .. } => Preview::Fresh {
                from: self.snapshot.status,
                error_class: self.entry.error_class,
            },
        }
    }
}

/// One run key to look up: source and period start (RFC 3339, as stored).
#[derive(Debug, Clone, Copy)]
pub struct KeyRef<'a> {
    /// Source id.
    pub source: &'a str,
    /// Period start.
    pub period_start: &'a str,
}

/// The ledger rows of `keys` (all of `pipeline` and `export_type`) that
/// exist, in no particular order, as of one read.
pub(crate) async fn key_rows<D: Driver>(
    driver: &D,
    pipeline: &str,
    export_type: &str,
    keys: &[KeyRef<'_>],
) -> Result<Vec<KeyRow>, Error> {
    let mut rows = Vec::new();
    if keys.is_empty() {
        return Ok(rows);
    }
    let wanted: serde_json::Value = keys
        .iter()
        .map(|k| serde_json::json!([k.source, k.period_start]))
        .collect();
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(
        &Statements::of(D::DIALECT).key_rows,
        &[
            Arg::Text(pipeline),
            Arg::Text(export_type),
            Arg::Json(Some(&wanted)),
        ],
        |row| {
            rows.push(key_row(&row)?);
            Ok(())
        },
    )
    .await?;
    tx.commit().await?;
    Ok(rows)
}

fn key_row(row: &Record) -> Result<KeyRow, Error> {
    Ok(KeyRow {
        entry: entry_of(row)?,
        snapshot: snapshot(row)?,
        batches: row.int("batches")?,
    })
}

/// The starts of `source`'s done rows (of `pipeline` and `export_type`),
/// latest instant first, `limit` of them after skipping `offset`: where
/// `sync` finds its last `lookback` done periods without reading the rest.
pub(crate) async fn done_starts<D: Driver>(
    driver: &D,
    pipeline: &str,
    export_type: &str,
    source: &str,
    limit: i64,
    offset: i64,
) -> Result<Vec<String>, Error> {
    let mut starts = Vec::new();
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(
        &Statements::of(D::DIALECT).done_starts,
        &[
            Arg::Text(pipeline),
            Arg::Text(export_type),
            Arg::Text(source),
            Arg::Int(limit),
            Arg::Int(offset),
        ],
        |row| {
            starts.push(row.text("period_start")?);
            Ok(())
        },
    )
    .await?;
    tx.commit().await?;
    Ok(starts)
}
