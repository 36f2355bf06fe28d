//! Behaviour of the file reader on real files in temporary folders.

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tidemark_core::spec::SourceSpec;
use tidemark_core::{ErrorClass, RawData, RawValue, Selector};

use super::*;

/// A minimal valid pipeline in `dir` whose only source has the given
/// `transport = "file"` settings.
fn pipeline(dir: &Path, source: &str, batch_size: usize) -> Pipeline {
    let text = format!(
        r#"
name = "orders"
export_type = "orders_daily"

[period]
granularity = "day"

[[sources]]
id = "archive"
transport = "file"
{source}

[fields]
id = {{ type = "text" }}

[load]
table = "orders"
key = ["id"]
batch_size = {batch_size}
"#
    );
    Pipeline::parse(&text, &dir.join("p.toml")).unwrap()
}

fn spec(pipeline: &Pipeline) -> &FileSourceSpec {
    match &pipeline.spec.sources[0] {
        SourceSpec::File(spec) => spec,
        other => panic!("expected a file source, got {other:?}"),
    }
}

fn day(text: &str) -> Period {
    Period::parse(text, tidemark_core::Granularity::Day, chrono_tz::UTC).unwrap()
}

async fn open(p: &Pipeline, resume: Option<&Checkpoint>) -> Result<FileReader, Error> {
    FileReader::open(p, spec(p), &day("2024-03-07"), resume).await
}

fn write(path: &Path, content: impl AsRef<[u8]>) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

/// The `id` field of a record, whatever the format.
fn id(record: &RawRecord) -> String {
    match record.get(&Selector::parse("id")) {
        RawValue::Str(s) => s.to_string(),
        RawValue::Json(v) => v.to_string(),
        RawValue::Missing => panic!("record without id: {:?}", record.to_json()),
    }
}

/// Every batch until `None`: the ids of each and its checkpoint.
async fn read_all(reader: &mut FileReader) -> Vec<(Vec<String>, Checkpoint)> {
    let mut batches = Vec::new();
    while let Some(batch) = reader.next_batch().await.unwrap() {
        assert!(!batch.records.is_empty(), "batches are never empty");
        batches.push((batch.records.iter().map(id).collect(), batch.checkpoint));
    }
    assert!(
        reader.next_batch().await.unwrap().is_none(),
        "stays exhausted"
    );
    batches
}

fn ids(batches: &[(Vec<String>, Checkpoint)]) -> Vec<String> {
    batches.iter().flat_map(|(ids, _)| ids.clone()).collect()
}

