//! The destination table as the pipeline defines it.

use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, FieldType, Pipeline, RowShape, Value};

/// Lineage columns every destination table carries, in table order.
pub const LINEAGE_COLUMNS: [&str; 6] = [
    "_tm_source",
    "_tm_export_type",
    "_tm_period_start",
    "_tm_run_id",
    "_tm_row_hash",
    "_tm_loaded_at",
];

/// The hash of the raw record each row was typed from (ADR 0021, "The
/// raw-record hash"): nullable, after the lineage columns. NULL means no
/// shortcut: the row's record is typed and compared by its row hash, as
/// for a table created before the column, which gets it added (NULL for
/// its rows until each is next written).
pub const RAW_HASH: &str = "_tm_raw_hash";

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
    /// Per column: whether its field is `required`.
    pub required: Vec<bool>,
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
            required: spec.fields.values().map(|f| f.required).collect(),
            soft_delete: spec.load.on_missing == OnMissing::SoftDelete,
        }
    }

    /// The columns as the row hash sees them.
    pub fn shape(&self) -> RowShape {
        RowShape::new(self.columns.iter().map(|(name, ty)| (name.as_str(), *ty)))
    }

    /// Whether column `i` may be added to an existing table: a field that is
    /// neither `required` nor part of the key, so that the rows already
    /// there, which have no value for it, hold NULL without contradicting
    /// the pipeline.
    pub fn can_add(&self, i: usize) -> bool {
        !self.key.contains(&i) && !self.required.get(i).copied().unwrap_or(false)
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
            required: vec![false; columns.len()],
            soft_delete: false,
        }
    }
}

/// How an existing table compares with the pipeline.
#[derive(Debug, Default)]
pub(crate) struct ColumnCheck {
    /// Contradictions, each naming its column: a changed type, a missing
    /// required or key field, a missing lineage column, a column that is
    /// not in `[fields]` (a removed field).
    pub problems: Vec<String>,
    /// Indices of fields the table lacks that may be added (see
    /// [`TableSchema::can_add`]).
    pub to_add: Vec<usize>,
    /// Nullable columns of tidemark's the table lacks, added to it:
    /// [`RAW_HASH`] for a table that predates it, [`DELETED_AT`] once
    /// `soft_delete` is turned on.
    pub extra_to_add: Vec<&'static str>,
}

/// Compares an existing table with the pipeline: every `[fields]` column
/// with its type, every lineage column, and no other column. `actual` is
/// `(name, declared type)` as the database reports it; `accepts` says
/// whether such a report fits a field type and `shown` names the type in
/// messages. Shared by both backends so they word contract errors alike.
pub(crate) fn compare_columns(
    schema: &TableSchema,
    actual: &[(String, String)],
    accepts: impl Fn(FieldType, &str) -> bool,
    shown: impl Fn(FieldType) -> &'static str,
) -> ColumnCheck {
    let mut check = ColumnCheck::default();
    for (i, (name, ty)) in schema.columns.iter().enumerate() {
        match actual.iter().find(|(n, _)| n == name) {
            None if schema.can_add(i) => check.to_add.push(i),
            None => check.problems.push(format!(
                "column `{name}` is missing (field of type {ty}, {}: only a field that is neither required nor in the key is added to an existing table)",
                if schema.key.contains(&i) { "in the key" } else { "required" }
            )),
            Some((_, declared)) if !accepts(*ty, declared) => check.problems.push(format!(
                "column `{name}` is {declared}, but field `{name}` has type {ty} (expected {})",
                shown(*ty)
            )),
            Some(_) => {}
        }
    }
    for lineage in LINEAGE_COLUMNS {
        if !actual.iter().any(|(n, _)| n == lineage) {
            check
                .problems
                .push(format!("lineage column `{lineage}` is missing"));
        }
    }
    let wanted = [(RAW_HASH, true), (DELETED_AT, schema.soft_delete)];
    check.extra_to_add = wanted
        .into_iter()
        .filter(|(column, wanted)| *wanted && !actual.iter().any(|(n, _)| n == column))
        .map(|(column, _)| column)
        .collect();
    for (name, _) in actual {
        let known = schema.columns.iter().any(|(n, _)| n == name)
            || LINEAGE_COLUMNS.contains(&name.as_str())
            || name == RAW_HASH
            || name == DELETED_AT;
        if !known {
            check.problems.push(format!(
                "column `{name}` is not in [fields] (a removed field: add it back, or drop the column)"
            ));
        }
    }
    check
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
