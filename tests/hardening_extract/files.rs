//! File sources: broken documents fail the period (items 1 and 13), bad
//! rows are rejects within `max_rejects` (13), messages name the real
//! problem (16), and a file regenerated between a crash and the resume is
//! read from the start (3).

use std::fs;
use std::time::{Duration, Instant};

use super::{ids, ledger, run, write_pipeline};
use crate::support::{backend_tests, Backend, Env, FifoWriter};

backend_tests! {
    unterminated_quote_fails_the_period: unterminated_quote_fails_the_period_sqlite, unterminated_quote_fails_the_period_postgres;
    empty_csv_file_fails_unless_missing_is_empty: empty_csv_file_fails_unless_missing_is_empty_sqlite, empty_csv_file_fails_unless_missing_is_empty_postgres;
    duplicate_header_column_read_by_a_field_fails_the_period: duplicate_header_column_read_by_a_field_fails_the_period_sqlite, duplicate_header_column_read_by_a_field_fails_the_period_postgres;
    bad_rows_are_rejects_within_max_rejects: bad_rows_are_rejects_within_max_rejects_sqlite, bad_rows_are_rejects_within_max_rejects_postgres;
    bad_row_messages_name_the_real_problem: bad_row_messages_name_the_real_problem_sqlite, bad_row_messages_name_the_real_problem_postgres;
    regenerated_file_after_a_crash_is_read_from_the_start: regenerated_file_after_a_crash_is_read_from_the_start_sqlite, regenerated_file_after_a_crash_is_read_from_the_start_postgres;
}

const DAY: &str = "2024-01-01";

/// A CSV source reading `data/DAY.csv`: id, amount, note.
fn csv_pipeline(env: &Env, missing: &str, load: &str) {
    write_pipeline(
        env,
        "quotes",
        &format!(
            "transport = \"file\"\nformat = \"csv\"\npath = \"data/{{period.start:%Y-%m-%d}}.csv\"\nmissing = \"{missing}\""
        ),
        "id = { type = \"int\", required = true }\namount = { type = \"int\" }\nnote = { type = \"text\" }",
        &format!("on_missing = \"delete\"\nmax_delete_fraction = 1.0\n{load}"),
    );
}

fn write_day(env: &Env, content: &[u8]) {
    let path = env.path(format!("pipelines/data/{DAY}.csv"));
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, content).unwrap();
}

/// Item 1: the file. Row 2's note opens a quote that never closes;
/// the csv crate would read rows 3 and 4 into that note, and a forced
/// re-sync would then delete them. Instead the period fails (class parse,
/// naming line 3), and the loaded rows stay as they were.
async fn unterminated_quote_fails_the_period(backend: Backend) {
    let env = Env::new(backend).await;
    csv_pipeline(&env, "error", "");
    write_day(
        &env,
        b"id,amount,note\n1,10,ok\n2,20,said\n3,30,fine\n4,40,fine\n",
    );
    run(&env, "quotes", DAY, &[]).expect_code(0, "the good export");
    assert_eq!(ids(&env, "quotes").await, ["1", "2", "3", "4"]);

    write_day(
        &env,
        b"id,amount,note\n1,10,ok\n2,20,\"he said \n3,30,fine\n4,40,fine\n",
    );
    let out = run(&env, "quotes", DAY, &["--force"]);
    out.expect_code(1, "a file ending inside a quoted field");
    for named in ["unterminated quoted field", "line 3", "quotes", DAY] {
        assert!(out.stderr.contains(named), "stderr names {named:?}\n{out}");
    }
    let entry = ledger(&env, "quotes", DAY);
    assert_eq!(entry["status"], "failed", "{entry}");
    assert_eq!(entry["error_class"], "parse", "{entry}");
    assert_eq!(
        ids(&env, "quotes").await,
        ["1", "2", "3", "4"],
        "no row was swallowed, nothing deleted"
    );
    let notes = env.db.select(&["note"], "FROM quotes WHERE id = 2").await;
    assert_eq!(notes[0][0].as_deref(), Some("said"), "row 2 unchanged");
}

/// Item 1: a 0-byte CSV (a half-written export has no header yet) fails
/// the period, unless the source reads an empty file as no records.
async fn empty_csv_file_fails_unless_missing_is_empty(backend: Backend) {
    let env = Env::new(backend).await;
    csv_pipeline(&env, "error", "");
    write_day(&env, b"");
    let out = run(&env, "quotes", DAY, &[]);
    out.expect_code(1, "a 0-byte CSV");
    assert!(out.stderr.contains("no header row"), "{out}");
    assert_eq!(ledger(&env, "quotes", DAY)["error_class"], "parse");

    csv_pipeline(&env, "empty", "");
    run(&env, "quotes", DAY, &[]).expect_code(0, "missing = \"empty\"");
    let entry = ledger(&env, "quotes", DAY);
    assert_eq!(
        (entry["status"].clone(), entry["rows_read"].clone()),
        ("done".into(), 0.into())
    );
}

