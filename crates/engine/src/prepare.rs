//! The read-and-type half of a run, in its own task: while batch N is being
//! committed, batch N+1 is typed and batch N+2 read. One prepared batch
//! waits at most, so memory stays at three batches.

use std::sync::Arc;

use tidemark_core::spec::SourceSpec;
use tidemark_core::{Error, Location, Origin, Period, Pipeline, RateGate, RawRecord, Row};
use tidemark_extract::{Checkpoint, OpenRequest, OpenSource};
use tidemark_load::{Reject, Store};
use tidemark_transform::{Presence, Transformer};
use tokio::sync::mpsc;
use tracing::Instrument;

/// A batch read and typed, not yet deduplicated or committed.
pub(crate) struct Prepared {
    /// Where the next batch starts.
    pub checkpoint: Checkpoint,
    /// Records read.
    pub read: u64,
    /// Typed rows with their origins, in source order.
    pub rows: Vec<(Row, Origin)>,
    /// Records that failed validation, with their error, in source order.
    pub rejects: Vec<(Error, Reject)>,
}

/// What the reading task sends: a batch (or the failure that ends it), or
/// the end of the source with the total it declared.
enum Item {
    Batch(Result<Prepared, Error>),
    End { expected: Option<u64> },
}

type Sender = mpsc::Sender<Item>;

/// The batches of one reading task, in order.
pub(crate) struct Batches {
    rx: mpsc::Receiver<Item>,
    expected: Option<u64>,
    exhausted: bool,
}

impl Batches {
    /// The next batch; `None` once the source is exhausted (or the task
    /// stopped).
    pub async fn recv(&mut self) -> Option<Result<Prepared, Error>> {
        match self.rx.recv().await? {
            Item::Batch(batch) => Some(batch),
            Item::End { expected } => {
                self.expected = expected;
                self.exhausted = true;
                None
            }
        }
    }

    /// The number of records the source declared for the period
    /// (`expect_count`), once [`Batches::recv`] returned `None` because the
    /// source was read to its end.
    pub fn expected(&self) -> Option<u64> {
        self.expected.filter(|_| self.exhausted)
    }
}

/// What to read: a source of a pipeline for a period, from `resume` on.
pub(crate) struct Read {
    pub pipeline: Arc<Pipeline>,
    pub source_id: String,
    /// What opens the source: the only way the engine reads one.
    pub opener: Arc<dyn OpenSource>,
    pub period: Period,
    pub resume: Option<Checkpoint>,
    /// Periods the engine runs at once ([`OpenRequest::periods_at_once`]).
    pub at_once: usize,
}

/// Reads and types batches from `read.resume` on; they arrive in order,
/// then the end of the source. A failure is sent as the last item. The
/// source's rate limit is the one `store` says every process shares, if
/// any.
pub(crate) fn spawn(read: Read, store: &Store, transformer: Arc<Transformer>) -> Batches {
    let (tx, rx) = mpsc::channel(1);
    let store = store.clone();
    tokio::spawn(
        async move {
            if let Err(e) = produce(&read, &store, &transformer, &tx).await {
                let _ = tx.send(Item::Batch(Err(e))).await;
            }
        }
        .in_current_span(),
    );
    Batches {
        rx,
        expected: None,
        exhausted: false,
    }
}

/// The gate every request of `source` passes: the database's shared bucket
/// when other processes may read the source too (PostgreSQL), else this
/// process's own (SQLite, where one process owns the file).
pub(crate) fn rate_gate(
    store: &Store,
    pipeline: &Pipeline,
    source: &SourceSpec,
) -> Option<Arc<dyn RateGate>> {
    let limit = match source {
        SourceSpec::Http(spec) => spec.rate_limit?,
        SourceSpec::Sql(spec) => spec.rate_limit?,
        SourceSpec::File(_) | SourceSpec::Custom(_) => return None,
    };
    let name = &pipeline.spec.name;
    let id = source.id();
    let gate = store
        .rate_gate(name, id, limit)
        .or_else(|| tidemark_extract::local_gate(name, id, limit))?;
    // Counted for /metrics (tidemark_rate_limit_wait_seconds_total).
    Some(crate::rate_stats::MeteredGate::wrap(name, id, gate))
}

