//! Delivering the notices outbox (docs/ledger.md "Notices", ADR 0024).
//!
//! The ledger writes a notice in the transaction of the change that causes
//! it; this module sends it afterwards. A delivery claims one pending
//! notice (leased, so two deliverers never send it at once), renders its
//! body from the stored payload and the pipeline file (the URL, which may
//! hold a secret, is read only here, only to send), POSTs it with
//! `Idempotency-Key: <id>` and records the answer. At least once: a
//! deliverer killed after its POST and before recording `sent` leaves the
//! notice to be sent again, under the same key, once its lease runs out.
//! Delivery never blocks or fails a run; a receiver that is down only
//! delays its notices.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng as _;
use tidemark_core::spec::{redacted_url, render_url, NotifyFormat};
use tidemark_core::{Error, Pipeline};
use tidemark_load::{
    notify_target, Delivered, NewNotice, NoticeKind, NoticeTargets, NotifyTarget, OutboxNotice,
    Store, LINEAGE_TARGET,
};

use crate::lineage;

/// How long one POST may take before it counts as a failed try.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a claimed notice is its deliverer's: one POST and its record,
/// with room to spare. A deliverer killed mid-send holds it this long.
pub const NOTICE_LEASE: Duration = Duration::from_secs(30);

/// How long a command spends delivering its notices before it exits.
pub const COMMAND_DELIVERY: Duration = Duration::from_secs(10);

/// Tries of one notice before it is `dead`.
pub const MAX_TRIES: i64 = 10;

/// The first back-off between tries; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(2);

/// The longest back-off between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// Who a pipeline's changes are told to, as the ledger writes its notices.
pub fn notice_targets(pipeline: &Pipeline) -> NoticeTargets {
    NoticeTargets {
        notify: pipeline
            .spec
            .notify
            .iter()
            .enumerate()
            .map(|(index, n)| NotifyTarget {
                index,
                on: n.on.clone(),
            })
            .collect(),
        lineage: pipeline.spec.lineage.is_some(),
    }
}

/// One notice delivered, retried or given up.
#[derive(Debug, Clone)]
pub struct DeliveryReport {
    /// The notice's id.
    pub id: String,
    /// Its kind.
    pub kind: String,
    /// Its target.
    pub target: String,
    /// Sent, to be tried again, or given up.
    pub outcome: DeliveryOutcome,
    /// Why it was not sent, if it was not.
    pub error: Option<String>,
}

/// How a delivery of a notice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The receiver took it.
    Sent,
    /// It waits for another try.
    Retry,
    /// It is given up (`dead`).
    Dead,
}

/// What a run of [`Deliverer::deliver_for`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryTally {
    /// Notices the receivers took.
    pub sent: u64,
    /// Notices to try again later.
    pub retried: u64,
    /// Notices given up.
    pub dead: u64,
}

/// Sends the outbox's notices of some pipelines.
#[derive(Clone)]
pub struct Deliverer {
    store: Store,
    owner: String,
    client: reqwest::Client,
    /// `serve --public-url`: bodies link to their period's page.
    public_url: Option<String>,
}

