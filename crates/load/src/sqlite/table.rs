//! Destination tables on SQLite: creation, contract checks, row writes and
//! reconciliation.
//!
//! Column types: decimals are stored as canonical text in a column declared
//! `DECIMAL_TEXT` (TEXT affinity), so SQLite never turns `10.10` into a
//! binary float; JSON likewise in `JSON_TEXT`. Dates and times are
//! canonical text, booleans 0/1.

use std::collections::HashSet;

use futures_util::TryStreamExt;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Row as _, Sqlite, Transaction};
use tidemark_core::spec::OnMissing;
use tidemark_core::KeySet;
use tidemark_core::{Error, FieldType, Hash128, Row, Value};

use crate::db_error::DbResultExt;
use crate::schema::{column_problems, quote, TableSchema, DELETED_AT, LINEAGE_COLUMNS};
use crate::writer::{BatchOutcome, Lineage, Reject, Write, Written};

/// The declared SQLite type of a field type.
fn sql_type(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Text => "TEXT",
        FieldType::Int => "INTEGER",
        FieldType::Float => "REAL",
        FieldType::Decimal => "DECIMAL_TEXT",
        FieldType::Bool => "BOOLEAN",
        FieldType::Date => "DATE",
        FieldType::Timestamp => "TIMESTAMP",
        FieldType::Timestamptz => "TIMESTAMPTZ",
        FieldType::Json => "JSON_TEXT",
    }
}

pub(super) async fn ensure_table(pool: &SqlitePool, schema: &TableSchema) -> Result<(), Error> {
    let exists: Option<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?")
            .bind(&schema.table)
            .fetch_optional(pool)
            .await
            .db()?;
    if exists.is_none() {
        return create_table(pool, schema).await;
    }
    check_table(pool, schema).await
}

async fn create_table(pool: &SqlitePool, schema: &TableSchema) -> Result<(), Error> {
    let mut columns: Vec<String> = schema
        .columns
        .iter()
        .map(|(name, ty)| format!("{} {}", quote(name), sql_type(*ty)))
        .collect();
    columns.extend(LINEAGE_COLUMNS.iter().map(|c| format!("{c} TEXT NOT NULL")));
    if schema.soft_delete {
        columns.push(format!("{DELETED_AT} TEXT"));
    }
    columns.push(format!("UNIQUE ({})", key_list(schema)));
    let table = quote(&schema.table);
    let mut tx = pool.begin().await.db()?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n  {}\n)",
        columns.join(",\n  ")
    ))
    .execute(&mut *tx)
    .await
    .db()?;
    sqlx::query(&format!(
        "CREATE INDEX IF NOT EXISTS {} ON {table} (_tm_source, _tm_export_type, _tm_period_start)",
        quote(&format!("{}__tm_run_key", schema.table))
    ))
    .execute(&mut *tx)
    .await
    .db()?;
    tx.commit().await.db()?;
    tracing::info!(table = %schema.table, "created destination table");
    Ok(())
}

/// An existing table must have every field with its type, the lineage
/// columns, and a UNIQUE index on exactly the natural key.
async fn check_table(pool: &SqlitePool, schema: &TableSchema) -> Result<(), Error> {
    let table = quote(&schema.table);
    let info = sqlx::query(&format!("PRAGMA table_info({table})"))
        .fetch_all(pool)
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
    let problems = column_problems(schema, &actual, sql_type, sql_type);
    if !problems.is_empty() {
        return Err(contract(problems.join("; ")));
    }
    let key: HashSet<&str> = schema.key_columns().map(|(n, _)| n.as_str()).collect();
    if !has_unique_index_on(pool, &table, &key).await? {
        let names: Vec<&str> = schema.key_columns().map(|(n, _)| n.as_str()).collect();
        return Err(contract(format!(
            "no UNIQUE constraint on exactly the natural key ({})",
            names.join(", ")
        )));
    }
    if schema.soft_delete && !actual.iter().any(|(n, _)| n == DELETED_AT) {
        sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN {DELETED_AT} TEXT"))
            .execute(pool)
            .await
            .db()?;
    }
    Ok(())
}

