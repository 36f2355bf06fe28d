//! Ledger statements on a transaction's held raw handle
//! ([`super::ffi::HeldConnection`]): the same SQL and the same neutral
//! arguments and rows as through sqlx, without a round trip to sqlx's
//! worker thread per statement.
//!
//! Parameters are bound the way sqlx binds them on SQLite: `$N` and `?N`
//! name argument `N`, a bare `?` the next one, and a parameter past the
//! last argument stays NULL.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{CachedStatement, Connection, ErrorCode};
use tidemark_core::Error;

use super::BUSY_TIMEOUT;
use crate::db_error::DbResultExt;
use crate::ledger::driver::{Arg, Cell, Record};

/// Begins a transaction (`begin` is `BEGIN` or `BEGIN IMMEDIATE`) without
/// waiting: `false` when another connection holds the write lock, so the
/// caller waits for it elsewhere (on sqlx's worker thread, never on the
/// runtime's).
pub(super) fn try_begin(conn: &Connection, begin: &str) -> Result<bool, Error> {
    conn.busy_timeout(Duration::ZERO).db()?;
    let begun = conn.execute_batch(begin);
    conn.busy_timeout(BUSY_TIMEOUT).db()?;
    match begun {
        Ok(()) => Ok(true),
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => Ok(false),
        Err(e) => Err(e).db(),
    }
}

