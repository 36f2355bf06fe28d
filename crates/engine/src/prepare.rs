//! The read-and-type half of a run, in its own task: while batch N is being
//! committed, batch N+1 is typed and batch N+2 read. One prepared batch
//! waits at most, so memory stays at three batches.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tidemark_core::spec::SourceSpec;
use tidemark_core::{
    Error, Hash128, KeyMap, Location, Origin, Period, Pipeline, RateGate, RawRecord, Row,
};
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
    /// Where each reject was in the batch (record number from 0), so that
    /// rejects found later ([`Prepared::type_rest`]) keep source order.
    pub reject_at: Vec<usize>,
    /// Records not typed yet because their raw hash may show them
    /// unchanged (ADR 0021, "The raw-record hash"): only when the run asked
    /// for it ([`Read::defer`]).
    pub deferred: Vec<Deferred>,
    /// With deferred records: every record that typed or was deferred, in
    /// source order, as [`tidemark_load::RunWriter::raw_unchanged`] takes
    /// them (its key hash, and its raw hash if deferred).
    pub order: Vec<(Hash128, Option<Hash128>)>,
    /// With deferred records: the batch's first and last locations, and
    /// the fields its typed records held, for the drift warning that
    /// waits until the deferred ones are typed.
    /// (Boxed: rarely there, and the batch travels through a channel.)
    drift: Option<Box<Drift>>,
}

/// A batch's first and last locations, and what its typed records held.
type Drift = (Option<(Location, Location)>, Presence);

/// A record whose typing waits for the writer's comparison of raw hashes.
pub(crate) struct Deferred {
    pub record: RawRecord,
    pub raw_hash: Hash128,
    /// Its record number in the batch, from 0.
    pub at: usize,
}

impl Prepared {
    /// Types the deferred records whose raw hash did not match
    /// (`unchanged` is [`tidemark_load::RunWriter::raw_unchanged`]'s answer
    /// for [`Prepared::order`]); the others are left out, as the writer
    /// counts them. Returns how many were unchanged.
    pub fn type_rest(&mut self, transformer: &Transformer, unchanged: &[bool]) -> usize {
        let deferred = std::mem::take(&mut self.deferred);
        let raw_answers = self
            .order
            .iter()
            .zip(unchanged)
            .filter(|((_, raw), _)| raw.is_some())
            .map(|(_, same)| *same);
        let mut hits = 0;
        let (span, mut presence) = self
            .drift
            .take()
            .map_or_else(|| (None, transformer.presence()), |drift| *drift);
        let mut late_rejects = Vec::new();
        let mut typed = 0;
        for (item, same) in deferred.into_iter().zip(raw_answers) {
            if same {
                hits += 1;
                continue;
            }
            typed += 1;
            match transformer.transform_noting(&item.record, &mut presence) {
                Ok(mut row) => {
                    row.raw_hash = Some(item.raw_hash);
                    self.rows.push((row, item.record.origin));
                }
                Err(error) => {
                    let reject = reject_of(&error, &item.record);
                    late_rejects.push((item.at, (error, reject)));
                }
            }
        }
        // A field no typed record held means drift only if no record took
        // the shortcut: an unchanged record says nothing new about fields.
        if hits == 0 && typed > 0 {
            warn_absent(transformer, &presence, span);
        }
        self.merge_rejects(late_rejects);
        self.order.clear();
        hits
    }

    /// Rejects found while typing deferred records, in source order among
    /// those found before.
    fn merge_rejects(&mut self, late: Vec<(usize, (Error, Reject))>) {
        if late.is_empty() {
            return;
        }
        let early = std::mem::take(&mut self.rejects)
            .into_iter()
            .zip(std::mem::take(&mut self.reject_at));
        let mut all: Vec<(usize, (Error, Reject))> =
            early.map(|(reject, at)| (at, reject)).chain(late).collect();
        all.sort_by_key(|(at, _)| *at);
        for (at, reject) in all {
            self.reject_at.push(at);
            self.rejects.push(reject);
        }
    }
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
    /// Set by the run once its writer knows the run key holds raw hashes:
    /// from then on, each batch only hashes its records and types their
    /// keys, and the rest of the typing waits for the writer's comparison
    /// ([`Prepared::deferred`]).
    pub defer: Arc<AtomicBool>,
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
        defer,
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
            let defer = defer.load(Ordering::Relaxed);
            let prepared = prepare(transformer, batch.records, batch.checkpoint, defer);
            if tx.send(Item::Batch(Ok(prepared))).await.is_err() {
                return Ok(());
            }
            continue;
        }
        let transformer = Arc::clone(transformer);
        let span = tracing::Span::current();
        let defer = defer.load(Ordering::Relaxed);
        typing = Some(tokio::task::spawn_blocking(move || {
            span.in_scope(|| prepare(&transformer, batch.records, batch.checkpoint, defer))
        }));
    }
    let expected = reader.expected_count();
    let _ = tx.send(Item::End { expected }).await;
    Ok(())
}

/// Types a batch, each row with its raw hash. With `defer`, a record
/// whose key types and whose key is once in the batch is only hashed and
/// left for [`Prepared::type_rest`]; a key twice in a batch is typed (the
/// last row must win, which the writer can only tell from typed rows).
fn prepare(
    transformer: &Transformer,
    records: Vec<RawRecord>,
    checkpoint: Checkpoint,
    defer: bool,
) -> Prepared {
    let read = records.len() as u64;
    let mut hasher = transformer.raw_hasher();
    let mut presence = transformer.presence();
    let span = batch_span(&records);
    let mut prepared = Prepared {
        checkpoint,
        read,
        rows: Vec::with_capacity(if defer { 0 } else { records.len() }),
        rejects: Vec::new(),
        reject_at: Vec::new(),
        deferred: Vec::new(),
        order: Vec::new(),
        drift: None,
    };
    let hashed: Vec<(RawRecord, Option<Hash128>, Option<Hash128>)> = records
        .into_iter()
        .map(|record| {
            let raw = hasher.hash(&record);
            let key = match (defer, raw) {
                (true, Some(_)) => transformer.key_hash_of(&record, &mut presence),
                _ => None,
            };
            (record, raw, key)
        })
        .collect();
    let once = keys_once(hashed.iter().filter_map(|(_, _, key)| *key));
    for (at, (record, raw, key)) in hashed.into_iter().enumerate() {
        if let (Some(key), Some(raw_hash)) = (key, raw) {
            if once.get(&key) == Some(&true) {
                prepared.order.push((key, Some(raw_hash)));
                prepared.deferred.push(Deferred {
                    record,
                    raw_hash,
                    at,
                });
                continue;
            }
        }
        match transformer.transform_noting(&record, &mut presence) {
            Ok(mut row) => {
                row.raw_hash = raw;
                if defer {
                    prepared.order.push((row.key_hash, None));
                }
                prepared.rows.push((row, record.origin));
            }
            Err(error) => {
                let reject = reject_of(&error, &record);
                prepared.rejects.push((error, reject));
                prepared.reject_at.push(at);
            }
        }
    }
    if prepared.deferred.is_empty() {
        prepared.order.clear();
        warn_absent(transformer, &presence, span);
    } else {
        prepared.drift = Some(Box::new((span, presence)));
    }
    prepared
}

/// For each key: whether it is in the batch once.
fn keys_once(keys: impl Iterator<Item = Hash128>) -> KeyMap<bool> {
    let mut once = KeyMap::default();
    for key in keys {
        once.entry(key)
            .and_modify(|single| *single = false)
            .or_insert(true);
    }
    once
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
