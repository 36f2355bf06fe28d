//! Raw records: what extract hands to transform, before any typing.
//!
//! CSV rows stay as `csv::StringRecord`s sharing one header list, so a
//! million-row period costs one allocation per row, not one per cell.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_128;

use crate::error::{Error, Location};
use crate::value::Hash128;

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

/// Hashes raw records (ADR 0021, "The raw-record hash"): 128 bits over
/// the record's bytes as the reader decoded them (a CSV row's cells and
/// its header, a JSON object's text), prefixed by a seed that stands for
/// everything else deciding how the record is typed (the compiled
/// `[fields]`, the timezone, the build). Two records with the same raw
/// hash therefore type to the same row; a change of configuration changes
/// every raw hash, so no stored one matches and the typed row decides.
///
/// Cells and header names are length-prefixed, so the encoding is
/// unambiguous. A malformed record has no raw hash: it never takes the
/// shortcut. The hash is never 0, which stored forms use for "none".
#[derive(Debug)]
pub struct RawHasher {
    seed: [u8; 16],
    scratch: Vec<u8>,
    /// The digest of the last CSV header row seen, found once per file.
    header: Option<(CsvHeaders, [u8; 16])>,
}

impl RawHasher {
    /// A hasher whose every hash is seeded with `seed`.
    pub fn new(seed: Hash128) -> RawHasher {
        RawHasher {
            seed: seed.to_bytes(),
            scratch: Vec::with_capacity(256),
            header: None,
        }
    }

    /// The raw hash of `record`; `None` for a malformed one.
    pub fn hash(&mut self, record: &RawRecord) -> Option<Hash128> {
        let header = match &record.data {
            RawData::Csv { headers, .. } => Some(self.header_digest(headers)),
            _ => None,
        };
        let out = &mut self.scratch;
        out.clear();
        out.extend_from_slice(&self.seed);
        match (&record.data, header) {
            (RawData::Csv { row, .. }, Some(header)) => {
                out.push(b'c');
                out.extend_from_slice(&header);
                for cell in row {
                    push_cell(out, cell.as_bytes());
                }
            }
            (RawData::Json(value), _) => {
                out.push(b'j');
                serde_json::to_writer(&mut *out, value).ok()?;
            }
            _ => return None,
        }
        Some(Hash128(xxh3_128(out).max(1)))
    }

    fn header_digest(&mut self, headers: &CsvHeaders) -> [u8; 16] {
        if let Some((known, digest)) = &self.header {
            if Arc::ptr_eq(known, headers) {
                return *digest;
            }
        }
        let mut bytes = Vec::new();
        for name in headers.iter() {
            push_cell(&mut bytes, name.as_bytes());
        }
        let digest = xxh3_128(&bytes).to_be_bytes();
        self.header = Some((Arc::clone(headers), digest));
        digest
    }
}

/// A cell, prefixed by its length.
fn push_cell(out: &mut Vec<u8>, cell: &[u8]) {
    out.extend_from_slice(&(cell.len() as u64).to_le_bytes());
    out.extend_from_slice(cell);
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
    fn raw_hash_sees_cells_header_seed_and_skips_malformed() {
        let csv = |headers: &[&str], row: &[&str]| RawRecord {
            data: RawData::Csv {
                headers: Arc::new(csv::StringRecord::from(headers.to_vec())),
                row: csv::StringRecord::from(row.to_vec()),
            },
            origin: origin(),
        };
        let mut hasher = RawHasher::new(Hash128(1));
        let base = hasher.hash(&csv(&["id", "v"], &["1", "x"])).unwrap();
        assert_eq!(hasher.hash(&csv(&["id", "v"], &["1", "x"])), Some(base));
        assert_ne!(hasher.hash(&csv(&["id", "v"], &["1", "y"])), Some(base));
        assert_ne!(hasher.hash(&csv(&["id", "w"], &["1", "x"])), Some(base));
        assert_ne!(hasher.hash(&csv(&["id", "v"], &["1x", ""])), Some(base));
        let mut other = RawHasher::new(Hash128(2));
        assert_ne!(other.hash(&csv(&["id", "v"], &["1", "x"])), Some(base));
        let json = RawRecord {
            data: RawData::Json(serde_json::json!({"id": 1, "v": "x"})),
            origin: origin(),
        };
        let a = hasher.hash(&json).unwrap();
        assert_ne!(a, base);
        assert_eq!(hasher.hash(&json), Some(a));
        let bad = RawRecord::malformed("x".into(), Error::Invariant("bad".into()), origin());
        assert_eq!(hasher.hash(&bad), None);
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
