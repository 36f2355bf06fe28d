//! Raw records: what extract hands to transform, before any typing.
//!
//! CSV rows stay as `csv::StringRecord`s sharing one header list, so a
//! million-row period costs one allocation per row, not one per cell.

use std::sync::Arc;

use crate::error::{Error, Location};

/// Where a record came from. The resource name is shared by every record of
/// a file or page.
#[derive(Debug, Clone)]
pub struct Origin {
    /// File path or (redacted) URL.
    pub resource: Arc<str>,
    /// Page number for paginated sources.
    pub page: Option<u64>,
    /// 1-based record number within the resource or page.
    pub record: u64,
    /// Line number in a text file, when known.
    pub line: Option<u64>,
}

impl Origin {
    /// The origin as an error location.
    pub fn location(&self) -> Location {
        Location {
            resource: self.resource.to_string(),
            page: self.page,
            record: Some(self.record),
            line: self.line,
        }
    }
}

/// The fields of one record.
#[derive(Debug, Clone)]
pub enum RawData {
    /// A CSV row and the header of its file.
    Csv {
        /// Column names from the header row.
        headers: Arc<csv::StringRecord>,
        /// The row's cells.
        row: csv::StringRecord,
    },
    /// A JSON object (readers hand anything else on as `Malformed`).
    Json(serde_json::Value),
    /// A row the reader could not decode (a CSV row with the wrong number
    /// of fields, an NDJSON line that is not JSON, invalid UTF-8, a record
    /// that is not a JSON object), while the document around it is fine.
    /// It travels with the good rows, so it counts as read, becomes a
    /// reject under `max_rejects` like any invalid row, and keeps its place
    /// in the checkpoint's record count.
    Malformed {
        /// The row as it was written (invalid UTF-8 replaced by U+FFFD),
        /// without its line terminator: what the rejects table keeps.
        raw: String,
        /// Why it could not be decoded, at its location.
        error: Box<Error>,
    },
}

/// One record and its origin.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// The fields.
    pub data: RawData,
    /// Where it came from.
    pub origin: Origin,
}

/// How a field is found in a record: a top-level name or an RFC 6901 JSON
/// pointer (anything starting with `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// A top-level field or CSV column name.
    Name(String),
    /// A JSON pointer into nested JSON.
    Pointer(String),
}

impl Selector {
    /// `from` as written in a pipeline file.
    pub fn parse(from: &str) -> Selector {
        if from.starts_with('/') {
            Selector::Pointer(from.to_string())
        } else {
            Selector::Name(from.to_string())
        }
    }

    /// The CSV column this selector reads: the name, or a pointer without
    /// its leading `/` (a CSV row has no nesting).
    pub fn csv_column(&self) -> &str {
        match self {
            Selector::Name(name) => name,
            Selector::Pointer(p) => p.trim_start_matches('/'),
        }
    }
}

/// A raw field value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RawValue<'a> {
    /// The record has no such field.
    Missing,
    /// A text cell (CSV) or JSON string.
    Str(&'a str),
    /// Any other JSON value (number, bool, null, array, object).
    Json(&'a serde_json::Value),
}

impl RawRecord {
    /// A row that could not be decoded (see [`RawData::Malformed`]).
    pub fn malformed(raw: String, error: Error, origin: Origin) -> RawRecord {
        RawRecord {
            data: RawData::Malformed {
                raw,
                error: Box::new(error),
            },
            origin,
        }
    }

    /// The decoding error of a malformed row, `None` for a good one.
    pub fn decode_error(&self) -> Option<&Error> {
        match &self.data {
            RawData::Malformed { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The header row of a CSV record, which [`csv_position`]s index.
    pub fn csv_headers(&self) -> Option<&CsvHeaders> {
        match &self.data {
            RawData::Csv { headers, .. } => Some(headers),
            _ => None,
        }
    }

    /// A CSV record's cell at a position [`csv_position`] found once for
    /// its header row (a name lookup per cell was 5% of a first backfill);
    /// `Missing` for any other record.
    pub fn csv_cell_at(&self, position: Option<usize>) -> RawValue<'_> {
        match (&self.data, position) {
            (RawData::Csv { row, .. }, Some(i)) => {
                row.get(i).map_or(RawValue::Missing, RawValue::Str)
            }
            _ => RawValue::Missing,
        }
    }

    /// Looks a field up. A malformed row has no fields.
    pub fn get(&self, selector: &Selector) -> RawValue<'_> {
        match (&self.data, selector) {
            (RawData::Csv { headers, .. }, selector) => {
                self.csv_cell_at(csv_position(headers, selector))
            }
            (RawData::Json(v), Selector::Name(name)) => json_value(v.get(name.as_str())),
            (RawData::Json(v), Selector::Pointer(p)) => json_value(v.pointer(p)),
            (RawData::Malformed { .. }, _) => RawValue::Missing,
        }
    }

    /// The whole record as JSON, for the rejects table: a malformed row is
    /// kept as the text it was written as.
    pub fn to_json(&self) -> serde_json::Value {
        match &self.data {
            RawData::Json(v) => v.clone(),
            RawData::Malformed { raw, .. } => serde_json::Value::String(raw.clone()),
            RawData::Csv { headers, row } => serde_json::Value::Object(
                headers
                    .iter()
                    .zip(row.iter())
                    .map(|(h, v)| (h.to_string(), serde_json::Value::String(v.to_string())))
                    .collect(),
            ),
        }
    }
}

/// A CSV file's header row, shared by its records.
pub type CsvHeaders = Arc<csv::StringRecord>;

/// Where `selector`'s column is in a CSV header row, if it is there.
pub fn csv_position(headers: &csv::StringRecord, selector: &Selector) -> Option<usize> {
    let name = selector.csv_column();
    headers.iter().position(|h| h == name)
}

fn json_value(v: Option<&serde_json::Value>) -> RawValue<'_> {
    match v {
        None => RawValue::Missing,
        Some(serde_json::Value::String(s)) => RawValue::Str(s),
        Some(other) => RawValue::Json(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin {
            resource: Arc::from("a.csv"),
            page: None,
            record: 1,
            line: Some(2),
        }
    }

    #[test]
    fn csv_lookup_by_name_and_pointer() {
        let headers = Arc::new(csv::StringRecord::from(vec!["id", "total"]));
        let rec = RawRecord {
            data: RawData::Csv {
                headers,
                row: csv::StringRecord::from(vec!["A1", "9.5"]),
            },
            origin: origin(),
        };
        assert_eq!(rec.get(&Selector::parse("total")), RawValue::Str("9.5"));
        assert_eq!(rec.get(&Selector::parse("/id")), RawValue::Str("A1"));
        assert_eq!(rec.get(&Selector::parse("nope")), RawValue::Missing);
        assert_eq!(
            rec.to_json(),
            serde_json::json!({"id": "A1", "total": "9.5"})
        );
    }

    #[test]
    fn json_lookup_by_name_and_pointer() {
        let rec = RawRecord {
            data: RawData::Json(serde_json::json!({"id": 7, "customer": {"name": "Ann"}})),
            origin: origin(),
        };
        assert_eq!(
            rec.get(&Selector::parse("id")),
            RawValue::Json(&serde_json::json!(7))
        );
        assert_eq!(
            rec.get(&Selector::parse("/customer/name")),
            RawValue::Str("Ann")
        );
        assert_eq!(
            rec.get(&Selector::parse("/customer/age")),
            RawValue::Missing
        );
    }
}
