//! The row-by-row paths of the SQLite backend, on the connection's raw
//! handle.
//!
//! sqlx runs each SQLite connection on a worker thread and ships every bound
//! value and every fetched row across a channel, with an allocation per
//! value and a thread wake-up per row. On a first backfill that overhead was
//! a third of sqlx's worker thread; reading a run key's stored hashes for a
//! re-sync was dominated by it. Here the same connection, locked and inside
//! the same transaction, is driven through rusqlite's prepared statements:
//! one single-row `INSERT` prepared per batch with its parameters rebound
//! per row, as the `sqlite3` shell's `.import` does, and rows read in place.

use std::fmt::Write as _;

use rusqlite::types::{Null, ValueRef};
use rusqlite::{Connection, ErrorCode, Statement};
use sqlx::SqliteConnection;
use tidemark_core::{Error, FieldType, Hash128, Row, Value};

use super::table::{key_list, live_rows_of_run_key, Stamp};
use crate::db_error::{raw_sqlite_error, DbResultExt};
use crate::schema::{
    bad_stored_key, quote, stored_key_from_text, TableSchema, DELETED_AT, LINEAGE_COLUMNS,
};
use crate::stored::StoredHashes;
use crate::writer::{Lineage, StoredRow, Write, WriteCounts};

/// Runs `work` on `conn`'s raw SQLite handle. Inside a transaction, the work
/// is part of it.
pub(super) async fn with_raw<R>(
    conn: &mut SqliteConnection,
    work: impl FnOnce(&Connection) -> Result<R, Error>,
) -> Result<R, Error> {
    let mut handle = conn.lock_handle().await.db()?;
    let raw = handle.as_raw_handle();
    // SAFETY: `handle` keeps sqlx's worker off this connection until it is
    // dropped, after `borrowed`, so only this thread uses the handle.
    // `from_handle` does not take ownership: dropping `borrowed` finalizes
    // the statements it prepared and never closes the database.
    #[allow(unsafe_code)]
    let borrowed = unsafe { Connection::from_handle(raw.as_ptr()) }.db()?;
    let result = blocking(|| work(&borrowed));
    drop(borrowed);
    drop(handle);
    result
}

/// Runs synchronous database work without stalling the other tasks of a
/// multi-threaded runtime (the heartbeat, the reader one batch ahead).
fn blocking<R>(work: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// Parameter numbers shared by the insert and update statements: `?1..?n`
/// are the `[fields]` values, then the lineage columns in table order.
struct Params {
    fields: usize,
}

impl Params {
    fn lineage(&self, i: usize) -> usize {
        self.fields + 1 + i
    }
    fn row_hash(&self) -> usize {
        self.lineage(4)
    }
}

/// `INSERT` of one row: values and lineage.
fn insert_sql(schema: &TableSchema) -> String {
    let mut names: Vec<String> = schema.columns.iter().map(|(n, _)| quote(n)).collect();
    names.extend(LINEAGE_COLUMNS.iter().map(ToString::to_string));
    let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        quote(&schema.table),
        names.join(", "),
        marks.join(", ")
    )
}

/// `UPDATE` of every value and lineage column by natural key; with
/// `only_if_different`, only when the hash or the run key differs, or the
/// row was soft-deleted, so an identical row is never rewritten.
fn update_sql(schema: &TableSchema, only_if_different: bool) -> String {
    let p = Params {
        fields: schema.columns.len(),
    };
    let mut sets: Vec<String> = schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, (n, _))| format!("{} = ?{}", quote(n), i + 1))
        .collect();
    sets.extend(
        LINEAGE_COLUMNS
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = ?{}", p.lineage(i))),
    );
    if schema.soft_delete {
        sets.push(format!("{DELETED_AT} = NULL"));
    }
    let key: Vec<String> = schema
        .key
        .iter()
        .map(|&i| format!("{} = ?{}", quote(&schema.columns[i].0), i + 1))
        .collect();
    let mut sql = format!(
        "UPDATE {} SET {} WHERE {}",
        quote(&schema.table),
        sets.join(", "),
        key.join(" AND ")
    );
    if only_if_different {
        let differs: Vec<String> = [4, 0, 1, 2]
            .iter()
            .map(|&i| format!("{} IS NOT ?{}", LINEAGE_COLUMNS[i], p.lineage(i)))
            .collect();
        sql.push_str(&format!(" AND ({}", differs.join(" OR ")));
        if schema.soft_delete {
            sql.push_str(&format!(" OR {DELETED_AT} IS NOT NULL"));
        }
        sql.push(')');
    }
    sql
}