fn parse_location(err: Error) -> (tidemark_core::Location, String) {
    match err {
        Error::Parse { location, message } => (location, message),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

/// Writes the records `a.ids` and `b.ids` as two files in `format`.
fn write_two_files(dir: &Path, format: &str, a: &[&str], b: &[&str]) {
    for (name, ids) in [("a", a), ("b", b)] {
        let content = match format {
            "csv" => ids
                .iter()
                .fold("id,n\n".to_string(), |acc, id| acc + &format!("{id},1\n")),
            "ndjson" => ids
                .iter()
                .map(|id| format!("{{\"id\":\"{id}\"}}\n"))
                .collect(),
            _ => json!(ids.iter().map(|id| json!({ "id": id })).collect::<Vec<_>>()).to_string(),
        };
        write(&dir.join(format!("data/{name}.{format}")), content);
    }
}

#[tokio::test]
async fn glob_and_template_pick_the_periods_files_in_path_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        &root.join("exports/2024/03/07/orders_b.csv"),
        "id,total\nB1,2\n",
    );
    write(
        &root.join("exports/2024/03/07/orders_a.csv"),
        "id,total\nA1,1\nA2,1\n",
    );
    write(
        &root.join("exports/2024/03/07/other.csv"),
        "id,total\nX,1\n",
    );
    write(
        &root.join("exports/2024/03/08/orders_c.csv"),
        "id,total\nC1,3\n",
    );
    fs::create_dir_all(root.join("exports/2024/03/07/orders_dir.csv")).unwrap();
    let p = pipeline(
        root,
        r#"format = "csv"
path = "exports/{period.start:%Y/%m/%d}/orders*.csv""#,
        100,
    );

    let mut reader = open(&p, None).await.unwrap();
    let batch = reader.next_batch().await.unwrap().unwrap();
    assert_eq!(
        batch.records.iter().map(id).collect::<Vec<_>>(),
        ["A1", "A2", "B1"]
    );
    let a = root
        .join("exports/2024/03/07/orders_a.csv")
        .display()
        .to_string();
    let b = root
        .join("exports/2024/03/07/orders_b.csv")
        .display()
        .to_string();
    let origins: Vec<_> = batch
        .records
        .iter()
        .map(|r| {
            (
                r.origin.resource.to_string(),
                r.origin.record,
                r.origin.line,
            )
        })
        .collect();
    assert_eq!(
        origins,
        [
            (a.clone(), 1, Some(2)),
            (a, 2, Some(3)),
            (b.clone(), 1, Some(2))
        ]
    );
    let mut checkpoint = batch.checkpoint.clone();
    let consumed = checkpoint["consumed"].take();
    assert_eq!(
        checkpoint,
        json!({"v": 2, "kind": "file", "file_index": 1, "file": b, "records": 1, "consumed": null})
    );
    assert!(
        consumed.as_str().is_some_and(|h| h.len() == 16),
        "the content identity is 16 hex digits: {consumed}"
    );
    assert!(reader.next_batch().await.unwrap().is_none());
}

#[tokio::test]
async fn batches_stop_at_batch_size_and_end_with_none() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("data/a.csv"),
        "id,n\n1,x\n2,x\n3,x\n4,x\n5,x\n",
    );
    let p = pipeline(
        dir.path(),
        r#"format = "csv"
path = "data/*.csv""#,
        2,
    );
    let mut reader = open(&p, None).await.unwrap();
    let batches = read_all(&mut reader).await;
    let sizes: Vec<_> = batches.iter().map(|(ids, _)| ids.len()).collect();
    assert_eq!(sizes, [2, 2, 1]);
    assert_eq!(ids(&batches), ["1", "2", "3", "4", "5"]);
    let records: Vec<_> = batches
        .iter()
        .map(|(_, cp)| cp["records"].clone())
        .collect();
    assert_eq!(records, [json!(2), json!(4), json!(5)]);
}

#[tokio::test]
async fn resuming_from_every_checkpoint_yields_exactly_the_rest() {
    for format in ["csv", "ndjson", "json"] {
        let dir = tempfile::tempdir().unwrap();
        write_two_files(dir.path(), format, &["a1", "a2", "a3"], &["b1", "b2"]);
        let empty = match format {
            "json" => "[]",
            "csv" => "id,n\n",
            _ => "",
        };
        write(&dir.path().join(format!("data/c.{format}")), empty);
        let p = pipeline(
            dir.path(),
            &format!("format = \"{format}\"\npath = \"data/*.{format}\""),
            2,
        );
        let full = read_all(&mut open(&p, None).await.unwrap()).await;
        let all = ids(&full);
        assert_eq!(all, ["a1", "a2", "a3", "b1", "b2"], "{format}");
        // The second batch spans the file boundary: a3, b1.
        assert_eq!(full[1].1["file_index"], json!(1), "{format}");
        assert_eq!(full[1].1["records"], json!(1), "{format}");
        let mut consumed = 0;
        for (batch_ids, checkpoint) in &full {
            consumed += batch_ids.len();
            let rest = read_all(&mut open(&p, Some(checkpoint)).await.unwrap()).await;
            assert_eq!(ids(&rest), all[consumed..], "{format} after {checkpoint}");
        }
    }
}

