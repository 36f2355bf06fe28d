//! What the ledger's `error_class` columns hold: the class of a failure, or
//! `interrupted`. Written and read back only through [`StoredClass`], so a
//! name the ledger holds is always one this enum spells.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use tidemark_core::{Error, ErrorClass};

/// The `error_class` of a run key (`_tm_runs`) or attempt (`_tm_attempts`):
/// why its last attempt ended without `done`.
///
/// `interrupted` is here, not in [`ErrorClass`], because an interruption is
/// no failure: a signal stopped the attempt after its last committed batch
/// and the key went back to `pending`, to be resumed. No [`Error`] has that
/// class, so [`Error::class`] stays a class some failure really has, and
/// code that acts on a failure's class (exit codes, retries) never has to
/// handle one no failure can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoredClass {
    /// The attempt failed with an error of this class (`failed`).
    Failure(ErrorClass),
    /// A signal stopped the attempt; the key is `pending` again.
    Interrupted,
}

impl StoredClass {
    /// Every name the column may hold: the failure classes, then
    /// `interrupted`.
    pub fn all() -> impl Iterator<Item = StoredClass> {
        ErrorClass::ALL
            .into_iter()
            .map(StoredClass::Failure)
            .chain([StoredClass::Interrupted])
    }

    /// The class recorded for a failed attempt.
    pub fn of(error: &Error) -> StoredClass {
        StoredClass::Failure(error.class())
    }

    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            StoredClass::Failure(class) => class.as_str(),
            StoredClass::Interrupted => "interrupted",
        }
    }
}

impl From<ErrorClass> for StoredClass {
    fn from(class: ErrorClass) -> StoredClass {
        StoredClass::Failure(class)
    }
}

/// A stored `error_class` that names no class this tidemark knows (a newer
/// tidemark wrote it, or the row was edited by hand).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error class {0:?}")]
pub struct UnknownClass(pub String);

impl FromStr for StoredClass {
    type Err = UnknownClass;

    fn from_str(name: &str) -> Result<StoredClass, UnknownClass> {
        StoredClass::all()
            .find(|c| c.as_str() == name)
            .ok_or_else(|| UnknownClass(name.to_string()))
    }
}

impl fmt::Display for StoredClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for StoredClass {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_classes_round_trip_through_their_names() {
        let names: Vec<&str> = StoredClass::all().map(StoredClass::as_str).collect();
        for class in StoredClass::all() {
            assert_eq!(class.as_str().parse::<StoredClass>(), Ok(class));
        }
        // The contract's list, less `lease_lost`: a lost lease is recorded
        // by the attempt that took over, never as a class.
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            [
                "config",
                "contract",
                "database",
                "incomplete",
                "interrupted",
                "invariant",
                "parse",
                "source",
                "validation"
            ]
        );
        assert_eq!(
            "lease_lost".parse::<StoredClass>(),
            Err(UnknownClass("lease_lost".into()))
        );
    }

    #[test]
    fn an_interruption_is_no_failure_class() {
        assert_eq!(StoredClass::Interrupted.as_str(), "interrupted");
        assert!("interrupted".parse::<ErrorClass>().is_err());
    }
}
