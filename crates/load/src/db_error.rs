//! Maps driver errors to tidemark's taxonomy, once, where they arise.

use tidemark_core::Error;

/// Classifies a sqlx error: connection-level trouble, pool time-outs, busy
/// or locked SQLite databases, PostgreSQL serialization failures, deadlocks
/// and administrator shutdowns are transient; constraint and type errors
/// are permanent.
pub(crate) fn db_error(err: sqlx::Error) -> Error {
    let transient = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let postgres = db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some();
            db.code().is_some_and(|code| {
                if postgres {
                    transient_sqlstate(&code)
                } else {
                    transient_sqlite_code(&code)
                }
            })
        }
        _ => false,
    };
    Error::Database {
        message: err.to_string(),
        transient,
    }
}

/// Whether SQLite answered `SQLITE_BUSY` (any extended code of it).
pub(crate) fn is_sqlite_busy(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
            && db.code().and_then(|c| sqlite_primary_code(&c)) == Some(5))
}

/// SQLite result codes worth a retry: SQLITE_BUSY (5) and SQLITE_LOCKED (6).
fn transient_sqlite_code(code: &str) -> bool {
    matches!(sqlite_primary_code(code), Some(5 | 6))
}

/// The primary result code of a SQLite (extended) code: its low byte.
fn sqlite_primary_code(code: &str) -> Option<i64> {
    code.parse::<i64>().ok().map(|n| n & 0xff)
}

/// PostgreSQL SQLSTATEs worth a retry: connection exceptions (08…),
/// serialization failure, deadlock, administrator/crash shutdown, cannot
/// connect now, too many connections, lock not available.
fn transient_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "53300" | "55P03"
        )
}

/// Shorthand for `.map_err(db_error)`.
pub(crate) trait DbResultExt<T> {
    fn db(self) -> Result<T, Error>;
}

impl<T> DbResultExt<T> for Result<T, sqlx::Error> {
    fn db(self) -> Result<T, Error> {
        self.map_err(db_error)
    }
}

/// Classifies an error of the raw SQLite connection the bulk paths use:
/// busy and locked databases are transient, everything else permanent.
pub(crate) fn raw_sqlite_error(err: rusqlite::Error) -> Error {
    let transient = matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    Error::Database {
        message: err.to_string(),
        transient,
    }
}

impl<T> DbResultExt<T> for Result<T, rusqlite::Error> {
    fn db(self) -> Result<T, Error> {
        self.map_err(raw_sqlite_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_serialization_and_connection_errors_are_transient() {
        assert!(transient_sqlite_code("5"));
        assert!(transient_sqlite_code("517")); // SQLITE_BUSY_SNAPSHOT
        assert!(!transient_sqlite_code("2067")); // SQLITE_CONSTRAINT_UNIQUE
        assert!(transient_sqlstate("40001"));
        assert!(transient_sqlstate("08006"));
        assert!(transient_sqlstate("57P01"));
        assert!(!transient_sqlstate("23505")); // unique violation
        assert!(!transient_sqlstate("42P01"));
        assert!(db_error(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!db_error(sqlx::Error::RowNotFound).is_transient());
    }
}