#[tokio::test]
async fn csv_honours_the_delimiter_and_shares_headers() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("data/a.csv"),
        "id;total\nA;1,5\nB;\"2;0\"\n",
    );
    let p = pipeline(
        dir.path(),
        r#"format = "csv"
delimiter = ";"
path = "data/a.csv""#,
        10,
    );
    let batch = open(&p, None)
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .unwrap();
    let totals: Vec<_> = batch
        .records
        .iter()
        .map(|r| r.get(&Selector::parse("total")))
        .collect();
    assert_eq!(totals, [RawValue::Str("1,5"), RawValue::Str("2;0")]);
    match (&batch.records[0].data, &batch.records[1].data) {
        (RawData::Csv { headers: h0, .. }, RawData::Csv { headers: h1, .. }) => {
            assert!(Arc::ptr_eq(h0, h1))
        }
        other => panic!("expected CSV rows, got {other:?}"),
    }
}

/// The malformed record's raw text and its error's location and message.
fn malformed(record: &RawRecord) -> (String, tidemark_core::Location, String) {
    match &record.data {
        RawData::Malformed { raw, error } => {
            let (location, message) = parse_location((**error).clone());
            (raw.clone(), location, message)
        }
        other => panic!("expected a malformed record, got {other:?}"),
    }
}

/// The error the first batch of `content` (in `data/a.csv`) fails with.
async fn csv_document_error(content: &[u8], missing: &str) -> Error {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("data/a.csv"), content);
    let source = format!("format = \"csv\"\npath = \"data/a.csv\"\nmissing = \"{missing}\"");
    let p = pipeline(dir.path(), &source, 10);
    match open(&p, None).await {
        Ok(mut reader) => reader.next_batch().await.unwrap_err(),
        Err(err) => err,
    }
}

#[tokio::test]
async fn bad_csv_rows_are_malformed_records_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data/a.csv");
    write(&file, "id,total\nA,1\n\"B\nB\",2\nC,3,extra\nD\nE,5\n");
    let p = pipeline(
        dir.path(),
        r#"format = "csv"
path = "data/a.csv""#,
        10,
    );
    let batch = open(&p, None)
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch.records.len(), 5, "bad rows are records too");
    assert_eq!(batch.checkpoint["records"], json!(5));
    let (raw, location, message) = malformed(&batch.records[2]);
    assert_eq!(raw, "C,3,extra");
    assert_eq!(location.resource, file.display().to_string());
    assert_eq!((location.record, location.line), (Some(3), Some(5)));
    assert!(
        message.contains("3 fields") && message.contains("has 2"),
        "{message}"
    );
    let (raw, location, _) = malformed(&batch.records[3]);
    assert_eq!((raw.as_str(), location.line), ("D", Some(6)));
    assert_eq!(id(&batch.records[4]), "E");

    write(&file, b"id,total\r\nA,1\r\nB,caf\xe9\r\n".as_slice());
    let batch = open(&p, None)
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .unwrap();
    let (raw, location, message) = malformed(&batch.records[1]);
    assert_eq!(
        (location.record, location.line),
        (Some(2), Some(3)),
        "CRLF lines"
    );
    assert_eq!(raw, "B,caf\u{fffd}");
    assert_eq!(message, "invalid UTF-8 in column `total`: \"caf\\xE9\"");
}

