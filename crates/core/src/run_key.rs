//! The run key: the identity of one unit of work and of every row it loads.

use std::fmt;

use crate::period::Period;

/// `(pipeline, source, export_type, period)`: one period run of one source.
/// The ledger holds exactly one row per run key (a UNIQUE constraint), and
/// every loaded row carries the key in its lineage columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunKey {
    /// Pipeline name.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// Export type.
    pub export_type: String,
    /// The period.
    pub period: Period,
}

impl RunKey {
    /// Builds a run key.
    pub fn new(pipeline: &str, source: &str, export_type: &str, period: Period) -> Self {
        RunKey {
            pipeline: pipeline.to_string(),
            source: source.to_string(),
            export_type: export_type.to_string(),
            period,
        }
    }
}

impl fmt::Display for RunKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pipeline {}, source {}, export_type {}, period {} ({} {})",
            self.pipeline,
            self.source,
            self.export_type,
            self.period.label(),
            self.period.granularity(),
            self.period.timezone()
        )
    }
}
