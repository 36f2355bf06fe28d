//! The error taxonomy shared by every stage.
//!
//! Whether an error is worth retrying is decided where it arises (the HTTP
//! client, the database driver, the parser) and carried as data, never
//! recovered later by matching on message text. The runner only asks
//! [`Error::is_transient`] and [`Error::class`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The class of a failure, as recorded in the ledger's `error_class` column
/// and shown by `tidemark status`.
///
/// Only failures have a class: the ledger's column also records an
/// interruption (`interrupted`), which is no failure and so no variant here
/// (the load stage's `StoredClass` covers both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// A value that does not fit its field (bad number, missing required field).
    Validation,
    /// Input that cannot be decoded at all (malformed CSV/JSON).
    Parse,
    /// The destination disagrees with the pipeline (column types, key).
    Contract,
    /// A safety rail refused the work (delete guard, duplicate keys, too many rejects).
    Invariant,
    /// The pipeline file, the command line or the worker's environment
    /// (an unusable `TMPDIR`) is wrong.
    Config,
    /// The source could not be read (missing file, HTTP failure).
    Source,
    /// The database failed.
    Database,
    /// The source returned another number of records than it declared
    /// (`expect_count`): the period is not complete, so it is not done.
    Incomplete,
}

impl ErrorClass {
    /// Every class.
    pub const ALL: [ErrorClass; 8] = [
        ErrorClass::Validation,
        ErrorClass::Parse,
        ErrorClass::Contract,
        ErrorClass::Invariant,
        ErrorClass::Config,
        ErrorClass::Source,
        ErrorClass::Database,
        ErrorClass::Incomplete,
    ];

    /// The snake_case name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Validation => "validation",
            ErrorClass::Parse => "parse",
            ErrorClass::Contract => "contract",
            ErrorClass::Invariant => "invariant",
            ErrorClass::Config => "config",
            ErrorClass::Source => "source",
            ErrorClass::Database => "database",
            ErrorClass::Incomplete => "incomplete",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`ErrorClass`] (read from a ledger a newer tidemark
/// wrote, or edited by hand).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error class {0:?}")]
pub struct UnknownErrorClass(pub String);

impl std::str::FromStr for ErrorClass {
    type Err = UnknownErrorClass;

    /// The class named as the ledger stores it ([`ErrorClass::as_str`]).
    fn from_str(name: &str) -> Result<Self, UnknownErrorClass> {
        ErrorClass::ALL
            .into_iter()
            .find(|c| c.as_str() == name)
            .ok_or_else(|| UnknownErrorClass(name.to_string()))
    }
}

/// Where in a source a record came from: enough for an operator to open the
/// file (or request the URL) and find the offending row.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    /// File path or URL (with secrets already redacted).
    pub resource: String,
    /// Page number for paginated sources (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u64>,
    /// Record number within the resource or page (1-based, header excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<u64>,
    /// Line number in a text file, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
}

impl Location {
    /// A location naming only a resource (a file or URL).
    pub fn resource(resource: impl Into<String>) -> Self {
        Location {
            resource: resource.into(),
            ..Location::default()
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.resource)?;
        if let Some(page) = self.page {
            write!(f, " page {page}")?;
        }
        if let Some(record) = self.record {
            write!(f, " row {record}")?;
        }
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        Ok(())
    }
}

