//! Transformer-level tests: pipelines from TOML text, records as extract
//! hands them over. Per-type parsing edge cases live in `parse.rs`.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde_json::json;
use tidemark_core::{value, ErrorClass, Location, Origin};

use super::*;

const FILE: &str = "pipelines/t.toml";

fn pipeline(fields: &str, key: &str) -> Pipeline {
    let text = format!(
        r#"
name = "orders"
export_type = "orders_daily"

[period]
granularity = "day"
timezone = "Europe/Berlin"

[[sources]]
id = "shop_eu"
transport = "file"
format = "csv"
path = "exports/*.csv"

[fields]
{fields}

[load]
table = "orders"
key = {key}
"#
    );
    Pipeline::parse(&text, Path::new(FILE)).expect("test pipeline")
}

fn transformer(fields: &str, key: &str) -> Result<Transformer, Error> {
    let p = pipeline(fields, key);
    let period = p.period("2024-03-07").expect("period");
    Transformer::new(&p, "shop_eu", &period)
}

fn origin(record: u64) -> Origin {
    Origin {
        resource: Arc::from("exports/a.csv"),
        page: None,
        record,
        line: Some(record + 1),
    }
}

fn csv(headers: &[&str], row: &[&str]) -> RawRecord {
    RawRecord {
        data: RawData::Csv {
            headers: Arc::new(csv::StringRecord::from(headers.to_vec())),
            row: csv::StringRecord::from(row.to_vec()),
        },
        origin: origin(3),
    }
}

fn json_record(value: serde_json::Value) -> RawRecord {
    RawRecord {
        data: RawData::Json(value),
        origin: Origin {
            resource: Arc::from("https://api.example/orders"),
            page: Some(2),
            record: 5,
            line: None,
        },
    }
}

fn dec(s: &str) -> Value {
    Value::Decimal(Decimal::from_str(s).expect("decimal"))
}

fn utc(s: &str) -> Value {
    Value::Timestamptz(
        DateTime::parse_from_rfc3339(s)
            .expect("rfc3339")
            .with_timezone(&Utc),
    )
}

