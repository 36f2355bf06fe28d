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
use tidemark_load::{ClaimRequest, Preview, RunStatus, Store};

use crate::cli::{Global, LogFormat, RunOptions};
use crate::commands::{flags_of, worker};
use crate::engine::claim_request;
use crate::exit::Exit;
use crate::plan::{self, Ask, Forced, Intent};

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
pub async fn show(
    global: &Global,
    targets: &[Target],
    options: &RunOptions,
    now: DateTime<Utc>,
) -> Result<Exit, Error> {
    let store = Store::open_read_only(&global.database_url).await?;
    let lines = lines(store.as_ref(), targets, options, now).await;
    if let Some(store) = &store {
        store.close().await;
    }
    let lines = lines?;
    print(&lines, targets.len() > 1, global.log_format);
    Ok(Exit::Success)
}

async fn lines(
    store: Option<&Store>,
    targets: &[Target],
    options: &RunOptions,
    now: DateTime<Utc>,
) -> Result<Vec<DryLine>, Error> {
    let worker = worker();
    // A dry run takes no lease; the claim rules only read its length.
    let lease_ttl = std::time::Duration::from_secs(30);
    let mut lines = Vec::new();
    for target in targets {
        let pipeline = &target.pipeline;
        let planned = plan::plan(store, pipeline, &target.sources, &target.ask, now).await?;
        let claims: Vec<(RunKey, ClaimRequest)> = planned
            .iter()
            .filter(|p| matches!(p.intent, Intent::Claim(_)))
            .map(|p| {
                let flags = flags_of(p, options, false);
                (
                    p.key.clone(),
                    claim_request(pipeline, &flags, &worker, lease_ttl),
                )
            })
            .collect();
        let previews = match store {
            None => vec![Preview::New; claims.len()],
            Some(store) => {
                crate::engine::retry(&pipeline.retry, "read the ledger", || {
                    store.preview_claims(&pipeline.spec.name, &pipeline.spec.export_type, &claims)
                })
                .await?
            }
        };
        let mut previews = previews.into_iter();
        for p in planned {
            let (action, reason) = match &p.intent {
                Intent::Leave(why) => ("skip", why.clone()),
                Intent::Claim(forced) => match previews.next() {
                    Some(preview) => describe(&preview, forced.as_ref()),
                    None => ("run", "new".to_string()),
                },
            };
            lines.push(DryLine {
                key: p.key,
                action,
                reason,
            });
        }
    }
    Ok(lines)
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
                format!("failed: {}", error_class.as_deref().unwrap_or("unknown")),
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

fn print(lines: &[DryLine], several_pipelines: bool, format: LogFormat) {
    let mut pipeline: Option<&str> = None;
    for line in lines {
        let key = &line.key;
        match format {
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
                if several_pipelines && pipeline != Some(key.pipeline.as_str()) {
                    say!("pipeline {}:", key.pipeline);
                    pipeline = Some(&key.pipeline);
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
    let tally = |action: &str| lines.iter().filter(|l| l.action == action).count();
    let actions = ["run", "resume", "re-run", "skip", "held"];
    match format {
        LogFormat::Json => {
            let mut summary = serde_json::Map::new();
            summary.insert("run_keys".into(), lines.len().into());
            for action in actions {
                summary.insert(action.into(), tally(action).into());
            }
            say!("{}", serde_json::json!({ "dry_run_summary": summary }));
        }
        LogFormat::Text => say!(
            "dry run: {} run key(s): {}; nothing was read or written",
            lines.len(),
            actions.map(|a| format!("{} {a}", tally(a))).join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preview_has_an_action_of_the_contract() {
        let failed = Preview::Fresh {
            from: RunStatus::Failed,
            error_class: Some("parse".into()),
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
