//! tidemark's transform stage: raw records to typed rows, each with its
//! natural-key hash and row hash.
//!
//! A [`Transformer`] is compiled once per source and period from the
//! pipeline's `[fields]` (selectors, time formats, defaults, `value`
//! templates), then types every record of that run with
//! [`Transformer::transform`]. Configuration mistakes surface as
//! [`Error::Config`] from [`Transformer::new`]; bad data surfaces as
//! [`Error::Validation`] naming the location, the output column and the raw
//! value (truncated to 200 characters). Nothing panics on any input.
//!
//! # Rules
//!
//! **Lookup.** A column reads `from` (default: its own name): a top-level
//! name or CSV column, or an RFC 6901 JSON pointer when it starts with `/`.
//! A `value = "..."` column ignores the record: its template is rendered
//! once (an unset `${ENV}` is a configuration error) and the text is typed
//! like a text cell; secrets are redacted in the messages.
//!
//! **Absent values.** A missing field, JSON `null` and the empty string are
//! all absent, for every type including text, because CSV cannot tell an
//! empty cell from a missing one. An absent value takes the `default` if
//! given, else fails if the field is `required`, else is NULL. A `default`
//! given as a TOML string is read like a text cell (with the column's
//! `format`); a TOML number or boolean like the same JSON value; a TOML date
//! or time in its ISO form; a table or array only for `json`. A default that
//! does not fit its type is a configuration error.
//!
//! **JSON scalars.** A JSON number or boolean is read as its JSON text (the
//! original digits: serde_json keeps them), so `5`, `"5"` and a CSV `5`
//! follow one rule. Arrays and objects are refused except for `json`.
//!
//! **Types.** Surrounding whitespace is ignored for every type but `text`
//! and `json`.
//! - `text`: the string as is; a JSON number or boolean as its JSON text.
//! - `int`: optional sign and digits, no separators. A number with a zero
//!   fraction (`5.0`, `1e3`) is accepted; `5.5`, overflow and booleans are not.
//! - `float`: a finite 64-bit float; `NaN` and infinities are refused.
//! - `decimal`: exact, never through a binary float; at most 28 significant
//!   digits (refused, not rounded, beyond that); `1e3` allowed; normalised,
//!   so `10.50` and `10.5` are the same value and hash alike.
//! - `bool`: `true/false`, `t/f`, `yes/no`, `y/n`, `1/0` in any case; JSON
//!   `true`/`false`/`0`/`1`.
//! - `date`: `format` if given, else `YYYY-MM-DD`.
//! - `timestamp` (naive): `format` if given, else `YYYY-MM-DDTHH:MM:SS[.f]`,
//!   with a space instead of `T`, and/or without seconds.
//! - `timestamptz` (stored in UTC): without `format`, RFC 3339 (a space may
//!   replace the `T`) or one of the naive forms as wall-clock time in the
//!   pipeline's timezone. A `format` without an offset is wall-clock time in
//!   the pipeline's timezone too. A time repeated by a DST fall-back is the
//!   earlier instant; a time skipped by a DST gap is a validation error.
//! - A `format` with an offset (`%z`, `%:z`, `%#z`, `%::z`, `%+`) or epoch
//!   seconds (`%s`) names an instant by itself: `timestamptz` stores it,
//!   while `date` and `timestamp` take its wall clock in the pipeline's
//!   timezone (the table's naive times are all in that timezone).
//! - `json`: a CSV cell is parsed as JSON text; a JSON record's value is
//!   taken as is (a JSON string stays a string).
//!
//! **Keys and hashes.** A NULL natural-key field is a validation error. The
//! key hash covers the key fields in `load.key` order, the row hash every
//! non-NULL column tagged with its name; both come from [`tidemark_core::value`].

#![warn(missing_docs)]
// `tidemark_core::Error` is the one error type every stage returns; its size
// is core's decision, and errors are the cold path here, so the lint about
// large `Err` variants is not actionable in this crate.

