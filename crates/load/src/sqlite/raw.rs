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

use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode};
use tidemark_core::{Error, FieldType, Hash128, Row, Value};

use super::table::{key_list, live_rows_of_run_key, Stamp};
use crate::db_error::{raw_sqlite_error, DbResultExt};
use crate::schema::{
    bad_stored_key, quote, stored_key_from_text, TableSchema, DELETED_AT, LINEAGE_COLUMNS, RAW_HASH,
};
use crate::stored::StoredHashes;
use crate::writer::{Lineage, StoredRow, Write, WriteCounts};

use super::ffi::BorrowingStatement;
pub(super) use crate::blocking;

/// Parameter numbers shared by the insert and update statements: `?1..?n`
/// are the `[fields]` values, then the lineage columns in table order,
/// then the raw-record hash.
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
    fn raw_hash(&self) -> usize {
        self.lineage(LINEAGE_COLUMNS.len())
    }
}

/// `INSERT` of one row: values and lineage.
fn insert_sql(schema: &TableSchema) -> String {
    let mut names: Vec<String> = schema.columns.iter().map(|(n, _)| quote(n)).collect();
    names.extend(LINEAGE_COLUMNS.iter().map(ToString::to_string));
    names.push(RAW_HASH.to_string());
    let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        quote(&schema.table),
        names.join(", "),
        marks.join(", ")
    )
}

/// Whether a write of this run key may replace the row it meets: its own
/// row, a row of an earlier period (a row belongs to the latest period that
/// holds it: ADR 0006), or a soft-deleted row (as a deleted one would be
/// gone). Period starts are compared as instants with `julianday`: SQLite
/// stores them as RFC 3339 text with their offsets, which does not sort as
/// time. An equal start under another run key keeps the row where it is.
fn may_take(p: &Params, schema: &TableSchema) -> String {
    let (source, export_type, start) = (p.lineage(0), p.lineage(1), p.lineage(2));
    let mut cond = format!(
        "(_tm_source = ?{source} AND _tm_export_type = ?{export_type} AND _tm_period_start = ?{start}) \
         OR julianday(?{start}) > julianday(_tm_period_start)"
    );
    if schema.soft_delete {
        cond.push_str(&format!(" OR {DELETED_AT} IS NOT NULL"));
    }
    format!("({cond})")
}

