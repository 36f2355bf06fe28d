//! Destination tables on SQLite: creation, contract checks, row writes and
//! reconciliation.
//!
//! Column types: decimals are stored as canonical text in a column declared
//! `DECIMAL_TEXT` (TEXT affinity), so SQLite never turns `10.10` into a
//! binary float; JSON likewise in `JSON_TEXT`. Dates and times are
//! canonical text, booleans 0/1.

use std::collections::HashSet;

use sqlx::sqlite::SqliteConnection;
use sqlx::Row as _;
use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, FieldType};

use crate::db_error::DbResultExt;
use crate::schema::{compare_columns, quote, TableSchema, DELETED_AT, LINEAGE_COLUMNS, RAW_HASH};
use crate::writer::Lineage;

/// The declared SQLite type of a field type, for new tables. Every type
/// SQLite does not store natively is stored as its canonical text and
/// declared `*_TEXT`, which gives the column TEXT affinity: SQLite keeps
/// the text as it is. Dates and times were declared `DATE`, `TIMESTAMP`
/// and `TIMESTAMPTZ` before (tables created then keep them): NUMERIC
/// affinity stored the same text, but only after trying to read it as a
/// number on every insert (1.2% of a first backfill's instructions with
/// two time columns).
fn sql_type(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Text => "TEXT",
        FieldType::Int => "INTEGER",
        FieldType::Float => "REAL",
        FieldType::Decimal => "DECIMAL_TEXT",
        FieldType::Bool => "BOOLEAN",
        FieldType::Date => "DATE_TEXT",
        FieldType::Timestamp => "TIMESTAMP_TEXT",
        FieldType::Timestamptz => "TIMESTAMPTZ_TEXT",
        FieldType::Json => "JSON_TEXT",
    }
}

/// Whether an existing column declared `declared` holds values of `ty`:
/// today's declared type, or the one tables created by earlier builds have.
fn accepts(ty: FieldType, declared: &str) -> bool {
    let earlier = match ty {
        FieldType::Date => Some("DATE"),
        FieldType::Timestamp => Some("TIMESTAMP"),
        FieldType::Timestamptz => Some("TIMESTAMPTZ"),
        _ => None,
    };
    declared == sql_type(ty) || earlier == Some(declared)
}

/// Everything runs on one connection, in this order, because a `PRAGMA`
/// reads the connection's cached schema without checking that it is
/// current: the `SELECT` on `sqlite_master` does check (and reloads a
/// schema another connection changed), so the pragmas after it see a table
/// created a moment ago by a run starting alongside this one.
pub(super) async fn ensure_table(
    conn: &mut SqliteConnection,
    schema: &TableSchema,
) -> Result<(), Error> {
    let exists: Option<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?")
            .bind(&schema.table)
            .fetch_optional(&mut *conn)
            .await
            .db()?;
    if exists.is_none() {
        return create_table(conn, schema).await;
    }
    check_table(conn, schema).await
}

async fn create_table(conn: &mut SqliteConnection, schema: &TableSchema) -> Result<(), Error> {
    let mut columns: Vec<String> = schema
        .columns
        .iter()
        .map(|(name, ty)| format!("{} {}", quote(name), sql_type(*ty)))
        .collect();
    columns.extend(LINEAGE_COLUMNS.iter().map(|c| format!("{c} TEXT NOT NULL")));
    columns.push(format!("{RAW_HASH} TEXT"));
    if schema.soft_delete {
        columns.push(format!("{DELETED_AT} TEXT"));
    }
    columns.push(format!("UNIQUE ({})", key_list(schema)));
    let table = quote(&schema.table);
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n  {}\n)",
        columns.join(",\n  ")
    ))
    .execute(&mut *conn)
    .await
    .db()?;
    // The run-key index holds the period start alone: source and export
    // type are nearly always the same for every row of a table, and SQLite
    // compared all three texts on every insert. A query for one run key
    // filters the other two on the rows of its period. First backfill of
    // 1,000,000 rows: 2.62-2.74 s -> 2.32-2.45 s (ADR 0003). Tables created
    // before keep their three-column index; both serve the same queries.
    sqlx::query(&format!(
        "CREATE INDEX IF NOT EXISTS {} ON {table} (_tm_period_start)",
        quote(&format!(
            "{}{}",
            schema.table,
            tidemark_core::spec::RUN_KEY_INDEX_SUFFIX
        ))
    ))
    .execute(&mut *conn)
    .await
    .db()?;
    tracing::info!(table = %schema.table, "created destination table");
    Ok(())
}