/// Every failure tidemark reports. Each variant knows its [`ErrorClass`]
/// and whether retrying the same operation could succeed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The pipeline file or command line is wrong. Nothing was touched.
    #[error("{file}: {key}: {message}")]
    Config {
        /// The pipeline file (or `command line`).
        file: String,
        /// The offending key, dotted (`load.key`, `fields.amount.type`).
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A raw value does not fit its field.
    #[error("{location}: field `{field}`: {message}: {value:?}")]
    Validation {
        /// Where the record came from.
        location: Location,
        /// Output column name.
        field: String,
        /// The raw value as read (truncated when long).
        value: String,
        /// What is wrong with it.
        message: String,
    },
    /// The input could not be decoded.
    #[error("{location}: {message}")]
    Parse {
        /// Where decoding failed.
        location: Location,
        /// The decoder's explanation.
        message: String,
    },
    /// The destination table contradicts the pipeline.
    #[error("table `{table}`: {message}")]
    Contract {
        /// Destination table.
        table: String,
        /// The contradiction, naming the columns.
        message: String,
    },
    /// The source no longer has the shape the pipeline reads: a CSV header
    /// lacks a column that `[fields]` reads (renamed or removed upstream).
    /// A contract error: reading on would turn that column into NULL over
    /// good data.
    #[error("{location}: {message}")]
    SourceDrift {
        /// The file or (redacted) URL, and page, whose header is at fault.
        location: Location,
        /// The missing columns, the fields reading them, the header found.
        message: String,
    },
    /// The source returned another number of records than it declared
    /// (`expect_count`). Permanent: the crawl ended normally, so trying it
    /// again at once would most likely meet the same answer.
    #[error("{0}")]
    Incomplete(String),
    /// A safety rail refused the work.
    #[error("{0}")]
    Invariant(String),
    /// The delete guard refused a reconciliation (`max_delete_fraction`, an
    /// empty source): an invariant error that notices tell apart
    /// (`guard_refused`).
    #[error("{0}")]
    DeletesRefused(String),
    /// A stored checkpoint no longer fits the source (the files were
    /// regenerated, the page changed, the pagination style was edited): the
    /// attempt cannot resume from it and starts the period over instead.
    /// Not a failure of the run unless it happens without a checkpoint.
    #[error("{0}")]
    StaleCheckpoint(String),
    /// The source could not be read.
    #[error("{message}")]
    Source {
        /// What failed, with the (redacted) resource.
        message: String,
        /// True for connect/timeout/reset, HTTP 408/429/5xx, truncated bodies.
        transient: bool,
        /// A server-requested delay before the next try (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// This attempt no longer holds the run key's lease: another attempt
    /// took it over, so nothing more may be committed (fencing).
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The database failed.
    #[error("database: {message}")]
    Database {
        /// The driver's message.
        message: String,
        /// True for I/O, pool time-outs, busy/locked, serialization failures.
        transient: bool,
    },
    /// A temporary file on this machine could not be created, written or
    /// read (the spill file of a period's stored row hashes). Permanent for
    /// the attempt: the directory stays full or unwritable until someone
    /// acts; the period fails and is tried again after its back-off.
    #[error("local temporary file in {dir}: {message}")]
    TempFile {
        /// The directory the file is made in (`TMPDIR`, else `/tmp`).
        dir: String,
        /// What was being done and the operating system's cause.
        message: String,
    },
    /// The database cannot store anything more: its disk is full, its
    /// storage failed, or its file is corrupt or read-only. Nothing later
    /// can succeed until an operator acts, so a command that meets this
    /// stops claiming work instead of failing every remaining period (or
    /// waiting on locks the failed transaction held).
    #[error("database storage: {message}")]
    Storage {
        /// The driver's message, naming the cause.
        message: String,
    },
}

impl Error {
    /// The class recorded in the ledger.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Config { .. } => ErrorClass::Config,
            Error::Validation { .. } => ErrorClass::Validation,
            Error::Parse { .. } => ErrorClass::Parse,
            Error::Contract { .. } | Error::SourceDrift { .. } => ErrorClass::Contract,
            Error::Incomplete(_) => ErrorClass::Incomplete,
            Error::Invariant(_)
            | Error::DeletesRefused(_)
            | Error::StaleCheckpoint(_)
            | Error::LeaseLost(_) => ErrorClass::Invariant,
            Error::Source { .. } => ErrorClass::Source,
            Error::Database { .. } | Error::Storage { .. } => ErrorClass::Database,
            Error::TempFile { .. } => ErrorClass::Config,
        }
    }

    /// Whether trying the same operation again may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Source { transient, .. } | Error::Database { transient, .. } => *transient,
            _ => false,
        }
    }

    /// The delay the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Source { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A configuration error about `key` in `file`.
    pub fn config(
        file: impl Into<String>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Config {
            file: file.into(),
            key: key.into(),
            message: message.into(),
        }
    }

    /// A permanent source error (missing file, HTTP 404, ...).
    pub fn source_permanent(message: impl Into<String>) -> Self {
        Error::Source {
            message: message.into(),
            transient: false,
            retry_after: None,
        }
    }

    /// A transient source error (connection reset, HTTP 503, ...).
    pub fn source_transient(message: impl Into<String>) -> Self {
        Error::Source {
            message: message.into(),
            transient: true,
            retry_after: None,
        }
    }
}

/// Shorthand used across the stages.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_source_and_database_errors_can_be_transient() {
        assert!(Error::source_transient("reset").is_transient());
        assert!(!Error::source_permanent("404").is_transient());
        assert!(Error::Database {
            message: "busy".into(),
            transient: true
        }
        .is_transient());
        assert!(!Error::Invariant("refused".into()).is_transient());
        assert!(!Error::config("f.toml", "load.key", "x").is_transient());
    }

    #[test]
    fn error_classes_round_trip_through_their_stored_names() {
        for class in ErrorClass::ALL {
            assert_eq!(class.as_str().parse::<ErrorClass>(), Ok(class));
            // serde's name is the stored one.
            assert_eq!(
                serde_json::to_value(class).unwrap(),
                serde_json::json!(class.as_str())
            );
        }
        assert_eq!(
            "interrupted".parse::<ErrorClass>(),
            Err(UnknownErrorClass("interrupted".into()))
        );
    }

    #[test]
    fn validation_error_names_location_field_and_value() {
        let err = Error::Validation {
            location: Location {
                resource: "a.csv".into(),
                record: Some(4),
                line: Some(5),
                page: None,
            },
            field: "amount".into(),
            value: "12,x".into(),
            message: "not a decimal".into(),
        };
        assert_eq!(
            err.to_string(),
            "a.csv row 4 (line 5): field `amount`: not a decimal: \"12,x\""
        );
        assert_eq!(err.class(), ErrorClass::Validation);
    }
}