mod decimal;
mod parse;
mod plan;

/// One typed row, ready to load. Defined in core so the loader shares it;
/// re-exported here because [`Transformer::transform`] produces it.
pub use tidemark_core::value::Row;

use std::sync::Arc;

use tidemark_core::record::{csv_position, CsvHeaders};
use tidemark_core::template::TemplateContext;
use tidemark_core::{
    Error, FieldType, Hash128, Period, Pipeline, RawData, RawHasher, RawRecord, RawValue, RowShape,
    Value,
};

use crate::parse::Raw;
use crate::plan::{Column, Lookup, Planner};

/// Raw values longer than this are cut in error messages.
const MAX_VALUE_CHARS: usize = 200;

/// The message for a NULL natural-key field.
const EMPTY_KEY: &str = "natural key field is empty";

/// The compiled `[fields]` plan for one source and period.
#[derive(Debug, Clone)]
pub struct Transformer {
    columns: Vec<Column>,
    names: Vec<String>,
    types: Vec<FieldType>,
    shape: RowShape,
    key_indices: Vec<usize>,
    /// What seeds every raw-record hash of this plan ([`RawHasher`]).
    raw_seed: Hash128,
}

/// Bumped whenever typing changes in a way the compiled plan's text does
/// not show, so that raw hashes stored by an earlier build no longer match
/// and every row is typed again once (the package version is in the seed
/// too; this covers changes between releases).
const RAW_HASH_VERSION: u32 = 1;

