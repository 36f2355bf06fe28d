//! `--dry-run` of `run`, `backfill` and `sync`: what the command would do
//! with each run key, and why, without reading a source or writing
//! anything.
//!
//! It plans with the command's own code ([`crate::plan`]: the open-period
//! rule, `--only`, due periods, forced re-runs) and previews each claim with
//! the ledger's own claim rules (`KeyRow::preview`), on a database opened
//! read-only ([`Store::open_read_only`]: no SQLite file is created, nothing
//! is migrated). So its answer is the real command's, unless the ledger
//! changes in between. Printing is the caller's.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Pipeline, RunKey};
use tidemark_load::{Preview, RunStatus, Store, WorkerId};

use crate::plan::{Ask, Forced, Intent, Planned, Planner};
use crate::run::{claim_request, RunFlags};

/// One pipeline's part of a command.
pub struct Target {
    /// The pipeline.
    pub pipeline: Arc<Pipeline>,
    /// The sources asked for.
    pub sources: Vec<String>,
    /// The periods asked for, and how.
    pub ask: Ask,
}

/// What the command would do with one run key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryLine {
    /// The run key.
    pub key: RunKey,
    /// `skip`, `run`, `resume`, `re-run` or `held`.
    pub action: &'static str,
    /// Why, in a few words.
    pub reason: String,
}

/// The dry run of `targets` at `now`, a page of each plan at a time, each
/// line handed to `each` as it is decided: a dry run of a million periods
/// holds one page (ADR 0014). A ledger read that still fails after the
/// retries ends it with the error, after the lines of the pages before.
pub async fn dry_run(
    store: Option<&Store>,
    targets: Vec<Target>,
    force_deletes: bool,
    worker: &WorkerId,
    now: DateTime<Utc>,
    mut each: impl FnMut(DryLine),
) -> Result<(), Error> {
    for target in targets {
        let mut planner = Planner::new(
            store.cloned(),
            target.pipeline,
            target.sources,
            target.ask,
            now,
            true,
        )?;
        while let Some(page) = planner.next_page().await? {
            for planned in page {
                each(line(planner.pipeline(), planned, force_deletes, worker));
            }
        }
    }
    Ok(())
}

/// What the command would do with one planned key: the plan's reason to
/// leave it, or the claim rules' answer for its ledger row as read.
fn line(pipeline: &Pipeline, planned: Planned, force_deletes: bool, worker: &WorkerId) -> DryLine {
    // A dry run takes no lease; the claim rules only read its length.
    let lease_ttl = std::time::Duration::from_secs(30);
    let (action, reason) = match &planned.intent {
        Intent::Leave(why) => ("skip", why.clone()),
        Intent::Claim(forced) => {
            let preview = planned.row.as_ref().map_or(Preview::New, |row| {
                let flags = RunFlags::of(&planned, force_deletes, false);
                row.preview(&claim_request(pipeline, &flags, worker, lease_ttl))
            });
            match (&preview, &planned.row) {
                // A marked key the claim would leave: say it is marked.
                (Preview::Done { .. }, Some(row)) if row.entry.marked.is_some() => {
                    ("skip", crate::plan::describe(&row.entry))
                }
                _ => describe(&preview, forced.as_ref()),
            }
        }
    };
    DryLine {
        key: planned.key,
        action,
        reason,
    }
}

/// The action and reason of a claim the ledger would answer with `preview`.
fn describe(preview: &Preview, forced: Option<&Forced>) -> (&'static str, String) {
    match preview {
        Preview::New => ("run", "new".into()),
        Preview::Done { finished_at } => (
            "skip",
            format!("done at {}", finished_at.as_deref().unwrap_or("?")),
        ),
        Preview::Held { owner, expires_at } => ("held", format!("by {owner} until {expires_at}")),
        Preview::Resume { batches } => ("resume", format!("from batch {}", batches + 1)),
        Preview::Fresh { from, error_class } => match (from, forced) {
            (RunStatus::Failed, _) => (
                "re-run",
                format!("failed: {}", error_class.map_or("unknown", |c| c.as_str())),
            ),
            (RunStatus::Pending, None) => ("run", "queued".into()),
            (RunStatus::Cancelled, None) => ("run", "cancelled before".into()),
            (RunStatus::Running, None) => (
                "re-run",
                "its last attempt stopped and cannot be resumed; starting over".into(),
            ),
            (_, Some(forced)) => ("re-run", forced_reason(forced)),
            (RunStatus::Done, None) => ("re-run", "forced".into()),
        },
    }
}

fn forced_reason(forced: &Forced) -> String {
    match forced {
        Forced::Flag => "forced".into(),
        Forced::Stale(why) => format!("stale: {why}"),
        Forced::Provisional => "provisional (done while open, due now)".into(),
        Forced::Lookback => "lookback (late data)".into(),
    }
}

/// The actions of the contract, in the summary's order.
pub const ACTIONS: [&str; 5] = ["run", "resume", "re-run", "skip", "held"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preview_has_an_action_of_the_contract() {
        let failed = Preview::Fresh {
            from: RunStatus::Failed,
            error_class: Some(tidemark_core::ErrorClass::Parse.into()),
        };
        assert_eq!(describe(&failed, None), ("re-run", "failed: parse".into()));
        let done = Preview::Fresh {
            from: RunStatus::Done,
            error_class: None,
        };
        assert_eq!(
            describe(&done, Some(&Forced::Stale("version 2 -> 3".into()))),
            ("re-run", "stale: version 2 -> 3".into())
        );
        assert_eq!(
            describe(&Preview::Resume { batches: 2 }, None),
            ("resume", "from batch 3".into())
        );
        assert_eq!(describe(&Preview::New, None), ("run", "new".into()));
        let held = Preview::Held {
            owner: "h:1:x".into(),
            expires_at: "2024-01-01T00:00:30.000Z".into(),
        };
        assert_eq!(
            describe(&held, None),
            ("held", "by h:1:x until 2024-01-01T00:00:30.000Z".into())
        );
    }
}