async fn produce(
    read: &Read,
    store: &Store,
    transformer: &Arc<Transformer>,
    tx: &Sender,
) -> Result<(), Error> {
    let Read {
        pipeline,
        source_id,
        opener,
        period,
        resume,
        at_once,
    } = read;
    let gate = pipeline
        .source(source_id)
        .and_then(|source| rate_gate(store, pipeline, source));
    let request = OpenRequest {
        pipeline,
        source_id,
        period,
        resume: resume.as_ref(),
        gate,
        periods_at_once: *at_once,
    };
    let mut reader = opener.open(request).await?;
    // Each batch after the first is typed on the blocking pool while the
    // next one is read, so a large period's reading and typing use two
    // cores instead of one (typing and hashing were two thirds of the
    // reader's time); the first is typed here, so a period of one batch
    // (most small periods) pays no hand-over.
    let mut typing: Option<tokio::task::JoinHandle<Prepared>> = None;
    let mut first = true;
    loop {
        // The typed batch goes to the writer while the next one is read: a
        // slow source never holds back the commit of what was read.
        let deliver = async {
            let Some(typed) = typing.take() else {
                return Ok(true);
            };
            let prepared = typed.await.map_err(|e| {
                Error::Invariant(format!(
                    "typing a batch of {period} ended without rows: {e}"
                ))
            })?;
            Ok::<_, Error>(tx.send(Item::Batch(Ok(prepared))).await.is_ok())
        };
        let (next, delivered) = tokio::join!(reader.next_batch(), deliver);
        if !delivered? {
            return Ok(()); // the run stopped listening (it failed)
        }
        let Some(batch) = next? else { break };
        if std::mem::take(&mut first) {
            let prepared = prepare(transformer, batch.records, batch.checkpoint);
            if tx.send(Item::Batch(Ok(prepared))).await.is_err() {
                return Ok(());
            }
            continue;
        }
        let transformer = Arc::clone(transformer);
        let span = tracing::Span::current();
        typing = Some(tokio::task::spawn_blocking(move || {
            span.in_scope(|| prepare(&transformer, batch.records, batch.checkpoint))
        }));
    }
    let expected = reader.expected_count();
    let _ = tx.send(Item::End { expected }).await;
    Ok(())
}

fn prepare(transformer: &Transformer, records: Vec<RawRecord>, checkpoint: Checkpoint) -> Prepared {
    let read = records.len() as u64;
    let mut rows = Vec::with_capacity(records.len());
    let mut rejects = Vec::new();
    let mut presence = transformer.presence();
    let span = batch_span(&records);
    for record in records {
        match transformer.transform_noting(&record, &mut presence) {
            Ok(row) => rows.push((row, record.origin)),
            Err(error) => {
                let reject = reject_of(&error, &record);
                rejects.push((error, reject));
            }
        }
    }
    warn_absent(transformer, &presence, span);
    Prepared {
        checkpoint,
        read,
        rows,
        rejects,
    }
}

/// Where a batch's first and last records came from.
fn batch_span(records: &[RawRecord]) -> Option<(Location, Location)> {
    Some((
        records.first()?.origin.location(),
        records.last()?.origin.location(),
    ))
}

/// Drift in JSON and NDJSON, where an absent field is normal: one warning
/// per batch naming the fields no record of it held (the run's span names
/// pipeline, source and period).
fn warn_absent(transformer: &Transformer, presence: &Presence, span: Option<(Location, Location)>) {
    let absent = transformer.absent_fields(presence);
    let Some((first, last)) = span.filter(|_| !absent.is_empty()) else {
        return;
    };
    let fields: Vec<String> = absent.iter().map(|f| format!("`{f}`")).collect();
    tracing::warn!(
        fields = %absent.join(","),
        first = %first,
        last = %last,
        "{} absent from every record of the batch (first..last): {ABSENT_NOTE}",
        fields.join(", ")
    );
}

/// What a field no JSON record held may mean, said alike by a run's
/// warning and by `validate --check-source`.
pub const ABSENT_NOTE: &str = "renamed or removed upstream? They load as NULL or their default";

fn reject_of(error: &Error, record: &RawRecord) -> Reject {
    let (field, value, reason) = match error {
        Error::Validation {
            field,
            value,
            message,
            ..
        } => (Some(field.clone()), Some(value.clone()), message.clone()),
        other => (None, None, other.to_string()),
    };
    Reject {
        location: record.origin.location().to_string(),
        field,
        value,
        reason,
        record: record.to_json(),
    }
}