/// One prepared write statement with the batch's lineage bound once;
/// parameters survive `reset`, so each row rebinds only its own values.
struct RowStatement<'c> {
    statement: Statement<'c>,
    params: Params,
}

impl<'c> RowStatement<'c> {
    fn prepare(
        conn: &'c Connection,
        sql: &str,
        schema: &TableSchema,
        stamp: &Stamp<'_>,
    ) -> Result<Self, Error> {
        let mut statement = conn.prepare(sql).db()?;
        let params = Params {
            fields: schema.columns.len(),
        };
        let lineage = [
            stamp.lineage.source.as_str(),
            stamp.lineage.export_type.as_str(),
            stamp.lineage.period_start.as_str(),
            stamp.run_id,
        ];
        for (i, value) in lineage.iter().enumerate() {
            statement
                .raw_bind_parameter(params.lineage(i), value)
                .db()?;
        }
        statement
            .raw_bind_parameter(params.lineage(5), stamp.loaded_at)
            .db()?;
        Ok(RowStatement { statement, params })
    }

    /// Binds `row` and runs the statement: the number of rows changed.
    fn execute(&mut self, row: &Row, scratch: &mut String) -> rusqlite::Result<usize> {
        for (i, value) in row.values.iter().enumerate() {
            bind_value(&mut self.statement, i + 1, value, scratch)?;
        }
        scratch.clear();
        let _ = write!(scratch, "{:032x}", row.row_hash.0);
        self.statement
            .raw_bind_parameter(self.params.row_hash(), scratch.as_str())?;
        self.statement.raw_execute()
    }
}

/// Binds a value as SQLite stores it: integers, reals and 0/1 natively,
/// everything else as canonical text (copied by SQLite, so `scratch` is
/// reused for the next value).
fn bind_value(
    statement: &mut Statement<'_>,
    index: usize,
    value: &Value,
    scratch: &mut String,
) -> rusqlite::Result<()> {
    match value {
        Value::Null => statement.raw_bind_parameter(index, Null),
        Value::Text(s) => statement.raw_bind_parameter(index, s.as_str()),
        Value::Int(i) => statement.raw_bind_parameter(index, i),
        Value::Float(f) => statement.raw_bind_parameter(index, f),
        Value::Bool(b) => statement.raw_bind_parameter(index, i64::from(*b)),
        other => {
            scratch.clear();
            other.write_canonical(scratch);
            statement.raw_bind_parameter(index, scratch.as_str())
        }
    }
}

fn is_unique_violation(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(e, _)
            if e.code == ErrorCode::ConstraintViolation
                && e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
    )
}

/// Writes a batch's changed rows. A row that changed is updated by key; a
/// row new to the run key is inserted without probing, and if its key
/// exists under another run key the failed single-row `INSERT` has written
/// nothing (SQLite undoes just that statement) and the row is updated
/// instead, only if something differs.
pub(super) fn write_rows(
    conn: &Connection,
    schema: &TableSchema,
    stamp: &Stamp<'_>,
    rows: &[(&Row, Write)],
) -> Result<WriteCounts, Error> {
    let mut insert = RowStatement::prepare(conn, &insert_sql(schema), schema, stamp)?;
    let mut update = RowStatement::prepare(conn, &update_sql(schema, false), schema, stamp)?;
    let mut update_if_different =
        RowStatement::prepare(conn, &update_sql(schema, true), schema, stamp)?;
    let mut written = WriteCounts::default();
    let mut scratch = String::new();
    for (row, write) in rows {
        if *write == Write::Update && update.execute(row, &mut scratch).db()? == 1 {
            written.updated += 1;
            continue;
        }
        match insert.execute(row, &mut scratch) {
            Ok(_) => written.inserted += 1,
            Err(e) if is_unique_violation(&e) => {
                if update_if_different.execute(row, &mut scratch).db()? == 1 {
                    written.updated += 1;
                } else {
                    written.unchanged += 1;
                }
            }
            Err(e) => return Err(raw_sqlite_error(e)),
        }
    }
    Ok(written)
}

