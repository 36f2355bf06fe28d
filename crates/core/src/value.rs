//! Typed values, their canonical text form, and the hashes built from them.
//!
//! The row hash decides whether a row changed, so it must never change for
//! the same typed values: not across runs, releases or databases. It is
//! xxh3-128 over each non-NULL value tagged with its column's name and type
//! (columns in name order, values length-prefixed), so a NULL column hashes
//! exactly as if the column did not exist: adding a nullable column to a
//! table leaves every stored row that has no value for it unchanged, and
//! reordering `[fields]` changes nothing. A test pins its output.
//!
//! The natural-key hash is the older encoding (type-tagged values in key
//! order, NULL marked): a key has no NULLs and never gains columns, and
//! `_tm_batches` of unfinished runs hold such hashes.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

/// The type of an output column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    /// UTF-8 text.
    Text,
    /// 64-bit signed integer.
    Int,
    /// 64-bit binary float.
    Float,
    /// Exact decimal (up to 28 significant digits); never a binary float.
    Decimal,
    /// Boolean.
    Bool,
    /// Calendar date.
    Date,
    /// Date and time without a timezone.
    Timestamp,
    /// An instant; stored in UTC.
    Timestamptz,
    /// Any JSON value.
    Json,
}

impl FieldType {
    /// The name used in pipeline files.
    pub fn name(self) -> &'static str {
        match self {
            FieldType::Text => "text",
            FieldType::Int => "int",
            FieldType::Float => "float",
            FieldType::Decimal => "decimal",
            FieldType::Bool => "bool",
            FieldType::Date => "date",
            FieldType::Timestamp => "timestamp",
            FieldType::Timestamptz => "timestamptz",
            FieldType::Json => "json",
        }
    }

    /// Whether the type can be part of a natural key. Floats compare
    /// inexactly and JSON has no order, so neither identifies an entity.
    pub fn can_be_key(self) -> bool {
        !matches!(self, FieldType::Float | FieldType::Json)
    }

    fn tag(self) -> u8 {
        match self {
            FieldType::Text => 1,
            FieldType::Int => 2,
            FieldType::Float => 3,
            FieldType::Decimal => 4,
            FieldType::Bool => 5,
            FieldType::Date => 6,
            FieldType::Timestamp => 7,
            FieldType::Timestamptz => 8,
            FieldType::Json => 9,
        }
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One typed value of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Text.
    Text(String),
    /// Integer.
    Int(i64),
    /// Float.
    Float(f64),
    /// Exact decimal, normalised (no trailing zeros).
    Decimal(Decimal),
    /// Boolean.
    Bool(bool),
    /// Date.
    Date(NaiveDate),
    /// Naive timestamp.
    Timestamp(NaiveDateTime),
    /// Instant in UTC.
    Timestamptz(DateTime<Utc>),
    /// JSON (objects with sorted keys).
    Json(serde_json::Value),
}

/// Formats used for the canonical text of dates and times.
pub const DATE_FORMAT: &str = "%Y-%m-%d";
/// Canonical naive timestamp format.
pub const TIMESTAMP_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.f";

impl Value {
    /// Whether this is NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The canonical text of a value: what SQLite stores for the text-backed
    /// types and what the hashes are computed over. `None` for NULL.
    pub fn canonical_text(&self) -> Option<String> {
        let mut out = String::new();
        self.write_canonical(&mut out).then_some(out)
    }

    /// Appends the canonical text to `out` (hot paths reuse one buffer);
    /// returns false, appending nothing, for NULL.
    pub fn write_canonical(&self, out: &mut impl fmt::Write) -> bool {
        let _ = match self {
            Value::Null => return false,
            Value::Text(s) => out.write_str(s),
            Value::Int(i) => write!(out, "{i}"),
            Value::Float(f) => write!(out, "{f}"),
            Value::Decimal(d) => write!(out, "{}", d.normalize()),
            Value::Bool(b) => write!(out, "{b}"),
            Value::Date(d) => write!(out, "{}", d.format(DATE_FORMAT)),
            Value::Timestamp(t) => write!(out, "{}", t.format(TIMESTAMP_FORMAT)),
            Value::Timestamptz(t) => out.write_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            Value::Json(j) => write!(out, "{j}"),
        };
        true
    }