/// `UPDATE` of every value and lineage column by natural key, where the
/// ownership rule lets this run key write ([`may_take`]); with
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
    // Written with the row, never compared (see the PostgreSQL merge).
    sets.push(format!("{RAW_HASH} = ?{}", p.raw_hash()));
    if schema.soft_delete {
        sets.push(format!("{DELETED_AT} = NULL"));
    }
    let key: Vec<String> = schema
        .key
        .iter()
        .map(|&i| format!("{} = ?{}", quote(&schema.columns[i].0), i + 1))
        .collect();
    let mut sql = format!(
        "UPDATE {} SET {} WHERE {} AND {}",
        quote(&schema.table),
        sets.join(", "),
        key.join(" AND "),
        may_take(&p, schema)
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
/// Texts are bound in place (see `ffi::statement`), so the rows and their
/// rendered texts must outlive the statement: `'d`.
struct RowStatement<'c, 'd> {
    statement: BorrowingStatement<'c, 'd>,
    params: Params,
}

impl<'c, 'd> RowStatement<'c, 'd> {
    fn prepare(
        conn: &'c Connection,
        sql: &str,
        schema: &TableSchema,
        stamp: &'d Stamp<'d>,
    ) -> Result<Self, Error> {
        let mut statement = BorrowingStatement::prepare(conn, sql).db()?;
        let params = Params {
            fields: schema.columns.len(),
        };
        let lineage = [
            stamp.lineage.source.as_str(),
            stamp.lineage.export_type.as_str(),
            stamp.lineage.period_start.as_str(),
            stamp.run_id,
        ];
        for (i, value) in lineage.into_iter().enumerate() {
            statement.bind_text(params.lineage(i), value).db()?;
        }
        statement
            .bind_text(params.lineage(5), stamp.loaded_at)
            .db()?;
        Ok(RowStatement { statement, params })
    }

    /// Binds `row`, with its pre-rendered texts, and runs the statement:
    /// the number of rows changed.
    fn execute(&mut self, row: &'d Row, texts: &mut Pieces<'d>) -> rusqlite::Result<usize> {
        for (i, value) in row.values.iter().enumerate() {
            match Bind::of(value) {
                Bind::Null => self.statement.bind_null(i + 1),
                Bind::Text(s) => self.statement.bind_text(i + 1, s),
                Bind::Int(n) => self.statement.bind_int(i + 1, n),
                Bind::Float(f) => self.statement.bind_float(i + 1, f),
                Bind::Rendered => self.statement.bind_text(i + 1, texts.next()),
            }?;
        }
        self.statement
            .bind_text(self.params.row_hash(), texts.next())?;
        match row.raw_hash {
            Some(_) => self
                .statement
                .bind_text(self.params.raw_hash(), texts.next())?,
            None => self.statement.bind_null(self.params.raw_hash())?,
        }
        self.statement.execute()
    }
}

/// A write statement prepared at its first use. A first load only inserts:
/// preparing the two `UPDATE`s it never runs was most of the statement
/// preparation of a small period (each names every column and the
/// ownership rule).
struct OnDemand<'c, 'd> {
    conn: &'c Connection,
    sql: String,
    schema: &'d TableSchema,
    stamp: &'d Stamp<'d>,
    statement: Option<RowStatement<'c, 'd>>,
}

impl<'c, 'd> OnDemand<'c, 'd> {
    fn new(
        conn: &'c Connection,
        sql: String,
        schema: &'d TableSchema,
        stamp: &'d Stamp<'d>,
    ) -> Self {
        OnDemand {
            conn,
            sql,
            schema,
            stamp,
            statement: None,
        }
    }

    fn get(&mut self) -> Result<&mut RowStatement<'c, 'd>, Error> {
        match &mut self.statement {
            Some(statement) => Ok(statement),
            slot => Ok(slot.insert(RowStatement::prepare(
                self.conn,
                &self.sql,
                self.schema,
                self.stamp,
            )?)),
        }
    }
}

/// How a value is bound: natively (integers, reals, booleans as 0/1,
/// text), or as its canonical text from [`Rendered`]. The one place that
/// decides, so rendering and binding agree on which values have a piece.
enum Bind<'v> {
    Null,
    Text(&'v str),
    Int(i64),
    Float(f64),
    Rendered,
}

impl<'v> Bind<'v> {
    fn of(value: &'v Value) -> Self {
        match value {
            Value::Null => Bind::Null,
            Value::Text(s) => Bind::Text(s),
            Value::Int(n) => Bind::Int(*n),
            Value::Float(f) => Bind::Float(*f),
            Value::Bool(b) => Bind::Int(i64::from(*b)),
            Value::Decimal(_)
            | Value::Date(_)
            | Value::Timestamp(_)
            | Value::Timestamptz(_)
            | Value::Json(_) => Bind::Rendered,
        }
    }
}

/// The text SQLite stores for every value it does not take natively
/// (decimals, dates, times, JSON), and each row's hash in hex, rendered
/// before the write lock is taken: formatting was 5% of a first backfill,
/// all of it inside the one writer's critical section, where the other
/// periods wait.
pub(crate) struct Rendered {
    text: String,
    /// End offset in `text` of each piece, in row order.
    ends: Vec<usize>,
    /// Index in `ends` of each row's first piece.
    firsts: Vec<usize>,
}

impl Rendered {
    pub(super) fn new(rows: &[(&Row, Write)]) -> Self {
        let mut rendered = Rendered {
            text: String::with_capacity(rows.len() * 96),
            ends: Vec::with_capacity(rows.len() * 4),
            firsts: Vec::with_capacity(rows.len()),
        };
        for (row, _) in rows {
            rendered.firsts.push(rendered.ends.len());
            for value in &row.values {
                if matches!(Bind::of(value), Bind::Rendered) {
                    value.write_canonical(&mut rendered.text);
                    rendered.ends.push(rendered.text.len());
                }
            }
            rendered.text.push_str(row.row_hash.hex().as_str());
            rendered.ends.push(rendered.text.len());
            if let Some(raw_hash) = row.raw_hash {
                rendered.text.push_str(raw_hash.hex().as_str());
                rendered.ends.push(rendered.text.len());
            }
        }
        rendered
    }

    /// The pieces of row number `row`, in order.
    fn row(&self, row: usize) -> Pieces<'_> {
        Pieces {
            rendered: self,
            next: self.firsts[row],
        }
    }
}

/// A cursor over one row's rendered pieces.
struct Pieces<'r> {
    rendered: &'r Rendered,
    next: usize,
}

impl<'r> Pieces<'r> {
    fn next(&mut self) -> &'r str {
        let ends = &self.rendered.ends;
        let start = if self.next == 0 {
            0
        } else {
            ends[self.next - 1]
        };
        let end = ends[self.next];
        self.next += 1;
        &self.rendered.text[start..end]
    }
}

/// Finds the period start of another run key that holds a row's key: the
/// row was not written because that period is later (or starts at the
/// same instant). Prepared only when a batch meets such a row.
struct Holder<'c> {
    conn: &'c Connection,
    sql: String,
    key: Vec<usize>,
}

