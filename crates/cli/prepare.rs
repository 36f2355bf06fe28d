//! The read-and-type half of a run, in its own task: while batch N is being
//! committed, batch N+1 is read and typed. One prepared batch waits at most,
//! so memory stays at two batches.

use std::sync::Arc;

use tidemark_core::spec::SourceSpec;
use tidemark_core::{Error, Origin, Period, Pipeline, RateGate, RawRecord, Row};
use tidemark_extract::{Checkpoint, SourceReader};
use tidemark_load::{Reject, Store};
use tidemark_transform::Transformer;
use tokio::sync::mpsc;
use tracing::Instrument;

/// A batch read and typed, not yet deduplicated or committed.
pub struct Prepared {
    /// Where the next batch starts.
    pub checkpoint: Checkpoint,
    /// Records read.
    pub read: u64,
    /// Typed rows with their origins, in source order.
    pub rows: Vec<(Row, Origin)>,
    /// Records that failed validation, with their error, in source order.
    pub rejects: Vec<(Error, Reject)>,
}

/// What to read: a source of a pipeline for a period, from `resume` on.
pub struct Read {
    pub pipeline: Arc<Pipeline>,
    pub source_id: String,
    pub period: Period,
    pub resume: Option<Checkpoint>,
}

/// Reads and types batches; the receiver yields them in order, then
/// closes. A failure is sent as the last item. The source's rate limit is
/// the one `store` says every process shares, if any.
pub fn spawn(
    read: Read,
    store: &Store,
    transformer: Arc<Transformer>,
) -> mpsc::Receiver<Result<Prepared, Error>> {
    let (tx, rx) = mpsc::channel(1);
    let store = store.clone();
    tokio::spawn(
        async move {
            if let Err(e) = produce(&read, &store, &transformer, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        }
        .in_current_span(),
    );
    rx
}

/// The gate every request of `source` passes: the database's shared bucket
/// when other processes may read the source too (PostgreSQL), else this
/// process's own (SQLite, where one process owns the file).
pub fn rate_gate(
    store: &Store,
    pipeline: &Pipeline,
    source: &SourceSpec,
) -> Option<Arc<dyn RateGate>> {
    let SourceSpec::Http(spec) = source else {
        return None;
    };
    let limit = spec.rate_limit?;
    let name = &pipeline.spec.name;
    store
        .rate_gate(name, &spec.id, limit)
        .or_else(|| tidemark_extract::local_gate(name, &spec.id, limit))
}

async fn produce(
    read: &Read,
    store: &Store,
    transformer: &Transformer,
    tx: &mpsc::Sender<Result<Prepared, Error>>,
) -> Result<(), Error> {
    let Read {
        pipeline,
        source_id,
        period,
        resume,
    } = read;
    let source = pipeline.source(source_id).ok_or_else(|| {
        Error::config(
            pipeline.file_name(),
            "sources",
            format!("no source {source_id:?}"),
        )
    })?;
    let gate = rate_gate(store, pipeline, source);
    let mut reader = SourceReader::open(pipeline, source, period, resume.as_ref(), gate).await?;
    while let Some(batch) = reader.next_batch().await? {
        let prepared = prepare(transformer, batch.records, batch.checkpoint);
        if tx.send(Ok(prepared)).await.is_err() {
            return Ok(()); // the run stopped listening (it failed)
        }
    }
    Ok(())
}

fn prepare(transformer: &Transformer, records: Vec<RawRecord>, checkpoint: Checkpoint) -> Prepared {
    let read = records.len() as u64;
    let mut rows = Vec::with_capacity(records.len());
    let mut rejects = Vec::new();
    for record in records {
        match transformer.transform(&record) {
            Ok(row) => rows.push((row, record.origin)),
            Err(error) => {
                let reject = reject_of(&error, &record);
                rejects.push((error, reject));
            }
        }
    }
    Prepared {
        checkpoint,
        read,
        rows,
        rejects,
    }
}

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