/// Item 1: a header naming `amount` twice, when a field reads `amount`, is
/// ambiguous: the period fails naming the column. A repeated column no
/// field reads is harmless.
async fn duplicate_header_column_read_by_a_field_fails_the_period(backend: Backend) {
    let env = Env::new(backend).await;
    csv_pipeline(&env, "error", "");
    write_day(&env, b"id,amount,note,amount\n1,10,ok,99\n");
    let out = run(&env, "quotes", DAY, &[]);
    out.expect_code(1, "a header naming amount twice");
    assert!(
        out.stderr.contains("`amount` 2 times (columns 2, 4)"),
        "{out}"
    );
    assert_eq!(ledger(&env, "quotes", DAY)["error_class"], "parse");
    assert!(!env.db.table_exists("quotes").await || ids(&env, "quotes").await.is_empty());

    write_day(&env, b"id,amount,note,extra,extra\n1,10,ok,a,b\n");
    run(&env, "quotes", DAY, &["--force"]).expect_code(0, "a repeated unread column");
    assert_eq!(ids(&env, "quotes").await, ["1"]);
}

/// Item 13: with `max_rejects = 5`, rows that cannot be decoded (too few
/// or too many fields, invalid UTF-8; NDJSON lines that are not JSON, a
/// comment, an array, a string) are rejects: kept in `_tm_rejects` with the
/// raw line as the record, a reason and the location, while the good rows
/// load. One more than `max_rejects` fails the period, as does a broken
/// document whatever `max_rejects` says.
async fn bad_rows_are_rejects_within_max_rejects(backend: Backend) {
    let env = Env::new(backend).await;
    csv_pipeline(&env, "error", "max_rejects = 5");
    write_day(
        &env,
        b"id,amount,note\n1,10,ok\n2,20\n3,30,x,extra\n4,40,caf\xe9\n5,50,fine\n",
    );
    let out = run(&env, "quotes", DAY, &[]);
    out.expect_code(0, "three bad CSV rows, max_rejects = 5");
    assert_eq!(ids(&env, "quotes").await, ["1", "5"]);
    let entry = ledger(&env, "quotes", DAY);
    assert_eq!(
        (entry["rows_read"].clone(), entry["rows_rejected"].clone()),
        (5.into(), 3.into()),
        "{entry}"
    );
    let rejects = env
        .db
        .select(
            &["record", "reason", "location"],
            "FROM _tm_rejects ORDER BY location",
        )
        .await;
    assert_eq!(rejects.len(), 3, "{rejects:?}");
    let text = |i: usize, c: usize| rejects[i][c].clone().unwrap_or_default();
    assert_eq!(serde_json::from_str::<String>(&text(0, 0)).unwrap(), "2,20");
    assert!(
        text(0, 1).contains("2 fields where the header has 3"),
        "{rejects:?}"
    );
    assert!(
        text(0, 2).contains(&format!("{DAY}.csv row 2 (line 3)")),
        "{rejects:?}"
    );
    assert_eq!(
        serde_json::from_str::<String>(&text(1, 0)).unwrap(),
        "3,30,x,extra"
    );
    assert_eq!(
        serde_json::from_str::<String>(&text(2, 0)).unwrap(),
        "4,40,caf\u{fffd}"
    );
    assert!(
        text(2, 1).contains("invalid UTF-8 in column `note`"),
        "{rejects:?}"
    );

    csv_pipeline(&env, "error", "max_rejects = 2");
    let out = run(&env, "quotes", DAY, &["--force"]);
    out.expect_code(1, "three bad rows, max_rejects = 2");
    assert_eq!(ledger(&env, "quotes", DAY)["error_class"], "parse");

    write_pipeline(
        &env,
        "events",
        "transport = \"file\"\nformat = \"ndjson\"\npath = \"data/{period.start:%Y-%m-%d}.ndjson\"",
        "id = { type = \"int\", required = true }",
        "max_rejects = 5",
    );
    let ndjson = env.path(format!("pipelines/data/{DAY}.ndjson"));
    fs::write(
        &ndjson,
        "{\"id\":1}\nNaN\n// a comment\n[1,2]\n\"text\"\n{\"id\":2}\n",
    )
    .unwrap();
    run(&env, "events", DAY, &[]).expect_code(0, "four bad NDJSON lines, max_rejects = 5");
    assert_eq!(ids(&env, "events").await, ["1", "2"]);
    let entry = ledger(&env, "events", DAY);
    assert_eq!(entry["rows_rejected"], 4, "{entry}");
    let records: Vec<String> = env
        .db
        .select(
            &["record"],
            "FROM _tm_rejects WHERE pipeline = 'events' ORDER BY location",
        )
        .await
        .into_iter()
        .map(|r| serde_json::from_str::<String>(&r[0].clone().unwrap_or_default()).unwrap())
        .collect();
    assert_eq!(records, ["NaN", "// a comment", "[1,2]", "\"text\""]);

    // A cut last line is a broken document, not a bad row.
    fs::write(&ndjson, "{\"id\":1}\n{\"id\":2}\n{\"id\":").unwrap();
    let out = run(&env, "events", DAY, &["--force"]);
    out.expect_code(1, "a cut NDJSON file");
    assert!(out.stderr.contains("cut"), "{out}");
    assert_eq!(ledger(&env, "events", DAY)["error_class"], "parse");
}

