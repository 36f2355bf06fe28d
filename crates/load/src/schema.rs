//! The destination table as the pipeline defines it.

use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, FieldType, Pipeline, Value};

/// Lineage columns every destination table carries, in table order.
pub const LINEAGE_COLUMNS: [&str; 6] = [
    "_tm_source",
    "_tm_export_type",
    "_tm_period_start",
    "_tm_run_id",
    "_tm_row_hash",
    "_tm_loaded_at",
];

/// Set by `on_missing = "soft_delete"`.
pub const DELETED_AT: &str = "_tm_deleted_at";

/// Columns, types and natural key of a destination table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSchema {
    /// Table name (validated as an identifier when the pipeline loaded).
    pub table: String,
    /// `[fields]` columns in order.
    pub columns: Vec<(String, FieldType)>,
    /// Indices of the natural key columns, in `load.key` order.
    pub key: Vec<usize>,
    /// Whether the table needs `_tm_deleted_at`.
    pub soft_delete: bool,
}

impl TableSchema {
    /// The table a pipeline loads into.
    pub fn from_pipeline(pipeline: &Pipeline) -> TableSchema {
        let spec = &pipeline.spec;
        let columns: Vec<(String, FieldType)> = spec
            .fields
            .iter()
            .map(|(name, f)| (name.clone(), f.ty))
            .collect();
        let key = spec
            .load
            .key
            .iter()
            .filter_map(|k| columns.iter().position(|(name, _)| name == k))
            .collect();
        TableSchema {
            table: spec.load.table.clone(),
            columns,
            key,
            soft_delete: spec.load.on_missing == OnMissing::SoftDelete,
        }
    }

    /// Column types in order.
    pub fn types(&self) -> Vec<FieldType> {
        self.columns.iter().map(|(_, ty)| *ty).collect()
    }

    /// Appended to a run key's WHERE clause: leaves out soft-deleted rows.
    pub(crate) fn live_only(&self) -> &'static str {
        if self.soft_delete {
            " AND _tm_deleted_at IS NULL" // DELETED_AT
        } else {
            ""
        }
    }

    /// `(name, type)` of each key column.
    pub fn key_columns(&self) -> impl Iterator<Item = &(String, FieldType)> {
        self.key.iter().map(|&i| &self.columns[i])
    }
}

#[cfg(test)]
impl TableSchema {
    /// A table of `columns` keyed on the first one, without soft deletes:
    /// what the backends' unit tests load into.
    pub(crate) fn for_test(table: &str, columns: &[(&str, FieldType)]) -> TableSchema {
        TableSchema {
            table: table.to_string(),
            columns: columns
                .iter()
                .map(|(name, ty)| ((*name).to_string(), *ty))
                .collect(),
            key: vec![0],
            soft_delete: false,
        }
    }
}

/// What an existing table lacks or contradicts: every `[fields]` column with
/// its type, and every lineage column. `actual` is `(name, declared type)`
/// as the database reports it; `accepts` says whether such a report fits a
/// field type and `shown` names the type in messages. Shared by both
/// backends so they word contract errors alike.
pub(crate) fn column_problems(
    schema: &TableSchema,
    actual: &[(String, String)],
    accepts: impl Fn(FieldType, &str) -> bool,
    shown: impl Fn(FieldType) -> &'static str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, ty) in &schema.columns {
        match actual.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("column `{name}` is missing (field of type {ty})")),
            Some((_, declared)) if !accepts(*ty, declared) => problems.push(format!(
                "column `{name}` is {declared}, but field `{name}` has type {ty} (expected {})",
                shown(*ty)
            )),
            Some(_) => {}
        }
    }
    for lineage in LINEAGE_COLUMNS {
        if !actual.iter().any(|(n, _)| n == lineage) {
            problems.push(format!("lineage column `{lineage}` is missing"));
        }
    }
    problems
}

/// Double-quotes an identifier. Names were validated as `[A-Za-z_][A-Za-z0-9_]*`,
/// so quoting only guards against reserved words.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

/// Reads a stored natural-key value back from its canonical text, as the
/// transform would have typed it; anything else means the table
/// contradicts the pipeline.
pub(crate) fn stored_key_from_text(
    table: &str,
    column: &str,
    ty: FieldType,
    text: &str,
) -> Result<Value, Error> {
    Value::from_canonical_text(ty, text)
        .ok_or_else(|| bad_stored_key(table, column, ty, &format!("{text:?}")))
}

/// A stored natural-key value that is not a valid value of its type.
pub(crate) fn bad_stored_key(table: &str, column: &str, ty: FieldType, shown: &str) -> Error {
    Error::Contract {
        table: table.to_string(),
        message: format!("stored key column `{column}` holds {shown}, which is not a valid {ty}"),
    }
}
