//! Compiling `[fields]` into a per-column plan, once per source and period.
//!
//! Everything that can be decided without seeing a record is decided here:
//! selectors, time formats, defaults and `value` templates. A mistake in
//! any of them is a configuration error before the first record is read,
//! not a validation error on every row.

use tidemark_core::spec::FieldSpec;
use tidemark_core::template::{Template, TemplateContext};
use tidemark_core::{Error, FieldType, Pipeline, Selector, Value};

use crate::parse::{Parser, Raw, TimeFormat};

/// Where a column's value comes from.
#[derive(Debug, Clone)]
pub(crate) enum Lookup {
    /// A field of the record (`from`, or the column name).
    Field(Selector),
    /// A `value` template, rendered and typed once.
    Constant(Value),
}

/// One output column, ready to type records.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) lookup: Lookup,
    pub(crate) parser: Parser,
    pub(crate) default: Option<Value>,
    pub(crate) required: bool,
    /// The period's exports may lack the field (`added`, or new to the
    /// period): its absence is expected, not worth a warning.
    pub(crate) may_lack: bool,
}

/// The message for a required field without a value.
pub(crate) const REQUIRED: &str = "required field is missing";

impl Column {
    /// The value of an absent (missing, null or empty) input: the default,
    /// else NULL unless the field is required.
    pub(crate) fn absent(&self) -> Result<Value, &'static str> {
        match &self.default {
            Some(value) => Ok(value.clone()),
            None if self.required => Err(REQUIRED),
            None => Ok(Value::Null),
        }
    }
}

/// Compiles columns of one pipeline for one template context.
pub(crate) struct Planner<'a> {
    pub(crate) pipeline: &'a Pipeline,
    pub(crate) ctx: TemplateContext<'a>,
}

impl Planner<'_> {
    fn config(&self, name: &str, key: &str, message: impl Into<String>) -> Error {
        Error::config(
            self.pipeline.file_name(),
            format!("fields.{name}.{key}"),
            message,
        )
    }

    /// Compiles one `[fields]` entry.
    pub(crate) fn column(&self, name: &str, spec: &FieldSpec) -> Result<Column, Error> {
        let format = match &spec.format {
            Some(text) => Some(TimeFormat::new(text).map_err(|m| self.config(name, "format", m))?),
            None => None,
        };
        let parser = Parser {
            ty: spec.ty,
            format,
            tz: self.pipeline.spec.period.timezone,
        };
        let default = match &spec.default {
            Some(d) => Some(default_value(&parser, d).map_err(|m| {
                self.config(
                    name,
                    "default",
                    format!("{d} does not fit type {}: {m}", spec.ty),
                )
            })?),
            None => None,
        };
        let mut column = Column {
            name: name.to_string(),
            lookup: Lookup::Field(Selector::parse(spec.from.as_deref().unwrap_or(name))),
            parser,
            default,
            required: spec.required,
            may_lack: self.pipeline.may_lack(name, self.ctx.period),
        };
        if let Some(template) = &spec.value {
            column.lookup = Lookup::Constant(self.constant(&column, template)?);
        }
        Ok(column)
    }

    /// Renders a `value` template and types the text like a text cell.
    /// Messages show the redacted rendering, so an `${ENV}` secret used in
    /// a value never reaches an error.
    fn constant(&self, column: &Column, text: &str) -> Result<Value, Error> {
        let name = column.name.as_str();
        let template = Template::parse(text).map_err(|m| self.config(name, "value", m))?;
        let rendered = template
            .render(&self.ctx)
            .map_err(|e| self.config(name, "value", e.to_string()))?;
        let shown = if template.uses_env() {
            template.render_redacted(&self.ctx)
        } else {
            rendered.clone()
        };
        if rendered.is_empty() {
            return column.absent().map_err(|_| {
                self.config(
                    name,
                    "value",
                    "renders to an empty text, but the field is required",
                )
            });
        }
        column
            .parser
            .parse(Raw::Text(&rendered))
            .map_err(|m| self.config(name, "value", format!("renders to {shown:?}: {m}")))
    }
}