impl<'c> Holder<'c> {
    fn new(conn: &'c Connection, schema: &TableSchema) -> Self {
        let key: Vec<String> = schema
            .key
            .iter()
            .enumerate()
            .map(|(n, &i)| format!("{} = ?{}", quote(&schema.columns[i].0), n + 1))
            .collect();
        let n = schema.key.len();
        let sql = format!(
            "SELECT _tm_period_start FROM {} WHERE {} \
             AND NOT (_tm_source = ?{} AND _tm_export_type = ?{} AND _tm_period_start = ?{})",
            quote(&schema.table),
            key.join(" AND "),
            n + 1,
            n + 2,
            n + 3
        );
        Holder {
            conn,
            sql,
            key: schema.key.clone(),
        }
    }

    fn period_of(&self, row: &Row, lineage: &Lineage) -> Result<Option<String>, Error> {
        let mut params: Vec<rusqlite::types::Value> = self
            .key
            .iter()
            .map(|&i| stored_value(&row.values[i]))
            .collect();
        params.extend(
            [&lineage.source, &lineage.export_type, &lineage.period_start]
                .map(|text| rusqlite::types::Value::Text(text.clone())),
        );
        let mut statement = self.conn.prepare_cached(&self.sql).db()?;
        let mut rows = statement.query(rusqlite::params_from_iter(params)).db()?;
        match rows.next().db()? {
            Some(found) => Ok(Some(found.get::<_, String>(0).db()?)),
            None => Ok(None),
        }
    }
}

/// A value as the table stores it (see [`Bind`]), owned.
fn stored_value(value: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as Stored;
    match Bind::of(value) {
        Bind::Null => Stored::Null,
        Bind::Text(s) => Stored::Text(s.to_string()),
        Bind::Int(n) => Stored::Integer(n),
        Bind::Float(f) => Stored::Real(f),
        Bind::Rendered => Stored::Text(value.canonical_text().unwrap_or_default()),
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
/// instead, only if something differs and the ownership rule lets this run
/// key take the row ([`may_take`]). A row left to a later period is counted
/// as superseded.
pub(super) fn write_rows<'d>(
    conn: &Connection,
    schema: &'d TableSchema,
    stamp: &'d Stamp<'d>,
    rows: &'d [(&'d Row, Write)],
    rendered: &'d Rendered,
) -> Result<WriteCounts, Error> {
    let mut insert = RowStatement::prepare(conn, &insert_sql(schema), schema, stamp)?;
    let mut update = OnDemand::new(conn, update_sql(schema, false), schema, stamp);
    let mut update_if_different = OnDemand::new(conn, update_sql(schema, true), schema, stamp);
    let holder = Holder::new(conn, schema);
    let mut written = WriteCounts::default();
    for (n, (row, write)) in rows.iter().enumerate() {
        if *write == Write::Update && update.get()?.execute(row, &mut rendered.row(n)).db()? == 1 {
            written.updated += 1;
            continue;
        }
        match insert.execute(row, &mut rendered.row(n)) {
            Ok(_) => written.inserted += 1,
            Err(e) if is_unique_violation(&e) => {
                if update_if_different
                    .get()?
                    .execute(row, &mut rendered.row(n))
                    .db()?
                    == 1
                {
                    written.updated += 1;
                } else if let Some(period) = holder.period_of(row, stamp.lineage)? {
                    tracing::debug!(key = %row.key_text(&schema.key), held_by = %period, "row left as it is: a later period holds its key");
                    written.superseded += 1;
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
    mut each: impl FnMut(StoredRow) -> Result<(), Error>,
) -> Result<(), Error> {
    scan(conn, schema, lineage, run_id, |key, row| {
        match row.row_hash {
            Some(row_hash) => each(StoredRow {
                key,
                row_hash,
                raw_hash: row.raw_hash,
                written_by_run: row.written_by_run,
            }),
            None => Ok(()),
        }
    })
}

/// Whether the run key has any live row (one step on the run-key index).
pub(super) fn holds_live_rows(
    conn: &Connection,
    schema: &TableSchema,
    lineage: &Lineage,
) -> Result<bool, Error> {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {} WHERE {})",
        quote(&schema.table),
        live_rows_of_run_key(schema)
    );
    conn.prepare_cached(&sql)
        .db()?
        .query_row(
            (&lineage.source, &lineage.export_type, &lineage.period_start),
            |row| row.get(0),
        )
        .db()
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
        Ok(())
    })?;
    Ok((live, vanished))
}

