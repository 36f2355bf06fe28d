//! tidemark's extract stage: reads one source's records for one period in
//! batches, each ending at a resumable checkpoint.
//!
//! The checkpoint is an opaque, versioned JSON value. The runner stores it
//! in the ledger in the same transaction as the batch it ends, and hands it
//! back to [`OpenSource::open`] when a new attempt resumes, so at most one
//! batch is read again after a crash. The engine reads every source through
//! [`OpenSource`] and [`BatchSource`] (the `source` module says what a
//! source promises); [`BuiltInSources`] opens the file and HTTP readers.

#![warn(missing_docs)]

mod file;
mod http;
mod source;
mod sql;

use std::sync::Arc;

use tidemark_core::spec::SourceSpec;
use tidemark_core::{Error, Period, Pipeline, RateGate, RawRecord};

pub use file::FileReader;
pub use http::limiter::local_gate;
pub use http::{FirstPage, HttpReader};
pub use source::{BatchSource, BuiltInSources, OpenRequest, OpenSource};
pub use sql::{close_pools as close_sql_pools, SqlReader};

/// A resumable position in a source, stored in the ledger as JSON.
pub type Checkpoint = serde_json::Value;

/// Records read in one go, and the position after the last of them.
#[derive(Debug)]
pub struct Batch {
    /// The records, at most `load.batch_size` of them.
    pub records: Vec<RawRecord>,
    /// Where the next batch starts.
    pub checkpoint: Checkpoint,
}

/// Reads one source for one period.
#[derive(Debug)]
pub enum SourceReader {
    /// `transport = "file"`.
    File(FileReader),
    /// `transport = "http"`.
    Http(HttpReader),
    /// `transport = "sql"`.
    Sql(SqlReader),
}

impl SourceReader {
    /// Opens `source` of `pipeline` for `period`, continuing after `resume`
    /// when given. Fails with a permanent source error when the source is
    /// missing and `missing = "error"`.
    ///
    /// `gate` is the source's rate limit (see [`RateGate`]); the caller
    /// chooses it because only the caller knows whether other processes
    /// share the source. File sources have none. It reads one period at a
    /// time (a SQL source's pool is sized for one; the engine opens its
    /// periods through [`OpenSource`], which says how many run at once).
    pub async fn open(
        pipeline: &Pipeline,
        source: &SourceSpec,
        period: &Period,
        resume: Option<&Checkpoint>,
        gate: Option<Arc<dyn RateGate>>,
    ) -> Result<SourceReader, Error> {
        match source {
            SourceSpec::File(spec) => Ok(SourceReader::File(
                FileReader::open(pipeline, spec, period, resume).await?,
            )),
            SourceSpec::Http(spec) => Ok(SourceReader::Http(
                HttpReader::open(pipeline, spec, period, resume, gate).await?,
            )),
            SourceSpec::Sql(spec) => Ok(SourceReader::Sql(
                SqlReader::open(pipeline, spec, period, resume, gate, 1).await?,
            )),
            SourceSpec::Custom(spec) => Err(custom_unsupplied(pipeline, &spec.id)),
        }
    }

    /// A first look at `source` for `period` without writing anything
    /// (`validate --check-source`): an HTTP source's first page, or a file
    /// or SQL source's first batch (a SQL source's first chunk).
    pub async fn first_page(
        pipeline: &Pipeline,
        source: &SourceSpec,
        period: &Period,
    ) -> Result<FirstPage, Error> {
        match source {
            SourceSpec::Http(spec) => HttpReader::first_page(pipeline, spec, period).await,
            SourceSpec::Custom(spec) => Err(custom_unsupplied(pipeline, &spec.id)),
            SourceSpec::File(_) | SourceSpec::Sql(_) => {
                let mut reader = SourceReader::open(pipeline, source, period, None, None).await?;
                let records = reader
                    .next_batch()
                    .await?
                    .map(|b| b.records)
                    .unwrap_or_default();
                Ok(FirstPage {
                    resource: records
                        .first()
                        .map(|r| r.origin.resource.to_string())
                        .unwrap_or_default(),
                    records: records.len() as u64,
                    first: records.into_iter().next(),
                })
            }
        }
    }

    /// The number of records the source declared for the period
    /// (`expect_count` on an HTTP source), once the source is exhausted;
    /// `None` when it declares none. The runner compares it with the rows
    /// read before it reconciles or marks the period done.
    pub fn expected_count(&self) -> Option<u64> {
        match self {
            SourceReader::File(_) => None,
            SourceReader::Http(reader) => reader.expected_count(),
            SourceReader::Sql(reader) => reader.expected_count(),
        }
    }

    /// The next batch, or `None` when the source is exhausted.
    pub async fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        match self {
            SourceReader::File(reader) => reader.next_batch().await,
            SourceReader::Http(reader) => reader.next_batch().await,
            SourceReader::Sql(reader) => reader.next_batch().await,
        }
    }
}

/// A `transport = "custom"` source that no program supplied: the
/// `tidemark` binary, or an engine built without
/// `EngineBuilder::source` for it.
pub(crate) fn custom_unsupplied(pipeline: &Pipeline, id: &str) -> Error {
    Error::config(
        pipeline.file_name(),
        "transport",
        format!(
            "source {id:?} has transport = \"custom\": it is read by the program that embeds tidemark-engine \
             (EngineBuilder::source({id:?}, ...)); this engine has no reader for it"
        ),
    )
}
