//! `--dry-run` of `run`, `backfill` and `sync`: what the command would do
//! with each run key, and why, without reading a source or writing
//! anything.
//!
//! It plans with the command's own code ([`crate::plan`]: the open-period
//! rule, `--only`, due periods, forced re-runs) and previews each claim with
//! the ledger's own claim rules ([`Store::preview_claims`]), on a database
//! opened read-only ([`Store::open_read_only`]: no SQLite file is created,
//! nothing is migrated). So its answer is the real command's, unless the
//! ledger changes in between.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Pipeline, RunKey};
use tidemark_load::{Preview, RunStatus, Store};

use crate::cli::{Global, LogFormat, RunOptions};
use crate::commands::{flags_of, worker};
use crate::engine::claim_request;
use crate::exit::Exit;
use crate::plan::{Ask, Forced, Intent, Planned, Planner};

/// One pipeline's part of a command.
pub struct Target {
    pub pipeline: Arc<Pipeline>,
    pub sources: Vec<String>,
    pub ask: Ask,
}

/// What the command would do with one run key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryLine {
    pub key: RunKey,
    /// `skip`, `run`, `resume`, `re-run` or `held`.
    pub action: &'static str,
    pub reason: String,
}

/// Prints the dry run of `targets` at `now`; exit 0 whatever it finds.
/// Lines are printed a page of the plan at a time, so a dry run of a
/// million periods holds one page (ADR 0014); a ledger read that still
/// fails after the retries ends it with the error, after the lines of the
/// pages before.
pub async fn show(
    global: &Global,
    targets: Vec<Target>,
    options: &RunOptions,
    now: DateTime<Utc>,
) -> Result<Exit, Error> {
    let store = Store::open_read_only(&global.database_url).await?;
    let mut printer = Printer::new(targets.len() > 1, global.log_format);
    let shown = print_plans(store.as_ref(), targets, options, now, &mut printer).await;
    if let Some(store) = &store {
        store.close().await;
    }
    shown?;
    printer.finish();
    Ok(Exit::Success)
}

async fn print_plans(
    store: Option<&Store>,
    targets: Vec<Target>,
    options: &RunOptions,
    now: DateTime<Utc>,
    printer: &mut Printer,
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
                printer.line(&line(planner.pipeline(), planned, options));
            }
        }
    }
    Ok(())
}

/// What the command would do with one planned key: the plan's reason to
/// leave it, or the claim rules' answer for its ledger row as read.
fn line(pipeline: &Pipeline, planned: Planned, options: &RunOptions) -> DryLine {
    // A dry run takes no lease; the claim rules only read its length.
    let lease_ttl = std::time::Duration::from_secs(30);
    let (action, reason) = match &planned.intent {
        Intent::Leave(why) => ("skip", why.clone()),
        Intent::Claim(forced) => {
            let preview = planned.row.as_ref().map_or(Preview::New, |row| {
                let flags = flags_of(&planned, options, false);
                row.preview(&claim_request(pipeline, &flags, &worker(), lease_ttl))
            });
            describe(&preview, forced.as_ref())
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
const ACTIONS: [&str; 5] = ["run", "resume", "re-run", "skip", "held"];

/// Prints dry-run lines as they come and counts them for the summary.
struct Printer {
    several_pipelines: bool,
    format: LogFormat,
    /// The pipeline whose header was printed last.
    pipeline: Option<String>,
    /// Lines per action of [`ACTIONS`].
    tally: [usize; ACTIONS.len()],
    lines: usize,
}

impl Printer {
    fn new(several_pipelines: bool, format: LogFormat) -> Printer {
        Printer {
            several_pipelines,
            format,
            pipeline: None,
            tally: [0; ACTIONS.len()],
            lines: 0,
        }
    }

    fn line(&mut self, line: &DryLine) {
        self.lines += 1;
        if let Some(i) = ACTIONS.iter().position(|a| *a == line.action) {
            self.tally[i] += 1;
        }
        let key = &line.key;
        match self.format {
            LogFormat::Json => say!(
                "{}",
                serde_json::json!({
                    "pipeline": key.pipeline,
                    "period_start": key.period.start_rfc3339(),
                    "period": key.period.label(),
                    "source": key.source,
                    "action": line.action,
                    "reason": line.reason,
                })
            ),
            LogFormat::Text => {
                if self.several_pipelines && self.pipeline.as_deref() != Some(&key.pipeline) {
                    say!("pipeline {}:", key.pipeline);
                    self.pipeline = Some(key.pipeline.clone());
                }
                say!(
                    "{} {} {}: {}",
                    key.period.label(),
                    key.source,
                    line.action,
                    line.reason
                );
            }
        }
    }

    fn finish(self) {
        match self.format {
            LogFormat::Json => {
                let mut summary = serde_json::Map::new();
                summary.insert("run_keys".into(), self.lines.into());
                for (action, n) in ACTIONS.iter().zip(self.tally) {
                    summary.insert((*action).into(), n.into());
                }
                say!("{}", serde_json::json!({ "dry_run_summary": summary }));
            }
            LogFormat::Text => say!(
                "dry run: {} run key(s): {}; nothing was read or written",
                self.lines,
                ACTIONS
                    .iter()
                    .zip(self.tally)
                    .map(|(a, n)| format!("{n} {a}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

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