impl Deliverer {
    /// A deliverer that claims notices as `owner` (a worker's
    /// `host:pid:instance`).
    pub fn new(store: Store, owner: String) -> Result<Deliverer, Error> {
        let client = reqwest::Client::builder()
            .timeout(POST_TIMEOUT)
            .user_agent(concat!("tidemark/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::config("notify", "(http client)", e.to_string()))?;
        Ok(Deliverer {
            store,
            owner,
            client,
            public_url: None,
        })
    }

    /// Links each notice to its period's page under `base` (the address
    /// people reach `serve --listen` at).
    pub fn public_url(mut self, base: Option<String>) -> Deliverer {
        self.public_url = base.map(|b| b.trim_end_matches('/').to_string());
        self
    }

    /// One step: claims the oldest deliverable notice of `pipelines`, sends
    /// it and records the answer. `None` when nothing is deliverable now.
    pub async fn deliver_next(
        &self,
        pipelines: &[Arc<Pipeline>],
    ) -> Result<Option<DeliveryReport>, Error> {
        let names: Vec<String> = pipelines.iter().map(|p| p.spec.name.clone()).collect();
        let Some(notice) = self
            .store
            .claim_notice(&self.owner, &names, NOTICE_LEASE)
            .await?
        else {
            return Ok(None);
        };
        let pipeline = pipelines.iter().find(|p| p.spec.name == notice.pipeline);
        let (outcome, error) = match pipeline {
            Some(pipeline) => self.send(pipeline, &notice).await,
            None => (Try::Dead, Some("its pipeline is not served here".into())),
        };
        let why = error.clone().unwrap_or_default();
        let (recorded, word) = match outcome {
            Try::Sent => (Delivered::Sent, DeliveryOutcome::Sent),
            Try::Retry(_) | Try::Dead if notice.attempts >= MAX_TRIES => {
                (Delivered::Dead(&why), DeliveryOutcome::Dead)
            }
            Try::Retry(after) => (
                Delivered::Retry(backoff(notice.attempts, after), &why),
                DeliveryOutcome::Retry,
            ),
            Try::Dead => (Delivered::Dead(&why), DeliveryOutcome::Dead),
        };
        self.store
            .record_notice(&notice.id, &self.owner, &recorded)
            .await?;
        log(&notice, word, error.as_deref());
        Ok(Some(DeliveryReport {
            id: notice.id,
            kind: notice.kind,
            target: notice.target,
            outcome: word,
            error,
        }))
    }

    /// Delivers what is deliverable now of `pipelines`, starting no
    /// delivery after `within` (one in flight ends within
    /// [`POST_TIMEOUT`]): what a command does before it exits. A notice not taken
    /// stays in the outbox for the next command or `serve`. Never fails:
    /// a database error ends it early and is logged.
    pub async fn deliver_for(
        &self,
        pipelines: &[Arc<Pipeline>],
        within: Duration,
    ) -> DeliveryTally {
        let started = Instant::now();
        let mut tally = DeliveryTally::default();
        // Checked between deliveries, never by cancelling one: a notice
        // abandoned mid-claim would stay leased to nobody for a lease.
        while started.elapsed() < within {
            match self.deliver_next(pipelines).await {
                Ok(Some(report)) => match report.outcome {
                    DeliveryOutcome::Sent => tally.sent += 1,
                    DeliveryOutcome::Dead => tally.dead += 1,
                    DeliveryOutcome::Retry => tally.retried += 1,
                },
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "could not deliver notices; they stay queued");
                    break;
                }
            }
        }
        tally
    }

    /// Renders and POSTs one notice.
    async fn send(&self, pipeline: &Pipeline, notice: &OutboxNotice) -> (Try, Option<String>) {
        let link = self
            .public_url
            .as_deref()
            .and_then(|base| period_link(base, pipeline, notice));
        let (url, body) = match render(pipeline, notice, link.as_deref()) {
            Ok(rendered) => rendered,
            Err(Render::Gone(why)) => return (Try::Dead, Some(why)),
            Err(Render::Later(why)) => return (Try::Retry(None), Some(why)),
        };
        let shown = shown_url(pipeline, &notice.target);
        let answer = self
            .client
            .post(&url)
            .header("Idempotency-Key", &notice.id)
            .json(&body)
            .send()
            .await;
        match answer {
            Ok(response) => judge(response.status().as_u16(), retry_after(&response), &shown),
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timed out"
                } else {
                    "could not connect or was cut off"
                };
                (Try::Retry(None), Some(format!("POST to {shown} {kind}")))
            }
        }
    }
}