#[tokio::test]
async fn broken_csv_documents_are_parse_errors() {
    let (location, message) = parse_location(
        csv_document_error(
            b"id,amount,note\n1,10,ok\n2,20,\"he said \n3,30,fine\n4,40,fine\n",
            "error",
        )
        .await,
    );
    assert_eq!((location.record, location.line), (Some(2), Some(3)));
    assert!(
        message.contains("unterminated quoted field") && message.contains("line 3"),
        "{message}"
    );
    let (location, message) = parse_location(
        csv_document_error(b"id,note\r\n1,\"a\r\nb\",\"c\r\n2,x\r\n", "error").await,
    );
    assert_eq!(
        location.line,
        Some(3),
        "the quote opens after a field spanning lines 2-3: {message}"
    );
    let (location, message) =
        parse_location(csv_document_error(b"id,\"note\n1,x\n", "error").await);
    assert_eq!(
        (location.record, location.line),
        (None, Some(1)),
        "{message}"
    );

    let (location, message) =
        parse_location(csv_document_error(b"id,amount,note\n1,10,ok\n2,2", "error").await);
    assert_eq!((location.record, location.line), (Some(2), Some(3)));
    assert!(message.contains("cut"), "{message}");

    let (location, message) = parse_location(csv_document_error(b"", "error").await);
    assert_eq!(location.line, Some(1));
    assert!(message.contains("no header row"), "{message}");
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("data/a.csv"), b"");
    let p = pipeline(
        dir.path(),
        "format = \"csv\"\npath = \"data/a.csv\"\nmissing = \"empty\"",
        10,
    );
    assert!(read_all(&mut open(&p, None).await.unwrap())
        .await
        .is_empty());

    let (location, message) =
        parse_location(csv_document_error(b"id,n,id\n1,2,3\n", "error").await);
    assert_eq!(location.line, Some(1));
    assert!(message.contains("`id` 2 times (columns 1, 3)"), "{message}");
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("data/a.csv"), b"id,n,n\n1,2,3\n");
    let p = pipeline(dir.path(), "format = \"csv\"\npath = \"data/a.csv\"", 10);
    let batches = read_all(&mut open(&p, None).await.unwrap()).await;
    assert_eq!(ids(&batches), ["1"], "a column no field reads may repeat");
}

#[tokio::test]
async fn ndjson_skips_blank_lines_and_hands_on_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data/a.ndjson");
    write(
        &file,
        b"\xef\xbb\xbf{\"id\":1}\n\n   \r\n{\"id\":2}\r\n[3]\nNaN\n{\"id\": 4,}\n{\"id\":\"\xc3\"}\n\"s\"\n{\"id\":5}".as_slice(),
    );
    let p = pipeline(
        dir.path(),
        r#"format = "ndjson"
path = "data/*.ndjson""#,
        10,
    );
    let batch = open(&p, None)
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .unwrap();
    let origins: Vec<_> = batch
        .records
        .iter()
        .map(|r| (r.origin.record, r.origin.line))
        .collect();
    assert_eq!(
        origins,
        [
            (1, Some(1)),
            (2, Some(4)),
            (3, Some(5)),
            (4, Some(6)),
            (5, Some(7)),
            (6, Some(8)),
            (7, Some(9)),
            (8, Some(10))
        ]
    );
    let (raw, location, message) = malformed(&batch.records[2]);
    assert_eq!((raw.as_str(), location.line), ("[3]", Some(5)));
    assert_eq!(
        message,
        "record is not a JSON object: the line holds an array"
    );
    let (raw, _, message) = malformed(&batch.records[3]);
    assert_eq!(raw, "NaN");
    assert!(message.starts_with("invalid JSON at column"), "{message}");
    let (raw, location, _) = malformed(&batch.records[4]);
    assert_eq!(
        (raw.as_str(), location.resource),
        ("{\"id\": 4,}", file.display().to_string())
    );
    let (_, _, message) = malformed(&batch.records[5]);
    assert!(
        message.contains("UTF-8") && message.contains("\\xC3"),
        "{message}"
    );
    let (_, _, message) = malformed(&batch.records[6]);
    assert!(message.contains("a string"), "{message}");
    assert_eq!(
        id(&batch.records[7]),
        "5",
        "a last line without a newline is fine"
    );

    write(&file, "{\"id\":1}\n{\"id\": 2, \"no");
    let (location, message) = parse_location(
        open(&p, None)
            .await
            .unwrap()
            .next_batch()
            .await
            .unwrap_err(),
    );
    assert_eq!((location.record, location.line), (Some(2), Some(2)));
    assert!(message.contains("cut"), "{message}");
}

