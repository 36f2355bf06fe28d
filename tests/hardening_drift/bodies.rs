//! Item 12: a body that arrived but cannot be decoded is permanent; only a
//! body cut by the transport is transient. The server answers raw bytes
//! ([`Reply::Raw`]) and counts requests:
//! exactly one for a body that cannot be decoded, every try for a cut one.

use std::io::Write as _;

use crate::hardening_extract::{ledger, write_pipeline};
use crate::support::http::{raw_chunked, raw_response, Reply, Server};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    undecodable_body_fails_as_parse_after_one_request: undecodable_body_fails_as_parse_after_one_request_sqlite, undecodable_body_fails_as_parse_after_one_request_postgres;
    body_cut_by_the_transport_is_retried: body_cut_by_the_transport_is_retried_sqlite, body_cut_by_the_transport_is_retried_postgres;
}

const DAY: &str = "2024-02-01";
/// `max_attempts` of the pipelines `write_pipeline` writes.
const TRIES: usize = 6;

const PAGE: &[u8] = br#"{"data":[{"id":"a"},{"id":"b"}]}"#;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Pipeline `api` reading JSON pages from `server`, with a secret in the
/// query that no message may show.
fn api(env: &Env, server: &Server) {
    write_pipeline(
        env,
        "api",
        &format!(
            "transport = \"http\"\nurl = \"{}/orders\"\nformat = \"json\"\nrecords = \"/data\"\n\
             query = {{ key = \"${{TM_DRIFT_KEY}}\" }}",
            server.base
        ),
        "id = { type = \"text\", required = true }",
        "",
    );
}

fn run_api(env: &Env) -> crate::support::Out {
    crate::hardening_extract::tidemark(
        env,
        &[("TM_DRIFT_KEY", "sekrit-4711")],
        &["run", "api", "--period", DAY, "--force"],
        std::time::Duration::from_secs(60),
    )
}

/// Bodies that arrived whole: a corrupt gzip stream, a gzip stream that
/// ends early inside a complete body, garbage chunk framing, an encoding
/// tidemark does not decode (br, deflate), latin-1 bytes in a JSON page,
/// and a body longer than its `Content-Length`. Each: exit 1, `failed` with
/// class `parse`, one request, a message naming the URL (its secret
/// redacted), the page and what failed to decode; nothing loaded.
async fn undecodable_body_fails_as_parse_after_one_request(backend: Backend) {
    let env = Env::new(backend).await;
    let zipped = gzip(PAGE);
    let mut corrupt = zipped.clone();
    let n = corrupt.len();
    corrupt[12..n - 8].iter_mut().for_each(|b| *b ^= 0x5a);
    let short_stream = zipped[..zipped.len() - 10].to_vec();
    let gz = "content-encoding: gzip\r\n";
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "corrupt gzip",
            raw_response(&corrupt, gz, usize::MAX),
            "cannot be decoded",
        ),
        (
            "a gzip stream ending inside a complete body",
            raw_response(&short_stream, gz, usize::MAX),
            "cannot be decoded",
        ),
        (
            "garbage chunk framing",
            raw_chunked("zz\r\n{\"data\":[]}\r\n0\r\n\r\n"),
            "Invalid chunk size",
        ),
        (
            "br",
            raw_response(PAGE, "content-encoding: br\r\n", usize::MAX),
            "Content-Encoding: br",
        ),
        (
            "deflate",
            raw_response(PAGE, "content-encoding: deflate\r\n", usize::MAX),
            "Content-Encoding: deflate",
        ),
        (
            "latin-1 in a JSON page",
            raw_response(br#"{"data":[{"id":"caf\xe9"}]}"#, "", usize::MAX),
            "invalid",
        ),
        (
            "a body longer than its Content-Length",
            [
                raw_response(&PAGE[..10], "", usize::MAX),
                PAGE[10..].to_vec(),
            ]
            .concat(),
            "invalid JSON",
        ),
    ];
    for (name, bytes, what) in cases {
        let server = Server::start(move |_| Reply::Raw(bytes.clone()));
        api(&env, &server);
        let out = run_api(&env);
        out.expect_code(1, name);
        assert_eq!(server.requests(), 1, "{name}: never retried\n{out}");
        assert!(!out.stderr.contains("retrying"), "{name}\n{out}");
        let entry = ledger(&env, "api", DAY);
        assert_eq!(entry["status"], "failed", "{name}: {entry}");
        assert_eq!(entry["error_class"], "parse", "{name}: {entry}");
        let message = entry["error_message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("{}/orders?key=***", server.base))
                && message.contains("page 1")
                && message.contains(what),
            "{name}: {message}"
        );
        assert!(!out.stderr.contains("sekrit-4711"), "{name}\n{out}");
        assert!(!message.contains("sekrit-4711"), "{name}: {message}");
        assert!(
            out.stderr.contains(&format!(
                "pipeline api, source src, export_type t, period {DAY}"
            )) && out.stderr.contains("parse error"),
            "{name}: the error line names pipeline, source and period\n{out}"
        );
        assert_eq!(env.db.count("FROM api").await, 0, "{name}");
    }
}

/// Bodies the transport cut (shorter than `Content-Length`, gzipped or
/// not; a chunked stream that stops mid-chunk): transient, tried
/// `max_attempts` times, then the period fails as `source`.
async fn body_cut_by_the_transport_is_retried(backend: Backend) {
    let env = Env::new(backend).await;
    let zipped = gzip(PAGE);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "a plain body cut short",
            raw_response(PAGE, "", PAGE.len() / 2),
        ),
        (
            "a gzip body cut short",
            raw_response(&zipped, "content-encoding: gzip\r\n", zipped.len() / 2),
        ),
        (
            "a chunked body cut mid-chunk",
            raw_chunked("20\r\n{\"data\":[{\"id\""),
        ),
    ];
    for (name, bytes) in cases {
        let server = Server::start(move |_| Reply::Raw(bytes.clone()));
        api(&env, &server);
        let out = run_api(&env);
        out.expect_code(1, name);
        assert_eq!(server.requests(), TRIES, "{name}: retried\n{out}");
        let entry = ledger(&env, "api", DAY);
        assert_eq!(entry["error_class"], "source", "{name}: {entry}");
    }
}
