//! The engine driven in process, as a program embedding it would: a
//! custom source, a SQLite destination in a temporary folder, and the
//! outcome checked where it lands (the destination table, the ledger, the
//! rejects), not only in what the call returns.

mod support;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use support::{key, pipeline_text, records, Env, FakeSource, Hold};
use tidemark_engine::plan::{Ask, PeriodRange, Planner};
use tidemark_engine::{
    Catalog, Engine, Error, ErrorClass, ManualClock, Outcome, RunEvent, RunFlags, RunMany, Service,
    ServiceConfig, Shutdown,
};

/// A run stopped between batches leaves its checkpoint; when the source
/// then says the checkpoint no longer fits (its data was rewritten), the
/// next run starts the period over under a new run id and ends with the
/// table a clean run of the new data gives, rows only the old data had
/// reconciled away.
#[tokio::test]
async fn restart_fresh_on_a_stale_checkpoint() {
    let env = Env::new().await;
    let text = pipeline_text("items", 2, r#"on_missing = "delete""#, "");
    let pipeline = env.pipeline("items.toml", &text);
    let old = records(&[
        ("k01", 1),
        ("k02", 2),
        ("k03", 3),
        ("k04", 4),
        ("k05", 5),
        ("k06", 6),
        ("k07", 7),
        ("k08", 8),
        ("k09", 9),
        ("k10", 10),
    ]);
    // The rewritten feed: k01 gone, k03 changed, k11 new.
    let new = records(&[
        ("k02", 2),
        ("k03", 33),
        ("k04", 4),
        ("k05", 5),
        ("k06", 6),
        ("k07", 7),
        ("k08", 8),
        ("k09", 9),
        ("k10", 10),
        ("k11", 11),
    ]);

    // First run: stopped once two batches are committed (the third is
    // held back until the stop is asked for).
    let hold = Arc::new(Hold {
        at_call: 3,
        ..Hold::default()
    });
    let first = FakeSource {
        hold: Some(Arc::clone(&hold)),
        ..FakeSource::with(old)
    };
    let shutdown = Shutdown::new();
    let engine = Engine::builder(env.store.clone())
        .shutdown(shutdown.clone())
        .source(support::SOURCE, Arc::new(first))
        .build();
    let run = tokio::spawn({
        let pipeline = Arc::clone(&pipeline);
        let key = key(&pipeline, "2024-01-02");
        async move { engine.run(&pipeline, key, RunFlags::default()).await }
    });
    hold.reached.notified().await;
    env.wait_for("SELECT batches FROM _tm_runs", 2).await;
    shutdown.request();
    hold.release.notify_one();
    let outcome = run.await.expect("first run");
    assert!(matches!(outcome, Outcome::Interrupted), "{outcome:?}");
    let stopped: Vec<(String, String, Option<String>, i64)> = env
        .fetch("SELECT status, run_id, checkpoint, batches FROM _tm_runs")
        .await;
    let (status, first_run_id, checkpoint, batches) = stopped[0].clone();
    assert_eq!(status, "pending");
    assert!(batches >= 2, "{batches} batches committed");
    let checkpoint: serde_json::Value =
        serde_json::from_str(&checkpoint.expect("a stored checkpoint")).expect("JSON");
    assert_eq!(checkpoint["next"].as_i64(), Some(batches * 2));

    // Second run: the source refuses that checkpoint.
    let second = FakeSource {
        stale_on_resume: true,
        ..FakeSource::with(new.clone())
    };
    let engine = env.engine(second.clone());
    let outcome = engine
        .run(&pipeline, key(&pipeline, "2024-01-02"), RunFlags::default())
        .await;
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");
    let opens = second.opens();
    assert_eq!(opens.len(), 2, "{opens:?}");
    assert_eq!(opens[0].1.as_ref(), Some(&checkpoint), "resumed first");
    assert_eq!(opens[1].1, None, "then read from the start");

    let runs: Vec<(String, String, i64)> = env
        .fetch("SELECT status, run_id, rows_deleted FROM _tm_runs")
        .await;
    let (status, run_id, deleted) = runs[0].clone();
    assert_eq!(status, "done");
    assert_ne!(
        run_id, first_run_id,
        "the period started over under a new run id"
    );
    assert_eq!(deleted, 1, "k01, committed by the first run, is gone");
    let attempts: Vec<(i64, String, String)> = env
        .fetch("SELECT attempt, run_id, status FROM _tm_attempts ORDER BY attempt")
        .await;
    assert_eq!(
        attempts,
        [
            (1, first_run_id.clone(), "interrupted".to_string()),
            (2, run_id.clone(), "done".to_string()),
        ]
    );

    // The same feed read by a clean run, in a database of its own.
    let clean = Env::new().await;
    let clean_pipeline = clean.pipeline("items.toml", &text);
    let outcome = clean
        .engine(FakeSource::with(new))
        .run(
            &clean_pipeline,
            key(&clean_pipeline, "2024-01-02"),
            RunFlags::default(),
        )
        .await;
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");
    let rows = env.rows("items").await;
    assert_eq!(rows, clean.rows("items").await);
    assert_eq!(rows.len(), 10);
    assert_eq!(rows[0], ("k02".to_string(), Some(2)));
    assert_eq!(rows[1], ("k03".to_string(), Some(33)));
    // What the new run wrote carries its run id (an unchanged row keeps
    // the run id that last wrote it).
    let written: Vec<(String, String)> = env
        .fetch("SELECT id, _tm_run_id FROM items WHERE id IN ('k03', 'k11') ORDER BY id")
        .await;
    assert_eq!(
        written,
        [
            ("k03".to_string(), run_id.clone()),
            ("k11".to_string(), run_id.clone())
        ]
    );
}

/// `load.on_duplicate_key` × `load.max_rejects` over one batch holding a
/// repeated key (`a`) and a value that is no integer (`c`).
#[tokio::test]
async fn on_duplicate_key_and_max_rejects() {
    struct Case {
        on_duplicate_key: &'static str,
        max_rejects: u64,
        /// `None`: done; else the failure's class.
        fails: Option<ErrorClass>,
        rows: &'static [(&'static str, i64)],
        rejects: usize,
    }
    let cases = [
        Case {
            on_duplicate_key: "first",
            max_rejects: 0,
            fails: Some(ErrorClass::Validation),
            rows: &[],
            rejects: 0,
        },
        Case {
            on_duplicate_key: "last",
            max_rejects: 0,
            fails: Some(ErrorClass::Validation),
            rows: &[],
            rejects: 0,
        },
        Case {
            on_duplicate_key: "error",
            max_rejects: 0,
            fails: Some(ErrorClass::Validation),
            rows: &[],
            rejects: 0,
        },
        Case {
            on_duplicate_key: "first",
            max_rejects: 1,
            fails: None,
            rows: &[("a", 1), ("b", 2)],
            rejects: 1,
        },
        Case {
            on_duplicate_key: "last",
            max_rejects: 1,
            fails: None,
            rows: &[("a", 3), ("b", 2)],
            rejects: 1,
        },
        Case {
            on_duplicate_key: "error",
            max_rejects: 1,
            fails: Some(ErrorClass::Invariant),
            rows: &[],
            rejects: 0,
        },
    ];
    for case in cases {
        let name = format!(
            "on_duplicate_key = {:?}, max_rejects = {}",
            case.on_duplicate_key, case.max_rejects
        );
        let env = Env::new().await;
        let load = format!(
            "on_duplicate_key = \"{}\"\nmax_rejects = {}",
            case.on_duplicate_key, case.max_rejects
        );
        let pipeline = env.pipeline("items.toml", &pipeline_text("items", 100, &load, ""));
        let mut input = records(&[("a", 1), ("b", 2), ("a", 3)]);
        input.push(serde_json::json!({"id": "c", "n": "many"}));
        let outcome = env
            .engine(FakeSource::with(input))
            .run(&pipeline, key(&pipeline, "2024-01-02"), RunFlags::default())
            .await;

        let ledger: Vec<(String, Option<String>, i64)> = env
            .fetch("SELECT status, error_class, rows_rejected FROM _tm_runs")
            .await;
        match (case.fails, &outcome) {
            (None, Outcome::Done(_)) => {
                assert_eq!(ledger, [("done".to_string(), None, 1)], "{name}");
            }
            (Some(class), Outcome::Failed(error)) => {
                assert_eq!(error.class(), class, "{name}: {error}");
                assert_eq!(ledger[0].0, "failed", "{name}");
                assert_eq!(ledger[0].1.as_deref(), Some(class.as_str()), "{name}");
            }
            (_, other) => panic!("{name}: {other:?}"),
        }
        let rows = env.rows("items").await;
        let expected: Vec<(String, Option<i64>)> = case
            .rows
            .iter()
            .map(|(id, n)| (id.to_string(), Some(*n)))
            .collect();
        assert_eq!(rows, expected, "{name}");
        let rejects: Vec<(String, Option<String>, Option<String>, String)> = env
            .fetch("SELECT source, field, value, location FROM _tm_rejects")
            .await;
        assert_eq!(rejects.len(), case.rejects, "{name}: {rejects:?}");
        if let Some((source, field, value, location)) = rejects.first() {
            assert_eq!(source, support::SOURCE, "{name}");
            assert_eq!(field.as_deref(), Some("n"), "{name}");
            assert!(
                value.as_deref().is_some_and(|v| v.contains("many")),
                "{name}: {value:?}"
            );
            assert!(location.contains("row 4"), "{name}: {location}");
        }
    }
}