/// A target's URL as logs and `last_error` may show it: every `${…}` by
/// its name, a password as `***`.
fn shown_url(pipeline: &Pipeline, target: &str) -> String {
    let url = match target {
        LINEAGE_TARGET => pipeline.spec.lineage.as_ref().map(|l| l.url.as_str()),
        target => target_index(target)
            .and_then(|i| pipeline.spec.notify.get(i))
            .map(|n| n.url.as_str()),
    };
    url.map(|u| tidemark_load::redact_url(&redacted_url(u)))
        .unwrap_or_default()
}

/// How one POST ended, before the try count is applied.
enum Try {
    Sent,
    /// Try again; the receiver's `Retry-After`, if any.
    Retry(Option<Duration>),
    Dead,
}

/// The verdict on an HTTP status: 2xx sent; 408, 429 and 5xx again later;
/// any other answer dead at once (the receiver refuses this notice).
fn judge(status: u16, retry_after: Option<Duration>, shown: &str) -> (Try, Option<String>) {
    let why = || Some(format!("POST to {shown} answered HTTP {status}"));
    match status {
        200..=299 => (Try::Sent, None),
        408 | 429 | 500..=599 => (Try::Retry(retry_after), why()),
        _ => (Try::Dead, why()),
    }
}

/// `Retry-After` in seconds (an HTTP date is taken as no advice).
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// The pause before the next try of a notice tried `tries` times:
/// doubling from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`], with jitter
/// (between half and all of it, so deliverers that failed together do not
/// retry together), and never shorter than the receiver asked.
fn backoff(tries: i64, asked: Option<Duration>) -> Duration {
    let exponent = u32::try_from(tries.saturating_sub(1).clamp(0, 16)).unwrap_or(16);
    let full = FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(exponent))
        .min(MAX_BACKOFF);
    let jittered = full.mul_f64(rand::thread_rng().gen_range(0.5..=1.0));
    asked.map_or(jittered, |asked| jittered.max(asked))
}

fn log(notice: &OutboxNotice, outcome: DeliveryOutcome, error: Option<&str>) {
    let (pipeline, source, period) = (&notice.pipeline, &notice.source, &notice.period_start);
    let error = error.unwrap_or_default();
    match outcome {
        DeliveryOutcome::Sent => tracing::info!(
            pipeline, source, period, notice = %notice.id, kind = %notice.kind,
            target = %notice.target, "notice delivered"
        ),
        DeliveryOutcome::Dead => tracing::warn!(
            pipeline, source, period, notice = %notice.id, kind = %notice.kind,
            target = %notice.target, error, "notice not delivered and given up (dead)"
        ),
        DeliveryOutcome::Retry => tracing::info!(
            pipeline, source, period, notice = %notice.id, kind = %notice.kind,
            target = %notice.target, error, "notice not delivered; trying again later"
        ),
    }
}

/// Why a notice could not be rendered.
enum Render {
    /// Its target is gone from the pipeline file: never deliverable.
    Gone(String),
    /// A `${…}` of its URL is not set here: another process may send it.
    Later(String),
}

fn target_index(target: &str) -> Option<usize> {
    target.strip_prefix("notify:")?.parse().ok()
}

/// The link to a notice's period page under `base`.
fn period_link(base: &str, pipeline: &Pipeline, notice: &OutboxNotice) -> Option<String> {
    let period = pipeline.period(&notice.period_start).ok()?;
    Some(format!(
        "{base}{}",
        crate::web::period_path(&notice.pipeline, &notice.source, &period)
    ))
}

