//! Notices through the transactional outbox (issue 23, ADR 0024): one
//! notice per change of a run key's state, written with the change,
//! delivered at least once with its id as the `Idempotency-Key`, never
//! lost by a crash, never holding a secret. A real receiver (the suite's
//! HTTP server) records every POST.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::support::http::{DownPort, Hit, Reply, Server};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    failing_three_times_then_fixed_tells_one_failed_and_one_recovered: failing_three_times_then_fixed_tells_one_failed_and_one_recovered_sqlite, failing_three_times_then_fixed_tells_one_failed_and_one_recovered_postgres;
    receiver_answering_400_makes_the_notice_dead_and_status_shows_it: receiver_answering_400_makes_the_notice_dead_and_status_shows_it_sqlite, receiver_answering_400_makes_the_notice_dead_and_status_shows_it_postgres;
    receiver_down_never_holds_a_run_and_gets_the_notice_once_back: receiver_down_never_holds_a_run_and_gets_the_notice_once_back_sqlite, receiver_down_never_holds_a_run_and_gets_the_notice_once_back_postgres;
    serve_killed_after_the_commit_and_before_delivery_delivers_once_after_restart: serve_killed_after_the_commit_and_before_delivery_delivers_once_after_restart_sqlite, serve_killed_after_the_commit_and_before_delivery_delivers_once_after_restart_postgres;
    serve_killed_after_the_post_sends_again_with_the_same_key: serve_killed_after_the_post_sends_again_with_the_same_key_sqlite, serve_killed_after_the_post_sends_again_with_the_same_key_postgres;
    a_refused_reconciliation_is_told_as_guard_refused: a_refused_reconciliation_is_told_as_guard_refused_sqlite, a_refused_reconciliation_is_told_as_guard_refused_postgres;
    a_slack_receiver_gets_one_line_of_text: a_slack_receiver_gets_one_line_of_text_sqlite, a_slack_receiver_gets_one_line_of_text_postgres;
    a_key_past_due_and_late_after_is_told_late_once: a_key_past_due_and_late_after_is_told_late_once_sqlite, a_key_past_due_and_late_after_is_told_late_once_postgres;
    notify_test_sends_a_sample_and_fails_when_refused: notify_test_sends_a_sample_and_fails_when_refused_sqlite, notify_test_sends_a_sample_and_fails_when_refused_postgres;
    prune_removes_sent_notices_and_keeps_dead_ones: prune_removes_sent_notices_and_keeps_dead_ones_sqlite, prune_removes_sent_notices_and_keeps_dead_ones_postgres;
    lineage_events_of_an_interrupted_backfill_validate: lineage_events_of_an_interrupted_backfill_validate_sqlite, lineage_events_of_an_interrupted_backfill_validate_postgres;
    serve_drain_tells_what_its_runs_changed_before_it_exits: serve_drain_tells_what_its_runs_changed_before_it_exits_sqlite, serve_drain_tells_what_its_runs_changed_before_it_exits_postgres;
    a_done_key_made_stale_is_told_stale_once: a_done_key_made_stale_is_told_stale_once_sqlite, a_done_key_made_stale_is_told_stale_once_postgres;
}

/// Two `serve`s on one PostgreSQL find the same late key: it is queued
/// and delivered once.
#[tokio::test]
async fn two_schedulers_queue_a_late_key_once_postgres() {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_late(Backend::Postgres, &server.base).await;
    let first = env.spawn(&["serve", "--workers", "1"]);
    let second = env.spawn(&["serve", "--workers", "1"]);
    env.wait_for_status("orders", DAY, Duration::from_secs(60), |e| {
        e["status"] == "done"
    });
    wait_until("the late notice delivered", Duration::from_secs(30), || {
        server.requests() >= 1
    });
    std::thread::sleep(Duration::from_secs(3));
    for serve in [first, second] {
        serve.signal("TERM");
        serve.finish(Duration::from_secs(30));
    }
    assert_eq!(
        kinds(&server.hits()),
        ["late"],
        "one late notice, sent once"
    );
    let all = notices(&env);
    assert_eq!(all.len(), 1, "{all:#?}");
}