#[tokio::test]
async fn json_records_at_a_pointer_or_the_whole_body() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("data/wrapped.json"),
        r#"{"data": [{"id": 1}, {"id": 2}], "next": null}"#,
    );
    let p = pipeline(
        dir.path(),
        r#"format = "json"
records = "/data"
path = "data/wrapped.json""#,
        10,
    );
    let batch = open(&p, None)
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch.records.iter().map(id).collect::<Vec<_>>(), ["1", "2"]);
    assert_eq!(batch.records[1].origin.record, 2);
    assert_eq!(batch.records[1].origin.line, None);

    write(&dir.path().join("data/bare.json"), r#"[{"id": "x"}]"#);
    for records in ["", "records = \"\"\n"] {
        let p = pipeline(
            dir.path(),
            &format!("format = \"json\"\n{records}path = \"data/bare.json\""),
            10,
        );
        let batch = open(&p, None)
            .await
            .unwrap()
            .next_batch()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(batch.records.iter().map(id).collect::<Vec<_>>(), ["x"]);
    }
}

#[tokio::test]
async fn json_pointer_to_anything_but_an_array_is_a_parse_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data/a.json");
    write(&file, r#"{"data": {"id": 1}}"#);
    for (pointer, expected) in [
        ("/data", "points to an object"),
        ("/items", "does not exist"),
        ("", "points to an object"),
    ] {
        let p = pipeline(
            dir.path(),
            &format!("format = \"json\"\nrecords = \"{pointer}\"\npath = \"data/a.json\""),
            10,
        );
        let (location, message) = parse_location(
            open(&p, None)
                .await
                .unwrap()
                .next_batch()
                .await
                .unwrap_err(),
        );
        assert_eq!(location.resource, file.display().to_string());
        assert!(
            message.contains(expected) && message.contains(&format!("{pointer:?}")),
            "{message}"
        );
    }
    write(&file, "[{\"id\": 1},\n{\"id\": 2");
    let p = pipeline(dir.path(), "format = \"json\"\npath = \"data/a.json\"", 10);
    let (location, _) = parse_location(
        open(&p, None)
            .await
            .unwrap()
            .next_batch()
            .await
            .unwrap_err(),
    );
    assert_eq!(location.line, Some(2));
}

#[tokio::test]
async fn no_match_is_a_permanent_error_or_an_empty_source() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(
        dir.path(),
        r#"format = "csv"
path = "exports/{period.start:%Y-%m-%d}/*.csv""#,
        10,
    );
    let err = open(&p, None).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Source);
    assert!(!err.is_transient());
    let expected = dir
        .path()
        .join("exports/2024-03-07/*.csv")
        .display()
        .to_string();
    assert_eq!(err.to_string(), format!("no file matches {expected}"));

    let p = pipeline(
        dir.path(),
        r#"format = "csv"
missing = "empty"
path = "exports/{period.start:%Y-%m-%d}/*.csv""#,
        10,
    );
    let mut reader = open(&p, None).await.unwrap();
    assert!(reader.next_batch().await.unwrap().is_none());
}

#[tokio::test]
async fn checkpoints_that_do_not_fit_the_files_are_invariant_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_two_files(dir.path(), "csv", &["a1", "a2"], &["b1"]);
    let p = pipeline(dir.path(), "format = \"csv\"\npath = \"data/*.csv\"", 10);
    let a = dir.path().join("data/a.csv").display().to_string();
    let b = dir.path().join("data/b.csv").display().to_string();
    let full = read_all(&mut open(&p, None).await.unwrap()).await;
    let good = full[0].1.clone();
    assert_eq!(good["records"], json!(1), "the only batch ends after b1");
    let consumed = good["consumed"].clone();
    let bad = [
        json!({"v": 2, "kind": "file", "file_index": 0, "file": b, "records": 1, "consumed": consumed}),
        json!({"v": 2, "kind": "file", "file_index": 2, "file": b, "records": 1, "consumed": consumed}),
        json!({"v": 2, "kind": "file", "file_index": 0, "file": a, "records": 3, "consumed": consumed}),
        json!({"v": 2, "kind": "file", "file_index": 1, "file": b, "records": 1, "consumed": "0123456789abcdef"}),
        json!({"v": 1, "kind": "file", "file_index": 1, "file": b, "records": 1}),
        json!({"v": 3, "kind": "file", "file_index": 1, "file": b, "records": 1, "consumed": consumed}),
        json!({"v": 2, "kind": "http", "file_index": 1, "file": b, "records": 1, "consumed": consumed}),
        json!({"page": 3}),
    ];
    for checkpoint in &bad {
        match open(&p, Some(checkpoint)).await.unwrap_err() {
            Error::StaleCheckpoint(message) => {
                assert!(
                    message.starts_with("checkpoint does not match the source's files: "),
                    "{message}"
                );
            }
            other => panic!("{checkpoint}: expected an invariant error, got {other:?}"),
        }
    }
    assert!(open(&p, Some(&good))
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .is_none());
}