/// The URL and the body of a notice for its target (with `link`, the
/// period's page, for people's formats).
fn render(
    pipeline: &Pipeline,
    notice: &OutboxNotice,
    link: Option<&str>,
) -> Result<(String, serde_json::Value), Render> {
    if notice.target == LINEAGE_TARGET {
        let lineage = pipeline.spec.lineage.as_ref().ok_or_else(|| {
            Render::Gone("the pipeline file has no [lineage] any more".to_string())
        })?;
        let url =
            render_url(&lineage.url).map_err(|e| Render::Later(format!("lineage.url: {e}")))?;
        return Ok((url, lineage::event(pipeline, &lineage.namespace, notice)));
    }
    let index = target_index(&notice.target);
    let notify = index
        .and_then(|i| pipeline.spec.notify.get(i))
        .ok_or_else(|| {
            Render::Gone(format!(
                "the pipeline file has no notify target {} any more",
                notice.target
            ))
        })?;
    let key = format!("notify[{}].url", index.unwrap_or_default());
    let url = render_url(&notify.url).map_err(|e| Render::Later(format!("{key}: {e}")))?;
    let body = match notify.format {
        NotifyFormat::Json => json_body(notice, link),
        NotifyFormat::Slack => slack_body(notice, link),
    };
    Ok((url, body))
}

