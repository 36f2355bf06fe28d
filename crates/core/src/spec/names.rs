//! The names tidemark makes tables, columns and indexes of, and the
//! rules they follow on both databases.
//!
//! Separate because these rules are not about any one section of the file:
//! they come from PostgreSQL (63 bytes, system columns) and SQLite (names
//! compared without regard to ASCII case, the row id), and the load crate
//! relies on the same constants when it names what it creates.

use indexmap::IndexMap;

use super::check::Checker;
use super::FieldSpec;
use crate::error::Error;

/// The longest identifier PostgreSQL keeps whole (NAMEDATALEN - 1 bytes);
/// a longer one is cut, silently, to this length.
pub const MAX_IDENTIFIER: usize = 63;

/// Names starting with this (in any ASCII case) belong to tidemark: the
/// lineage columns (`_tm_source`, ...) and the ledger's tables.
const RESERVED_PREFIX: &str = "_tm_";

/// The index tidemark makes on each destination table is named
/// `TABLE__tm_run_key` (crates/load's table modules).
pub const RUN_KEY_INDEX_SUFFIX: &str = "__tm_run_key";

/// Columns every table has on one of the databases, with that database:
/// SQLite's row id (under its three names) and PostgreSQL's system columns.
const SYSTEM_COLUMNS: [(&str, &str); 9] = [
    ("rowid", "SQLite"),
    ("oid", "SQLite"),
    ("_rowid_", "SQLite"),
    ("tableoid", "PostgreSQL"),
    ("xmin", "PostgreSQL"),
    ("cmin", "PostgreSQL"),
    ("xmax", "PostgreSQL"),
    ("cmax", "PostgreSQL"),
    ("ctid", "PostgreSQL"),
];

impl Checker<'_> {
    /// A name tidemark makes a column or table of. The rules are those of
    /// the stricter of the two databases: at most 63 bytes (PostgreSQL cuts
    /// longer identifiers, so two long names would become one), ASCII only,
    /// and `_tm_` reserved in any case (SQLite compares names without
    /// regard to ASCII case, so `_TM_SOURCE` is `_tm_source` there).
    fn identifier(&self, key: &str, name: &str) -> Result<(), Error> {
        let ok = !name.is_empty()
            && name.len() <= MAX_IDENTIFIER
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(self.err(key, format!("{name:?} is not a valid name: use letters, digits and _, not starting with a digit, at most {MAX_IDENTIFIER} bytes (PostgreSQL cuts longer names, so two of them could become one)")));
        }
        if name.to_ascii_lowercase().starts_with(RESERVED_PREFIX) {
            return Err(self.err(key, format!("{name:?}: names starting with _tm_ (in any case) are reserved for tidemark's lineage columns and tables")));
        }
        Ok(())
    }

    /// A field's column name: an identifier that is none of the columns a
    /// database already gives every table. On SQLite a column named
    /// `rowid` would stand in for the row id tidemark deletes by (the
    /// wrong rows would go); on PostgreSQL a system column's name cannot be
    /// created at all. Compared without regard to case, as SQLite does.
    pub(super) fn column_name(&self, key: &str, name: &str) -> Result<(), Error> {
        self.identifier(key, name)?;
        let system = SYSTEM_COLUMNS
            .iter()
            .find(|(column, _)| column.eq_ignore_ascii_case(name));
        match system {
            Some((column, database)) => Err(self.err(
                key,
                format!("{name:?} is the name of {database}'s own column `{column}` on every table; rename the field (its input can keep the name through `from`)"),
            )),
            None => Ok(()),
        }
    }

    /// The destination table's name: an identifier that leaves room for the
    /// index tidemark names after it (`TABLE__tm_run_key`) within
    /// [`MAX_IDENTIFIER`] bytes, and is not itself such an index's name.
    pub(super) fn table_name(&self, name: &str) -> Result<(), Error> {
        let key = "load.table";
        self.identifier(key, name)?;
        let longest = MAX_IDENTIFIER - RUN_KEY_INDEX_SUFFIX.len();
        if name.len() > longest {
            return Err(self.err(
                key,
                format!(
                    "{name:?} is {} bytes: tidemark names the table's index {name}{RUN_KEY_INDEX_SUFFIX}, which must fit in {MAX_IDENTIFIER} bytes (PostgreSQL cuts longer names, and two cut names collide); give a table name of at most {longest} bytes",
                    name.len()
                ),
            ));
        }
        if name.to_ascii_lowercase().ends_with(RUN_KEY_INDEX_SUFFIX) {
            return Err(self.err(
                key,
                format!("{name:?}: names ending in {RUN_KEY_INDEX_SUFFIX} (in any case) are reserved for the index tidemark makes on each destination table"),
            ));
        }
        Ok(())
    }

    /// Field `i` must not name the same column as an earlier one on either
    /// database: SQLite compares column names without regard to ASCII case
    /// (`note` and `Note` are one column there, two on PostgreSQL).
    pub(super) fn distinct_column(
        &self,
        fields: &IndexMap<String, FieldSpec>,
        i: usize,
        name: &str,
    ) -> Result<(), Error> {
        let earlier = fields
            .keys()
            .take(i)
            .find(|other| other.eq_ignore_ascii_case(name));
        match earlier {
            Some(other) => Err(self.err(
                format!("fields.{name}"),
                format!("{name:?} and {other:?} name the same column on SQLite, which compares names without regard to case; rename one of them"),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::tests::{config_err, parse, GOOD};

    #[test]
    fn reserved_and_invalid_names_are_refused() {
        let (key, _) = config_err(&GOOD.replace("region =", "_tm_region ="));
        assert_eq!(key, "fields._tm_region");
        let (key, _) = config_err(&GOOD.replace("table = \"orders\"", "table = \"orders; drop\""));
        assert_eq!(key, "load.table");
    }

    /// Names that are one on SQLite (any ASCII case) or on PostgreSQL (the
    /// first 63 bytes) are refused, naming both.
    #[test]
    fn names_equal_on_either_database_are_refused() {
        let (key, message) = config_err(&GOOD.replace("region =", "Amount ="));
        assert_eq!(key, "fields.Amount");
        assert!(
            message.contains("\"amount\"") && message.contains("\"Amount\""),
            "{message}"
        );
        let (key, _) = config_err(&GOOD.replace("region =", "_TM_Source ="));
        assert_eq!(key, "fields._TM_Source");
        for system in ["rowid", "OID", "_rowid_", "xmin", "ctid", "tableoid"] {
            let (key, message) = config_err(&GOOD.replace("region =", &format!("{system} =")));
            assert_eq!(key, format!("fields.{system}"));
            assert!(message.contains("own column"), "{message}");
        }
        let long = "a".repeat(64);
        let (key, message) = config_err(&GOOD.replace("region =", &format!("{long} =")));
        assert_eq!(key, format!("fields.{long}"));
        assert!(message.contains("63"), "{message}");
        let table = "t".repeat(52);
        let (key, message) =
            config_err(&GOOD.replace("table = \"orders\"", &format!("table = \"{table}\"")));
        assert_eq!(key, "load.table");
        assert!(message.contains("__tm_run_key"), "{message}");
        let fits = "t".repeat(51);
        parse(&GOOD.replace("table = \"orders\"", &format!("table = \"{fits}\""))).unwrap();
        let (key, _) =
            config_err(&GOOD.replace("table = \"orders\"", "table = \"Orders__TM_run_key\""));
        assert_eq!(key, "load.table");
        let (key, _) = config_err(&GOOD.replace("table = \"orders\"", "table = \"_TM_runs\""));
        assert_eq!(key, "load.table");
    }
}