/// A checkpoint names the content it was written after: a file rewritten
/// between a crash and the resume (a new first row; the same size with
/// another value; an earlier file of the period) does not fit it, while
/// records added after the checkpoint do.
#[tokio::test]
async fn checkpoints_do_not_fit_content_that_changed_before_them() {
    for format in ["csv", "ndjson", "json"] {
        let dir = tempfile::tempdir().unwrap();
        write_two_files(dir.path(), format, &["a1", "a2"], &["b1", "b2", "b3"]);
        let p = pipeline(
            dir.path(),
            &format!("format = \"{format}\"\npath = \"data/*.{format}\""),
            3,
        );
        let full = read_all(&mut open(&p, None).await.unwrap()).await;
        let after_b1 = full[0].1.clone();
        assert_eq!(
            (after_b1["file_index"].clone(), after_b1["records"].clone()),
            (json!(1), json!(1))
        );
        let fits = |cp: Checkpoint| {
            let p = p.clone();
            async move { open(&p, Some(&cp)).await.map(|_| ()) }
        };
        let rewrites: [(&[&str], &[&str], bool); 5] = [
            (&["a1", "a2"], &["b1", "b2", "b3"], true),
            (&["a1", "a2"], &["b1", "b2", "b3", "b4"], format != "json"),
            (&["a1", "a2"], &["b0", "b1", "b2", "b3"], false),
            (&["a1", "a2"], &["b9", "b2", "b3"], false),
            (&["a1", "a9"], &["b1", "b2", "b3"], false),
        ];
        for (a, b, expected) in rewrites {
            write_two_files(dir.path(), format, a, b);
            match fits(after_b1.clone()).await {
                Ok(()) => assert!(expected, "{format}: {a:?} {b:?} should not fit"),
                Err(Error::StaleCheckpoint(why)) => {
                    assert!(!expected, "{format}: {a:?} {b:?} should fit: {why}")
                }
                Err(other) => panic!("{format}: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn glob_characters_in_the_pipeline_folder_are_literal() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("exports[old]");
    write(&base.join("a.ndjson"), "{\"id\":1}\n");
    let p = pipeline(&base, "format = \"ndjson\"\npath = \"*.ndjson\"", 10);
    let batch = open(&p, None)
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(batch.records.len(), 1);

    let absolute = glob::Pattern::escape(&base.display().to_string()) + "/*.ndjson";
    let p = pipeline(
        dir.path(),
        &format!("format = \"ndjson\"\npath = {absolute:?}"),
        10,
    );
    assert_eq!(
        open(&p, None)
            .await
            .unwrap()
            .next_batch()
            .await
            .unwrap()
            .unwrap()
            .records
            .len(),
        1
    );
}

#[test]
fn only_interruptions_and_timeouts_are_transient() {
    let transient = io_error(
        "cannot read",
        "a.csv",
        &io::Error::from(io::ErrorKind::TimedOut),
    );
    assert!(transient.is_transient());
    let permanent = io_error(
        "cannot open",
        "a.csv",
        &io::Error::from(io::ErrorKind::PermissionDenied),
    );
    assert!(!permanent.is_transient());
    assert!(
        permanent.to_string().starts_with("cannot open a.csv: "),
        "{permanent}"
    );
}

/// A FIFO blocks until its writer opens and writes; meanwhile the runtime
/// (single-threaded here) must keep running other tasks. A batch must come
/// back as soon as it is full, while the writer still holds the FIFO open:
/// the reader streams instead of reading to the end first.
#[cfg(unix)]
#[tokio::test]
async fn reads_a_fifo_without_stalling_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("data")).unwrap();
    let fifo = dir.path().join("data/feed.csv");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo failed");
    let p = pipeline(dir.path(), "format = \"csv\"\npath = \"data/*.csv\"", 2);

    let (go, wait) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let first = wait.recv_timeout(Duration::from_secs(10)).is_ok();
        let mut out = fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        io::Write::write_all(&mut out, b"id,n\n1,a\n2,b\n").unwrap();
        let second = wait.recv_timeout(Duration::from_secs(10)).is_ok();
        io::Write::write_all(&mut out, b"3,c\n").unwrap();
        (first, second)
    });
    let mut reader = open(&p, None).await.unwrap();
    let first = tokio::spawn(async move {
        let batch = reader.next_batch().await;
        (reader, batch)
    });
    // Runs only if the blocked read left the runtime's one thread free.
    tokio::time::sleep(Duration::from_millis(50)).await;
    go.send(()).unwrap();
    let (mut reader, batch) = first.await.unwrap();
    let batch = batch.unwrap().unwrap();
    assert_eq!(batch.records.iter().map(id).collect::<Vec<_>>(), ["1", "2"]);
    go.send(()).unwrap();
    assert_eq!(ids(&read_all(&mut reader).await), ["3"]);
    assert_eq!(
        writer.join().unwrap(),
        (true, true),
        "the runtime was stalled, or the reader waited for the whole file"
    );
}