async fn has_unique_index_on(
    pool: &SqlitePool,
    table: &str,
    key: &HashSet<&str>,
) -> Result<bool, Error> {
    let indexes = sqlx::query(&format!("PRAGMA index_list({table})"))
        .fetch_all(pool)
        .await
        .db()?;
    for index in indexes {
        if index.get::<i64, _>("unique") != 1 {
            continue;
        }
        let name: String = index.get("name");
        let cols = sqlx::query(&format!("PRAGMA index_info({})", quote(&name)))
            .fetch_all(pool)
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
    let live = if schema.soft_delete {
        format!(" AND {DELETED_AT} IS NULL")
    } else {
        String::new()
    };
    format!("_tm_source = ? AND _tm_export_type = ? AND _tm_period_start = ?{live}")
}

/// Reads a stored natural key back into typed values and hashes it the way
/// the transform stage does.
pub(super) fn key_hash_of(schema: &TableSchema, row: &SqliteRow) -> Result<Hash128, Error> {
    let mut values = Vec::with_capacity(schema.key.len());
    for (i, (name, ty)) in schema.key_columns().enumerate() {
        values.push((*ty, decode(row, i, name, *ty)?));
    }
    Ok(tidemark_core::value::key_hash(
        values.iter().map(|(t, v)| (*t, v)),
    ))
}

fn decode(row: &SqliteRow, i: usize, name: &str, ty: FieldType) -> Result<Value, Error> {
    let bad = |text: String| Error::Contract {
        table: String::new(),
        message: format!("stored key column `{name}` holds {text:?}, which is not a valid {ty}"),
    };
    match ty {
        FieldType::Int => Ok(row
            .try_get::<Option<i64>, _>(i)
            .db()?
            .map_or(Value::Null, Value::Int)),
        FieldType::Bool => Ok(row
            .try_get::<Option<i64>, _>(i)
            .db()?
            .map_or(Value::Null, |b| Value::Bool(b != 0))),
        _ => match row.try_get::<Option<String>, _>(i).db()? {
            None => Ok(Value::Null),
            Some(text) => Value::from_canonical_text(ty, &text).ok_or_else(|| bad(text)),
        },
    }
}

/// Lineage values stamped on every written row.
pub(super) struct Stamp<'a> {
    pub lineage: &'a Lineage,
    pub run_id: &'a str,
    pub loaded_at: &'a str,
}

type Query<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

fn bind_value<'q>(query: Query<'q>, value: &Value) -> Query<'q> {
    match value {
        Value::Null => query.bind(None::<String>),
        Value::Int(i) => query.bind(*i),
        Value::Float(f) => query.bind(*f),
        Value::Bool(b) => query.bind(i64::from(*b)),
        other => query.bind(other.canonical_text()),
    }
}

fn bind_stamp<'q>(query: Query<'q>, stamp: &Stamp<'_>, row: &Row) -> Query<'q> {
    query
        .bind(stamp.lineage.source.clone())
        .bind(stamp.lineage.export_type.clone())
        .bind(stamp.lineage.period_start.clone())
        .bind(stamp.run_id.to_string())
        .bind(row.row_hash.to_hex())
        .bind(stamp.loaded_at.to_string())
}

fn bind_key<'q>(mut query: Query<'q>, schema: &TableSchema, row: &Row) -> Query<'q> {
    for &i in &schema.key {
        query = bind_value(query, &row.values[i]);
    }
    query
}

fn key_match(schema: &TableSchema) -> String {
    schema
        .key_columns()
        .map(|(n, _)| format!("{} = ?", quote(n)))
        .collect::<Vec<_>>()
        .join(" AND ")
}

fn insert_head(schema: &TableSchema) -> String {
    let mut names: Vec<String> = schema.columns.iter().map(|(n, _)| quote(n)).collect();
    names.extend(LINEAGE_COLUMNS.iter().map(ToString::to_string));
    format!(
        "INSERT INTO {} ({})",
        quote(&schema.table),
        names.join(", ")
    )
}

