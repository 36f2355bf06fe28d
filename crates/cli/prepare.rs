//! The read-and-type half of a run, in its own task: while batch N is being
//! committed, batch N+1 is read and typed. One prepared batch waits at most,
//! so memory stays at two batches.

use std::sync::Arc;

use tidemark_core::{Error, Location, Origin, Period, Pipeline, RawRecord, Row};
use tidemark_extract::{Checkpoint, SourceReader};
use tidemark_load::Reject;
use tidemark_transform::{Presence, Transformer};
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

/// Reads and types batches from `resume` on; the receiver yields them in
/// order, then closes. A failure is sent as the last item.
pub fn spawn(
    pipeline: Arc<Pipeline>,
    source_id: String,
    period: Period,
    resume: Option<Checkpoint>,
    transformer: Arc<Transformer>,
) -> mpsc::Receiver<Result<Prepared, Error>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(
        async move {
            if let Err(e) = produce(&pipeline, &source_id, &period, resume, &transformer, &tx).await
            {
                let _ = tx.send(Err(e)).await;
            }
        }
        .in_current_span(),
    );
    rx
}

async fn produce(
    pipeline: &Pipeline,
    source_id: &str,
    period: &Period,
    resume: Option<Checkpoint>,
    transformer: &Transformer,
    tx: &mpsc::Sender<Result<Prepared, Error>>,
) -> Result<(), Error> {
    let source = pipeline.source(source_id).ok_or_else(|| {
        Error::config(
            pipeline.file_name(),
            "sources",
            format!("no source {source_id:?}"),
        )
    })?;
    let mut reader = SourceReader::open(pipeline, source, period, resume.as_ref()).await?;
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
fn warn_absent(
    transformer: &Transformer,
    presence: &Presence,
    span: Option<(Location, Location)>,
) {
    let absent = transformer.absent_fields(presence);
    let Some((first, last)) = span.filter(|_| !absent.is_empty()) else {
        return;
    };
    let fields: Vec<String> = absent.iter().map(|f| format!("`{f}`")).collect();
    tracing::warn!(
        fields = %absent.join(","),
        first = %first,
        last = %last,
        "{} absent from every record of the batch {first} .. {last}: renamed or removed upstream? \
         (they load as NULL or their default)",
        fields.join(", ")
    );
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
