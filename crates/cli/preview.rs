//! Printing `--dry-run`: one line per run key (text, or JSON with
//! `--log-format json`) and a summary by action. The engine decides the
//! lines ([`tidemark_engine::dry_run`]); this only prints them.

use tidemark_core::Error;
use tidemark_engine::{DryLine, Engine, Target, ACTIONS};

use crate::cli::{LogFormat, RunOptions};
use crate::exit::Exit;
use crate::setup::Setup;

/// Prints the dry run of `targets` at the command's clock; exit 0 whatever
/// it finds. Lines are printed as the engine decides them, a page of the
/// plan at a time (ADR 0014); a ledger read that still fails after the
/// retries ends it with the error, after the lines of the pages before.
pub async fn show(
    setup: &Setup<'_>,
    targets: Vec<Target>,
    options: &RunOptions,
) -> Result<Exit, Error> {
    let store = setup.open_read_only().await?;
    let mut printer = Printer::new(targets.len() > 1, setup.global.log_format);
    let shown = tidemark_engine::dry_run(
        store.as_ref(),
        targets,
        options.force_deletes,
        &Engine::this_process(),
        setup.clock.now(),
        |line| printer.line(&line),
    )
    .await;
    if let Some(store) = &store {
        store.close().await;
    }
    shown?;
    printer.finish();
    Ok(Exit::Success)
}

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
