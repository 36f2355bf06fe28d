//! Maps driver errors to tidemark's taxonomy, once, where they arise.

use tidemark_core::Error;

/// Classifies a sqlx error: connection-level trouble, pool time-outs, busy
/// or locked SQLite databases, PostgreSQL serialization failures, deadlocks
/// and administrator shutdowns are transient; constraint and type errors
/// are permanent.
pub(crate) fn db_error(err: sqlx::Error) -> Error {
    if is_connection_lost(&err) {
        crate::postgres::connection_lost();
    }
    if is_storage_failure(&err) {
        return Error::Storage {
            message: err.to_string(),
        };
    }
    if is_connection_limit(&err) {
        return Error::Database {
            message: connection_limit_message(&err),
            transient: true,
        };
    }
    if matches!(err, sqlx::Error::PoolTimedOut) {
        return Error::Database {
            message: format!(
                "{err}: every connection of this process's pool stayed busy, or the server had no \
                 free connection slot, for {}s (retried)",
                crate::ACQUIRE_TIMEOUT_SECS
            ),
            transient: true,
        };
    }
    let transient = is_transient(&err);
    Error::Database {
        message: err.to_string(),
        transient,
    }
}

/// Whether a sqlx error is worth a retry (see [`db_error`]).
pub(crate) fn is_transient(err: &sqlx::Error) -> bool {
    match err {
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
            }) || is_connection_limit(err)
        }
        _ => false,
    }
}

/// Whether the database says it cannot store anything more: disk full,
/// an I/O or storage error, a corrupt or read-only database.
pub(crate) fn is_storage_failure(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let Some(code) = db.code() else {
        return false;
    };
    if db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        storage_sqlstate(&code)
    } else {
        sqlite_primary_code(&code).is_some_and(storage_sqlite_code)
    }
}

/// SQLite's SQLITE_READONLY (8), SQLITE_IOERR (10), SQLITE_CORRUPT (11),
/// SQLITE_FULL (13) and SQLITE_NOTADB (26).
fn storage_sqlite_code(primary: i64) -> bool {
    matches!(primary, 8 | 10 | 11 | 13 | 26)
}

/// PostgreSQL's disk_full, out_of_memory, io_error, data_corrupted and
/// index_corrupted. (too_many_connections, also class 53, is transient.)
fn storage_sqlstate(code: &str) -> bool {
    matches!(code, "53100" | "53200" | "58030" | "XX001" | "XX002")
}

/// Whether PostgreSQL (or a pooler in front of it) refused a connection
/// because every slot is taken: SQLSTATE 53300 `too_many_connections`
/// ("sorry, too many clients already", "remaining connection slots are
/// reserved for …", "too many connections for role/database"), or
/// PgBouncer's own limits ("no more connections allowed (max_client_conn)",
/// sent as 08P01). Transient: a slot frees when another client ends.
pub(crate) fn is_connection_limit(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() else {
        return false;
    };
    connection_limit_sqlstate(pg.code(), pg.message())
}

/// [`is_connection_limit`] on a SQLSTATE and the server's message.
fn connection_limit_sqlstate(code: &str, message: &str) -> bool {
    code == "53300" || (code == "08P01" && message.contains("no more connections allowed"))
}

/// What an operator reads when the server is out of connection slots: the
/// cause, that it is retried, and what to change.
pub(crate) fn connection_limit_message(err: &sqlx::Error) -> String {
    format!(
        "the PostgreSQL server has no free connection slot ({err}): its max_connections \
         (or the role's, the database's or PgBouncer's limit) is exhausted by all its clients \
         together; retrying with back-off. Raise max_connections, run fewer tidemark processes \
         or fewer --workers/--concurrency (each process opens at most 2 per key at once + 2-4, \
         README \"Connections\"), or put PgBouncer in front (--pgbouncer)"
    )
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

/// PostgreSQL SQLSTATEs worth a retry: the session ended (see
/// [`session_ended_sqlstate`]), serialization failure, deadlock, too many
/// connections, lock not available.
fn transient_sqlstate(code: &str) -> bool {
    session_ended_sqlstate(code) || matches!(code, "40001" | "40P01" | "53300" | "55P03")
}

/// PostgreSQL SQLSTATEs that say the session is gone: connection
/// exceptions (08…), administrator or crash shutdown, cannot connect now.
fn session_ended_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
}

/// Whether `err` says its connection is gone: the socket failed, or the
/// server ended the session.
fn is_connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| session_ended_sqlstate(&code)),
        _ => false,
    }
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
    if let rusqlite::Error::SqliteFailure(failure, _) = &err {
        if storage_sqlite_code(i64::from(failure.extended_code & 0xff)) {
            return Error::Storage {
                message: err.to_string(),
            };
        }
    }
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
        assert!(storage_sqlite_code(13) && storage_sqlite_code(10) && !storage_sqlite_code(5));
        assert!(storage_sqlstate("53100") && !storage_sqlstate("53300"));
        assert!(!db_error(sqlx::Error::RowNotFound).is_transient());
    }

    /// A server out of connection slots (PostgreSQL's 53300 in all its
    /// wordings, PgBouncer's client limit) is transient, never storage,
    /// and not any other protocol error or class-53 failure.
    #[test]
    fn connection_limits_are_transient() {
        assert!(connection_limit_sqlstate(
            "53300",
            "sorry, too many clients already"
        ));
        assert!(connection_limit_sqlstate(
            "53300",
            "remaining connection slots are reserved for non-replication superuser connections"
        ));
        assert!(connection_limit_sqlstate(
            "53300",
            "too many connections for role \"etl\""
        ));
        assert!(connection_limit_sqlstate(
            "08P01",
            "no more connections allowed (max_client_conn)"
        ));
        assert!(!connection_limit_sqlstate(
            "08P01",
            "invalid message format"
        ));
        assert!(!connection_limit_sqlstate("53100", "could not extend file"));
        assert!(!connection_limit_sqlstate(
            "53400",
            "configuration limit exceeded"
        ));
        assert!(transient_sqlstate("53300"));
        assert!(!storage_sqlstate("53300"));
        assert!(!is_connection_limit(&sqlx::Error::PoolTimedOut));
    }
}