/// Runs a statement; the number of rows it changed.
pub(super) fn execute(conn: &Connection, sql: &str, args: &[Arg<'_>]) -> Result<u64, Error> {
    let mut stmt = prepared(conn, sql, args)?;
    let mut rows = stmt.raw_query();
    while rows.next().db()?.is_some() {}
    Ok(conn.changes())
}

/// Runs a query and hands each row to `each`.
pub(super) fn fetch_each(
    conn: &Connection,
    sql: &str,
    args: &[Arg<'_>],
    mut each: impl FnMut(Record) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut stmt = prepared(conn, sql, args)?;
    let names: Arc<[String]> = stmt.column_names().into_iter().map(String::from).collect();
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next().db()? {
        let cells = (0..names.len())
            .map(|i| row.get_ref(i).db().and_then(cell))
            .collect::<Result<_, _>>()?;
        each(Record::new(Arc::clone(&names), cells))?;
    }
    Ok(())
}

/// `sql` prepared (from the connection's cache, for the rest of the
/// transaction) with `args` bound.
fn prepared<'c>(
    conn: &'c Connection,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<CachedStatement<'c>, Error> {
    let mut stmt = conn.prepare_cached(sql).db()?;
    stmt.clear_bindings();
    let mut next = 0;
    for param in 1..=stmt.parameter_count() {
        let named = stmt
            .parameter_name(param)
            .map(|name| name.trim_start_matches(['$', '?']).parse::<usize>());
        let n = match named {
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                return Err(Error::Database {
                    message: format!(
                        "ledger statement has a parameter that is not numbered: {sql}"
                    ),
                    transient: false,
                })
            }
            None => {
                next += 1;
                next
            }
        };
        let Some(arg) = n.checked_sub(1).and_then(|i| args.get(i)) else {
            continue;
        };
        bind(&mut stmt, param, arg)?;
    }
    Ok(stmt)
}

/// Binds one argument: JSON as its text (the columns are TEXT).
fn bind(stmt: &mut CachedStatement<'_>, param: usize, arg: &Arg<'_>) -> Result<(), Error> {
    match *arg {
        Arg::Int(n) => stmt.raw_bind_parameter(param, n),
        Arg::OptInt(n) => stmt.raw_bind_parameter(param, n),
        Arg::Float(f) => stmt.raw_bind_parameter(param, f),
        Arg::Bool(b) => stmt.raw_bind_parameter(param, b),
        Arg::Text(s) => stmt.raw_bind_parameter(param, s),
        Arg::OptText(s) => stmt.raw_bind_parameter(param, s),
        Arg::Bytes(b) => stmt.raw_bind_parameter(param, b),
        Arg::Json(v) => stmt.raw_bind_parameter(param, v.map(serde_json::Value::to_string)),
    }
    .db()
}

/// Reads a cell by the type of the value stored in it: SQLite's columns
/// are typed by value, not by declaration.
fn cell(value: ValueRef<'_>) -> Result<Cell, Error> {
    Ok(match value {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(n) => Cell::Int(n),
        ValueRef::Real(f) => Cell::Float(f),
        ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
        ValueRef::Text(t) => {
            Cell::Text(String::from_utf8(t.to_vec()).map_err(|e| Error::Database {
                message: format!("ledger text is not UTF-8: {e}"),
                transient: false,
            })?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(conn: &Connection, sql: &str, args: &[Arg<'_>]) -> Vec<Vec<Cell>> {
        let mut out = Vec::new();
        fetch_each(conn, sql, args, |row| {
            let cells = ["a", "b", "c"]
                .iter()
                .map(|name| {
                    row.opt_int(name)
                        .map(|n| n.map_or(Cell::Null, Cell::Int))
                        .or_else(|_| row.text(name).map(Cell::Text))
                        .unwrap_or_else(|e| panic!("{name}: {e}"))
                })
                .collect();
            out.push(cells);
            Ok(())
        })
        .expect("query");
        out
    }

    /// `$N` names argument N wherever it appears, as sqlx binds it; a
    /// parameter past the last argument is NULL.
    #[test]
    fn numbered_parameters_bind_by_number_not_by_position() {
        let conn = Connection::open_in_memory().expect("database");
        let got = rows(
            &conn,
            "SELECT $2 AS a, $1 AS b, $3 AS c",
            &[Arg::Int(1), Arg::Text("two")],
        );
        assert_eq!(
            got,
            vec![vec![Cell::Text("two".into()), Cell::Int(1), Cell::Null]]
        );
        // The cached statement is reused with fresh bindings.
        let got = rows(&conn, "SELECT $2 AS a, $1 AS b, $3 AS c", &[Arg::Int(5)]);
        assert_eq!(got, vec![vec![Cell::Null, Cell::Int(5), Cell::Null]]);
    }

    /// Changed rows are counted; a busy-free `BEGIN` begins.
    #[test]
    fn execute_counts_changes_inside_a_begun_transaction() {
        let conn = Connection::open_in_memory().expect("database");
        conn.execute_batch("CREATE TABLE t (n INTEGER)")
            .expect("table");
        assert!(try_begin(&conn, "BEGIN IMMEDIATE").expect("begin"));
        let inserted = execute(
            &conn,
            "INSERT INTO t SELECT $1 UNION ALL SELECT $1 + 1",
            &[Arg::Int(7)],
        )
        .expect("insert");
        assert_eq!(inserted, 2);
        execute(&conn, "COMMIT", &[]).expect("commit");
        assert_eq!(
            execute(&conn, "DELETE FROM t WHERE n > $1", &[Arg::Int(0)]).expect("delete"),
            2
        );
    }

    /// A second connection that finds the write lock taken is told so at
    /// once instead of waiting out the busy timeout.
    #[test]
    fn a_held_write_lock_is_reported_not_waited_for() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.db");
        let first = Connection::open(&path).expect("first");
        first
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (n INTEGER)")
            .expect("setup");
        let second = Connection::open(&path).expect("second");
        assert!(try_begin(&first, "BEGIN IMMEDIATE").expect("begin"));
        let started = std::time::Instant::now();
        assert!(!try_begin(&second, "BEGIN IMMEDIATE").expect("busy is no error"));
        assert!(started.elapsed() < Duration::from_secs(5));
        execute(&first, "COMMIT", &[]).expect("commit");
        assert!(try_begin(&second, "BEGIN IMMEDIATE").expect("free again"));
    }
}