/// `UPDATE` of every value and lineage column by natural key; with
/// `only_if_different`, only when the hash or the run key differs, or the
/// row was soft-deleted, so an identical row is never rewritten.
fn update_sql(schema: &TableSchema, only_if_different: bool) -> String {
    let mut sets: Vec<String> = schema
        .columns
        .iter()
        .map(|(n, _)| format!("{} = ?", quote(n)))
        .collect();
    sets.extend(LINEAGE_COLUMNS.iter().map(|c| format!("{c} = ?")));
    if schema.soft_delete {
        sets.push(format!("{DELETED_AT} = NULL"));
    }
    let mut sql = format!(
        "UPDATE {} SET {} WHERE {}",
        quote(&schema.table),
        sets.join(", "),
        key_match(schema)
    );
    if only_if_different {
        sql.push_str(
            " AND (_tm_row_hash IS NOT ? OR _tm_source IS NOT ? OR _tm_export_type IS NOT ? OR _tm_period_start IS NOT ?",
        );
        if schema.soft_delete {
            sql.push_str(&format!(" OR {DELETED_AT} IS NOT NULL"));
        }
        sql.push(')');
    }
    sql
}

/// Writes a batch's changed rows. Rows new to the run key go in multi-row
/// `INSERT`s (one statement per chunk instead of one per row); the few
/// whose key exists under another run key, and rows that changed, are
/// updated one by one, and only when something differs.
pub(super) async fn write_rows(
    tx: &mut Transaction<'_, Sqlite>,
    schema: &TableSchema,
    stamp: &Stamp<'_>,
    rows: &[(&Row, Write)],
    try_direct: bool,
) -> Result<BatchOutcome, Error> {
    let mut outcome = BatchOutcome::default();
    let mut fresh = Vec::new();
    for (row, write) in rows {
        match write {
            Write::Update if update(tx, schema, stamp, row, false).await? => {
                outcome.written.add(Written::Updated)
            }
            _ => fresh.push(*row),
        }
    }
    let per_row = schema.columns.len() + LINEAGE_COLUMNS.len();
    let chunk_size = (MAX_VARIABLES / per_row).clamp(1, 500);
    let mut direct = try_direct;
    for chunk in fresh.chunks(chunk_size) {
        // Keys new to the run key are usually new to the table (a first
        // backfill): insert them without probing, inside a savepoint; a
        // unique violation undoes the chunk and switches to probing.
        if direct {
            let mut savepoint = sqlx::Connection::begin(&mut **tx).await.db()?;
            match insert_many(&mut savepoint, schema, stamp, chunk).await {
                Ok(n) => {
                    savepoint.commit().await.db()?;
                    outcome.written.inserted += n;
                    continue;
                }
                Err(Error::Database { .. }) => {
                    savepoint.rollback().await.db()?;
                    direct = false;
                    outcome.direct_copy_conflict = true;
                }
                Err(e) => return Err(e),
            }
        }
        let taken = existing_keys(tx, schema, chunk).await?;
        let (elsewhere, new): (Vec<&Row>, Vec<&Row>) =
            chunk.iter().partition(|r| taken.contains(&r.key_hash));
        outcome.written.inserted += insert_many(tx, schema, stamp, &new).await?;
        for row in elsewhere {
            outcome
                .written
                .add(if update(tx, schema, stamp, row, true).await? {
                    Written::Updated
                } else {
                    Written::Unchanged
                });
        }
    }
    Ok(outcome)
}

/// SQLite's default limit on bound parameters per statement (since 3.32).
const MAX_VARIABLES: usize = 32_766;

/// Which of these rows' natural keys are already in the table (under any run key).
async fn existing_keys(
    tx: &mut Transaction<'_, Sqlite>,
    schema: &TableSchema,
    rows: &[&Row],
) -> Result<KeySet, Error> {
    let list = if schema.key.len() == 1 {
        format!(
            "{} IN ({})",
            key_list(schema),
            vec!["?"; rows.len()].join(", ")
        )
    } else {
        let tuple = format!("({})", vec!["?"; schema.key.len()].join(", "));
        format!(
            "({}) IN (VALUES {})",
            key_list(schema),
            vec![tuple; rows.len()].join(", ")
        )
    };
    let sql = format!(
        "SELECT {} FROM {} WHERE {list}",
        key_list(schema),
        quote(&schema.table)
    );
    let mut query = sqlx::query(&sql);
    for row in rows {
        query = bind_key(query, schema, row);
    }
    let found = query.fetch_all(&mut **tx).await.db()?;
    found.iter().map(|r| key_hash_of(schema, r)).collect()
}

