//! The source seam: how the engine reads a period, whoever wrote the
//! reader. tidemark's file and HTTP readers implement it, and so can a
//! program that embeds the engine (a gRPC API, an internal queue, a
//! generator): the engine reads only through these two traits.
//!
//! The contract a source keeps, so that a run stays exactly-once in effect:
//!
//! - [`OpenSource::open`] opens one period, `[start, end)`, and continues
//!   after `resume` when given: the checkpoint of the last batch the
//!   engine committed, exactly as the source returned it.
//! - [`BatchSource::next_batch`] returns the next batch of records with the
//!   checkpoint *after* its last record, or `None` once the period is read
//!   whole. The engine commits each batch's rows and its checkpoint in one
//!   transaction, so after a crash at most the batch in flight is read
//!   again.
//! - A checkpoint is opaque JSON owned by the source; version it (e.g.
//!   `{"v": 1, ...}`) and answer [`Error::StaleCheckpoint`] when one no
//!   longer fits what the source holds: the engine then starts the period
//!   over under a new run id (the committed rows stay and are reconciled).
//! - Errors carry their class: a transient one (`Error::is_transient`) is
//!   retried by the engine with the pipeline's back-off, reopening from the
//!   last committed checkpoint; anything else fails the attempt.

use std::sync::Arc;

use async_trait::async_trait;
use tidemark_core::spec::SourceSpec;
use tidemark_core::{Error, Period, Pipeline, RateGate};

use crate::{Batch, Checkpoint, FileReader, HttpReader, SourceReader, SqlReader};

/// What a source is opened for: one source of a pipeline, one period.
pub struct OpenRequest<'a> {
    /// The pipeline being run (its `[load] batch_size`, timezone, ...).
    pub pipeline: &'a Pipeline,
    /// The source's id in the pipeline (part of the run key).
    pub source_id: &'a str,
    /// The period to read, `[start, end)`.
    pub period: &'a Period,
    /// The checkpoint of the last committed batch: continue after it.
    pub resume: Option<&'a Checkpoint>,
    /// The source's rate limit, when the pipeline declares one; the engine
    /// chooses it because only it knows whether other processes share the
    /// source (PostgreSQL: one bucket for every process).
    pub gate: Option<Arc<dyn RateGate>>,
    /// How many periods the engine reads at once (`--concurrency`,
    /// `--workers`; 1 for `run`): a source that keeps connections sizes
    /// its pool by it (a SQL source holds one connection per period).
    pub periods_at_once: usize,
}

impl OpenRequest<'_> {
    /// The most records a batch should hold (`[load] batch_size`).
    pub fn batch_size(&self) -> usize {
        self.pipeline.spec.load.batch_size
    }
}

/// Opens a source for a period. Shared by every run of a process.
#[async_trait]
pub trait OpenSource: Send + Sync {
    /// Opens the period, continuing after `request.resume` when given.
    async fn open(&self, request: OpenRequest<'_>) -> Result<Box<dyn BatchSource>, Error>;
}

/// One opened period of a source, read a batch at a time.
#[async_trait]
pub trait BatchSource: Send {
    /// The next batch with the checkpoint after it; `None` once the period
    /// is read whole.
    async fn next_batch(&mut self) -> Result<Option<Batch>, Error>;

    /// The number of records the source declared for the period, once it
    /// is exhausted (`expect_count`); `None` when it declares none. The
    /// engine compares it with the rows read before it reconciles or marks
    /// the period done.
    fn expected_count(&self) -> Option<u64> {
        None
    }
}

#[async_trait]
impl BatchSource for SourceReader {
    async fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        SourceReader::next_batch(self).await
    }

    fn expected_count(&self) -> Option<u64> {
        SourceReader::expected_count(self)
    }
}

/// The sources tidemark ships, as the pipeline's `[[sources]]` declare
/// them: `transport = "file"`, `"http"` and `"sql"`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltInSources;

#[async_trait]
impl OpenSource for BuiltInSources {
    async fn open(&self, request: OpenRequest<'_>) -> Result<Box<dyn BatchSource>, Error> {
        let pipeline = request.pipeline;
        let source = pipeline.source(request.source_id).ok_or_else(|| {
            Error::config(
                pipeline.file_name(),
                "sources",
                format!("no source {:?}", request.source_id),
            )
        })?;
        let reader = match source {
            SourceSpec::File(spec) => SourceReader::File(
                FileReader::open(pipeline, spec, request.period, request.resume).await?,
            ),
            SourceSpec::Http(spec) => SourceReader::Http(
                HttpReader::open(pipeline, spec, request.period, request.resume, request.gate)
                    .await?,
            ),
            SourceSpec::Sql(spec) => SourceReader::Sql(
                SqlReader::open(
                    pipeline,
                    spec,
                    request.period,
                    request.resume,
                    request.gate,
                    request.periods_at_once,
                )
                .await?,
            ),
            SourceSpec::Custom(spec) => return Err(crate::custom_unsupplied(pipeline, &spec.id)),
        };
        Ok(Box::new(reader))
    }
}