/// What a live row holds besides its natural key.
struct LiveRow {
    /// `None` for a row hash that is not one of ours (the row is then
    /// rewritten, never skipped).
    row_hash: Option<Hash128>,
    /// `None` when the row has no raw-record hash.
    raw_hash: Option<Hash128>,
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
    mut each: impl FnMut(Hash128, LiveRow) -> Result<(), Error>,
) -> Result<(), Error> {
    let sql = format!(
        "SELECT {}, _tm_row_hash, _tm_run_id = ?, rowid, {RAW_HASH} FROM {} WHERE {}",
        key_list(schema),
        quote(&schema.table),
        live_rows_of_run_key(schema)
    );
    let mut statement = conn.prepare_cached(&sql).db()?;
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
            ValueRef::Text(hex) => Hash128::from_hex_bytes(hex),
            _ => None,
        };
        let raw_hash = match row.get_ref(hash_column + 3).db()? {
            ValueRef::Text(hex) => Hash128::from_hex_bytes(hex).filter(|h| h.0 != 0),
            _ => None,
        };
        let live = LiveRow {
            row_hash,
            raw_hash,
            written_by_run: row.get::<_, Option<i64>>(hash_column + 1).db()? == Some(1),
            rowid: row.get(hash_column + 2).db()?,
        };
        each(key_hash_of(schema, row)?, live)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::quote;
    use std::str::FromStr;

    fn schema() -> TableSchema {
        TableSchema::for_test(
            "items",
            &[
                ("id", FieldType::Text),
                ("amount", FieldType::Decimal),
                ("n", FieldType::Int),
                ("at", FieldType::Timestamptz),
                ("doc", FieldType::Json),
            ],
        )
    }

    fn table(schema: &TableSchema) -> Connection {
        let conn = Connection::open_in_memory().expect("in-memory database");
        let mut columns: Vec<String> = schema.columns.iter().map(|(n, _)| quote(n)).collect();
        columns.extend(LINEAGE_COLUMNS.iter().map(ToString::to_string));
        columns.push(RAW_HASH.to_string());
        conn.execute_batch(&format!(
            "CREATE TABLE items ({}, UNIQUE (id))",
            columns.join(", ")
        ))
        .expect("table");
        conn
    }

    fn lineage() -> Lineage {
        Lineage {
            pipeline: "p".into(),
            source: "s".into(),
            export_type: "e".into(),
            period_start: "2024-01-01T00:00:00Z".into(),
            period_end: "2024-01-02T00:00:00Z".into(),
        }
    }

    /// Decimals, times and JSON are stored as their canonical texts, and
    /// the hash as 32 hex digits; native values and NULLs as themselves.
    /// Every text is bound in place, so this also checks that each row
    /// gets its own pieces.
    #[test]
    fn rows_are_stored_with_their_canonical_texts() {
        let schema = schema();
        let shape = schema.shape();
        let time = chrono::DateTime::parse_from_rfc3339("2024-01-02T03:04:05.5+01:00")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let first = Row::new(
            &shape,
            &schema.key,
            vec![
                Value::Text("A-1".into()),
                Value::Decimal(rust_decimal::Decimal::from_str("10.50").unwrap()),
                Value::Int(7),
                Value::Timestamptz(time),
                Value::Null,
            ],
        );
        let second = Row::new(
            &shape,
            &schema.key,
            vec![
                Value::Text("A-2".into()),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Json(serde_json::json!({"b": 1, "a": [true]})),
            ],
        );
        let rows = [(&first, Write::Upsert), (&second, Write::Upsert)];
        let conn = table(&schema);
        let lineage = lineage();
        let stamp = Stamp {
            lineage: &lineage,
            run_id: "run",
            loaded_at: "2024-01-03T00:00:00Z",
        };
        let rendered = Rendered::new(&rows);
        let written = write_rows(&conn, &schema, &stamp, &rows, &rendered).expect("written");
        assert_eq!(written.inserted, 2);

        let stored = |id: &str| -> Vec<String> {
            conn.query_row(
                "SELECT quote(amount), quote(n), quote(at), quote(doc), _tm_row_hash FROM items WHERE id = ?",
                [id],
                |r| (0..5).map(|i| r.get::<_, String>(i)).collect(),
            )
            .expect("row")
        };
        assert_eq!(
            stored("A-1"),
            vec![
                "'10.5'".to_string(),
                "7".into(),
                "'2024-01-02T02:04:05.500Z'".into(),
                "NULL".into(),
                first.row_hash.to_hex(),
            ]
        );
        assert_eq!(
            stored("A-2"),
            vec![
                "NULL".to_string(),
                "NULL".into(),
                "NULL".into(),
                r#"'{"a":[true],"b":1}'"#.into(),
                second.row_hash.to_hex(),
            ]
        );

        // The same rows again: each insert hits the key and the row is then
        // bound a second time, for the update that finds nothing changed.
        let again = write_rows(&conn, &schema, &stamp, &rows, &rendered).expect("written");
        assert_eq!((again.inserted, again.updated, again.unchanged), (0, 0, 2));
    }
}