/// Types a TOML `default`. Strings are read like a text cell (with the
/// column's `format`); numbers and booleans like the same JSON value; TOML
/// dates and times in their ISO form; tables and arrays only for `json`.
fn default_value(parser: &Parser, default: &toml::Value) -> Result<Value, String> {
    use serde_json::Value as J;
    match default {
        toml::Value::String(s) => parser.parse(Raw::Text(s)),
        toml::Value::Datetime(d) if parser.ty == FieldType::Json => {
            Ok(Value::Json(J::String(d.to_string())))
        }
        toml::Value::Datetime(d) => Parser {
            format: None,
            ..parser.clone()
        }
        .parse(Raw::Text(&d.to_string())),
        toml::Value::Array(_) | toml::Value::Table(_) if parser.ty != FieldType::Json => {
            Err(format!(
                "a TOML {} cannot be a {} value",
                default.type_str(),
                parser.ty
            ))
        }
        other => {
            let json = toml_to_json(other)?;
            parser.parse(Raw::Json(&json))
        }
    }
}

/// TOML → JSON, for `json` defaults and for numbers and booleans.
fn toml_to_json(value: &toml::Value) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    Ok(match value {
        toml::Value::String(s) => J::String(s.clone()),
        toml::Value::Integer(i) => J::Number((*i).into()),
        toml::Value::Float(f) => {
            J::Number(serde_json::Number::from_f64(*f).ok_or("not a finite number")?)
        }
        toml::Value::Boolean(b) => J::Bool(*b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(items) => {
            J::Array(items.iter().map(toml_to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(table) => J::Object(
            table
                .iter()
                .map(|(k, v)| Ok((k.clone(), toml_to_json(v)?)))
                .collect::<Result<_, String>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;
    use chrono_tz::Europe::Berlin;
    use rust_decimal::Decimal;
    use std::str::FromStr;

    fn parser(ty: FieldType, format: Option<&str>) -> Parser {
        Parser {
            ty,
            format: format.map(|f| TimeFormat::new(f).expect("format")),
            tz: Berlin,
        }
    }

    fn default_of(ty: FieldType, toml_value: &str) -> Result<Value, String> {
        default_with(parser(ty, None), toml_value)
    }

    fn default_with(parser: Parser, toml_value: &str) -> Result<Value, String> {
        let table: toml::Table = toml::from_str(&format!("v = {toml_value}")).expect("toml");
        default_value(&parser, &table["v"])
    }

    #[test]
    fn scalar_defaults_convert_to_the_column_type() {
        assert_eq!(default_of(FieldType::Int, "5"), Ok(Value::Int(5)));
        assert_eq!(default_of(FieldType::Int, "5.0"), Ok(Value::Int(5)));
        assert_eq!(default_of(FieldType::Int, "\" 5 \""), Ok(Value::Int(5)));
        assert!(default_of(FieldType::Int, "5.5").is_err());
        assert_eq!(default_of(FieldType::Float, "5"), Ok(Value::Float(5.0)));
        assert!(default_of(FieldType::Float, "nan").is_err());
        assert_eq!(
            default_of(FieldType::Decimal, "0.1"),
            Ok(Value::Decimal(Decimal::from_str("0.1").expect("d")))
        );
        assert_eq!(
            default_of(FieldType::Decimal, "\"0.10\""),
            Ok(Value::Decimal(Decimal::from_str("0.1").expect("d")))
        );
        assert_eq!(default_of(FieldType::Bool, "false"), Ok(Value::Bool(false)));
        assert_eq!(default_of(FieldType::Bool, "1"), Ok(Value::Bool(true)));
        assert_eq!(
            default_of(FieldType::Text, "42"),
            Ok(Value::Text("42".into()))
        );
        assert_eq!(
            default_of(FieldType::Text, "\"\""),
            Ok(Value::Text(String::new()))
        );
        assert!(default_of(FieldType::Text, "[1]")
            .unwrap_err()
            .contains("array"));
    }

    #[test]
    fn time_and_json_defaults() {
        let day = Value::Date(NaiveDate::from_ymd_opt(2024, 1, 2).expect("date"));
        assert_eq!(default_of(FieldType::Date, "2024-01-02"), Ok(day.clone()));
        assert_eq!(
            default_with(parser(FieldType::Date, Some("%d.%m.%Y")), "\"02.01.2024\""),
            Ok(day.clone())
        );
        // A TOML date literal is ISO whatever the column's input format.
        assert_eq!(
            default_with(parser(FieldType::Date, Some("%d.%m.%Y")), "2024-01-02"),
            Ok(day)
        );
        assert!(default_of(FieldType::Date, "\"tomorrow\"").is_err());
        assert_eq!(
            default_of(FieldType::Json, "{ a = 1, b = [true, \"x\"] }"),
            Ok(Value::Json(serde_json::json!({"a": 1, "b": [true, "x"]})))
        );
        assert_eq!(
            default_of(FieldType::Json, "\"[1, 2]\""),
            Ok(Value::Json(serde_json::json!([1, 2])))
        );
    }
}