#[tokio::test]
async fn a_csv_header_lacking_a_read_column_is_drift_before_any_record() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), "format = \"csv\"\npath = \"in/*.csv\"", 100);
    // The second file of the glob lost `id`: the period fails at open,
    // before the first file's rows are handed out.
    write(&dir.path().join("in/a.csv"), "id,x\n1,a\n");
    write(&dir.path().join("in/b.csv"), "ident,x\n2,b\n");
    let err = open(&p, None).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Contract, "{err}");
    let text = err.to_string();
    assert!(text.contains("b.csv"), "{text}");
    assert!(text.contains("lacks the column `id`"), "{text}");
    assert!(text.contains("\"ident\", \"x\""), "{text}");
    assert!(!err.is_transient());
    // Renamed back: the same files read.
    write(&dir.path().join("in/b.csv"), "x,id\nb,2\n");
    let mut reader = open(&p, None).await.unwrap();
    assert_eq!(ids(&read_all(&mut reader).await), ["1", "2"]);
}

/// A path with no wildcard is looked at directly: it names the same file,
/// spelled the same way (checkpoints hold the name), as the glob did; and
/// a path the glob would spell otherwise still goes through the glob.
#[test]
fn a_path_without_wildcards_names_the_file_as_the_glob_does() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("pipelines");
    std::fs::create_dir_all(base.join("data/2024")).unwrap();
    std::fs::write(base.join("data/2024/a.csv"), "id\n1\n").unwrap();
    let glob_names = |pattern: &str| -> Vec<String> {
        glob::glob(pattern)
            .unwrap()
            .map(|p| p.unwrap().display().to_string())
            .collect()
    };
    for rendered in ["data/2024/a.csv", "data/2024/missing.csv"] {
        let path = base.join(rendered);
        assert!(super::is_plain(&path), "{}", path.display());
        let direct: Vec<String> = super::readable(path.clone())
            .into_iter()
            .map(|f| f.name.to_string())
            .collect();
        assert_eq!(
            direct,
            glob_names(&path.display().to_string()),
            "{rendered}"
        );
    }
    for odd in [
        "data/./2024/a.csv",
        "data/../data/2024/a.csv",
        "data//2024/a.csv",
    ] {
        assert!(!super::is_plain(&base.join(odd)), "{odd}");
    }
    // A folder is not a file to read, whichever way it is found.
    assert!(super::readable(base.join("data")).is_none());
}