/// (field, value, message) of a validation error, after checking its location.
fn validation(err: Error, location: &Location) -> (String, String, String) {
    match err {
        Error::Validation {
            location: at,
            field,
            value,
            message,
        } => {
            assert_eq!(&at, location);
            (field, value, message)
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
}

fn config(err: Error) -> (String, String) {
    match err {
        Error::Config { file, key, message } => {
            assert_eq!(file, FILE);
            (key, message)
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

const ORDERS: &str = r#"
order_id   = { type = "text", required = true }
amount     = { type = "decimal", from = "total" }
qty        = { type = "int" }
paid       = { type = "bool" }
created_at = { type = "timestamptz", format = "%d.%m.%Y %H:%M" }
"#;

const ORDER_HEADERS: [&str; 5] = ["order_id", "total", "qty", "paid", "created_at"];

#[test]
fn types_a_csv_record_in_table_order() {
    let t = transformer(ORDERS, r#"["order_id"]"#).expect("transformer");
    assert_eq!(
        t.types(),
        [
            FieldType::Text,
            FieldType::Decimal,
            FieldType::Int,
            FieldType::Bool,
            FieldType::Timestamptz
        ]
    );
    assert_eq!(
        t.names(),
        ["order_id", "amount", "qty", "paid", "created_at"]
    );
    assert_eq!(t.key_indices(), [0]);
    let row = t
        .transform(&csv(
            &ORDER_HEADERS,
            &["A-1", "10.50", " 3 ", "yes", "07.03.2024 13:45"],
        ))
        .expect("row");
    assert_eq!(
        row.values,
        [
            Value::Text("A-1".into()),
            dec("10.5"),
            Value::Int(3),
            Value::Bool(true),
            utc("2024-03-07T12:45:00Z"),
        ]
    );
    assert_eq!(row.row_hash, value::row_hash(t.shape(), &row.values));
    assert_eq!(
        row.key_hash,
        value::key_hash([(FieldType::Text, &Value::Text("A-1".into()))])
    );
}

#[test]
fn key_indices_follow_load_key_order() {
    let fields = r#"
a = { type = "text" }
b = { type = "int" }
c = { type = "text" }
"#;
    let t = transformer(fields, r#"["c", "a"]"#).expect("transformer");
    assert_eq!(t.key_indices(), [2, 0]);
    let row = t
        .transform(&csv(&["a", "b", "c"], &["x", "1", "y"]))
        .expect("row");
    let swapped = t
        .transform(&csv(&["a", "b", "c"], &["y", "1", "x"]))
        .expect("row");
    let expected = value::key_hash([
        (FieldType::Text, &Value::Text("y".into())),
        (FieldType::Text, &Value::Text("x".into())),
    ]);
    assert_eq!(row.key_hash, expected);
    assert_ne!(row.key_hash, swapped.key_hash);
}

#[test]
fn equal_decimals_hash_equal_and_changes_do_not() {
    let t = transformer(ORDERS, r#"["order_id"]"#).expect("transformer");
    let row = |total: &str| {
        t.transform(&csv(
            &ORDER_HEADERS,
            &["A-1", total, "3", "no", "07.03.2024 13:45"],
        ))
        .expect("row")
    };
    assert_eq!(row("10.50").row_hash, row("10.5").row_hash);
    assert_eq!(row("10.50"), row("10.500"));
    assert_ne!(row("10.50").row_hash, row("10.51").row_hash);
    assert_eq!(row("10.50").key_hash, row("10.51").key_hash);
}

#[test]
fn errors_name_location_field_and_value() {
    let t = transformer(ORDERS, r#"["order_id"]"#).expect("transformer");
    let err = t
        .transform(&csv(
            &ORDER_HEADERS,
            &["A-1", "12,x", "3", "no", "07.03.2024 13:45"],
        ))
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Validation);
    assert_eq!(
        err.to_string(),
        "exports/a.csv row 3 (line 4): field `amount`: not a decimal: \"12,x\""
    );

    let loc = origin(3).location();
    let err = t
        .transform(&csv(
            &ORDER_HEADERS,
            &["A-1", "1", "3.5", "no", "07.03.2024 13:45"],
        ))
        .unwrap_err();
    let (field, value, message) = validation(err, &loc);
    assert_eq!((field.as_str(), value.as_str()), ("qty", "3.5"));
    assert!(message.starts_with("not an integer"), "{message}");

    let err = t
        .transform(&csv(
            &ORDER_HEADERS,
            &["A-1", "1", "3", "maybe", "07.03.2024 13:45"],
        ))
        .unwrap_err();
    assert_eq!(validation(err, &loc).0, "paid");

    let err = t
        .transform(&csv(
            &ORDER_HEADERS,
            &["A-1", "1", "3", "no", "2024-03-07 13:45"],
        ))
        .unwrap_err();
    let (field, value, message) = validation(err, &loc);
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("created_at", "2024-03-07 13:45")
    );
    assert_eq!(message, "does not match format \"%d.%m.%Y %H:%M\"");
}

#[test]
fn long_values_are_cut_in_errors() {
    let t = transformer(r#"n = { type = "int" }"#, r#"["n"]"#).expect("transformer");
    let long = "ä".repeat(500);
    let err = t.transform(&csv(&["n"], &[&long])).unwrap_err();
    let (_, value, _) = validation(err, &origin(3).location());
    assert_eq!(value.chars().count(), MAX_VALUE_CHARS);
    assert!(value.ends_with('…'));
    assert_eq!(excerpt("short"), "short");
    assert_eq!(excerpt(&"x".repeat(200)), "x".repeat(200));
}

#[test]
fn absent_values_are_null_default_or_required_errors() {
    let fields = r#"
id       = { type = "int", required = true }
note     = { type = "text" }
qty      = { type = "int", default = 1 }
price    = { type = "decimal", default = "0.00" }
currency = { type = "text", default = "EUR" }
"#;
    let t = transformer(fields, r#"["id"]"#).expect("transformer");
    let defaults = [
        Value::Null,
        Value::Int(1),
        dec("0"),
        Value::Text("EUR".into()),
    ];
    // Missing column, empty CSV cell, JSON null and missing JSON field are all absent.
    let row = t
        .transform(&csv(&["id", "note", "qty", "price"], &["7", "", "", ""]))
        .expect("row");
    assert_eq!(row.values[1..], defaults);
    let row = t
        .transform(&json_record(
            json!({"id": 7, "note": null, "qty": null, "price": ""}),
        ))
        .expect("row");
    assert_eq!(row.values[1..], defaults);
    let row = t
        .transform(&csv(&["id", "qty", "currency"], &["7", "4", "USD"]))
        .expect("row");
    assert_eq!(
        row.values[1..],
        [
            Value::Null,
            Value::Int(4),
            dec("0"),
            Value::Text("USD".into())
        ]
    );

    let loc = origin(3).location();
    for record in [csv(&["id"], &[""]), csv(&["other"], &["x"])] {
        let (field, value, message) = validation(t.transform(&record).unwrap_err(), &loc);
        assert_eq!(
            (field.as_str(), value.as_str(), message.as_str()),
            ("id", "", "required field is missing")
        );
    }
    let err = t.transform(&json_record(json!({"id": null}))).unwrap_err();
    assert!(
        err.to_string()
            .contains("page 2 row 5: field `id`: required field is missing"),
        "{err}"
    );
}

#[test]
fn null_key_is_a_validation_error() {
    let fields = r#"
shop = { type = "text" }
id   = { type = "int" }
"#;
    let t = transformer(fields, r#"["shop", "id"]"#).expect("transformer");
    let err = t.transform(&csv(&["shop", "id"], &["eu", ""])).unwrap_err();
    let (field, _, message) = validation(err, &origin(3).location());
    assert_eq!(
        (field.as_str(), message.as_str()),
        ("id", "natural key field is empty")
    );
    assert!(t.transform(&csv(&["shop", "id"], &["eu", "1"])).is_ok());
}

#[test]
fn bad_defaults_are_config_errors() {
    let err = transformer(r#"n = { type = "int", default = "many" }"#, r#"["n"]"#).unwrap_err();
    let (key, message) = config(err);
    assert_eq!(key, "fields.n.default");
    assert!(message.contains("not an integer"), "{message}");
    let err = transformer(r#"d = { type = "date", default = 5 }"#, r#"["d"]"#).unwrap_err();
    assert_eq!(config(err).0, "fields.d.default");
}

#[test]
fn value_templates_are_rendered_once_and_typed() {
    let fields = r#"
id     = { type = "int" }
region = { type = "text", value = "{source.id}" }
day    = { type = "date", value = "{period.start:%Y-%m-%d}" }
start  = { type = "timestamptz", value = "{period.start}" }
label  = { type = "text", value = "{pipeline.name}-{period.end:%d}" }
"#;
    let t = transformer(fields, r#"["id", "region"]"#).expect("transformer");
    // The record's own `region` is ignored.
    let row = t
        .transform(&csv(&["id", "region"], &["1", "us"]))
        .expect("row");
    assert_eq!(
        row.values,
        [
            Value::Int(1),
            Value::Text("shop_eu".into()),
            Value::Date(NaiveDate::from_ymd_opt(2024, 3, 7).expect("date")),
            utc("2024-03-06T23:00:00Z"),
            Value::Text("orders-08".into()),
        ]
    );
}

#[test]
fn value_templates_fail_as_config_errors() {
    let err = transformer(
        r#"
id = { type = "int" }
x  = { type = "text", value = "${TIDEMARK_TRANSFORM_TEST_UNSET_VARIABLE}" }
"#,
        r#"["id"]"#,
    )
    .unwrap_err();
    let (key, message) = config(err);
    assert_eq!(key, "fields.x.value");
    assert!(
        message.contains("TIDEMARK_TRANSFORM_TEST_UNSET_VARIABLE"),
        "{message}"
    );

    let (key, message) = config(
        transformer(r#"n = { type = "int", value = "{source.id}" }"#, r#"["n"]"#).unwrap_err(),
    );
    assert_eq!(key, "fields.n.value");
    assert_eq!(message, "renders to \"shop_eu\": not an integer");

    // A secret read into a value never appears in a message.
    std::env::set_var("TIDEMARK_TRANSFORM_TEST_SECRET", "s3cret");
    let err = transformer(
        r#"n = { type = "int", value = "${TIDEMARK_TRANSFORM_TEST_SECRET}" }"#,
        r#"["n"]"#,
    )
    .unwrap_err();
    let (_, message) = config(err);
    assert!(
        !message.contains("s3cret") && message.contains("***"),
        "{message}"
    );
}

#[test]
fn json_pointer_from_reads_nested_fields() {
    let fields = r#"
id       = { type = "int", from = "/order/id" }
customer = { type = "text", from = "/order/customer/name" }
total    = { type = "decimal", from = "/order/lines/0/total" }
"#;
    let t = transformer(fields, r#"["id"]"#).expect("transformer");
    let record: serde_json::Value = serde_json::from_str(
        r#"{"order": {"id": 12.0, "customer": {"name": "Ann"}, "lines": [{"total": 0.1000000000000000000000001}]}}"#,
    )
    .expect("json");
    let row = t.transform(&json_record(record)).expect("row");
    assert_eq!(
        row.values,
        [
            Value::Int(12),
            Value::Text("Ann".into()),
            dec("0.1000000000000000000000001")
        ]
    );
    let row = t
        .transform(&json_record(json!({"order": {"id": 1}})))
        .expect("row");
    assert_eq!(row.values, [Value::Int(1), Value::Null, Value::Null]);
}

#[test]
fn json_columns_differ_between_csv_and_json_records() {
    let fields = r#"
id    = { type = "int" }
attrs = { type = "json" }
"#;
    let t = transformer(fields, r#"["id"]"#).expect("transformer");
    let from_csv = t
        .transform(&csv(&["id", "attrs"], &["1", r#"{"b": 2, "a": [1]}"#]))
        .expect("row");
    assert_eq!(from_csv.values[1], Value::Json(json!({"a": [1], "b": 2})));
    let err = t
        .transform(&csv(&["id", "attrs"], &["1", "{not json"]))
        .unwrap_err();
    let (field, value, message) = validation(err, &origin(3).location());
    assert_eq!((field.as_str(), value.as_str()), ("attrs", "{not json"));
    assert!(message.starts_with("not valid JSON"), "{message}");

    let string = t
        .transform(&json_record(json!({"id": 1, "attrs": "{\"b\": 2}"})))
        .expect("row");
    assert_eq!(string.values[1], Value::Json(json!("{\"b\": 2}")));
    let object = t
        .transform(&json_record(json!({"id": 1, "attrs": {"b": 2, "a": [1]}})))
        .expect("row");
    assert_eq!(object.values[1], from_csv.values[1]);
    assert_eq!(object.row_hash, from_csv.row_hash);
}

#[test]
fn json_records_read_numbers_and_refuse_structures() {
    let fields = r#"
id   = { type = "text" }
n    = { type = "int" }
"#;
    let t = transformer(fields, r#"["id"]"#).expect("transformer");
    let row = t
        .transform(&json_record(json!({"id": 42, "n": "7"})))
        .expect("row");
    assert_eq!(row.values, [Value::Text("42".into()), Value::Int(7)]);
    let loc = Location {
        resource: "https://api.example/orders".into(),
        page: Some(2),
        record: Some(5),
        line: None,
    };
    let (field, value, message) = validation(
        t.transform(&json_record(json!({"id": "a", "n": [1, 2]})))
            .unwrap_err(),
        &loc,
    );
    assert_eq!((field.as_str(), value.as_str()), ("n", "[1,2]"));
    assert!(message.contains("JSON array"), "{message}");
    let (field, value, _) = validation(
        t.transform(&json_record(json!({"id": "a", "n": true})))
            .unwrap_err(),
        &loc,
    );
    assert_eq!((field.as_str(), value.as_str()), ("n", "true"));
}

#[test]
fn timestamptz_dst_gap_and_overlap_in_the_pipeline_timezone() {
    let fields = r#"
id = { type = "int" }
at = { type = "timestamptz", format = "%d.%m.%Y %H:%M" }
"#;
    let t = transformer(fields, r#"["id"]"#).expect("transformer");
    let at = |s: &str| {
        t.transform(&csv(&["id", "at"], &["1", s]))
            .map(|row| row.values[1].clone())
    };
    assert_eq!(
        at("27.10.2024 02:30").expect("overlap"),
        utc("2024-10-27T00:30:00Z")
    );
    assert_eq!(
        at("27.10.2024 03:30").expect("after"),
        utc("2024-10-27T02:30:00Z")
    );
    let (field, value, message) =
        validation(at("31.03.2024 02:30").unwrap_err(), &origin(3).location());
    assert_eq!((field.as_str(), value.as_str()), ("at", "31.03.2024 02:30"));
    assert!(
        message.contains("does not exist in timezone Europe/Berlin"),
        "{message}"
    );
}

#[test]
fn never_panics_on_odd_input() {
    let t = transformer(ORDERS, r#"["order_id"]"#).expect("transformer");
    let odd = [
        "",
        " ",
        "-",
        "+",
        ".",
        "e",
        "1e999999999999",
        "\u{0}",
        "٣",
        "9".repeat(400).as_str(),
        "💥",
    ]
    .map(str::to_string);
    for cell in &odd {
        for i in 0..ORDER_HEADERS.len() {
            let mut row = vec!["A-1", "1", "1", "y", "07.03.2024 13:45"];
            row[i] = cell;
            let _ = t.transform(&csv(&ORDER_HEADERS, &row));
        }
    }
    // A short row (fewer cells than headers) reads as missing fields.
    let short = t.transform(&csv(&ORDER_HEADERS, &["A-1"])).expect("row");
    assert_eq!(
        short.values[1..],
        [Value::Null, Value::Null, Value::Null, Value::Null]
    );
    assert!(t
        .transform(&json_record(json!(["not", "an", "object"])))
        .is_err());
}

#[test]
fn fields_absent_from_every_json_record_of_a_batch_are_named() {
    let t = transformer(
        "id = { type = \"int\", required = true }\n\
         note = { type = \"text\" }\n\
         region = { type = \"text\", default = \"eu\" }\n\
         nested = { type = \"text\", from = \"/a/b\" }\n\
         fixed = { type = \"text\", value = \"x\" }",
        "[\"id\"]",
    )
    .expect("transformer");
    let mut presence = t.presence();
    assert!(t.absent_fields(&presence).is_empty(), "no record: no claim");
    for record in [
        json!({"id": 1, "note": null}),
        json!({"id": 2, "a": {"b": "y"}}),
        json!({"note": "no id"}),
    ] {
        let _ = t.transform_noting(&json_record(record), &mut presence);
    }
    // `note` is held (null counts), `nested` by one record; `region` has a
    // default but is still named; `id` is required, `fixed` reads nothing.
    assert_eq!(t.absent_fields(&presence), ["region"]);
    // CSV records are never counted: their header is checked instead.
    let mut presence = t.presence();
    let _ = t.transform_noting(&csv(&["id"], &["1"]), &mut presence);
    assert!(t.absent_fields(&presence).is_empty());
}

/// Cells are found by the position of their column in each file's header
/// row, looked up once per header row: a second file with its columns in
/// another order, a column missing, a short row, and back to the first
/// file, all through one batch's `Presence`, read the right cells.
#[test]
fn csv_cells_follow_each_header_row_through_one_batch() {
    let t = transformer(
        "id = { type = \"int\", required = true }\n\
         note = { type = \"text\" }\n\
         fixed = { type = \"text\", value = \"x\" }",
        "[\"id\"]",
    )
    .expect("transformer");
    let first = Arc::new(csv::StringRecord::from(vec!["id", "note"]));
    let second = Arc::new(csv::StringRecord::from(vec!["extra", "note", "id"]));
    let record = |headers: &Arc<csv::StringRecord>, row: &[&str]| RawRecord {
        data: RawData::Csv {
            headers: Arc::clone(headers),
            row: csv::StringRecord::from(row.to_vec()),
        },
        origin: origin(3),
    };
    let mut presence = t.presence();
    let mut typed = |r: RawRecord| t.transform_noting(&r, &mut presence).expect("row").values;
    let text = |s: &str| Value::Text(s.into());
    assert_eq!(
        typed(record(&first, &["1", "a"])),
        [Value::Int(1), text("a"), text("x")]
    );
    assert_eq!(
        typed(record(&second, &["?", "b", "2"])),
        [Value::Int(2), text("b"), text("x")]
    );
    assert_eq!(
        typed(record(&first, &["3"])),
        [Value::Int(3), Value::Null, text("x")]
    );
    let no_note = Arc::new(csv::StringRecord::from(vec!["id"]));
    assert_eq!(
        typed(record(&no_note, &["4"])),
        [Value::Int(4), Value::Null, text("x")]
    );
    // The same answers as the lookup by name.
    assert_eq!(
        t.transform(&record(&second, &["?", "b", "2"]))
            .expect("row")
            .values,
        [Value::Int(2), text("b"), text("x")]
    );
}

/// The key typed alone hashes as the full row's key; a record whose key
/// does not type has none. The raw hash follows the record's bytes and the
/// plan: a changed default (same bytes) changes every raw hash.
#[test]
fn key_hash_alone_and_raw_hash_follow_the_plan() {
    let fields = r#"
id = { type = "int" }
day = { type = "date", format = "%d.%m.%Y" }
note = { type = "text", default = "x" }
"#;
    let t = transformer(fields, r#"["day", "id"]"#).expect("plan");
    let mut presence = t.presence();
    let record = csv(&["note", "id", "day"], &["a", " 7 ", "01.02.2024"]);
    let row = t.transform(&record).expect("typed");
    assert_eq!(t.key_hash_of(&record, &mut presence), Some(row.key_hash));
    let json = json_record(json!({"id": 7, "day": "01.02.2024"}));
    assert_eq!(t.key_hash_of(&json, &mut presence), Some(row.key_hash));
    let bad = csv(&["note", "id", "day"], &["a", "seven", "01.02.2024"]);
    assert_eq!(t.key_hash_of(&bad, &mut presence), None);
    let empty = csv(&["note", "id", "day"], &["a", "", "01.02.2024"]);
    assert_eq!(t.key_hash_of(&empty, &mut presence), None);

    let raw = t.raw_hasher().hash(&record).expect("raw hash");
    assert_eq!(t.raw_hasher().hash(&record), Some(raw), "stable");
    let same = transformer(fields, r#"["day", "id"]"#).expect("plan");
    assert_eq!(same.raw_hasher().hash(&record), Some(raw), "same plan");
    let other_default =
        transformer(&fields.replace("\"x\"", "\"y\""), r#"["day", "id"]"#).expect("plan");
    assert_ne!(other_default.raw_hasher().hash(&record), Some(raw));
    let other_format =
        transformer(&fields.replace("%d.%m.%Y", "%d/%m/%Y"), r#"["day", "id"]"#).expect("plan");
    assert_ne!(other_format.raw_hasher().hash(&record), Some(raw));
}
