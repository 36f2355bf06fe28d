//! A JSON page parsed with its records kept compact: everything but the
//! array at the `records` pointer becomes a `Value` (the cursor and the
//! declared total are read from it), while each element of that array is
//! parsed, written back as JSON text and dropped, and parsed again only
//! when it is handed out. A parsed tree of small records costs many times
//! their text; kept as text, a page costs about twice its size, which is
//! what its limit (`load.memory_budget / 16`) counts on (ADR 0020).
//!
//! The array is left as `null` in the document, so a pointer that reads
//! inside it (a cursor taken from the last record) cannot be answered from
//! the document: for such a source the page is parsed whole instead, as
//! before.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A page's document with the records array taken out as texts.
pub(crate) struct Split {
    /// The document, with `null` where the records array was.
    pub(crate) doc: Value,
    /// The array's elements as JSON text; `None` when there was no array
    /// at the pointer (the document then holds whatever was there).
    pub(crate) records: Option<Vec<String>>,
}

/// Whether `pointer` reads inside the array at `records` (or is it), so
/// the document without the array cannot answer it.
pub(crate) fn reads_records(records: &str, pointer: &str) -> bool {
    pointer
        .strip_prefix(records)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Parses `body`, taking the array at `pointer` (RFC 6901) out as texts.
pub(crate) fn split(body: &[u8], pointer: &str) -> Result<Split, serde_json::Error> {
    let path: Vec<String> = pointer.split('/').skip(1).map(unescape).collect();
    let mut records = None;
    let mut de = serde_json::Deserializer::from_slice(body);
    let doc = At {
        path: &path,
        out: &mut records,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(Split { doc, records })
}

/// The key under which serde_json's `arbitrary_precision` passes a number
/// to a visitor, as a one-entry map holding its digits.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Deserializes a value whose `path` leads to the records array.
struct At<'p, 'o> {
    path: &'p [String],
    out: &'o mut Option<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for At<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for At<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            let mut texts = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(element) = seq.next_element::<Value>()? {
                texts.push(element.to_string());
            }
            *self.out = Some(texts);
            return Ok(Value::Null);
        };
        let wanted: Option<usize> = first.parse().ok();
        let mut items = Vec::new();
        loop {
            let item = if wanted == Some(items.len()) {
                seq.next_element_seed(At {
                    path: rest,
                    out: &mut *self.out,
                })?
            } else {
                seq.next_element::<Value>()?
            };
            match item {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.is_empty() && key == NUMBER_TOKEN {
                // A number, as `arbitrary_precision` hands it over.
                let digits: String = map.next_value()?;
                return serde_json::from_str(&digits).map_err(serde::de::Error::custom);
            }
            let value = match self.path.split_first() {
                Some((first, rest)) if *first == key => map.next_value_seed(At {
                    path: rest,
                    out: &mut *self.out,
                })?,
                _ => map.next_value::<Value>()?,
            };
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }

    // Any other value is kept as it is; at the records pointer it is the
    // "not an array" the cursor reports.
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_records_come_out_as_texts_and_the_rest_stays_a_document() {
        let body = br#"{"meta":{"next":"c2","total":3},"data":[{"a":1},{"b":2.50},7],"z":[1]}"#;
        let split = split(body, "/data").unwrap();
        assert_eq!(
            split.doc,
            json!({"meta": {"next": "c2", "total": 3}, "data": null, "z": [1]})
        );
        // Numbers keep their digits (arbitrary_precision), a non-object
        // element is kept for the cursor to refuse.
        assert_eq!(split.records.unwrap(), [r#"{"a":1}"#, r#"{"b":2.50}"#, "7"]);
    }

    #[test]
    fn a_pointer_through_arrays_escapes_and_the_whole_document() {
        let body = br#"{"a/b":[{"x":0},{"rows":[{"id":1}]}]}"#;
        let split = split(body, "/a~1b/1/rows").unwrap();
        assert_eq!(split.records.unwrap(), [r#"{"id":1}"#]);
        assert_eq!(split.doc, json!({"a/b": [{"x": 0}, {"rows": null}]}));
        let whole = super::split(br#"[{"id":1},{"id":2}]"#, "").unwrap();
        assert_eq!(whole.records.unwrap().len(), 2);
        assert_eq!(whole.doc, Value::Null);
    }

    #[test]
    fn no_array_at_the_pointer_leaves_what_is_there() {
        let split = split(br#"{"data":12.0,"n":{"k":"v"}}"#, "/data").unwrap();
        assert!(split.records.is_none());
        assert_eq!(split.doc, json!({"data": 12.0, "n": {"k": "v"}}));
        let missing = super::split(br#"{"other":[1]}"#, "/data").unwrap();
        assert!(missing.records.is_none());
        assert!(super::split(br#"{"data":[1,"#, "/data").is_err());
        assert!(super::split(br#"{"data":[]} x"#, "/data").is_err());
    }

    #[test]
    fn pointers_inside_the_records_are_told_apart() {
        assert!(reads_records("/data", "/data/9/id"));
        assert!(reads_records("/data", "/data"));
        assert!(reads_records("", "/0/id"));
        assert!(!reads_records("/data", "/database/next"));
        assert!(!reads_records("/data", "/meta/next"));
    }
}