    /// Parses a canonical text back into a value of `ty`; the inverse of
    /// [`Value::canonical_text`], used to read stored keys back.
    pub fn from_canonical_text(ty: FieldType, text: &str) -> Option<Value> {
        Some(match ty {
            FieldType::Text => Value::Text(text.to_string()),
            FieldType::Int => Value::Int(text.parse().ok()?),
            FieldType::Float => Value::Float(text.parse().ok()?),
            FieldType::Decimal => Value::Decimal(Decimal::from_str(text).ok()?.normalize()),
            FieldType::Bool => Value::Bool(match text {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return None,
            }),
            FieldType::Date => Value::Date(NaiveDate::parse_from_str(text, DATE_FORMAT).ok()?),
            FieldType::Timestamp => {
                Value::Timestamp(NaiveDateTime::parse_from_str(text, TIMESTAMP_FORMAT).ok()?)
            }
            FieldType::Timestamptz => {
                Value::Timestamptz(DateTime::parse_from_rfc3339(text).ok()?.with_timezone(&Utc))
            }
            FieldType::Json => Value::Json(serde_json::from_str(text).ok()?),
        })
    }
}

/// A 128-bit hash, stored as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash128(pub u128);

impl Hash128 {
    /// 32 lowercase hex digits.
    pub fn to_hex(self) -> String {
        self.hex().as_str().to_string()
    }

    /// 32 lowercase hex digits, without an allocation. Every row's hash is
    /// written as text on the load path, where `{:032x}` through the
    /// formatter cost about 600 instructions a row.
    pub fn hex(self) -> HexDigits {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0.to_be_bytes()) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0xf)];
        }
        HexDigits(out)
    }

    /// Parses [`Hash128::to_hex`] output: exactly 32 hex digits, else
    /// `None` (a value tidemark did not write).
    pub fn from_hex(text: &str) -> Option<Hash128> {
        Hash128::from_hex_bytes(text.as_bytes())
    }

    /// [`Hash128::from_hex`] of bytes as a database hands them over. A
    /// re-sync reads two of these per stored row: a loop over the digits
    /// (128-bit shifts) was 8.5 % of an unchanged SQL re-sync's CPU, the
    /// checked table-driven decode of `faster_hex` a fraction of that.
    /// Either case is read: SQLite's `hex()` writes upper case.
    pub fn from_hex_bytes(digits: &[u8]) -> Option<Hash128> {
        if digits.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        faster_hex::hex_decode(digits, &mut bytes).ok()?;
        Some(Hash128(u128::from_be_bytes(bytes)))
    }

    /// The 16 big-endian bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

impl fmt::Display for Hash128 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hex().as_str())
    }
}

/// The hex digits of a [`Hash128`]; see [`Hash128::hex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HexDigits([u8; 32]);

impl HexDigits {
    /// The digits as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits are ever written, so this never falls back.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// A set of natural-key hashes. The keys are xxh3 output, already uniform,
/// so the table uses their own bits instead of hashing them again with
/// SipHash (three lookups per row on the load path).
pub type KeySet = std::collections::HashSet<Hash128, BuildKeyHasher>;

/// A map from natural-key hashes; see [`KeySet`].
pub type KeyMap<V> = std::collections::HashMap<Hash128, V, BuildKeyHasher>;

/// Builds [`KeyHasher`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuildKeyHasher;

impl std::hash::BuildHasher for BuildKeyHasher {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

/// Folds a [`Hash128`] to 64 bits; other input is mixed byte by byte.
#[derive(Debug, Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u128(&mut self, n: u128) {
        let bytes = n.to_le_bytes();
        let (low, high) = bytes.split_at(8);
        let word = |b: &[u8]| b.iter().rev().fold(0u64, |acc, x| acc << 8 | u64::from(*x));
        self.0 ^= word(low) ^ word(high);
    }
}

/// One typed row, ready to load: values in column order plus the hashes the
/// loader uses to skip unchanged rows and to recognise vanished keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Values in `[fields]` order.
    pub values: Vec<Value>,
    /// Hash of the natural key.
    pub key_hash: Hash128,
    /// Hash of all values.
    pub row_hash: Hash128,
    /// Hash of the raw record the row was typed from, seeded with
    /// everything that decides the typing ([`crate::record::RawHasher`]),
    /// stored beside the row hash: a later run that reads the same raw
    /// record under the same configuration knows the row unchanged without
    /// typing it (ADR 0021). `None` when not known (the row then carries
    /// no shortcut).
    pub raw_hash: Option<Hash128>,
}

impl Row {
    /// A row of `values` (in the column order of `shape`) with its hashes;
    /// `key` holds the indices of the natural key's columns.
    pub fn new(shape: &RowShape, key: &[usize], values: Vec<Value>) -> Row {
        let key_hash = key_hash(
            key.iter()
                .filter_map(|&i| Some((*shape.types.get(i)?, values.get(i)?))),
        );
        Row {
            row_hash: row_hash(shape, &values),
            values,
            key_hash,
            raw_hash: None,
        }
    }
}

