//! A prepared statement that binds text without SQLite copying it.
//!
//! rusqlite binds every text with `SQLITE_TRANSIENT`, so SQLite frees the
//! previous value, allocates, and copies the new one for every parameter of
//! every row. The write path rebinds six texts per row inside the write
//! lock, where the other periods wait. Binding them with `SQLITE_STATIC`
//! (SQLite reads the caller's bytes in place while the statement runs) cut
//! a first backfill's instructions by 4.3% (callgrind, 100,000 rows; ADR
//! 0003).
//!
//! `SQLITE_STATIC` is only sound while the bound bytes outlive every step
//! that reads them. [`BorrowingStatement`] carries the lifetime `'d` of the
//! data it may bind, so the borrow checker keeps every bound text alive for
//! as long as the statement exists.

use std::ffi::{c_char, c_int, CStr};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use rusqlite::{ffi, Connection};

/// A statement prepared on a borrowed connection `'c` that binds texts
/// borrowed for `'d` in place. Parameters keep their bindings across
/// [`BorrowingStatement::execute`], as with `sqlite3_reset`.
pub(crate) struct BorrowingStatement<'c, 'd> {
    stmt: NonNull<ffi::sqlite3_stmt>,
    db: *mut ffi::sqlite3,
    _conn: PhantomData<&'c Connection>,
    _data: PhantomData<&'d str>,
}

impl<'c, 'd> BorrowingStatement<'c, 'd> {
    /// Prepares `sql` (one statement) on `conn`.
    pub(crate) fn prepare(conn: &'c Connection, sql: &str) -> rusqlite::Result<Self> {
        let len = text_len(sql)?;
        // SAFETY: `conn` is open for `'c`, which the statement cannot
        // outlive; `sql` is valid for `len` bytes during the call.
        let db = unsafe { conn.handle() };
        let mut stmt = ptr::null_mut();
        let code = unsafe {
            ffi::sqlite3_prepare_v2(
                db,
                sql.as_ptr().cast::<c_char>(),
                len,
                &mut stmt,
                ptr::null_mut(),
            )
        };
        if code != ffi::SQLITE_OK {
            // SAFETY: `db` is open; a failed prepare leaves `stmt` null.
            return Err(unsafe { error(db) });
        }
        let stmt = NonNull::new(stmt).ok_or_else(|| {
            rusqlite::Error::SqliteFailure(
                ffi::Error::new(ffi::SQLITE_MISUSE),
                Some("empty statement".to_string()),
            )
        })?;
        Ok(BorrowingStatement {
            stmt,
            db,
            _conn: PhantomData,
            _data: PhantomData,
        })
    }

    /// Binds `text` to parameter `index` (1-based) without a copy.
    pub(crate) fn bind_text(&mut self, index: usize, text: &'d str) -> rusqlite::Result<()> {
        let len = text_len(text)?;
        // SAFETY: `text` lives for `'d`, which outlives `self`, so SQLite
        // never reads it after it is freed; the statement is valid.
        let code = unsafe {
            ffi::sqlite3_bind_text(
                self.stmt.as_ptr(),
                param(index)?,
                text.as_ptr().cast::<c_char>(),
                len,
                ffi::SQLITE_STATIC(),
            )
        };
        self.check(code)
    }

    pub(crate) fn bind_int(&mut self, index: usize, value: i64) -> rusqlite::Result<()> {
        // SAFETY: the statement is valid.
        let code = unsafe { ffi::sqlite3_bind_int64(self.stmt.as_ptr(), param(index)?, value) };
        self.check(code)
    }

    pub(crate) fn bind_float(&mut self, index: usize, value: f64) -> rusqlite::Result<()> {
        // SAFETY: the statement is valid.
        let code = unsafe { ffi::sqlite3_bind_double(self.stmt.as_ptr(), param(index)?, value) };
        self.check(code)
    }

    pub(crate) fn bind_null(&mut self, index: usize) -> rusqlite::Result<()> {
        // SAFETY: the statement is valid.
        let code = unsafe { ffi::sqlite3_bind_null(self.stmt.as_ptr(), param(index)?) };
        self.check(code)
    }