/// Item 16 (extract part): an NDJSON line holding an array or a string is
/// "not a JSON object", not a missing field; invalid UTF-8 names the column
/// and shows the bytes instead of numbering the field two ways.
async fn bad_row_messages_name_the_real_problem(backend: Backend) {
    let env = Env::new(backend).await;
    write_pipeline(
        &env,
        "events",
        "transport = \"file\"\nformat = \"ndjson\"\npath = \"data/{period.start:%Y-%m-%d}.ndjson\"",
        "id = { type = \"int\", required = true }",
        "",
    );
    let ndjson = env.path(format!("pipelines/data/{DAY}.ndjson"));
    for (line, kind) in [("[1, 2]", "an array"), ("\"id\"", "a string")] {
        fs::create_dir_all(ndjson.parent().unwrap()).unwrap();
        fs::write(&ndjson, format!("{{\"id\":1}}\n{line}\n")).unwrap();
        let out = run(&env, "events", DAY, &["--force"]);
        out.expect_code(1, line);
        assert!(
            out.stderr.contains(&format!(
                "record is not a JSON object: the line holds {kind}"
            )),
            "{out}"
        );
        assert!(!out.stderr.contains("required field is missing"), "{out}");
    }

    csv_pipeline(&env, "error", "");
    write_day(&env, b"id,amount,note\n1,10,caf\xe9 au lait\n");
    let out = run(&env, "quotes", DAY, &[]);
    out.expect_code(1, "invalid UTF-8");
    assert!(
        out.stderr
            .contains("invalid UTF-8 in column `note`: \"caf\\xE9 au lait\""),
        "{out}"
    );
    assert!(!out.stderr.contains("in field"), "{out}");
}

/// Item 3: killed after two batches of a FIFO export, then the export is
/// regenerated with a new first row. The checkpoint names the content it
/// was written after, so the resume sees the change and starts the period
/// over: the new row is loaded (a resume at "record 10" of the new file
/// would have skipped it while counting it read).
async fn regenerated_file_after_a_crash_is_read_from_the_start(backend: Backend) {
    let env = Env::new(backend).await;
    csv_pipeline(&env, "error", "batch_size = 5");
    let rows: Vec<String> = (1..=20).map(|i| format!("{i},{i}0,row {i}\n")).collect();
    let header = "id,amount,note\n";
    let path = env.path(format!("pipelines/data/{DAY}.csv"));
    let fifo = FifoWriter::create(&path);
    let first = env.spawn(&["run", "quotes", "--period", DAY]);
    fifo.write(&format!("{header}{}", rows[..12].concat()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(env.status_of("quotes", DAY), Some(e) if e["rows_read"] == 10) {
        assert!(Instant::now() < deadline, "two batches were not committed");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill9();
    drop(fifo);
    fs::remove_file(&path).unwrap();
    fs::write(
        &path,
        format!("{header}0,0,new first row\n{}", rows.concat()),
    )
    .unwrap();

    let out = run(&env, "quotes", DAY, &[]);
    out.expect_code(0, "the resume after the export was regenerated");
    assert!(
        out.stderr
            .contains("checkpoint no longer matches the source"),
        "the run says why it starts over\n{out}"
    );
    let expected: Vec<String> = {
        let mut all: Vec<String> = (0..=20).map(|i| i.to_string()).collect();
        all.sort();
        all
    };
    assert_eq!(
        ids(&env, "quotes").await,
        expected,
        "the new first row is loaded"
    );
    let entry = ledger(&env, "quotes", DAY);
    assert_eq!(entry["status"], "done", "{entry}");
    assert_eq!(
        entry["rows_read"], 21,
        "the period was read once, from the start: {entry}"
    );
}