/// Key hash, row hash and "written by this run" (when `run_id` is given) of
/// the run key's live rows.
pub(super) fn stored_rows(
    conn: &Connection,
    schema: &TableSchema,
    lineage: &Lineage,
    run_id: Option<&str>,
) -> Result<Vec<StoredRow>, Error> {
    let mut stored = Vec::new();
    scan(conn, schema, lineage, run_id, |key, row| {
        if let Some(row_hash) = row.row_hash {
            stored.push(StoredRow {
                key,
                row_hash,
                written_by_run: row.written_by_run,
            });
        }
    })?;
    Ok(stored)
}

/// The run key's live row count, and the rowids of the rows it held at the
/// start whose natural key no batch of this run has seen.
pub(super) fn vanished_rows(
    conn: &Connection,
    schema: &TableSchema,
    lineage: &Lineage,
    existing: &StoredHashes,
) -> Result<(u64, Vec<i64>), Error> {
    let (mut live, mut vanished) = (0u64, Vec::new());
    scan(conn, schema, lineage, None, |key, row| {
        live += 1;
        if existing.vanished(key) {
            vanished.push(row.rowid);
        }
    })?;
    Ok((live, vanished))
}

/// What a live row holds besides its natural key.
struct LiveRow {
    /// `None` for a row hash that is not one of ours (the row is then
    /// rewritten, never skipped).
    row_hash: Option<Hash128>,
    written_by_run: bool,
    rowid: i64,
}

/// Calls `each` with the key hash and the rest of every live row of the
/// run key.
fn scan(
    conn: &Connection,
    schema: &TableSchema,
    lineage: &Lineage,
    run_id: Option<&str>,
    mut each: impl FnMut(Hash128, LiveRow),
) -> Result<(), Error> {
    let sql = format!(
        "SELECT {}, _tm_row_hash, _tm_run_id = ?, rowid FROM {} WHERE {}",
        key_list(schema),
        quote(&schema.table),
        live_rows_of_run_key(schema)
    );
    let mut statement = conn.prepare(&sql).db()?;
    let mut rows = statement
        .query((
            run_id.unwrap_or_default(),
            &lineage.source,
            &lineage.export_type,
            &lineage.period_start,
        ))
        .db()?;
    let hash_column = schema.key.len();
    while let Some(row) = rows.next().db()? {
        let row_hash = match row.get_ref(hash_column).db()? {
            ValueRef::Text(hex) => std::str::from_utf8(hex).ok().and_then(Hash128::from_hex),
            _ => None,
        };
        let live = LiveRow {
            row_hash,
            written_by_run: row.get::<_, Option<i64>>(hash_column + 1).db()? == Some(1),
            rowid: row.get(hash_column + 2).db()?,
        };
        each(key_hash_of(schema, row)?, live);
    }
    Ok(())
}

/// Reads a stored natural key (the first columns of `row`) back into typed
/// values and hashes it the way the transform stage does.
fn key_hash_of(schema: &TableSchema, row: &rusqlite::Row<'_>) -> Result<Hash128, Error> {
    let mut values = Vec::with_capacity(schema.key.len());
    for (i, (name, ty)) in schema.key_columns().enumerate() {
        values.push((*ty, decode(row.get_ref(i).db()?, &schema.table, name, *ty)?));
    }
    Ok(tidemark_core::value::key_hash(
        values.iter().map(|(t, v)| (*t, v)),
    ))
}

fn decode(stored: ValueRef<'_>, table: &str, name: &str, ty: FieldType) -> Result<Value, Error> {
    match (ty, stored) {
        (_, ValueRef::Null) => Ok(Value::Null),
        (FieldType::Int, ValueRef::Integer(i)) => Ok(Value::Int(i)),
        (FieldType::Bool, ValueRef::Integer(b)) => Ok(Value::Bool(b != 0)),
        (_, ValueRef::Text(bytes)) => {
            stored_key_from_text(table, name, ty, &String::from_utf8_lossy(bytes))
        }
        (_, other) => Err(bad_stored_key(table, name, ty, &format!("{other:?}"))),
    }
}