/// A source that returns fewer records than it declares fails the period
/// `incomplete`, and the rows of an earlier done run that the short read
/// lacks stay: nothing was reconciled.
#[tokio::test]
async fn expect_count_mismatch_reconciles_nothing() {
    let env = Env::new().await;
    let text = pipeline_text("items", 100, r#"on_missing = "delete""#, "");
    let pipeline = env.pipeline("items.toml", &text);
    let all = records(&[("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)]);
    let outcome = env
        .engine(FakeSource {
            expected: Some(5),
            ..FakeSource::with(all)
        })
        .run(&pipeline, key(&pipeline, "2024-01-02"), RunFlags::default())
        .await;
    assert!(matches!(outcome, Outcome::Done(_)), "{outcome:?}");

    // Three records, five declared; a forced re-run.
    let short = FakeSource {
        expected: Some(5),
        ..FakeSource::with(records(&[("a", 1), ("b", 20), ("c", 3)]))
    };
    let force = RunFlags {
        force: true,
        ..RunFlags::default()
    };
    let outcome = env
        .engine(short)
        .run(&pipeline, key(&pipeline, "2024-01-02"), force)
        .await;
    match &outcome {
        Outcome::Failed(error @ Error::Incomplete(_)) => {
            assert_eq!(error.class(), ErrorClass::Incomplete)
        }
        other => panic!("{other:?}"),
    }
    type Ledger = (String, Option<String>, Option<i64>, i64, i64);
    let ledger: Vec<Ledger> = env
        .fetch("SELECT status, error_class, rows_expected, rows_read, rows_deleted FROM _tm_runs")
        .await;
    assert_eq!(
        ledger,
        [(
            "failed".to_string(),
            Some("incomplete".to_string()),
            Some(5),
            3,
            0
        )]
    );
    let attempts: Vec<(String, Option<String>)> = env
        .fetch("SELECT status, error_class FROM _tm_attempts ORDER BY attempt")
        .await;
    assert_eq!(
        attempts,
        [
            ("done".to_string(), None),
            ("failed".to_string(), Some("incomplete".to_string())),
        ]
    );
    // The batch read stays (b updated); d and e, absent from it, too.
    let rows = env.rows("items").await;
    assert_eq!(
        rows,
        [
            ("a".to_string(), Some(1)),
            ("b".to_string(), Some(20)),
            ("c".to_string(), Some(3)),
            ("d".to_string(), Some(4)),
            ("e".to_string(), Some(5)),
        ]
    );
}

/// A run that finds the database unable to store anything (here its
/// source says so) stops `run_many` from claiming further keys: they end
/// `NotRun`, never opened and never claimed.
#[tokio::test]
async fn run_many_stops_claiming_after_a_storage_error() {
    let env = Env::new().await;
    let pipeline = env.pipeline("items.toml", &pipeline_text("items", 100, "", ""));
    let source = FakeSource {
        fail_period: Some((
            "2024-01-01".to_string(),
            Error::Storage {
                message: "database or disk is full".to_string(),
            },
        )),
        ..FakeSource::with(records(&[("a", 1)]))
    };
    let engine = env.engine(source.clone());
    let (planner, how) = first_three_days(&engine, &pipeline);
    let events: Vec<RunEvent> = engine.run_many(vec![planner], how).collect().await;

    let mut ran = Vec::new();
    for event in events {
        match event {
            RunEvent::Planned { keys, jobs } => assert_eq!((keys, jobs), (3, 3)),
            RunEvent::Ran(ran_key) => ran.push(ran_key),
            RunEvent::PlanFailed(e) => panic!("planning failed: {e}"),
        }
    }
    let labels: Vec<String> = ran.iter().map(|k| k.key.period.label()).collect();
    assert_eq!(labels, ["2024-01-01", "2024-01-02", "2024-01-03"]);
    assert!(
        matches!(ran[0].outcome, Outcome::Failed(Error::Storage { .. })),
        "{:?}",
        ran[0].outcome
    );
    for later in &ran[1..] {
        match &later.outcome {
            Outcome::NotRun { reason } => {
                assert!(reason.contains("stopped claiming"), "{reason}")
            }
            other => panic!("{}: {other:?}", later.key),
        }
    }
    assert_eq!(source.opens().len(), 1, "only the first period was read");
    let ledger: Vec<(String, String, Option<String>)> = env
        .fetch("SELECT period_start, status, error_class FROM _tm_runs")
        .await;
    assert_eq!(
        ledger,
        [(
            "2024-01-01T00:00:00Z".to_string(),
            "failed".to_string(),
            Some("database".to_string())
        )]
    );
}

/// The plan of 2024-01-01 … 2024-01-03 from the test source, run one key
/// at a time.
fn first_three_days(
    engine: &Engine,
    pipeline: &Arc<tidemark_engine::Pipeline>,
) -> (Planner, RunMany) {
    let range = PeriodRange {
        from: pipeline.period("2024-01-01").expect("period"),
        to: pipeline.period("2024-01-03").expect("period"),
    };
    let ask = Ask::Periods {
        range,
        only: None,
        force: false,
    };
    let planner = engine
        .plan(Arc::clone(pipeline), vec![support::SOURCE.to_string()], ask)
        .expect("plan");
    let how = RunMany {
        concurrency: 1,
        force_deletes: false,
        wait: false,
    };
    (planner, how)
}

fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .expect("time")
        .with_timezone(&Utc)
}

/// The service's scheduler, stepped by hand on a manual clock: a fire
/// queues the closed periods since `period.start` and not the open one; the
/// workers run them; a day later the next fire queues one more.
#[tokio::test]
async fn scheduler_fires_due_keys() {
    let env = Env::new().await;
    let folder = env.dir.path().join("pipelines");
    std::fs::create_dir(&folder).expect("pipelines folder");
    let text = pipeline_text("items", 100, "", "[schedule]\ncron = \"0 3 * * *\"");
    std::fs::write(folder.join("items.toml"), text).expect("pipeline file");
    let clock = Arc::new(ManualClock::new(at("2024-01-04T03:00:00Z")));
    let source = FakeSource {
        ids_per_period: true,
        ..FakeSource::with(records(&[("a", 1), ("b", 2)]))
    };
    let engine = Engine::builder(env.store.clone())
        .clock(clock.clone())
        .source(support::SOURCE, Arc::new(source.clone()))
        .build();
    let service = Service::new(
        engine,
        ServiceConfig {
            public_url: None,
            catalog: Catalog::new(&folder),
            workers: 1,
            poll: Duration::from_millis(50),
            drain: true,
            schedule: true,
        },
    )
    .expect("service");

    let next = service.fire_due().await;
    assert_eq!(next, Some(at("2024-01-05T03:00:00Z")));
    assert_eq!(
        work_all(&service).await,
        [
            "2024-01-01T00:00:00Z",
            "2024-01-02T00:00:00Z",
            "2024-01-03T00:00:00Z"
        ]
    );
    // Not yet time for the next fire: nothing more is queued.
    clock.advance(chrono::Duration::hours(1));
    service.fire_due().await;
    assert!(work_all(&service).await.is_empty());
    let queued: Vec<(i64,)> = env
        .fetch("SELECT COUNT(*) FROM _tm_runs WHERE period_start >= '2024-01-04'")
        .await;
    assert_eq!(queued[0].0, 0, "the open period was not queued");

    clock.set(at("2024-01-05T03:00:00Z"));
    let next = service.fire_due().await;
    assert_eq!(next, Some(at("2024-01-06T03:00:00Z")));
    assert_eq!(work_all(&service).await, ["2024-01-04T00:00:00Z"]);

    let ledger: Vec<(String, String, Option<String>)> = env
        .fetch("SELECT period_start, status, enqueued_by FROM _tm_runs ORDER BY period_start")
        .await;
    let starts: Vec<&str> = ledger.iter().map(|(start, _, _)| start.as_str()).collect();
    assert_eq!(
        starts,
        [
            "2024-01-01T00:00:00Z",
            "2024-01-02T00:00:00Z",
            "2024-01-03T00:00:00Z",
            "2024-01-04T00:00:00Z"
        ]
    );
    for (start, status, by) in &ledger {
        assert_eq!(status, "done", "{start}");
        assert_eq!(by.as_deref(), Some("schedule"), "{start}");
    }
    let loaded: Vec<(i64,)> = env.fetch("SELECT COUNT(*) FROM items").await;
    assert_eq!(loaded[0].0, 8, "two rows for each of four days");
}

/// Works the queue until nothing is claimable; the period starts worked,
/// each asserted done.
async fn work_all(service: &Service) -> Vec<String> {
    let mut worked = Vec::new();
    while let Some(done) = service.work_once().await.expect("claim") {
        assert!(
            matches!(done.outcome, Outcome::Done(_)),
            "{}: {:?}",
            done.period_start,
            done.outcome
        );
        worked.push(done.period_start);
    }
    worked
}

/// A pipeline file edited while served takes effect at the next reload;
/// one broken while served keeps its previous definition, which still runs
/// the keys queued for it (a broken file never served before is left
/// out); once fixed, a reload takes the new definition, and files added or
/// removed are picked up. (No signal and no waiting: the reload is called.)
#[tokio::test]
async fn reload_keeps_a_broken_pipelines_previous_definition() {
    let env = Env::new().await;
    let folder = env.dir.path().join("pipelines");
    std::fs::create_dir(&folder).expect("pipelines folder");
    let alpha = folder.join("alpha.toml");
    let v1 = pipeline_text("alpha", 100, "", "");
    std::fs::write(&alpha, &v1).expect("write");
    let engine = env.engine(FakeSource::with(records(&[("a", 1)])));
    let service = Service::new(
        engine.clone(),
        ServiceConfig {
            public_url: None,
            catalog: Catalog::new(&folder),
            workers: 1,
            poll: Duration::from_millis(50),
            drain: true,
            schedule: false,
        },
    )
    .expect("service");
    assert_eq!(service.pipeline_names(), ["alpha"]);
    let reloader = service.reloader();

    // An edit takes effect at the reload.
    let v2 = v1.replace("export_type", "version = \"2\"\nexport_type");
    std::fs::write(&alpha, &v2).expect("edit alpha");
    assert_eq!(reloader.reload(), 1);
    let served = Arc::new(tidemark_engine::Pipeline::load(&alpha).expect("v2 loads"));
    assert_eq!(served.spec.version, "2");
    queue_and_work(&engine, &service, &served, "2024-01-01").await;

    // Broken (an unknown key), plus a broken file never served.
    std::fs::write(
        &alpha,
        v2.replace("version = \"2\"", "version = \"3\"\nbogus_key = 1"),
    )
    .expect("break alpha");
    std::fs::write(folder.join("gamma.toml"), "name = ").expect("write gamma");
    assert_eq!(reloader.reload(), 1);
    assert_eq!(service.pipeline_names(), ["alpha"]);
    queue_and_work(&engine, &service, &served, "2024-01-02").await;
    let versions: Vec<(String, String)> = env
        .fetch("SELECT period_start, handler_version FROM _tm_runs ORDER BY period_start")
        .await;
    assert_eq!(
        versions,
        [
            ("2024-01-01T00:00:00Z".to_string(), "2".to_string()),
            ("2024-01-02T00:00:00Z".to_string(), "2".to_string()),
        ],
        "both keys ran under the definition served"
    );

    // Fixed under a new name, and a second pipeline added.
    std::fs::write(&alpha, pipeline_text("alpha_v2", 100, "", "")).expect("fix alpha");
    std::fs::write(folder.join("beta.toml"), pipeline_text("beta", 100, "", "")).expect("beta");
    assert_eq!(reloader.reload(), 2);
    assert_eq!(service.pipeline_names(), ["alpha_v2", "beta"]);

    std::fs::remove_file(folder.join("beta.toml")).expect("remove beta");
    std::fs::remove_file(folder.join("gamma.toml")).expect("remove gamma");
    assert_eq!(reloader.reload(), 1);
    assert_eq!(service.pipeline_names(), ["alpha_v2"]);
}

/// Queues the period `label` of `pipeline` (as `backfill --enqueue`
/// would) and works it to done.
async fn queue_and_work(
    engine: &Engine,
    service: &Service,
    pipeline: &Arc<tidemark_engine::Pipeline>,
    label: &str,
) {
    let ask = Ask::Periods {
        range: PeriodRange::one(pipeline.period(label).expect("period")),
        only: None,
        force: false,
    };
    let plan = engine
        .plan(Arc::clone(pipeline), vec![support::SOURCE.to_string()], ask)
        .expect("plan");
    assert_eq!(engine.enqueue(plan, 0).await.expect("enqueue"), (1, 1));
    let start = format!("{label}T00:00:00Z");
    assert_eq!(work_all(service).await, [start]);
}

/// Asks the stop token this thread put in [`STOP_AT_DONE`] for a stop as
/// a `run done` is logged: after the transaction that finished the period
/// committed (and claimed the worker's next key with it), before the next
/// run starts. Nothing else is recorded. The process's one global
/// subscriber (a scoped one misses events whose callsites other tests'
/// threads met first), acting only on the threads that ask for it.
struct StopAtDone;

thread_local! {
    static STOP_AT_DONE: std::cell::RefCell<Option<Shutdown>> = const { std::cell::RefCell::new(None) };
}

/// Sets [`StopAtDone`] as the global subscriber (once), and `shutdown` as
/// this thread's token.
fn stop_at_done(shutdown: Shutdown) {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        tracing::subscriber::set_global_default(StopAtDone).expect("no other global subscriber");
    });
    STOP_AT_DONE.with(|stop| *stop.borrow_mut() = Some(shutdown));
}

impl tracing::Subscriber for StopAtDone {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0 == "run done" {
            STOP_AT_DONE.with(|stop| {
                if let Some(shutdown) = stop.borrow().as_ref() {
                    shutdown.request();
                }
            });
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// The claim piggy-back's hand-back (ADR 0022): the transaction that
/// finishes a worker's period claims its next key; a stop asked for right
/// after that commit leaves the next key unstarted, and it is handed back
/// at once (`pending`, lease released, attempt `interrupted`), never left
/// leased. The keys after it are not claimed at all. Both ways a period
/// finishes: its one batch with `done` (batch size 100), and the last of
/// several batches, then `done` (batch size 1).
#[tokio::test]
async fn a_key_claimed_with_the_previous_period_but_not_started_is_handed_back() {
    handed_back(false).await;
}

/// The same moment on PostgreSQL, whose claim locks the run row and
/// whose finishing transaction commits differently.
#[tokio::test]
async fn a_key_claimed_with_the_previous_period_but_not_started_is_handed_back_postgres() {
    handed_back(true).await;
}

async fn handed_back(postgres: bool) {
    for batch_size in [100, 1] {
        let env = Env::on(postgres).await;
        let text = pipeline_text("items", batch_size, "", "");
        let pipeline = env.pipeline("items.toml", &text);
        let source = FakeSource::with(records(&[("a", 1), ("b", 2)]));
        let shutdown = Shutdown::new();
        let engine = Engine::builder(env.store.clone())
            .shutdown(shutdown.clone())
            .source(support::SOURCE, Arc::new(source.clone()))
            .build();
        let (planner, how) = first_three_days(&engine, &pipeline);
        stop_at_done(shutdown);
        let events: Vec<RunEvent> = engine.run_many(vec![planner], how).collect().await;
        let outcomes: Vec<(String, String)> = events
            .iter()
            .filter_map(|event| match event {
                RunEvent::Ran(ran) => {
                    let outcome = format!("{:?}", ran.outcome);
                    let name = outcome.split(['(', ' ']).next().unwrap_or("").to_string();
                    Some((ran.key.period.label(), name))
                }
                _ => None,
            })
            .collect();
        let expected = [
            ("2024-01-01", "Done"),
            ("2024-01-02", "Stopped"),
            ("2024-01-03", "Stopped"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()));
        let on = if postgres { "PostgreSQL" } else { "SQLite" };
        assert_eq!(outcomes, expected, "{on}, batch size {batch_size}");
        assert_eq!(source.opens().len(), 1, "only the first period was read");
        let text = |cells: &[Option<&str>]| -> Vec<Option<String>> {
            cells.iter().map(|c| c.map(str::to_string)).collect()
        };
        let ledger = env
            .texts(
                "SELECT status, error_class, lease_owner, CAST(attempt AS TEXT) FROM _tm_runs ORDER BY period_start",
            )
            .await;
        assert_eq!(
            ledger,
            [
                text(&[Some("done"), None, None, Some("1")]),
                text(&[Some("pending"), Some("interrupted"), None, Some("1")]),
            ],
            "{on}, batch size {batch_size}: the second key was claimed by the first one's transaction and handed back; the third never claimed"
        );
        let attempts = env
            .texts(
                "SELECT CAST(a.attempt AS TEXT), a.status FROM _tm_attempts a JOIN _tm_runs r ON r.id = a.run_ref ORDER BY r.period_start",
            )
            .await;
        assert_eq!(
            attempts,
            [
                text(&[Some("1"), Some("done")]),
                text(&[Some("1"), Some("interrupted")]),
            ],
            "{on}, batch size {batch_size}"
        );
    }
}