/// The columns of a table as the row hash sees them, compiled once per
/// table: their types in column order, and for each column, in name order,
/// the 9 bytes that tag its values (xxh3-64 of the name, little endian, and
/// the type tag). A fixed-size tag kept inline, rather than the name's own
/// bytes behind a pointer, keeps the row hash as fast as it was without
/// names (ADR 0008); two names whose 64-bit hashes collide are not a
/// practical concern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowShape {
    types: Vec<FieldType>,
    by_name: Vec<(usize, [u8; 9])>,
}

impl RowShape {
    /// The shape of columns `(name, type)` given in column order.
    pub fn new<'a>(columns: impl IntoIterator<Item = (&'a str, FieldType)>) -> RowShape {
        let columns: Vec<(&str, FieldType)> = columns.into_iter().collect();
        let mut by_name: Vec<(usize, [u8; 9])> = columns
            .iter()
            .enumerate()
            .map(|(i, (name, ty))| {
                let mut tag = [0u8; 9];
                tag[..8].copy_from_slice(&xxh3_64(name.as_bytes()).to_le_bytes());
                tag[8] = ty.tag();
                (i, tag)
            })
            .collect();
        by_name.sort_by(|a, b| columns[a.0].0.cmp(columns[b.0].0));
        RowShape {
            types: columns.iter().map(|(_, ty)| *ty).collect(),
            by_name,
        }
    }

    /// Column types in column order.
    pub fn types(&self) -> &[FieldType] {
        &self.types
    }
}