/// An existing table must have every field with its type, the lineage
/// columns, no other column, and a UNIQUE index on exactly the natural key.
/// A field it lacks that is neither required nor in the key is added as a
/// nullable column, on this connection under the write lock the caller's
/// `BEGIN IMMEDIATE` took, so two runs cannot both add it.
async fn check_table(conn: &mut SqliteConnection, schema: &TableSchema) -> Result<(), Error> {
    let table = quote(&schema.table);
    let info = sqlx::query(&format!("PRAGMA table_info({table})"))
        .fetch_all(&mut *conn)
        .await
        .db()?;
    let actual: Vec<(String, String)> = info
        .iter()
        .map(|r| {
            (
                r.get::<String, _>("name"),
                r.get::<String, _>("type").to_uppercase(),
            )
        })
        .collect();
    let contract = |message: String| Error::Contract {
        table: schema.table.clone(),
        message,
    };
    let check = compare_columns(schema, &actual, accepts, sql_type);
    if !check.problems.is_empty() {
        return Err(contract(check.problems.join("; ")));
    }
    let key: HashSet<&str> = schema.key_columns().map(|(n, _)| n.as_str()).collect();
    if !has_unique_index_on(conn, &table, &key).await? {
        let names: Vec<&str> = schema.key_columns().map(|(n, _)| n.as_str()).collect();
        return Err(contract(format!(
            "no UNIQUE constraint on exactly the natural key ({})",
            names.join(", ")
        )));
    }
    for &i in &check.to_add {
        let (name, ty) = &schema.columns[i];
        sqlx::query(&format!(
            "ALTER TABLE {table} ADD COLUMN {} {}",
            quote(name),
            sql_type(*ty)
        ))
        .execute(&mut *conn)
        .await
        .db()?;
        tracing::info!(table = %schema.table, column = %name, "added column (new field)");
    }
    for column in check.extra_to_add {
        // Both are TEXT here: SQLite stores times as RFC 3339 text.
        sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN {column} TEXT"))
            .execute(&mut *conn)
            .await
            .db()?;
        tracing::info!(table = %schema.table, column, "added column");
    }
    Ok(())
}

async fn has_unique_index_on(
    conn: &mut SqliteConnection,
    table: &str,
    key: &HashSet<&str>,
) -> Result<bool, Error> {
    let indexes = sqlx::query(&format!("PRAGMA index_list({table})"))
        .fetch_all(&mut *conn)
        .await
        .db()?;
    for index in indexes {
        if index.get::<i64, _>("unique") != 1 {
            continue;
        }
        let name: String = index.get("name");
        let cols = sqlx::query(&format!("PRAGMA index_info({})", quote(&name)))
            .fetch_all(&mut *conn)
            .await
            .db()?;
        let cols: HashSet<String> = cols.iter().map(|r| r.get::<String, _>("name")).collect();
        if cols.len() == key.len() && key.iter().all(|k| cols.contains(*k)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `"a", "b"`: the natural key columns.
pub(super) fn key_list(schema: &TableSchema) -> String {
    schema
        .key_columns()
        .map(|(n, _)| quote(n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The WHERE clause selecting the live rows of one run key; binds source,
/// export type and period start.
pub(super) fn live_rows_of_run_key(schema: &TableSchema) -> String {
    let live = schema.live_only();
    format!("_tm_source = ? AND _tm_export_type = ? AND _tm_period_start = ?{live}")
}

/// Lineage values stamped on every written row.
pub(super) struct Stamp<'a> {
    pub lineage: &'a Lineage,
    pub run_id: &'a str,
    pub loaded_at: &'a str,
}

pub(super) async fn delete_rows(
    conn: &mut SqliteConnection,
    schema: &TableSchema,
    on_missing: OnMissing,
    rowids: &[i64],
) -> Result<u64, Error> {
    let now = crate::now_text();
    let table = quote(&schema.table);
    let mut deleted = 0;
    for chunk in rowids.chunks(500) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let sql = match on_missing {
            OnMissing::SoftDelete => {
                format!("UPDATE {table} SET {DELETED_AT} = ? WHERE rowid IN ({marks})")
            }
            _ => format!("DELETE FROM {table} WHERE rowid IN ({marks})"),
        };
        let mut query = sqlx::query(&sql);
        if on_missing == OnMissing::SoftDelete {
            query = query.bind(now.clone());
        }
        for id in chunk {
            query = query.bind(*id);
        }
        deleted += query.execute(&mut *conn).await.db()?.rows_affected();
    }
    Ok(deleted)
}