/// The secret in the receiver's URL (a token in its query): no body may
/// hold it.
const SECRET: &str = "s3cr3t-hook-token";

const DAY: &str = "2024-01-05";
const CSV: &str = "pipelines/data/orders/2024/01/05/orders.csv";

/// A receiver answering `status` (changeable while it runs).
fn receiver(status: &Arc<AtomicU16>) -> Server {
    let status = Arc::clone(status);
    Server::start(move |_| Reply::status(status.load(Ordering::SeqCst), "application/json", "{}"))
}

/// The `orders` example told through one `[[notify]]` entry at `base`
/// (the URL, secret token and all, read from `${ALERT_URL}`).
async fn orders_told(backend: Backend, base: &str) -> Env {
    let mut env = Env::orders(backend).await;
    env.set_var("ALERT_URL", &format!("{base}/hook?token={SECRET}"));
    env.edit_pipeline("orders", |text| {
        format!(
            "{text}\n[[notify]]\nurl = \"${{ALERT_URL}}\"\n\
             on = [\"failed\", \"recovered\", \"guard_refused\", \"incomplete\"]\n"
        )
    });
    env
}

/// Queues `orders` from `from` to `to` for a `serve` to run.
fn enqueue(env: &Env, from: &str, to: &str) {
    env.tidemark(&[
        "backfill",
        "orders",
        "--from",
        from,
        "--to",
        to,
        "--enqueue",
    ])
    .expect_code(0, "queued");
}

/// Breaks (or restores) the day's export: an amount that is no decimal
/// fails the period with a validation error, never retried.
fn break_day(env: &Env, broken: bool) {
    let path = env.path(CSV);
    let text = std::fs::read_to_string(&path).unwrap();
    let text = if broken {
        text.replacen("981.14", "9x1.14", 1)
    } else {
        text.replacen("9x1.14", "981.14", 1)
    };
    std::fs::write(&path, text).unwrap();
}

/// The bodies of the POSTs the receiver got, as JSON, in order.
fn bodies(hits: &[Hit]) -> Vec<Json> {
    hits.iter()
        .map(|h| serde_json::from_slice(&h.body).expect("a JSON body"))
        .collect()
}