/// The JSON body of a notice: its id and kind, then what the ledger
/// recorded (run key, period, attempt and worker, error, counts).
pub fn json_body(notice: &OutboxNotice, link: Option<&str>) -> serde_json::Value {
    let mut body = serde_json::json!({
        "id": notice.id,
        "kind": notice.kind,
        "occurred_at": notice.created_at,
    });
    if let Some(link) = link {
        body["link"] = serde_json::Value::String(link.to_string());
    }
    if let (Some(body), Some(payload)) = (body.as_object_mut(), notice.payload.as_object()) {
        for (k, v) in payload {
            body.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    body
}

/// A Slack message (`text`) telling the notice in one line.
pub fn slack_body(notice: &OutboxNotice, link: Option<&str>) -> serde_json::Value {
    let p = &notice.payload;
    let text = |k: &str| {
        p.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let what = match notice.kind.as_str() {
        "failed" => "failed",
        "recovered" => "recovered: done again after failing",
        "late" => "is late: not done",
        "guard_refused" => "failed: a reconciliation was refused by the delete guard",
        "stale" => "is stale: done under another version or [fields]",
        "incomplete" => "failed: incomplete",
        "test" => "test notice: the wiring works",
        other => other,
    };
    let mut line = format!(
        "tidemark: {} / {} period {} {what}",
        notice.pipeline, notice.source, notice.period_start
    );
    let class = text("error_class");
    if !class.is_empty() {
        line.push_str(&format!(" ({class}): {}", text("error_message")));
    }
    if let Some(attempt) = p.get("attempt").and_then(serde_json::Value::as_i64) {
        if attempt > 0 {
            line.push_str(&format!(" [attempt {attempt}, {}]", text("worker")));
        }
    }
    if let Some(link) = link {
        line.push_str(&format!(" <{link}|period page>"));
    }
    serde_json::json!({ "text": line })
}

/// Queues a `test` notice for every `[[notify]]` entry of `pipeline` (the
/// run key names its first source and the current period); how many.
pub async fn queue_test(
    store: &Store,
    pipeline: &Pipeline,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<usize, Error> {
    let source = pipeline
        .spec
        .sources
        .first()
        .map(|s| s.id().to_string())
        .unwrap_or_default();
    let period = tidemark_core::Period::containing_instant(
        pipeline.spec.period.granularity,
        pipeline.spec.period.timezone,
        now,
    );
    let (start, end) = (period.start_rfc3339(), period.end_rfc3339());
    let sent_at = now.to_rfc3339();
    let payload = serde_json::json!({
        "pipeline": pipeline.spec.name,
        "source": source,
        "export_type": pipeline.spec.export_type,
        "period_start": start,
        "period_end": end,
        "attempt": 0,
        "message": "a test notice from `tidemark notify test`",
    });
    let mut queued = 0;
    for index in 0..pipeline.spec.notify.len() {
        let target = notify_target(index);
        let new = NewNotice {
            kind: NoticeKind::Test,
            target: &target,
            pipeline: &pipeline.spec.name,
            source: &source,
            export_type: &pipeline.spec.export_type,
            period_start: &start,
            due_key: &sent_at,
            payload: &payload,
        };
        if store.insert_notice(&new).await? {
            queued += 1;
        }
    }
    Ok(queued)
}

/// How far back the scheduler looks for late run keys: periods due more
/// than this before `now - late_after` are not told late any more (a
/// `serve` started on an old backlog does not page for every day of it).
pub const LATE_LOOKBACK: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most periods one look for late keys considers.
const LATE_MAX_PERIODS: usize = 1_000;

/// Queues a `late` notice for every run key of `pipeline` that is not done
/// although its due instant plus a `[[notify]]` entry's `late_after` has
/// passed at `now` (within [`LATE_LOOKBACK`]). Each is inserted once per
/// (run key, due instant, target) however many schedulers look: the
/// outbox's UNIQUE key. Returns how many were new.
pub async fn queue_late(
    store: &Store,
    pipeline: &Pipeline,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<u64, Error> {
    let late: Vec<(usize, chrono::Duration)> = pipeline
        .spec
        .notify
        .iter()
        .enumerate()
        .filter(|(_, n)| n.on.contains(&NoticeKind::Late))
        .filter_map(|(i, n)| Some((i, chrono::Duration::from_std(n.late_after()?).ok()?)))
        .collect();
    let Some(shortest) = late.iter().map(|(_, d)| *d).min() else {
        return Ok(0);
    };
    let Some(first) = pipeline.first_period else {
        return Ok(0);
    };
    let span = chrono::Duration::from_std(LATE_LOOKBACK + pipeline.lag).unwrap_or_default();
    let oldest = tidemark_core::Period::containing_instant(
        pipeline.spec.period.granularity,
        pipeline.spec.period.timezone,
        now - shortest - span,
    );
    let start = if oldest.start() > first.start() {
        oldest
    } else {
        first
    };
    let periods: Vec<tidemark_core::Period> =
        std::iter::successors(Some(start), |p| Some(p.next()))
            .take_while(|p| pipeline.due_at(p).is_some_and(|due| due + shortest <= now))
            .take(LATE_MAX_PERIODS)
            .collect();
    let (Some(from), Some(to)) = (periods.first(), periods.last()) else {
        return Ok(0);
    };
    let (from, to) = (from.start_rfc3339(), to.start_rfc3339());
    let mut done = std::collections::HashSet::new();
    store
        .status_each(
            &pipeline.spec.name,
            tidemark_load::StartRange {
                from: Some(&from),
                to: Some(&to),
            },
            |entry| {
                if entry.status == tidemark_load::RunStatus::Done
                    && entry.export_type == pipeline.spec.export_type
                {
                    done.insert((entry.source, entry.period_start));
                }
                Ok(())
            },
        )
        .await?;
    let mut queued = 0;
    for period in &periods {
        let Some(due) = pipeline.due_at(period) else {
            continue;
        };
        let start = period.start_rfc3339();
        for source in &pipeline.spec.sources {
            if done.contains(&(source.id().to_string(), start.clone())) {
                continue;
            }
            for (index, after) in &late {
                if due + *after > now {
                    continue;
                }
                queued += u64::from(
                    queue_one_late(store, pipeline, period, source.id(), due, (*index, *after))
                        .await?,
                );
            }
        }
    }
    Ok(queued)
}

/// Queues a `stale` notice for every done run key of `pipeline`, due
/// within [`LATE_LOOKBACK`] of `now`, that is stale against the pipeline's
/// current handler `version` and `[fields]`: once per run key and pipeline
/// identity (the outbox's UNIQUE key), however many schedulers look. A key
/// is not stale in the ledger (it is judged against the file), so this is
/// found where the file is read: by `serve`'s scheduler. Returns how many
/// were new.
pub async fn queue_stale(
    store: &Store,
    pipeline: &Pipeline,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<u64, Error> {
    let targets: Vec<String> = notice_targets(pipeline)
        .wanting(NoticeKind::Stale)
        .collect();
    let Some(first) = pipeline.first_period.filter(|_| !targets.is_empty()) else {
        return Ok(0);
    };
    let span = chrono::Duration::from_std(LATE_LOOKBACK + pipeline.lag).unwrap_or_default();
    let oldest = tidemark_core::Period::containing_instant(
        pipeline.spec.period.granularity,
        pipeline.spec.period.timezone,
        now - span,
    );
    let from = if oldest.start() > first.start() {
        oldest
    } else {
        first
    };
    let from = from.start_rfc3339();
    let fingerprint = pipeline.fields_fingerprint();
    let version = &pipeline.spec.version;
    let identity = format!("version {version}; fields {}", fingerprint.as_str());
    let mut stale = Vec::new();
    store
        .status_each(
            &pipeline.spec.name,
            tidemark_load::StartRange {
                from: Some(&from),
                to: None,
            },
            |mut entry| {
                entry.judge_staleness(version, &fingerprint);
                if entry.stale && entry.export_type == pipeline.spec.export_type {
                    stale.push(entry);
                }
                Ok(())
            },
        )
        .await?;
    let mut queued = 0;
    for entry in &stale {
        let payload = serde_json::json!({
            "pipeline": entry.pipeline,
            "source": entry.source,
            "export_type": entry.export_type,
            "period_start": entry.period_start,
            "period_end": entry.period_end,
            "attempt": entry.attempts,
            "run_id": entry.run_id,
            "stale_reason": entry.stale_reason,
        });
        for target in &targets {
            let new = NewNotice {
                kind: NoticeKind::Stale,
                target,
                pipeline: &entry.pipeline,
                source: &entry.source,
                export_type: &entry.export_type,
                period_start: &entry.period_start,
                due_key: &identity,
                payload: &payload,
            };
            queued += u64::from(store.insert_notice(&new).await?);
        }
    }
    Ok(queued)
}

/// One `late` notice: the run key, when it became due and how late.
async fn queue_one_late(
    store: &Store,
    pipeline: &Pipeline,
    period: &tidemark_core::Period,
    source: &str,
    due: chrono::DateTime<chrono::Utc>,
    (index, after): (usize, chrono::Duration),
) -> Result<bool, Error> {
    let start = period.start_rfc3339();
    let due_at = due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let payload = serde_json::json!({
        "pipeline": pipeline.spec.name,
        "source": source,
        "export_type": pipeline.spec.export_type,
        "period_start": start,
        "period_end": period.end_rfc3339(),
        "attempt": 0,
        "due_at": due_at,
        "late_since": (due + after).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    });
    let target = notify_target(index);
    store
        .insert_notice(&NewNotice {
            kind: NoticeKind::Late,
            target: &target,
            pipeline: &pipeline.spec.name,
            source,
            export_type: &pipeline.spec.export_type,
            period_start: &start,
            due_key: &due_at,
            payload: &payload,
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_408_429_and_5xx_are_tried_again() {
        for status in [408, 429, 500, 502, 503] {
            assert!(
                matches!(judge(status, None, "u").0, Try::Retry(_)),
                "{status}"
            );
        }
        for status in [400, 401, 403, 404, 410, 422] {
            assert!(matches!(judge(status, None, "u").0, Try::Dead), "{status}");
        }
        assert!(matches!(judge(204, None, "u").0, Try::Sent));
    }

    #[test]
    fn backoff_doubles_with_jitter_and_honours_retry_after() {
        for _ in 0..50 {
            let first = backoff(1, None);
            assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2));
            let third = backoff(3, None);
            assert!(third >= Duration::from_secs(4) && third <= Duration::from_secs(8));
            assert!(backoff(40, None) <= MAX_BACKOFF);
            assert!(backoff(1, Some(Duration::from_secs(90))) >= Duration::from_secs(90));
        }
    }
}