impl Transformer {
    /// Compiles the `[fields]` plan for one source and period: selectors,
    /// formats, parsed defaults, and `value` templates rendered once (a
    /// template reading an unset `${ENV}` is an [`Error::Config`] naming the
    /// pipeline file and `fields.NAME.value`). A `default` that does not fit
    /// its type is an [`Error::Config`] for `fields.NAME.default`.
    pub fn new(
        pipeline: &Pipeline,
        source_id: &str,
        period: &Period,
    ) -> Result<Transformer, Error> {
        let spec = &pipeline.spec;
        let planner = Planner {
            pipeline,
            ctx: TemplateContext {
                period,
                source_id,
                pipeline: &spec.name,
            },
        };
        let columns = spec
            .fields
            .iter()
            .map(|(name, field)| planner.column(name, field))
            .collect::<Result<Vec<_>, _>>()?;
        let key_indices = spec
            .load
            .key
            .iter()
            .map(|key| {
                spec.fields.get_index_of(key).ok_or_else(|| {
                    Error::config(
                        pipeline.file_name(),
                        "load.key",
                        format!("key field `{key}` is not defined in [fields]"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Transformer {
            raw_seed: raw_seed(&columns, &key_indices),
            names: columns.iter().map(|c| c.name.clone()).collect(),
            types: columns.iter().map(|c| c.parser.ty).collect(),
            shape: RowShape::new(columns.iter().map(|c| (c.name.as_str(), c.parser.ty))),
            columns,
            key_indices,
        })
    }

    /// Column types in table order (the order of `[fields]`).
    pub fn types(&self) -> &[FieldType] {
        &self.types
    }

    /// The columns as the row hash sees them.
    pub fn shape(&self) -> &RowShape {
        &self.shape
    }

    /// Column names in table order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Indices (into the columns) of the natural key, in `load.key` order.
    pub fn key_indices(&self) -> &[usize] {
        &self.key_indices
    }

    /// A hasher of raw records seeded with this plan: see [`RawHasher`].
    pub fn raw_hasher(&self) -> RawHasher {
        RawHasher::new(self.raw_seed)
    }

    /// The natural-key hash of a record, typing only the key's columns
    /// (what finds the stored row before the rest is typed); `None` when a
    /// key column does not type, is empty, or the record is malformed: the
    /// full typing then reports it. Equal to the [`Row::key_hash`] that
    /// [`Transformer::transform_noting`] would give, by the same steps.
    pub fn key_hash_of(&self, record: &RawRecord, presence: &mut Presence) -> Option<Hash128> {
        if record.decode_error().is_some() {
            return None;
        }
        let positions = record
            .csv_headers()
            .map(|headers| presence.csv_positions(headers, &self.columns));
        let from_csv = positions.is_some();
        let mut values = Vec::with_capacity(self.key_indices.len());
        for &i in &self.key_indices {
            let column = self.columns.get(i)?;
            let position = positions.and_then(|p| p.get(i).copied());
            let value = column_value(column, record, from_csv, None, position).ok()?;
            if value.is_null() {
                return None;
            }
            values.push((*self.types.get(i)?, value));
        }
        Some(tidemark_core::value::key_hash(
            values.iter().map(|(ty, v)| (*ty, v)),
        ))
    }

    /// Types one raw record. A row the reader could not decode fails with
    /// the reader's error, so it is rejected like any invalid row.
    pub fn transform(&self, record: &RawRecord) -> Result<Row, Error> {
        self.typed(record, None, None)
    }

    /// An empty [`Presence`] for one batch.
    pub fn presence(&self) -> Presence {
        Presence {
            held: vec![false; self.columns.len()],
            json_records: 0,
            csv: None,
        }
    }

    /// [`Transformer::transform`], noting in `presence` which fields a JSON
    /// record holds. The lookup is the one typing does, so noting costs a
    /// flag per cell.
    pub fn transform_noting(
        &self,
        record: &RawRecord,
        presence: &mut Presence,
    ) -> Result<Row, Error> {
        if let Some(headers) = record.csv_headers() {
            let positions = presence.csv_positions(headers, &self.columns);
            return self.typed(record, None, Some(positions));
        }
        if !matches!(record.data, RawData::Json(_)) {
            return self.typed(record, None, None);
        }
        presence.json_records += 1;
        self.typed(record, Some(&mut presence.held), None)
    }

    /// The fields no JSON record of a batch held, among those that read the
    /// input, are not `required` (a missing required field fails its
    /// record already) and that the period's exports may not lack
    /// (`added`: a record without the key is an older export's). Empty when the batch had no JSON record: a CSV
    /// header is checked whole instead (source drift is an error there).
    pub fn absent_fields(&self, presence: &Presence) -> Vec<&str> {
        if presence.json_records == 0 {
            return Vec::new();
        }
        self.columns
            .iter()
            .zip(&presence.held)
            .filter(|(c, held)| {
                !**held && !c.required && !c.may_lack && matches!(c.lookup, Lookup::Field(_))
            })
            .map(|(c, _)| c.name.as_str())
            .collect()
    }

    /// `positions`: where each column is in the record's CSV header row,
    /// found once per header row; else each cell is looked up by name.
    fn typed(
        &self,
        record: &RawRecord,
        mut held: Option<&mut Vec<bool>>,
        positions: Option<&[Option<usize>]>,
    ) -> Result<Row, Error> {
        if let Some(error) = record.decode_error() {
            return Err(error.clone());
        }
        let from_csv = matches!(record.data, RawData::Csv { .. });
        let values = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, column)| {
                let flag = held.as_deref_mut().and_then(|h| h.get_mut(i));
                let position = positions.and_then(|p| p.get(i).copied());
                column_value(column, record, from_csv, flag, position)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for &i in &self.key_indices {
            if !matches!(values.get(i), Some(v) if !v.is_null()) {
                let name = self.names.get(i).map_or("", String::as_str);
                return Err(invalid(record, name, "", EMPTY_KEY));
            }
        }
        Ok(Row::new(&self.shape, &self.key_indices, values))
    }
}

/// The seed of a plan's raw hashes: the compiled columns as their debug
/// text (names, selectors, types, formats, the timezone, defaults,
/// `required`, `value` constants as rendered for this period), the key,
/// the package version and [`RAW_HASH_VERSION`]. Any change to them
/// changes every raw hash; the text is never stored, only its hash, so a
/// different rendering in another build only costs one re-typing.
fn raw_seed(columns: &[Column], key_indices: &[usize]) -> Hash128 {
    let text = format!(
        "tidemark {} raw {RAW_HASH_VERSION}\n{columns:?}\n{key_indices:?}",
        env!("CARGO_PKG_VERSION")
    );
    Hash128(xxhash_rust::xxh3::xxh3_128(text.as_bytes()))
}

/// Which fields the JSON records of one batch held: in JSON and NDJSON an
/// absent field is normal, so a field renamed upstream shows only as a
/// field that no record of a batch has (see [`Transformer::absent_fields`]).
#[derive(Debug, Clone)]
pub struct Presence {
    /// Per column: some record held the field (even as `null`).
    held: Vec<bool>,
    json_records: u64,
    /// The CSV header row the batch's records share, and where each
    /// column is in it.
    csv: Option<(CsvHeaders, Vec<Option<usize>>)>,
}

impl Presence {
    /// Where each column is in `headers`: found once per header row.
    fn csv_positions(&mut self, headers: &CsvHeaders, columns: &[Column]) -> &[Option<usize>] {
        let known = matches!(&self.csv, Some((h, _)) if Arc::ptr_eq(h, headers));
        if !known {
            let positions = columns
                .iter()
                .map(|c| match &c.lookup {
                    Lookup::Field(selector) => csv_position(headers, selector),
                    Lookup::Constant(_) => None,
                })
                .collect();
            self.csv = Some((Arc::clone(headers), positions));
        }
        self.csv.as_ref().map_or(&[], |(_, p)| p.as_slice())
    }
}

/// Reads and types one column of one record, setting `held` when the
/// record has the field. `position`: the column's place in the record's CSV
/// header row, when known.
fn column_value(
    column: &Column,
    record: &RawRecord,
    from_csv: bool,
    held: Option<&mut bool>,
    position: Option<Option<usize>>,
) -> Result<Value, Error> {
    let selector = match &column.lookup {
        Lookup::Constant(value) => return Ok(value.clone()),
        Lookup::Field(selector) => selector,
    };
    let found = match position {
        Some(position) => record.csv_cell_at(position),
        None => record.get(selector),
    };
    if let Some(held) = held {
        *held |= !matches!(found, RawValue::Missing);
    }
    let raw = match found {
        RawValue::Missing | RawValue::Str("") | RawValue::Json(serde_json::Value::Null) => {
            return column
                .absent()
                .map_err(|m| invalid(record, &column.name, "", m));
        }
        RawValue::Str(s) if from_csv => Raw::Text(s),
        RawValue::Str(s) => Raw::JsonString(s),
        RawValue::Json(v) => Raw::Json(v),
    };
    column.parser.parse(raw).map_err(|message| {
        let text = match found {
            RawValue::Str(s) => s.to_string(),
            RawValue::Json(v) => v.to_string(),
            RawValue::Missing => String::new(),
        };
        invalid(record, &column.name, &text, message)
    })
}

/// A validation error at `record`'s origin.
fn invalid(record: &RawRecord, field: &str, value: &str, message: impl Into<String>) -> Error {
    Error::Validation {
        location: record.origin.location(),
        field: field.to_string(),
        value: excerpt(value),
        message: message.into(),
    }
}

/// At most [`MAX_VALUE_CHARS`] characters, ending in `…` when cut: an error
/// must show the value, not a megabyte of it.
fn excerpt(value: &str) -> String {
    match value.char_indices().nth(MAX_VALUE_CHARS) {
        None => value.to_string(),
        Some(_) => {
            let cut = value
                .char_indices()
                .nth(MAX_VALUE_CHARS - 1)
                .map_or(value.len(), |(i, _)| i);
            format!("{}…", &value[..cut])
        }
    }
}

#[cfg(test)]
mod tests;
