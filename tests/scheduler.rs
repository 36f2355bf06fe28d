//! `sync` (due periods, lookback) and `serve` (the scheduler; two of them
//! sharing one database never run a period twice).

use std::time::{Duration, Instant};

use chrono::{Days, Utc};

use crate::support::{backend_tests, Backend, Env};

/// The events example with `period.start` `days` days ago, so a handful of
/// periods are due (the files for those days are missing: `missing = "empty"`).
async fn recent_events(backend: Backend, days: u64, extra: &str) -> (Env, Vec<String>) {
    let env = Env::new(backend).await;
    env.copy_example("events");
    let start = Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(days))
        .expect("date");
    env.edit_pipeline("events", |text| {
        format!(
            "{}\n{extra}",
            text.replace("start = \"2024-01-01\"", &format!("start = \"{start}\""))
                .replace("every = \"15m\"", "every = \"1s\"")
        )
    });
    let due = (0..days)
        .map(|i| {
            start
                .checked_add_days(Days::new(i))
                .expect("date")
                .to_string()
        })
        .collect();
    (env, due)
}

async fn sync_runs_due_periods_then_only_lookback(backend: Backend) {
    let (env, due) = recent_events(backend, 3, "").await;
    env.set_option("events", "period", "lookback", "1");
    env.tidemark(&["sync", "events"])
        .expect_code(0, "first sync");
    let status = env.status("events");
    let mut started: Vec<&str> = status
        .iter()
        .map(|e| e["period_start"].as_str().unwrap_or(""))
        .collect();
    started.sort_unstable();
    assert_eq!(started.len(), 3, "exactly the due periods ran: {status:?}");
    for (entry, day) in started.iter().zip(&due) {
        assert!(entry.starts_with(day.as_str()), "{entry} vs {day}");
    }
    assert!(status
        .iter()
        .all(|e| e["status"] == "done" && e["attempts"] == 1));

    // A second sync re-runs only the last done period (lookback = 1).
    let out = env.tidemark(&["sync", "events"]);
    out.expect_code(0, "second sync");
    let attempts: Vec<i64> = env
        .status("events")
        .iter()
        .map(|e| e["attempts"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(
        attempts,
        [1, 1, 2],
        "only the newest due period runs again\n{out}"
    );

    // Today's period is not due (it has not ended): never in the ledger.
    let today = Utc::now().date_naive().to_string();
    assert!(env.status_of("events", &today).is_none());
}

async fn two_schedulers_never_run_a_period_twice(backend: Backend) {
    let (env, due) = recent_events(backend, 6, "").await;
    let a = env.spawn(&["serve", "--concurrency", "2"]);
    let b = env.spawn(&["serve", "--concurrency", "2"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = env.status("events");
        if status.len() == due.len() && status.iter().all(|e| e["status"] == "done") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "schedulers did not finish the due periods: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Let both schedulers fire a few more times over the done periods.
    std::thread::sleep(Duration::from_millis(2500));
    for running in [a, b] {
        let pid = running.pid().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(killed.success());
        running
            .finish(Duration::from_secs(20))
            .expect_code(0, "serve exits 0 on SIGTERM");
    }
    let status = env.status("events");
    assert_eq!(status.len(), due.len());
    for entry in &status {
        assert_eq!(entry["attempts"], 1, "a period ran more than once: {entry}");
    }
}

/// A pipeline without `[schedule]` is still worked (its keys come from
/// `backfill --enqueue`), but a folder with no pipeline at all, or with a
/// broken one, is a configuration error before any database is touched.
async fn serve_without_pipelines_is_a_config_error(backend: Backend) {
    let env = Env::new(backend).await;
    let out = env.tidemark(&["serve", "--drain"]);
    out.expect_code(2, "no pipeline files");
    assert!(out.stderr.contains("no pipeline files"), "{out}");
    env.copy_example("orders");
    env.edit_pipeline("orders", |t| t.replace("on_missing", "on_mising"));
    let out = env.tidemark(&["serve", "--drain"]);
    out.expect_code(2, "a broken pipeline file");
    assert!(
        out.stderr.contains("orders.toml") && out.stderr.contains("on_mising"),
        "{out}"
    );
    assert!(env.db.untouched().await, "no database touched");
}

backend_tests! {
    sync_runs_due_periods_then_only_lookback: sync_runs_due_periods_then_only_lookback_sqlite, sync_runs_due_periods_then_only_lookback_postgres;
    two_schedulers_never_run_a_period_twice: two_schedulers_never_run_a_period_twice_sqlite, two_schedulers_never_run_a_period_twice_postgres;
    serve_without_pipelines_is_a_config_error: serve_without_pipelines_is_a_config_error_sqlite, serve_without_pipelines_is_a_config_error_postgres;
}