impl Row {
    /// `A-1, 2024-01-01`: the values at `key` (the natural key's columns),
    /// for messages.
    pub fn key_text(&self, key: &[usize]) -> String {
        key.iter()
            .map(|&i| {
                self.values
                    .get(i)
                    .and_then(Value::canonical_text)
                    .unwrap_or_else(|| "NULL".into())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Hasher over typed values: the encoding of every value goes into one
/// buffer, hashed in one call at the end. Feeding xxh3's streaming state
/// four small pieces per field (tag, presence, length, text) and setting up
/// that state per row was 9% of a first backfill's samples; the one-shot
/// hash of the same bytes is the same hash.
struct ValueHasher {
    input: Vec<u8>,
}

impl ValueHasher {
    fn new() -> Self {
        ValueHasher {
            input: Vec::with_capacity(256),
        }
    }

    /// Type tag, then 0 for NULL, or 1, the canonical text's length (u64,
    /// little endian) and the text.
    fn add(&mut self, ty: FieldType, value: &Value) {
        self.input.push(ty.tag());
        if value.is_null() {
            self.input.push(0);
            return;
        }
        self.input.push(1);
        self.add_text(value);
    }

    /// The canonical text's length (u64, little endian), then the text, of
    /// a value that is not NULL.
    fn add_text(&mut self, value: &Value) {
        // The length goes before the text: reserve it, write the text in
        // place, then fill it in.
        let at = self.input.len();
        self.input.extend_from_slice(&[0; 8]);
        value.write_canonical(&mut ByteWriter(&mut self.input));
        let len = (self.input.len() - at - 8) as u64;
        self.input[at..at + 8].copy_from_slice(&len.to_le_bytes());
    }

    fn finish(&self) -> Hash128 {
        Hash128(xxh3_128(&self.input))
    }
}

/// Lets `write!` append UTF-8 text to a byte buffer.
struct ByteWriter<'a>(&'a mut Vec<u8>);

impl fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The row hash: changes exactly when some typed value of the row changes,
/// and is the same for a NULL column as for no such column. Each non-NULL
/// value, in name order, adds its column's tag (see [`RowShape`]), its
/// canonical text's length (u64, little endian) and the text.
pub fn row_hash(shape: &RowShape, values: &[Value]) -> Hash128 {
    let mut hasher = ValueHasher::new();
    for (i, tag) in &shape.by_name {
        let Some(value) = values.get(*i).filter(|v| !v.is_null()) else {
            continue;
        };
        hasher.input.extend_from_slice(tag);
        hasher.add_text(value);
    }
    hasher.finish()
}

/// The natural-key hash: identifies an entity within a run key.
pub fn key_hash<'a>(parts: impl IntoIterator<Item = (FieldType, &'a Value)>) -> Hash128 {
    let mut hasher = ValueHasher::new();
    for (ty, value) in parts {
        hasher.add(ty, value);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (RowShape, Vec<Value>) {
        (
            RowShape::new([
                ("id", FieldType::Text),
                ("n", FieldType::Int),
                ("amount", FieldType::Decimal),
                ("at", FieldType::Timestamptz),
                ("ok", FieldType::Bool),
            ]),
            vec![
                Value::Text("A-1".into()),
                Value::Int(42),
                Value::Decimal(Decimal::from_str("10.50").unwrap().normalize()),
                Value::Timestamptz(
                    DateTime::parse_from_rfc3339("2024-01-01T10:00:00+02:00")
                        .unwrap()
                        .with_timezone(&Utc),
                ),
                Value::Null,
            ],
        )
    }

    fn columns(columns: &[(&str, FieldType)]) -> RowShape {
        RowShape::new(columns.iter().copied())
    }

    #[test]
    fn row_hash_is_pinned() {
        // If this fails, every stored row would look changed after an upgrade.
        let (shape, values) = sample();
        assert_eq!(
            row_hash(&shape, &values).to_hex(),
            "6cd979281cf6b2b17674cf837458587b"
        );
    }

    #[test]
    fn row_hash_of_long_values_is_pinned() {
        // Lengths over 255 bytes take more than one byte of the length
        // prefix, for text and for a value written in canonical form.
        let long = "x".repeat(300);
        let json = serde_json::json!({ "note": long.clone(), "n": [1, 2, 3] });
        let shape = columns(&[
            ("t", FieldType::Text),
            ("j", FieldType::Json),
            ("d", FieldType::Date),
        ]);
        let values = [Value::Text(long), Value::Json(json), Value::Null];
        assert_eq!(
            row_hash(&shape, &values).to_hex(),
            "f724dcfbae2f31b8bd6d615c9b7cbe74"
        );
    }

    #[test]
    fn key_hash_is_pinned() {
        // Unchanged since the first release: `_tm_batches` of unfinished
        // runs hold key hashes, and stored keys are hashed again on read.
        let values = [Value::Text("A-1".into()), Value::Int(42), Value::Null];
        let hash = key_hash([
            (FieldType::Text, &values[0]),
            (FieldType::Int, &values[1]),
            (FieldType::Date, &values[2]),
        ]);
        assert_eq!(hash.to_hex(), "27ad4082dc18ef834ca5a595b99a8a28");
    }

    #[test]
    fn a_null_column_hashes_as_if_it_were_absent() {
        // A nullable column added to `[fields]` (anywhere) leaves the hash
        // of a row without a value for it as it was: history is not
        // rewritten when the table gains the column.
        let (before, values) = sample();
        let base = row_hash(&before, &values);
        let added = columns(&[
            ("id", FieldType::Text),
            ("note", FieldType::Text),
            ("n", FieldType::Int),
            ("amount", FieldType::Decimal),
            ("at", FieldType::Timestamptz),
            ("ok", FieldType::Bool),
        ]);
        let mut with_null = values.clone();
        with_null.insert(1, Value::Null);
        assert_eq!(row_hash(&added, &with_null), base);
        let mut with_value = values.clone();
        with_value.insert(1, Value::Text("late".into()));
        assert_ne!(row_hash(&added, &with_value), base);
        // The `ok` column that is NULL in the sample might as well not exist.
        let without_ok = columns(&[
            ("id", FieldType::Text),
            ("n", FieldType::Int),
            ("amount", FieldType::Decimal),
            ("at", FieldType::Timestamptz),
        ]);
        assert_eq!(row_hash(&without_ok, &values[..4]), base);
    }

    #[test]
    fn row_hash_ignores_column_order_but_not_names_or_types() {
        let (shape_a, values) = sample();
        let base = row_hash(&shape_a, &values);
        let reordered = columns(&[
            ("ok", FieldType::Bool),
            ("at", FieldType::Timestamptz),
            ("amount", FieldType::Decimal),
            ("n", FieldType::Int),
            ("id", FieldType::Text),
        ]);
        let mut reversed = values.clone();
        reversed.reverse();
        assert_eq!(row_hash(&reordered, &reversed), base);
        // The same value under another name, or of another type, differs.
        let one = |name, ty| row_hash(&columns(&[(name, ty)]), &[Value::Text("5".into())]);
        assert_ne!(one("a", FieldType::Text), one("b", FieldType::Text));
        assert_ne!(one("a", FieldType::Text), one("a", FieldType::Json));
    }

    #[test]
    fn a_new_row_carries_its_key_and_row_hashes() {
        let (shape, values) = sample();
        let row = Row::new(&shape, &[0, 1], values.clone());
        assert_eq!(row.row_hash, row_hash(&shape, &values));
        let types = shape.types();
        assert_eq!(
            row.key_hash,
            key_hash([(types[0], &values[0]), (types[1], &values[1])])
        );
        assert_eq!(row.values, values);
    }

    #[test]
    fn row_hash_sees_every_change() {
        let (shape, values) = sample();
        let base = row_hash(&shape, &values);
        let mut changed = values.clone();
        changed[1] = Value::Int(43);
        assert_ne!(base, row_hash(&shape, &changed));
        let mut null_vs_empty = values.clone();
        null_vs_empty[0] = Value::Text(String::new());
        let mut null = values.clone();
        null[0] = Value::Null;
        assert_ne!(row_hash(&shape, &null_vs_empty), row_hash(&shape, &null));
        // Shifting text between neighbouring fields changes the hash.
        let two = columns(&[("a", FieldType::Text), ("b", FieldType::Text)]);
        let a = row_hash(&two, &[Value::Text("ab".into()), Value::Text("c".into())]);
        let b = row_hash(&two, &[Value::Text("a".into()), Value::Text("bc".into())]);
        assert_ne!(a, b);
        // Nor can text move between a name and a value.
        let c = row_hash(
            &columns(&[("ab", FieldType::Text)]),
            &[Value::Text("c".into())],
        );
        let d = row_hash(
            &columns(&[("a", FieldType::Text)]),
            &[Value::Text("bc".into())],
        );
        assert_ne!(c, d);
    }

    #[test]
    fn equal_decimals_hash_equal() {
        let a = Value::Decimal(Decimal::from_str("10.50").unwrap().normalize());
        let b = Value::Decimal(Decimal::from_str("10.5").unwrap().normalize());
        let shape = columns(&[("d", FieldType::Decimal)]);
        assert_eq!(row_hash(&shape, &[a]), row_hash(&shape, &[b]));
    }

    #[test]
    fn canonical_text_round_trips() {
        let (shape, values) = sample();
        for (ty, value) in shape.types().iter().zip(&values) {
            if let Some(text) = value.canonical_text() {
                assert_eq!(
                    Value::from_canonical_text(*ty, &text).as_ref(),
                    Some(value),
                    "{ty}"
                );
            }
        }
        let ts = Value::Timestamp(
            NaiveDateTime::parse_from_str("2024-01-02T03:04:05.250", TIMESTAMP_FORMAT).unwrap(),
        );
        assert_eq!(ts.canonical_text().unwrap(), "2024-01-02T03:04:05.250");
        assert_eq!(
            Value::from_canonical_text(FieldType::Timestamp, "2024-01-02T03:04:05.250"),
            Some(ts)
        );
    }

    #[test]
    fn key_sets_work_with_the_folding_hasher() {
        let mut set = KeySet::default();
        assert!(set.insert(Hash128(1 << 70 | 5)));
        assert!(set.insert(Hash128(5)));
        assert!(!set.insert(Hash128(5)));
        assert!(set.contains(&Hash128(1 << 70 | 5)));
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn hex_round_trips() {
        let h = Hash128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(Hash128::from_hex(&h.to_hex()), Some(h));
        assert_eq!(Hash128::from_hex(&h.to_hex().to_uppercase()), Some(h));
        let small = Hash128(0xab);
        assert_eq!(small.to_hex().len(), 32, "zero-padded");
        assert_eq!(Hash128::from_hex(&small.to_hex()), Some(small));
        for not_ours in [
            "",
            "ab",
            "+0000000000000000000000000000000",
            &"g".repeat(32),
            &"0".repeat(33),
        ] {
            assert_eq!(Hash128::from_hex(not_ours), None, "{not_ours:?}");
        }
        // One digit off the hex ranges' edges, at every position.
        for bad in ['/', ':', '@', 'G', '`', 'g', ' ', '\0', '\u{e9}'] {
            for at in 0..32 {
                let mut text = "0".repeat(31);
                text.insert(at, bad);
                let bytes = text.as_bytes();
                assert_eq!(
                    Hash128::from_hex_bytes(&bytes[..32.min(bytes.len())]),
                    None,
                    "{text:?}"
                );
            }
        }
        let mixed = "0123456789abcdefABCDEF0123456789";
        assert_eq!(
            Hash128::from_hex(mixed),
            Some(Hash128(0x0123_4567_89ab_cdef_abcd_ef01_2345_6789))
        );
    }
}
