//! `[load]`: the destination table, its natural key, how a re-run
//! reconciles the rows that vanished, and how much memory and how large a
//! transaction one period may use.
//!
//! Separate because these are the settings the load crate acts on, with
//! their checks beside them; the rules for the table's name itself are in
//! `names.rs`, shared with the columns.

use schemars::JsonSchema;
use serde::Deserialize;

use super::check::{Checker, BATCH_SIZE, MEMORY_BUDGET};
use super::schema;
use super::PipelineSpec;
use crate::error::Error;

/// Within one period's input, what to do with repeated natural keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DuplicateKeyPolicy {
    /// The last occurrence wins.
    #[default]
    Last,
    /// The first occurrence wins.
    First,
    /// Fail the period (class `invariant`).
    Error,
}

/// Rows of a run key absent from the source on a re-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// Leave them.
    #[default]
    Keep,
    /// Delete them.
    Delete,
    /// Set `_tm_deleted_at`.
    SoftDelete,
}

/// `[load]`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// Destination table.
    #[schemars(schema_with = "schema::table_name")]
    pub table: String,
    /// Natural key columns (UNIQUE).
    #[schemars(length(min = 1))]
    pub key: Vec<String>,
    /// Repeated keys within a period.
    #[serde(default)]
    pub on_duplicate_key: DuplicateKeyPolicy,
    /// Rows that vanished from the source.
    #[serde(default)]
    pub on_missing: OnMissing,
    /// Refuse a reconciliation deleting more than this fraction of the run key's rows.
    #[serde(default = "default_max_delete_fraction")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_delete_fraction: f64,
    /// Bad rows tolerated per period (kept in the rejects table).
    #[serde(default)]
    pub max_rejects: u64,
    /// Records per batch (one transaction each).
    #[serde(default = "default_batch_size")]
    #[schemars(range(min = BATCH_SIZE.min.0, max = BATCH_SIZE.max.0))]
    pub batch_size: usize,
    /// The most memory one running period keeps for comparing its rows
    /// with what the table holds (the stored row hashes and the keys it has
    /// seen): `64MiB`, `512KiB`, `2GiB`. A period whose stored rows need
    /// more compares them through a sorted temporary file instead (ADR 0007).
    #[serde(default = "default_memory_budget")]
    pub memory_budget: String,
}

impl LoadSpec {
    /// `memory_budget` in bytes (checked when the pipeline was loaded).
    pub fn memory_budget_bytes(&self) -> u64 {
        parse_size(&self.memory_budget).unwrap_or(DEFAULT_MEMORY_BUDGET)
    }
}

/// 64 MiB: about 1.7 million stored rows compared in memory, and with the
/// rest of a run (two batches, SQLite's page caches) a peak RSS below
/// 160 MiB whatever the period's size.
const DEFAULT_MEMORY_BUDGET: u64 = 64 << 20;

fn default_memory_budget() -> String {
    "64MiB".to_string()
}

/// A size such as `64MiB` (binary units), `64MB` (decimal) or `1048576`
/// (bytes).
fn parse_size(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
}

const fn default_max_delete_fraction() -> f64 {
    0.5
}
const fn default_batch_size() -> usize {
    10_000
}

impl Checker<'_> {
    pub(super) fn load(&self, spec: &PipelineSpec) -> Result<(), Error> {
        let load = &spec.load;
        self.table_name(&load.table)?;
        if load.key.is_empty() {
            return Err(self.err("load.key", "at least one natural key field is required"));
        }
        for (i, key) in load.key.iter().enumerate() {
            let Some(field) = spec.fields.get(key) else {
                return Err(self.err(
                    "load.key",
                    format!("key field `{key}` is not defined in [fields]"),
                ));
            };
            if !field.ty.can_be_key() {
                return Err(self.err("load.key", format!("key field `{key}` has type {}, which cannot identify a row; use text, int or decimal", field.ty)));
            }
            if load.key[..i].contains(key) {
                return Err(self.err("load.key", format!("key field `{key}` is listed twice")));
            }
        }
        if !(0.0..=1.0).contains(&load.max_delete_fraction) {
            return Err(self.err("load.max_delete_fraction", "must be between 0.0 and 1.0"));
        }
        self.count("load.batch_size", load.batch_size, &BATCH_SIZE)?;
        self.memory_budget(&load.memory_budget)
    }

    /// `load.memory_budget`: a size within [`MEMORY_BUDGET`].
    fn memory_budget(&self, text: &str) -> Result<(), Error> {
        let key = "load.memory_budget";
        let bytes = parse_size(text).map_err(|e| {
            self.err(
                key,
                format!("invalid size {text:?} ({e}); give one such as \"64MiB\""),
            )
        })?;
        if (MEMORY_BUDGET.min.0..=MEMORY_BUDGET.max.0).contains(&bytes) {
            return Ok(());
        }
        Err(self.err(
            key,
            format!(
                "{text:?} cannot work: {}; give a size from {} to {}",
                MEMORY_BUDGET.why, MEMORY_BUDGET.min.1, MEMORY_BUDGET.max.1
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::tests::{config_err, GOOD};

    #[test]
    fn key_must_be_a_field() {
        let (key, message) = config_err(&GOOD.replace("key = [\"order_id\"]", "key = [\"id\"]"));
        assert_eq!(key, "load.key");
        assert!(message.contains("`id`"), "{message}");
        let (_, message) =
            config_err(&GOOD.replace("key = [\"order_id\"]", "key = [\"amount\", \"amount\"]"));
        assert!(message.contains("twice"), "{message}");
    }
}
