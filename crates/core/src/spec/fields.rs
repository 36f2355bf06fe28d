//! `[fields]`: the output columns, each with its type, where its value
//! comes from, and `added` (the periods whose exports may lack it).
//!
//! Separate because a field is the unit of schema evolution: `added`
//! reaches past parsing into which periods may lack a column, and the
//! checks tie each field to the key, the period and its own format.

use std::fmt;

use schemars::JsonSchema;
use serde::Deserialize;

use super::check::Checker;
use super::{Pipeline, PipelineSpec};
use crate::error::Error;
use crate::period::Period;
use crate::value::FieldType;

/// One `[fields]` entry.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Column type.
    #[serde(rename = "type")]
    pub ty: FieldType,
    /// Input field name, or a JSON pointer (`/customer/id`). Default: the column name.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub from: Option<String>,
    /// strftime-style format for date/timestamp/timestamptz input.
    #[serde(default)]
    pub format: Option<String>,
    /// A missing, null or empty value is an error.
    #[serde(default)]
    pub required: bool,
    /// Used when the input value is missing, null or empty.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::any_value")]
    pub default: Option<toml::Value>,
    /// A constant or templated value instead of reading the input.
    #[serde(default)]
    pub value: Option<String>,
    /// The field was added after periods were loaded, so older exports may
    /// lack its column: `true` (any period), or the first period whose
    /// exports have it (`"2024-03-01"`; earlier periods may lack it, later
    /// ones may not). Where it applies, a CSV header without the column is
    /// not source drift and the field loads as NULL or its `default`.
    #[serde(default)]
    pub added: Added,
}

/// `fields.NAME.added`: which periods' exports may lack the field's column
/// (schema evolution, not source drift; see the README "When the source
/// changes").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Added {
    /// Not declared: every export must have the column (`false`).
    #[default]
    No,
    /// Any period's export may lack it (`true`).
    Any,
    /// Exports of periods before this one may lack it; from this period on
    /// the column is required like any other (`"2024-03-01"`).
    From(String),
}

