//! JSON files: one document per file, records at an RFC 6901 pointer.
//!
//! A JSON document cannot be cut into records before it is parsed, so each
//! file is parsed whole (one file at a time) and its records are handed out
//! from memory. Sources too large for that should export NDJSON.

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use serde_json::Value;
use tidemark_core::{Error, Origin, RawData, RawRecord};
use xxhash_rust::xxh3::Xxh3;

use super::{io_error, json_kind, parse_error, strip_bom};

/// A parsed JSON file's (or HTTP page's) records.
pub(crate) struct JsonCursor {
    records: Elements,
    resource: Arc<str>,
    /// Records handed out so far.
    record: u64,
}

/// The records array: parsed, or (an HTTP page's) as JSON texts parsed
/// one at a time when handed out.
enum Elements {
    Values(std::vec::IntoIter<Value>),
    Texts(std::vec::IntoIter<String>),
}

impl JsonCursor {
    /// A cursor over records kept as JSON texts (each a valid JSON value).
    pub(crate) fn from_texts(texts: Vec<String>, resource: Arc<str>) -> JsonCursor {
        JsonCursor {
            records: Elements::Texts(texts.into_iter()),
            resource,
            record: 0,
        }
    }

    /// Reads and parses the file and takes the array at `pointer` (`""`:
    /// the whole document). Anything but an array there is a parse error:
    /// treating a missing or mistyped array as "no records" could make a
    /// broken export look like an empty period. The whole file is consumed
    /// here, so `hasher` comes back having hashed all of it.
    pub(super) fn open(
        mut file: File,
        resource: Arc<str>,
        pointer: &str,
        mut hasher: Xxh3,
    ) -> Result<(JsonCursor, Xxh3), Error> {
        let doc = parse_document(&mut file, &resource, &mut hasher)?;
        Ok((JsonCursor::from_document(doc, resource, pointer)?, hasher))
    }

    /// Takes the array at `pointer` out of an already parsed document.
    pub(crate) fn from_document(
        mut doc: Value,
        resource: Arc<str>,
        pointer: &str,
    ) -> Result<JsonCursor, Error> {
        let shown = if pointer.is_empty() {
            "\"\" (the whole document)".to_string()
        } else {
            format!("{pointer:?}")
        };
        match doc.pointer_mut(pointer).map(Value::take) {
            Some(Value::Array(records)) => Ok(JsonCursor {
                records: Elements::Values(records.into_iter()),
                resource,
                record: 0,
            }),
            Some(other) => Err(parse_error(
                &resource,
                None,
                None,
                format!(
                    "records pointer {shown} points to {}, not an array",
                    json_kind(&other)
                ),
            )),
            None => Err(parse_error(
                &resource,
                None,
                None,
                format!("records pointer {shown} does not exist in the document"),
            )),
        }
    }

    /// The next record, or `None` when the array is exhausted. An element
    /// that is not an object is a bad row (a reject under `max_rejects`),
    /// kept as its JSON text.
    pub(crate) fn next_record(&mut self) -> Result<Option<RawRecord>, Error> {
        let value = match &mut self.records {
            Elements::Values(values) => values.next(),
            Elements::Texts(texts) => match texts.next() {
                Some(text) => Some(serde_json::from_str(&text).map_err(|e| {
                    parse_error(&self.resource, Some(self.record + 1), None, e.to_string())
                })?),
                None => None,
            },
        };
        let Some(value) = value else {
            return Ok(None);
        };
        self.record += 1;
        let origin = Origin {
            resource: Arc::clone(&self.resource),
            page: None,
            record: self.record,
            line: None,
        };
        if !value.is_object() {
            let why = format!(
                "record is not a JSON object: element {} of the records array is {}",
                self.record,
                json_kind(&value)
            );
            let error = parse_error(&self.resource, Some(self.record), None, why);
            return Ok(Some(RawRecord::malformed(value.to_string(), error, origin)));
        }
        Ok(Some(RawRecord {
            data: RawData::Json(value),
            origin,
        }))
    }
}

/// Reads the file to its end, never relying on its size (a FIFO has
/// none), and parses it.
/// The raw bytes are dropped as soon as the document is built.
fn parse_document(file: &mut File, resource: &str, hasher: &mut Xxh3) -> Result<Value, Error> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| io_error("cannot read", resource, &e))?;
    hasher.update(&bytes);
    serde_json::from_slice(strip_bom(&bytes)).map_err(|e| {
        parse_error(
            resource,
            None,
            Some(u64::try_from(e.line()).unwrap_or(u64::MAX)),
            format!("invalid JSON: {e}"),
        )
    })
}
