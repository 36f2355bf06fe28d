//! `tidemark serve`: a long-running scheduler. Each pipeline with a
//! `[schedule]` gets a `sync` when its schedule fires. Several `serve`
//! processes (on any hosts) may share one PostgreSQL: each claims run keys
//! through the ledger, so a period held by another process is skipped (and
//! taken over once that process's lease expires), never run twice at once.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use tidemark_core::{Error, Pipeline};
use tidemark_load::Store;
use tokio::task::JoinSet;

use crate::cli::{Global, RunOptions, ServeArgs};
use crate::commands::{all_pipelines, run_jobs, sync_jobs};
use crate::engine::Outcome;
use crate::exit::Exit;

pub async fn serve(global: &Global, args: ServeArgs) -> Result<Exit, Error> {
    let pipelines: Vec<Arc<Pipeline>> = all_pipelines(global)?
        .into_iter()
        .filter(|p| {
            let scheduled = p.schedule.is_some() && p.first_period.is_some();
            if !scheduled {
                tracing::info!(pipeline = %p.spec.name, "no [schedule] or period.start: not scheduled");
            }
            scheduled
        })
        .map(Arc::new)
        .collect();
    if pipelines.is_empty() {
        return Err(Error::config(
            global.pipelines.display().to_string(),
            "schedule",
            "no pipeline in this folder has both [schedule] and period.start",
        ));
    }
    let store = Store::connect(&global.database_url).await?;
    tracing::info!(pipelines = pipelines.len(), "scheduler started");
    let mut next: HashMap<String, chrono::DateTime<Utc>> = pipelines
        .iter()
        .map(|p| (p.spec.name.clone(), Utc::now()))
        .collect();
    let mut running: JoinSet<String> = JoinSet::new();
    let mut busy: Vec<String> = Vec::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let now = Utc::now();
        for pipeline in &pipelines {
            let name = &pipeline.spec.name;
            if busy.contains(name) || next.get(name).is_some_and(|at| *at > now) {
                continue;
            }
            let following = pipeline
                .schedule
                .as_ref()
                .and_then(|s| s.next_after(now))
                .unwrap_or(now);
            next.insert(name.clone(), following);
            busy.push(name.clone());
            running.spawn(sync_once(
                store.clone(),
                Arc::clone(pipeline),
                usize::from(args.concurrency),
            ));
        }
        let wake = next.values().min().copied().unwrap_or(now);
        let sleep = (wake - Utc::now())
            .to_std()
            .unwrap_or_default()
            .min(std::time::Duration::from_secs(60));
        tokio::select! {
            _ = &mut shutdown => break,
            Some(done) = running.join_next(), if !running.is_empty() => {
                if let Ok(name) = done {
                    busy.retain(|n| n != &name);
                }
            }
            _ = tokio::time::sleep(sleep) => {}
        }
    }
    tracing::info!(
        running = running.len(),
        "shutting down: waiting for running periods to finish"
    );
    while running.join_next().await.is_some() {}
    store.close().await;
    Ok(Exit::Success)
}

/// One scheduled `sync` of one pipeline; outcomes are logged, not fatal.
async fn sync_once(store: Store, pipeline: Arc<Pipeline>, concurrency: usize) -> String {
    let name = pipeline.spec.name.clone();
    let options = RunOptions {
        source: None,
        force: false,
        force_deletes: false,
    };
    match sync_jobs(&store, &pipeline, &options, Utc::now()).await {
        Ok(jobs) if jobs.is_empty() => tracing::debug!(pipeline = %name, "nothing due"),
        Ok(jobs) => {
            for (key, outcome) in run_jobs(jobs, concurrency, false).await {
                match outcome {
                    Outcome::Done(_) => tracing::info!(%key, "period done"),
                    Outcome::AlreadyDone(_) => tracing::debug!(%key, "already done"),
                    Outcome::Held { owner } => {
                        tracing::info!(%key, %owner, "held by another worker; skipped")
                    }
                    Outcome::NotRun { reason } => tracing::warn!(%key, %reason, "not run"),
                    Outcome::Failed(e) => {
                        tracing::warn!(%key, class = %e.class(), error = %e, "period failed")
                    }
                }
            }
        }
        Err(e) => tracing::error!(pipeline = %name, error = %e, "sync failed"),
    }
    name
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