impl<'de> Deserialize<'de> for Added {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Added, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Added;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "true, false, or the first period whose exports have the column as a string, such as \"2024-03-01\"",
                )
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Added, E> {
                Ok(if v { Added::Any } else { Added::No })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Added, E> {
                Ok(Added::From(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Pipeline {
    /// Whether `period`'s exports may lack the column of field `name`
    /// (`fields.NAME.added`): then a CSV header without it is not drift.
    pub fn may_lack(&self, name: &str, period: &Period) -> bool {
        let Some(field) = self.spec.fields.get(name) else {
            return false;
        };
        match &field.added {
            Added::No => false,
            Added::Any => true,
            Added::From(text) => Period::parse(
                text,
                self.spec.period.granularity,
                self.spec.period.timezone,
            )
            .is_ok_and(|first| period.start() < first.start()),
        }
    }

    /// This pipeline as one period reads it when `fields` are new to that
    /// period (the ledger saw the period before they existed, see
    /// [`crate::FieldsFingerprint::carry`]): each of them read as if
    /// declared `added = true`, whatever the file says.
    pub fn with_new_fields(&self, fields: &[String]) -> Pipeline {
        let mut pipeline = self.clone();
        for name in fields {
            if let Some(field) = pipeline.spec.fields.get_mut(name) {
                field.added = Added::Any;
            }
        }
        pipeline
    }
}

impl Checker<'_> {
    pub(super) fn fields(&self, spec: &PipelineSpec) -> Result<(), Error> {
        if spec.fields.is_empty() {
            return Err(self.err("fields", "at least one field is required"));
        }
        for (i, (name, field)) in spec.fields.iter().enumerate() {
            let at = |k: &str| format!("fields.{name}.{k}");
            self.column_name(&format!("fields.{name}"), name)?;
            self.distinct_column(&spec.fields, i, name)?;
            if let Some(value) = &field.value {
                self.template(&at("value"), value)?;
                if field.from.is_some() {
                    return Err(self.err(at("value"), "give either `value` or `from`, not both"));
                }
            }
            if let Some(from) = &field.from {
                if from.is_empty() {
                    return Err(self.err(at("from"), "must not be empty"));
                }
            }
            self.added(spec, name, field)?;
            if let Some(format) = &field.format {
                if !matches!(
                    field.ty,
                    FieldType::Date | FieldType::Timestamp | FieldType::Timestamptz
                ) {
                    return Err(self.err(
                        at("format"),
                        format!("`format` applies to date and time types, not {}", field.ty),
                    ));
                }
                if chrono::format::StrftimeItems::new(format)
                    .any(|i| matches!(i, chrono::format::Item::Error))
                {
                    return Err(self.err(at("format"), format!("invalid time format {format:?}")));
                }
            }
        }
        Ok(())
    }

    /// `fields.NAME.added`: a field older exports may lack must be able to
    /// be absent: it reads the input, is not part of the key, and is not
    /// `required` unless a `default` stands in; its period must parse.
    fn added(&self, spec: &PipelineSpec, name: &str, field: &FieldSpec) -> Result<(), Error> {
        let key = format!("fields.{name}.added");
        if field.added == Added::No {
            return Ok(());
        }
        if field.value.is_some() {
            return Err(self.err(
                key,
                "a `value` field reads no column, so no export can lack it; remove `added`",
            ));
        }
        if spec.load.key.iter().any(|k| k == name) {
            return Err(self.err(key, format!("`{name}` is part of load.key: a key field cannot be NULL, so its column cannot be absent from any export")));
        }
        if field.required && field.default.is_none() {
            return Err(self.err(key, "a `required` field without a `default` would reject every row of an export that lacks the column; give it a `default` or drop `required`"));
        }
        if let Added::From(text) = &field.added {
            Period::parse(text, spec.period.granularity, spec.period.timezone).map_err(|e| {
                self.err(
                    key,
                    format!("{e}; give the first period whose exports have the column (\"2024-03-01\"), or true for any period"),
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::period::Granularity;
    use crate::spec::tests::{config_err, parse, GOOD};

    #[test]
    fn added_says_which_periods_may_lack_a_column_and_is_checked() {
        let day =
            |text: &str| Period::parse(text, Granularity::Day, chrono_tz::Europe::Berlin).unwrap();
        let with = |added: &str| {
            GOOD.replace(
                "amount = { type = \"decimal\", from = \"total\" }",
                &format!("amount = {{ type = \"decimal\", from = \"total\", added = {added} }}"),
            )
        };
        let p = parse(&with("\"2024-03-01\"")).unwrap();
        assert!(p.may_lack("amount", &day("2024-02-29")));
        assert!(!p.may_lack("amount", &day("2024-03-01")));
        assert!(!p.may_lack("order_id", &day("2024-02-29")));
        assert!(parse(&with("true"))
            .unwrap()
            .may_lack("amount", &day("2030-01-01")));
        assert!(!parse(&with("false"))
            .unwrap()
            .may_lack("amount", &day("2020-01-01")));
        assert!(!parse(GOOD).unwrap().may_lack("amount", &day("2020-01-01")));
        let view = parse(GOOD).unwrap().with_new_fields(&["amount".into()]);
        assert!(view.may_lack("amount", &day("2030-01-01")));

        let (key, message) = config_err(&with("\"March\""));
        assert_eq!(key, "fields.amount.added");
        assert!(
            message.contains("first period whose exports have the column"),
            "{message}"
        );
        let (_, message) = config_err(&with("3"));
        assert!(
            message.contains("true, false, or the first period"),
            "{message}"
        );
        let keyed = GOOD.replace(
            "order_id = { type = \"text\", required = true }",
            "order_id = { type = \"text\", added = true }",
        );
        let (key, message) = config_err(&keyed);
        assert_eq!(key, "fields.order_id.added");
        assert!(message.contains("load.key"), "{message}");
        let required =
            with("true").replace("from = \"total\",", "from = \"total\", required = true,");
        let (key, message) = config_err(&required);
        assert_eq!(key, "fields.amount.added");
        assert!(message.contains("default"), "{message}");
        assert!(
            parse(&required.replace("required = true,", "required = true, default = 0,")).is_ok()
        );
        let valued = GOOD.replace(
            "value = \"{source.id}\"",
            "value = \"{source.id}\", added = true",
        );
        assert_eq!(config_err(&valued).0, "fields.region.added");
    }
}
