//! What a claim would do with each run key, found without locking or
//! writing anything: the answer of a dry run. It reads the same columns a
//! claim locks and applies the same claim rules ([`super::rules::decide`])
//! to them, so a dry run cannot disagree with the claim that follows it
//! unless the ledger changes in between.

use std::collections::HashMap;

use tidemark_core::{Error, RunKey};

use super::driver::{Driver, LedgerTx, Record};
use super::flow::snapshot;
use super::rules::{decide, Decision};
use super::sql::Statements;
use super::{ClaimRequest, RunStatus};

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
        /// The error class of the last failure, if any.
        error_class: Option<String>,
    },
}

/// The preview of each `(key, request)` (all of `pipeline` and
/// `export_type`), in order, as of one read of the ledger.
pub(crate) async fn preview<D: Driver>(
    driver: &D,
    pipeline: &str,
    export_type: &str,
    keys: &[(RunKey, ClaimRequest)],
) -> Result<Vec<Preview>, Error> {
    let mut rows: HashMap<(String, String), Record> = HashMap::new();
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(
        &Statements::of(D::DIALECT).preview_runs,
        &[
            super::driver::Arg::Text(pipeline),
            super::driver::Arg::Text(export_type),
        ],
        |row| {
            rows.insert((row.text("source")?, row.text("period_start")?), row);
            Ok(())
        },
    )
    .await?;
    tx.commit().await?;
    keys.iter()
        .map(
            |(key, request)| match rows.get(&(key.source.clone(), key.period.start_rfc3339())) {
                None => Ok(Preview::New),
                Some(row) => preview_row(row, request),
            },
        )
        .collect()
}

fn preview_row(row: &Record, request: &ClaimRequest) -> Result<Preview, Error> {
    let snapshot = snapshot(row)?;
    let from = snapshot.status;
    Ok(match decide(snapshot, request) {
        Decision::Done(_) => Preview::Done {
            finished_at: row.opt_text("finished_at")?,
        },
        Decision::Held { owner, expires_at } => Preview::Held { owner, expires_at },
        Decision::Take {
            resume: Some(_), ..
        } => Preview::Resume {
            batches: row.int("batches")?,
        },
        Decision::Take { resume: None, .. } => Preview::Fresh {
            from,
            error_class: row.opt_text("error_class")?,
        },
    })
}