    /// Runs the statement to completion and resets it, keeping its
    /// bindings: the number of rows it changed. A statement that returns
    /// rows is an error, as in rusqlite's `execute`.
    pub(crate) fn execute(&mut self) -> rusqlite::Result<usize> {
        // SAFETY: the statement is valid and every bound text outlives it.
        let code = unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) };
        let result = match code {
            ffi::SQLITE_DONE => {
                // SAFETY: `db` is open for `'c`.
                let changes = unsafe { ffi::sqlite3_changes(self.db) };
                Ok(usize::try_from(changes).unwrap_or_default())
            }
            ffi::SQLITE_ROW => Err(rusqlite::Error::ExecuteReturnedResults),
            // SAFETY: read before the reset, which would clear the message.
            _ => Err(unsafe { error(self.db) }),
        };
        // SAFETY: the statement is valid. The reset repeats a failed step's
        // code, which `result` already holds.
        unsafe { ffi::sqlite3_reset(self.stmt.as_ptr()) };
        result
    }

    fn check(&self, code: c_int) -> rusqlite::Result<()> {
        if code == ffi::SQLITE_OK {
            Ok(())
        } else {
            // SAFETY: `db` is open for `'c`.
            Err(unsafe { error(self.db) })
        }
    }
}

impl Drop for BorrowingStatement<'_, '_> {
    fn drop(&mut self) {
        // SAFETY: the statement was prepared by `prepare` and is finalized
        // exactly once, here.
        unsafe { ffi::sqlite3_finalize(self.stmt.as_ptr()) };
    }
}

/// The connection's last error, with its extended code (so a UNIQUE
/// violation reads as `SQLITE_CONSTRAINT_UNIQUE`) and message.
///
/// # Safety
/// `db` must be an open connection.
unsafe fn error(db: *mut ffi::sqlite3) -> rusqlite::Error {
    let code = ffi::sqlite3_extended_errcode(db);
    let message = CStr::from_ptr(ffi::sqlite3_errmsg(db))
        .to_string_lossy()
        .into_owned();
    rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some(message))
}

fn text_len(text: &str) -> rusqlite::Result<c_int> {
    c_int::try_from(text.len())
        .map_err(|_| rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_TOOBIG), None))
}

fn param(index: usize) -> rusqlite::Result<c_int> {
    c_int::try_from(index).map_err(|_| rusqlite::Error::InvalidParameterCount(index, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Connection {
        let conn = Connection::open_in_memory().expect("in-memory database");
        conn.execute_batch("CREATE TABLE t (k TEXT UNIQUE, n INTEGER, f REAL, z TEXT)")
            .expect("table");
        conn
    }

    /// Rows bound in place, one after another through one statement, end
    /// up with their own values; a binding kept across rows is reused.
    #[test]
    fn each_row_gets_its_own_bound_values() {
        let conn = table();
        let keys: Vec<String> = (0..3).map(|i| format!("key-{i}")).collect();
        let kept = "kept".to_string();
        {
            let mut insert =
                BorrowingStatement::prepare(&conn, "INSERT INTO t VALUES (?1, ?2, ?3, ?4)")
                    .expect("prepare");
            insert.bind_text(4, &kept).expect("bind once");
            for (i, key) in (0i64..).zip(&keys) {
                insert.bind_text(1, key).expect("bind");
                insert.bind_int(2, i).expect("bind");
                if i == 1 {
                    insert.bind_null(3).expect("bind");
                } else {
                    insert.bind_float(3, i as f64 / 2.0).expect("bind");
                }
                assert_eq!(insert.execute().expect("insert"), 1);
            }
        }
        let mut rows = conn
            .prepare("SELECT k, n, f, z FROM t ORDER BY n")
            .expect("select");
        let got: Vec<(String, i64, Option<f64>, String)> = rows
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(
            got,
            vec![
                ("key-0".into(), 0, Some(0.0), "kept".into()),
                ("key-1".into(), 1, None, "kept".into()),
                ("key-2".into(), 2, Some(1.0), "kept".into()),
            ]
        );
    }

    /// A UNIQUE violation carries its extended code and message, and the
    /// statement stays usable after it.
    #[test]
    fn a_failed_step_reports_the_extended_code_and_resets() {
        let conn = table();
        let mut insert =
            BorrowingStatement::prepare(&conn, "INSERT INTO t (k) VALUES (?1)").expect("prepare");
        insert.bind_text(1, "a").expect("bind");
        assert_eq!(insert.execute().expect("first insert"), 1);
        let err = insert.execute().expect_err("duplicate key");
        match &err {
            rusqlite::Error::SqliteFailure(e, Some(message)) => {
                assert_eq!(e.extended_code, ffi::SQLITE_CONSTRAINT_UNIQUE);
                assert!(message.contains("UNIQUE"), "{message}");
            }
            other => panic!("unexpected error {other:?}"),
        }
        insert.bind_text(1, "b").expect("bind");
        assert_eq!(insert.execute().expect("insert after the error"), 1);
    }

    #[test]
    fn bad_sql_is_an_error_not_a_panic() {
        let conn = table();
        assert!(BorrowingStatement::prepare(&conn, "INSERT INTO nowhere VALUES (1)").is_err());
        assert!(BorrowingStatement::prepare(&conn, "   ").is_err());
    }
}