fn kinds(hits: &[Hit]) -> Vec<String> {
    bodies(hits)
        .iter()
        .map(|b| b["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// No body holds the secret, and each carries its id as the key.
fn check_bodies(hits: &[Hit]) {
    for hit in hits {
        let text = String::from_utf8_lossy(&hit.body);
        assert!(!text.contains(SECRET), "a secret in a notice body: {text}");
        let body: Json = serde_json::from_slice(&hit.body).unwrap();
        assert_eq!(
            hit.headers.get("idempotency-key").map(String::as_str),
            body["id"].as_str(),
            "the Idempotency-Key is the notice id"
        );
    }
}

/// `status --notices --json`: one object per notice.
fn notices(env: &Env) -> Vec<Json> {
    let out = env.tidemark(&["status", "orders", "--notices", "--json"]);
    out.expect_code(0, "status --notices --json");
    out.json_lines()
}

fn wait_until(what: &str, timeout: Duration, ok: impl FnMut() -> bool) {
    assert!(waited_for(timeout, ok), "{what}: not within {timeout:?}");
}

/// Whether `ok` became true within `timeout` (the caller says what failed,
/// with what it knows).
fn waited_for(timeout: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !ok() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// A period failing three times (three commands, each a failed attempt)
/// then fixed: the receiver is told `failed` once and `recovered` once, by
/// the commands themselves before they exit.
async fn failing_three_times_then_fixed_tells_one_failed_and_one_recovered(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_told(backend, &server.base).await;
    break_day(&env, true);
    for _ in 0..3 {
        env.tidemark(&["run", "orders", "--period", DAY])
            .expect_code(1, "a period with a bad amount fails");
    }
    break_day(&env, false);
    env.tidemark(&["run", "orders", "--period", DAY])
        .expect_code(0, "the fixed period is done");
    let hits = server.hits();
    assert_eq!(
        kinds(&hits),
        ["failed", "recovered"],
        "{:#?}",
        bodies(&hits)
    );
    check_bodies(&hits);
    let failed = &bodies(&hits)[0];
    assert_eq!(failed["pipeline"], "orders");
    assert_eq!(failed["source"], "archive");
    assert_eq!(failed["period_start"], "2024-01-05T00:00:00+01:00");
    assert_eq!(failed["attempt"], 1);
    assert_eq!(failed["error_class"], "validation");
    let recovered = &bodies(&hits)[1];
    assert_eq!(recovered["attempt"], 4);
    assert!(recovered["counts"]["rows_read"].as_u64().unwrap() > 0);
    let all = notices(&env);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(all.iter().all(|n| n["status"] == "sent"), "{all:#?}");
}

/// A receiver that refuses the notice (400): `dead` at once, with the
/// answer's status, and `status --notices` shows it.
async fn receiver_answering_400_makes_the_notice_dead_and_status_shows_it(backend: Backend) {
    let status = Arc::new(AtomicU16::new(400));
    let server = receiver(&status);
    let env = orders_told(backend, &server.base).await;
    break_day(&env, true);
    env.tidemark(&["run", "orders", "--period", DAY])
        .expect_code(1, "the period fails");
    assert_eq!(server.requests(), 1, "a refused notice is not tried again");
    let all = notices(&env);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["status"], "dead");
    assert_eq!(all[0]["attempts"], 1);
    let error = all[0]["last_error"].as_str().unwrap();
    assert!(error.contains("HTTP 400"), "{error}");
    assert!(
        !error.contains(SECRET),
        "the URL's secret in the error: {error}"
    );
    let table = env.tidemark(&["status", "orders", "--notices"]);
    table.expect_code(0, "status --notices");
    assert!(table.stdout.contains("dead"), "{table}");
    assert!(table.stdout.contains("1 dead"), "{table}");
    // And /metrics counts it, for an alert.
    let addr = crate::observability::free_addr();
    let listen = addr.to_string();
    let serve = env.spawn(&[
        "serve",
        "--workers",
        "1",
        "--no-schedule",
        "--listen",
        &listen,
    ]);
    crate::observability::wait_ready(addr, &serve).await;
    let metrics = crate::observability::must_get(addr, "/metrics").await;
    let m = crate::observability::parse(&metrics.body);
    let dead = [("pipeline", "orders"), ("status", "dead")];
    let pending = [("pipeline", "orders"), ("status", "pending")];
    assert_eq!(
        crate::observability::value(&m, "tidemark_notices", &dead),
        1.0
    );
    assert_eq!(
        crate::observability::value(&m, "tidemark_notices", &pending),
        0.0
    );
    // And the period's page lists it.
    let page = crate::observability::must_get(addr, "/periods/orders/archive/2024-01-05").await;
    assert_eq!(page.status, 200);
    for part in ["Notices", "notice-dead", "HTTP 400"] {
        assert!(
            page.body.contains(part),
            "{part:?} missing from the period page"
        );
    }
    serve.signal("TERM");
    serve.finish(Duration::from_secs(30));
    assert_eq!(server.requests(), 1, "a dead notice is never sent again");
}

/// A receiver that is down: the run ends at once (its notice waits), and
/// the notice reaches the receiver once it is back, exactly once.
async fn receiver_down_never_holds_a_run_and_gets_the_notice_once_back(backend: Backend) {
    let down = DownPort::reserve();
    let env = orders_told(backend, &format!("http://127.0.0.1:{}", down.port)).await;
    break_day(&env, true);
    let out = env.tidemark(&["run", "orders", "--period", DAY]);
    out.expect_code(1, "the period fails");
    // Not held: the command tried once, was refused at once (a POST waiting
    // out its timeout says "timed out"), and left the notice queued rather
    // than waiting to try again. Asserted on what happened, not on the
    // clock, which a busy machine stretches.
    let waiting = notices(&env);
    assert_eq!(waiting.len(), 1, "{waiting:#?}");
    assert_eq!(waiting[0]["status"], "pending", "{waiting:#?}");
    assert_eq!(
        waiting[0]["attempts"], 1,
        "one try, no waiting for a second: {waiting:#?}"
    );
    let error = waiting[0]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("could not connect"),
        "refused at once, not timed out ({:?}): {error}",
        out.elapsed
    );
    let status = Arc::new(AtomicU16::new(200));
    let server = Server::start_on(down, {
        let status = Arc::clone(&status);
        move |_| Reply::status(status.load(Ordering::SeqCst), "application/json", "{}")
    });
    let serve = env.spawn(&[
        "serve",
        "--workers",
        "1",
        "--no-schedule",
        "--public-url",
        "https://tidemark.example/",
    ]);
    assert!(
        waited_for(Duration::from_secs(30), || server.requests() >= 1),
        "the notice was not delivered within 30 s; the outbox: {:#?}\nserve:\n{}",
        notices(&env),
        serve.output_so_far()
    );
    // Time for a second delivery, if there were one.
    std::thread::sleep(Duration::from_secs(2));
    serve.signal("TERM");
    serve.finish(Duration::from_secs(30));
    assert_eq!(kinds(&server.hits()), ["failed"]);
    check_bodies(&server.hits());
    assert_eq!(
        bodies(&server.hits())[0]["link"],
        "https://tidemark.example/periods/orders/archive/2024-01-05",
        "serve --public-url links the period's page"
    );
    assert_eq!(notices(&env)[0]["status"], "sent");
}

/// `serve` killed after it committed a failure (and its notice) and
/// before the notice went out: the restarted service delivers it, once.
/// The first service cannot send (the receiver's URL variable is not set
/// where it runs), which holds it between the commit and the delivery.
async fn serve_killed_after_the_commit_and_before_delivery_delivers_once_after_restart(
    backend: Backend,
) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_told(backend, &server.base).await;
    break_day(&env, true);
    enqueue(&env, DAY, DAY);
    let blind = env.spawn_without(
        &["ALERT_URL"],
        &["serve", "--workers", "1", "--no-schedule"],
    );
    env.wait_for_status("orders", DAY, Duration::from_secs(30), |e| {
        e["status"] == "failed"
    });
    wait_until("a delivery tried", Duration::from_secs(30), || {
        notices(&env)
            .first()
            .is_some_and(|n| n["attempts"].as_i64() >= Some(1))
    });
    blind.kill9();
    assert_eq!(
        server.requests(),
        0,
        "nothing was delivered before the kill"
    );
    let serve = env.spawn(&["serve", "--workers", "1", "--no-schedule"]);
    wait_until("the notice delivered", Duration::from_secs(40), || {
        server.requests() >= 1
    });
    std::thread::sleep(Duration::from_secs(2));
    serve.signal("TERM");
    serve.finish(Duration::from_secs(30));
    assert_eq!(kinds(&server.hits()), ["failed"], "delivered exactly once");
    check_bodies(&server.hits());
    assert_eq!(notices(&env)[0]["status"], "sent");
}

/// `serve` killed after its POST and before it recorded `sent`: the next
/// service sends the notice again, under the same `Idempotency-Key`, so
/// the receiver can tell it is the same notice.
async fn serve_killed_after_the_post_sends_again_with_the_same_key(backend: Backend) {
    let hold = Arc::new(AtomicU16::new(1));
    let server = Server::start({
        let hold = Arc::clone(&hold);
        move |_| {
            let ok = Reply::status(200, "application/json", "{}");
            if hold.load(Ordering::SeqCst) == 1 {
                Reply::Hold(Duration::from_secs(120), Box::new(ok))
            } else {
                ok
            }
        }
    });
    let env = orders_told(backend, &server.base).await;
    break_day(&env, true);
    enqueue(&env, DAY, DAY);
    let first = env.spawn(&["serve", "--workers", "1", "--no-schedule"]);
    wait_until("the first POST", Duration::from_secs(30), || {
        server.requests() >= 1
    });
    first.kill9();
    hold.store(0, Ordering::SeqCst);
    let serve = env.spawn(&["serve", "--workers", "1", "--no-schedule"]);
    // Sent again once the killed deliverer's lease (30 s) has run out.
    wait_until("the notice sent again", Duration::from_secs(60), || {
        notices(&env).first().is_some_and(|n| n["status"] == "sent")
    });
    serve.signal("TERM");
    serve.finish(Duration::from_secs(30));
    let hits = server.hits();
    assert_eq!(
        hits.len(),
        2,
        "the POST the kill interrupted, then one more"
    );
    let keys: HashSet<_> = hits
        .iter()
        .map(|h| h.headers.get("idempotency-key").cloned())
        .collect();
    assert_eq!(keys.len(), 1, "both POSTs carry the same key: {keys:?}");
    check_bodies(&hits);
}

/// A reconciliation the delete guard refuses (most rows gone from the
/// export) is told as `guard_refused`, not as a plain failure.
async fn a_refused_reconciliation_is_told_as_guard_refused(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_told(backend, &server.base).await;
    env.tidemark(&["run", "orders", "--period", DAY])
        .expect_code(0, "the first load");
    let path = env.path(CSV);
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text.lines().take(2).collect();
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();
    env.tidemark(&["run", "orders", "--period", DAY, "--force"])
        .expect_code(1, "the guard refuses the deletes");
    let hits = server.hits();
    assert_eq!(kinds(&hits), ["guard_refused"], "{:#?}", bodies(&hits));
    assert_eq!(bodies(&hits)[0]["error_class"], "invariant");
    check_bodies(&hits);
}

/// `format = "slack"`: the receiver gets a Slack message, one line naming
/// the pipeline, source, period, kind and error.
async fn a_slack_receiver_gets_one_line_of_text(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_told(backend, &server.base).await;
    env.edit_pipeline("orders", |text| format!("{text}format = \"slack\"\n"));
    break_day(&env, true);
    env.tidemark(&["run", "orders", "--period", DAY])
        .expect_code(1, "the period fails");
    let hits = server.hits();
    assert_eq!(hits.len(), 1);
    let body = &bodies(&hits)[0];
    let text = body["text"].as_str().expect("a `text` message");
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
    for part in [
        "orders",
        "archive",
        "2024-01-05",
        "failed",
        "validation",
        "9x1.14",
    ] {
        assert!(text.contains(part), "{part:?} missing from {text:?}");
    }
    assert!(!text.contains(SECRET));
}

/// The `orders` example from 2024-01-05 only, scheduled, told `late` three
/// hours past due, at a clock (`TIDEMARK_NOW`) well past that.
async fn orders_late(backend: Backend, base: &str) -> Env {
    let mut env = Env::orders(backend).await;
    env.set_var("ALERT_URL", &format!("{base}/hook?token={SECRET}"));
    env.set_var("TIDEMARK_NOW", "2024-01-06T12:00:00Z");
    env.set_option("orders", "period", "start", "\"2024-01-05\"");
    env.edit_pipeline("orders", |text| {
        format!(
            "{text}\n[schedule]\nevery = \"1h\"\n\n[[notify]]\nurl = \"${{ALERT_URL}}\"\n\
             on = [\"late\", \"recovered\"]\nlate_after = \"3h\"\n"
        )
    });
    env
}

/// `TIDEMARK_NOW` past the period's due instant + `late_after`, the key not
/// done: `serve`'s scheduler tells it `late`, once; done afterwards, it is
/// told nothing more (it never failed, so there is no `recovered`).
async fn a_key_past_due_and_late_after_is_told_late_once(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_late(backend, &server.base).await;
    let serve = env.spawn(&["serve", "--workers", "1"]);
    env.wait_for_status("orders", DAY, Duration::from_secs(60), |e| {
        e["status"] == "done"
    });
    wait_until("the late notice delivered", Duration::from_secs(30), || {
        server.requests() >= 1
    });
    std::thread::sleep(Duration::from_secs(2));
    serve.signal("TERM");
    serve.finish(Duration::from_secs(30));
    let hits = server.hits();
    assert_eq!(kinds(&hits), ["late"], "{:#?}", bodies(&hits));
    let late = &bodies(&hits)[0];
    assert_eq!(late["period_start"], "2024-01-05T00:00:00+01:00");
    // Due at the end (midnight, UTC+1) plus the two hours' lag.
    assert_eq!(late["due_at"], "2024-01-06T01:00:00Z");
    assert_eq!(late["late_since"], "2024-01-06T04:00:00Z");
    check_bodies(&hits);
    // A second look (a restarted scheduler) queues nothing more.
    let again = env.spawn(&["serve", "--workers", "1"]);
    std::thread::sleep(Duration::from_secs(3));
    again.signal("TERM");
    again.finish(Duration::from_secs(30));
    assert_eq!(server.requests(), 1);
    assert_eq!(notices(&env).len(), 1);
}

/// `notify test PIPELINE` sends a `test` notice to each target: exit 0
/// when taken, 1 when refused.
async fn notify_test_sends_a_sample_and_fails_when_refused(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_told(backend, &server.base).await;
    let out = env.tidemark(&["notify", "test", "orders"]);
    out.expect_code(0, "the receiver takes the test notice");
    assert!(out.stdout.contains("1 sent"), "{out}");
    assert_eq!(kinds(&server.hits()), ["test"]);
    check_bodies(&server.hits());
    status.store(404, Ordering::SeqCst);
    env.tidemark(&["notify", "test", "orders"])
        .expect_code(1, "a receiver that refuses");
    assert_eq!(server.requests(), 2);
}

/// `prune --older-than` deletes sent notices older than the cut-off and
/// keeps dead ones (they wait for someone to look).
async fn prune_removes_sent_notices_and_keeps_dead_ones(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let env = orders_told(backend, &server.base).await;
    env.tidemark(&["notify", "test", "orders"])
        .expect_code(0, "sent");
    status.store(400, Ordering::SeqCst);
    env.tidemark(&["notify", "test", "orders"])
        .expect_code(1, "dead");
    assert_eq!(notices(&env).len(), 2);
    env.tidemark(&["prune", "--older-than", "1d"])
        .expect_code(0, "prune");
    assert_eq!(notices(&env).len(), 2, "younger than the cut-off: kept");
    std::thread::sleep(Duration::from_millis(1100));
    env.tidemark(&["prune", "--older-than", "1s"])
        .expect_code(0, "prune");
    let left = notices(&env);
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(left[0]["status"], "dead");
    drop(server);
}

/// The OpenLineage events of a backfill of two days whose second day is
/// interrupted by a signal after two batches and resumed by the next
/// command: each validates with openlineage-python (tests/lineage/
/// validate.py; `scripts/test-setup.sh` installs it); START and the end of
/// an attempt share its run id; the interrupted attempt ends in ABORT; the
/// nominal time is the period; the row count is the ledger's.
async fn lineage_events_of_an_interrupted_backfill_validate(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let mut env = Env::orders(backend).await;
    env.set_var("OL_URL", &format!("{}/api/v1/lineage", server.base));
    env.edit_pipeline("orders", |text| {
        format!("{text}\n[lineage]\nurl = \"${{OL_URL}}\"\nnamespace = \"tidemark://test\"\n")
    });
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let mut day = crate::service::SlowDay::new(&env);
    let backfill = env.spawn(&[
        "backfill",
        "orders",
        "--from",
        "2024-01-07",
        "--to",
        "2024-01-08",
        "--concurrency",
        "1",
    ]);
    day.feed(0, 12);
    crate::service::wait_for_batches(&env, 2).await;
    backfill.signal("TERM");
    backfill.wait_for_stderr("stopping", Duration::from_secs(10));
    day.feed(12, 15);
    backfill
        .finish(Duration::from_secs(25))
        .expect_code(0, "a first SIGTERM exits 0");
    day.make_regular();
    env.tidemark(&["run", "orders", "--period", "2024-01-08"])
        .expect_code(0, "the resumed run");
    let events = bodies(&server.hits());
    let lines: String = events.iter().map(|e| format!("{e}\n")).collect();
    let check = python_check(&lines);
    assert!(
        check.status.success(),
        "openlineage-python refuses the events:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let of = |start: &str| -> Vec<(String, String)> {
        events
            .iter()
            .filter(|e| e["run"]["facets"]["nominalTime"]["nominalStartTime"] == start)
            .map(|e| {
                (
                    e["eventType"].as_str().unwrap().to_string(),
                    e["run"]["runId"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let day7 = of("2024-01-07T00:00:00+01:00");
    let types: Vec<&str> = day7.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(types, ["START", "COMPLETE"], "{events:#?}");
    assert_eq!(day7[0].1, day7[1].1, "START and COMPLETE share the run id");
    let day8 = of("2024-01-08T00:00:00+01:00");
    let types: Vec<&str> = day8.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        ["START", "ABORT", "START", "COMPLETE"],
        "{events:#?}"
    );
    assert_eq!(
        day8[0].1, day8[1].1,
        "the interrupted attempt's events share its run id"
    );
    assert_eq!(
        day8[2].1, day8[3].1,
        "the resumed attempt's events share its run id"
    );
    assert_ne!(day8[0].1, day8[2].1, "each attempt is its own run");
    for e in &events {
        assert_eq!(e["job"]["name"], "orders.archive");
        assert_eq!(e["outputs"][0]["name"], "orders");
        let start = e["run"]["facets"]["nominalTime"]["nominalStartTime"]
            .as_str()
            .unwrap();
        let end = e["run"]["facets"]["nominalTime"]["nominalEndTime"]
            .as_str()
            .unwrap();
        assert!(
            start.ends_with("T00:00:00+01:00") && end.ends_with("T00:00:00+01:00"),
            "{e}"
        );
    }
    for (day, entry) in [
        ("2024-01-07", env.status_of("orders", "2024-01-07")),
        ("2024-01-08", env.status_of("orders", "2024-01-08")),
    ] {
        let entry = entry.expect("in the ledger");
        let written = ["rows_inserted", "rows_updated", "rows_unchanged"]
            .iter()
            .map(|k| entry[*k].as_u64().unwrap())
            .sum::<u64>();
        let complete = events
            .iter()
            .find(|e| {
                e["eventType"] == "COMPLETE"
                    && e["run"]["facets"]["nominalTime"]["nominalStartTime"]
                        .as_str()
                        .unwrap()
                        .starts_with(day)
            })
            .expect("a COMPLETE event");
        assert_eq!(
            complete["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"], written,
            "{day}"
        );
    }
}

/// Runs tests/lineage/validate.py on `events` (one JSON object a line).
fn python_check(events: &str) -> std::process::Output {
    use std::io::Write as _;
    let script = crate::support::repo_root().join("tests/lineage/validate.py");
    let mut child = std::process::Command::new("python3")
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (scripts/test-setup.sh installs openlineage-python)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(events.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `serve --drain` delivers the notices of its last runs before it exits
/// (its deliverer stops between two deliveries, never abandoning a claimed
/// notice), as a command does.
async fn serve_drain_tells_what_its_runs_changed_before_it_exits(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let mut env = orders_told(backend, &server.base).await;
    env.set_var("OL_URL", &format!("{}/api/v1/lineage", server.base));
    env.edit_pipeline("orders", |text| {
        format!("{text}\n[lineage]\nurl = \"${{OL_URL}}\"\nnamespace = \"tidemark://test\"\n")
    });
    break_day(&env, true);
    enqueue(&env, "2024-01-04", DAY);
    env.spawn(&["serve", "--workers", "1", "--no-schedule", "--drain"])
        .finish(Duration::from_secs(60))
        .expect_code(0, "drained");
    let all = notices(&env);
    // Day 4: START, COMPLETE; day 5: START, FAIL and `failed`.
    assert_eq!(all.len(), 5, "{all:#?}");
    assert!(all.iter().all(|n| n["status"] == "sent"), "{all:#?}");
    assert_eq!(server.requests(), 5);
}

/// Two `serve`s on one PostgreSQL share the outbox: each of the notices
/// of ten periods (a START and a COMPLETE each) reaches the receiver once.
#[tokio::test]
async fn two_servers_deliver_each_notice_once_postgres() {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let mut env = Env::orders(Backend::Postgres).await;
    env.set_var("OL_URL", &format!("{}/api/v1/lineage", server.base));
    env.edit_pipeline("orders", |text| {
        format!("{text}\n[lineage]\nurl = \"${{OL_URL}}\"\nnamespace = \"tidemark://test\"\n")
    });
    enqueue(&env, "2024-01-01", "2024-01-10");
    let first = env.spawn(&["serve", "--workers", "2", "--no-schedule", "--drain"]);
    let second = env.spawn(&["serve", "--workers", "2", "--no-schedule", "--drain"]);
    first
        .finish(Duration::from_secs(90))
        .expect_code(0, "drained");
    second
        .finish(Duration::from_secs(90))
        .expect_code(0, "drained");
    let all = notices(&env);
    assert_eq!(all.len(), 20, "{all:#?}");
    assert!(
        all.iter()
            .all(|n| n["status"] == "sent" && n["attempts"] == 1),
        "{all:#?}"
    );
    let hits = server.hits();
    let keys: HashSet<_> = hits
        .iter()
        .map(|h| h.headers.get("idempotency-key").cloned())
        .collect();
    assert_eq!((hits.len(), keys.len()), (20, 20), "each notice sent once");
}

/// A done key that a new handler `version` makes stale is told `stale`
/// by `serve`'s scheduler, once (a restarted scheduler queues nothing more).
async fn a_done_key_made_stale_is_told_stale_once(backend: Backend) {
    let status = Arc::new(AtomicU16::new(200));
    let server = receiver(&status);
    let mut env = Env::orders(backend).await;
    env.set_var("ALERT_URL", &format!("{}/hook?token={SECRET}", server.base));
    env.set_var("TIDEMARK_NOW", "2024-01-06T12:00:00Z");
    env.set_option("orders", "period", "start", "\"2024-01-05\"");
    env.edit_pipeline("orders", |text| {
        format!(
            "{text}\n[schedule]\nevery = \"1h\"\n\n[[notify]]\nurl = \"${{ALERT_URL}}\"\non = [\"stale\"]\n"
        )
    });
    env.tidemark(&["run", "orders", "--period", DAY])
        .expect_code(0, "done under version 1");
    assert_eq!(server.requests(), 0, "a first load is no news");
    env.edit_pipeline("orders", |text| {
        text.replacen("version = \"1\"", "version = \"2\"", 1)
    });
    for _ in 0..2 {
        let serve = env.spawn(&["serve", "--workers", "1"]);
        wait_until(
            "the stale notice delivered",
            Duration::from_secs(30),
            || server.requests() >= 1,
        );
        std::thread::sleep(Duration::from_secs(2));
        serve.signal("TERM");
        serve.finish(Duration::from_secs(30));
    }
    let hits = server.hits();
    assert_eq!(kinds(&hits), ["stale"], "{:#?}", bodies(&hits));
    let reason = bodies(&hits)[0]["stale_reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("version 1 -> 2"), "{reason}");
    check_bodies(&hits);
}