async fn insert_many(
    tx: &mut Transaction<'_, Sqlite>,
    schema: &TableSchema,
    stamp: &Stamp<'_>,
    rows: &[&Row],
) -> Result<u64, Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let marks = format!(
        "({})",
        vec!["?"; schema.columns.len() + LINEAGE_COLUMNS.len()].join(", ")
    );
    let sql = format!(
        "{} VALUES {}",
        insert_head(schema),
        vec![marks; rows.len()].join(", ")
    );
    let mut query = sqlx::query(&sql);
    for row in rows {
        for value in &row.values {
            query = bind_value(query, value);
        }
        query = bind_stamp(query, stamp, row);
    }
    Ok(query.execute(&mut **tx).await.db()?.rows_affected())
}

async fn update(
    tx: &mut Transaction<'_, Sqlite>,
    schema: &TableSchema,
    stamp: &Stamp<'_>,
    row: &Row,
    only_if_different: bool,
) -> Result<bool, Error> {
    let sql = update_sql(schema, only_if_different);
    let mut query = sqlx::query(&sql);
    for value in &row.values {
        query = bind_value(query, value);
    }
    query = bind_key(bind_stamp(query, stamp, row), schema, row);
    if only_if_different {
        query = query
            .bind(row.row_hash.to_hex())
            .bind(stamp.lineage.source.clone())
            .bind(stamp.lineage.export_type.clone())
            .bind(stamp.lineage.period_start.clone());
    }
    Ok(query.execute(&mut **tx).await.db()?.rows_affected() == 1)
}

pub(super) async fn insert_reject(
    tx: &mut Transaction<'_, Sqlite>,
    lineage: &Lineage,
    run_id: &str,
    reject: &Reject,
    now: &str,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO _tm_rejects (pipeline, source, export_type, period_start, run_id, location, field, value,
                                  reason, record, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&lineage.pipeline)
    .bind(&lineage.source)
    .bind(&lineage.export_type)
    .bind(&lineage.period_start)
    .bind(run_id)
    .bind(&reject.location)
    .bind(&reject.field)
    .bind(&reject.value)
    .bind(&reject.reason)
    .bind(reject.record.to_string())
    .bind(now)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

/// Live rows of the run key, and the rowids of those whose natural key no
/// batch of this run has seen. Runs inside the final transaction, which
/// holds the write lock, so the rowids stay valid until the delete.
pub(super) async fn vanished_rows(
    tx: &mut Transaction<'_, Sqlite>,
    schema: &TableSchema,
    lineage: &Lineage,
    seen: &KeySet,
) -> Result<(u64, Vec<i64>), Error> {
    let sql = format!(
        "SELECT {}, rowid AS _tm_rowid FROM {} WHERE {}",
        key_list(schema),
        quote(&schema.table),
        live_rows_of_run_key(schema)
    );
    let mut rows = sqlx::query(&sql)
        .bind(&lineage.source)
        .bind(&lineage.export_type)
        .bind(&lineage.period_start)
        .fetch(&mut **tx);
    let (mut live, mut vanished) = (0u64, Vec::new());
    while let Some(row) = rows.try_next().await.db()? {
        live += 1;
        if !seen.contains(&key_hash_of(schema, &row)?) {
            vanished.push(row.try_get::<i64, _>("_tm_rowid").db()?);
        }
    }
    Ok((live, vanished))
}

pub(super) async fn delete_rows(
    tx: &mut Transaction<'_, Sqlite>,
    schema: &TableSchema,
    on_missing: OnMissing,
    rowids: &[i64],
    now: &str,
) -> Result<u64, Error> {
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
            query = query.bind(now.to_string());
        }
        for id in chunk {
            query = query.bind(*id);
        }
        deleted += query.execute(&mut **tx).await.db()?.rows_affected();
    }
    Ok(deleted)
}
