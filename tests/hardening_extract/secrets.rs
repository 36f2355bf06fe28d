//! Item 7: a secret never leaves the requests, in any form it takes on the
//! way out and back. The key sits in a URL path and a query, the token in
//! a header; both hold a space, quotes, `+`, `%` and `/`, the key also a
//! non-ASCII letter. The server re-encodes the key its own way in the
//! `Link` URLs it hands back (lower-case `%xx`, `/` encoded), builds a
//! cursor from it, and quotes both (JSON-escaped) in its error bodies. The
//! key must not appear in any spelling on stderr (text and JSON logs at
//! debug level), in `status`, or anywhere in the ledger; and the stored
//! checkpoints must still bring it back, so the resumed runs succeed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{sqlite_bytes, tidemark};
use crate::support::http::{percent_decode, Hit, Reply, Request, Server};
use crate::support::{backend_tests, Backend, Env, Out, TestDb};

backend_tests! {
    secrets_never_leave_the_requests_in_any_encoding: secrets_never_leave_the_requests_in_any_encoding_sqlite, secrets_never_leave_the_requests_in_any_encoding_postgres;
}

const KEY: &str = "my secret\"+%/t\u{f6}k";
const TOKEN: &str = "T0k \"x\"+%/ y";
const DAY: &str = "2024-03-01";

/// Every spelling of `secret` a leak could take, computed here
/// independently of tidemark's own code.
fn spellings(secret: &str) -> Vec<String> {
    let encode = |keep: &dyn Fn(u8) -> bool, lower: bool, plus: bool| -> String {
        secret
            .bytes()
            .map(|b| match b {
                b' ' if plus => "+".to_string(),
                b if keep(b) => (b as char).to_string(),
                b if lower => format!("%{b:02x}"),
                b => format!("%{b:02X}"),
            })
            .collect()
    };
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    let form = |b: u8| b.is_ascii_alphanumeric() || b"*-._".contains(&b);
    let path = |b: u8| b.is_ascii_graphic() && !b"\"#<>?`{}".contains(&b);
    let json = serde_json::to_string(secret).unwrap();
    let mut all = vec![
        secret.to_string(),
        encode(&unreserved, false, false),
        encode(&unreserved, true, false),
        encode(&form, false, true),
        encode(&path, false, false),
        json.trim_matches('"').to_string(),
        json.trim_matches('"').replace('\u{f6}', "\\u00f6"),
        format!("{secret:?}").trim_matches('"').to_string(),
    ];
    // The distinctive middle of each, so that a spelling nobody listed
    // still shows (`secret"`, `secret%22`, `secret\"`, ...).
    all.extend(
        [
            "secret\"",
            "secret%22",
            "secret\\\"",
            "secret+%22",
            "T0k \"",
            "T0k%20",
            "T0k+%22",
            "T0k \\\"",
        ]
        .map(String::from),
    );
    all.sort();
    all.dedup();
    all
}

#[track_caller]
fn assert_clean(what: &str, text: &str) {
    for spelled in spellings(KEY).iter().chain(&spellings(TOKEN)) {
        assert!(
            !text.contains(spelled.as_str()),
            "{what} holds the secret as {spelled:?}:\n{text}"
        );
    }
}

/// Checks one invocation's output and returns it.
#[track_caller]
fn clean(out: Out) -> Out {
    assert_clean("stdout", &out.stdout);
    assert_clean("stderr", &out.stderr);
    out
}

/// The server: rejects any request without both secrets (401), fails
/// each source's second page while `fail` is set, and echoes the secrets
/// back in `Link` URLs, cursors and error bodies.
fn api(fail: Arc<AtomicBool>) -> Server {
    Server::start(move |r: &Request| {
        let authorized = r.headers.get("authorization").map(String::as_str)
            == Some(&format!("Bearer {TOKEN}"))
            && r.query.get("api_key").map(String::as_str) == Some(KEY);
        if !authorized {
            return Reply::status(
                401,
                "text/plain",
                format!("bad credentials for {}", r.target),
            );
        }
        let echo = format!(
            "{{\"error\":\"unknown page for key {} and token {}\"}}",
            serde_json::to_string(KEY).unwrap(),
            serde_json::to_string(TOKEN).unwrap()
        );
        if r.path == format!("/a/{KEY}/items") {
            let page = r.num("page").unwrap_or(1);
            if page == 2 && fail.load(Ordering::SeqCst) {
                return Reply::status(404, "application/json", echo);
            }
            let body: String = (0..4)
                .map(|i| format!("{{\"id\":\"a{page}{i}\"}}\n"))
                .collect();
            let reply = Reply::ndjson(body);
            if page == 2 {
                return reply;
            }
            // The server's own encoding: lower-case hex, `/` encoded too.
            let key: String = KEY
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02x}")
                    }
                })
                .collect();
            let next = format!("{}/a/{key}/items?api_key={key}&day={DAY}&page=2", r.base);
            return reply.with_header("link", &format!("<{next}>; rel=\"next\""));
        }
        if r.path == "/b/items" {
            let cursor = format!("c2:{KEY}");
            return match r.query.get("cursor") {
                None => Reply::json(format!(
                    "{{\"data\":[{{\"id\":\"b0\"}},{{\"id\":\"b1\"}},{{\"id\":\"b2\"}},{{\"id\":\"b3\"}}],\"next\":{}}}",
                    serde_json::to_string(&cursor).unwrap()
                )),
                Some(c) if *c == cursor && !fail.load(Ordering::SeqCst) => {
                    Reply::json("{\"data\":[{\"id\":\"b4\"}],\"next\":null}")
                }
                Some(_) => Reply::status(404, "application/json", echo),
            };
        }
        Reply::status(
            404,
            "text/plain",
            format!("no route {}", percent_decode(&r.target, false)),
        )
    })
}

fn pipeline(env: &Env, base: &str) {
    let text = format!(
        r#"name = "vault"
export_type = "t"

[period]
granularity = "day"

[[sources]]
id = "links"
transport = "http"
format = "ndjson"
url = "{base}/a/${{TM_KEY}}/items"
query = {{ api_key = "${{TM_KEY}}", day = "{{period.start:%Y-%m-%d}}" }}
headers = {{ Authorization = "Bearer ${{TM_TOKEN}}" }}
pagination = {{ style = "link_header" }}

[[sources]]
id = "cursors"
transport = "http"
format = "json"
url = "{base}/b/items"
query = {{ api_key = "${{TM_KEY}}" }}
headers = {{ Authorization = "Bearer ${{TM_TOKEN}}" }}
records = "/data"
pagination = {{ style = "cursor", cursor = "/next", param = "cursor" }}

[fields]
id = {{ type = "text", required = true }}

[load]
table = "vault"
key = ["id"]
batch_size = 4

[retry]
max_attempts = 2
base_delay = "10ms"
max_delay = "100ms"
"#
    );
    env.write("pipelines/vault.toml", &text);
}

/// Everything the ledger and the table hold, as text.
async fn database_text(db: &TestDb) -> String {
    match db {
        TestDb::Sqlite { path } => String::from_utf8_lossy(&sqlite_bytes(path)).into_owned(),
        TestDb::Postgres { .. } => {
            let mut text = String::new();
            for table in [
                "_tm_runs",
                "_tm_attempts",
                "_tm_batches",
                "_tm_rejects",
                "vault",
            ] {
                for row in db
                    .rows(&format!("SELECT CAST(t AS TEXT) FROM {table} t"))
                    .await
                {
                    text.push_str(&row[0].clone().unwrap_or_default());
                    text.push('\n');
                }
            }
            text
        }
    }
}

async fn secrets_never_leave_the_requests_in_any_encoding(backend: Backend) {
    let env = Env::new(backend).await;
    let fail = Arc::new(AtomicBool::new(true));
    let server = api(Arc::clone(&fail));
    pipeline(&env, &server.base);
    let vars = [
        ("TM_KEY", KEY),
        ("TM_TOKEN", TOKEN),
        ("TIDEMARK_LOG", "debug"),
    ];
    let minute = Duration::from_secs(60);

    let out = clean(tidemark(
        &env,
        &vars,
        &["run", "vault", "--period", DAY],
        minute,
    ));
    out.expect_code(1, "both sources fail on their second page");
    assert!(
        out.stderr.contains("/a/***/items?api_key=***&day="),
        "the shown URL keeps its shape\n{out}"
    );
    let status = clean(tidemark(
        &env,
        &vars,
        &["status", "vault", "--json"],
        minute,
    ));
    let entries = status.json_lines();
    assert_eq!(entries.len(), 2, "{status}");
    for entry in &entries {
        assert_eq!(entry["status"], "failed", "{entry}");
        assert_eq!(entry["rows_read"], 4, "page 1 was committed: {entry}");
        let message = entry["error_message"].as_str().unwrap();
        assert!(
            message.contains("HTTP 404") && message.contains("***"),
            "{message}"
        );
    }
    clean(tidemark(&env, &vars, &["status", "vault"], minute));
    let messages = env.db.select(&["error_message"], "FROM _tm_runs").await;
    assert_eq!(messages.len(), 2);
    for message in &messages {
        assert_clean(
            "_tm_runs.error_message",
            message[0].as_deref().unwrap_or_default(),
        );
    }
    assert_clean("the database", &database_text(&env.db).await);

    // The checkpoints, sealed, still hold what the resume needs.
    fail.store(false, Ordering::SeqCst);
    let out = clean(tidemark(
        &env,
        &vars,
        &["--log-format", "json", "run", "vault", "--period", DAY],
        minute,
    ));
    out.expect_code(0, "the resumed runs follow the stored link and cursor");
    assert_eq!(
        super::ids(&env, "vault").await,
        ["a10", "a11", "a12", "a13", "a20", "a21", "a22", "a23", "b0", "b1", "b2", "b3", "b4"]
    );
    let hits = server.hits();
    assert!(
        hits.iter()
            .all(|h| h.query.get("api_key").map(String::as_str) == Some(KEY)
                && h.headers.get("authorization") == Some(&format!("Bearer {TOKEN}"))),
        "every request carried both secrets"
    );
    let resumed: Vec<&Hit> = hits
        .iter()
        .filter(|h| h.query.contains_key("cursor") || h.query.contains_key("page"))
        .collect();
    assert_eq!(
        resumed.len(),
        4,
        "each second page twice, the first pages once: {:?}",
        hits.iter().map(|h| &h.target).collect::<Vec<_>>()
    );
    assert!(
        hits.iter().any(|h| h
            .target
            .contains("/a/my%20secret%22%2b%25%2ft%c3%b6k/items")),
        "the link was followed as the server spelled it"
    );
    clean(tidemark(
        &env,
        &vars,
        &["status", "vault", "--json"],
        minute,
    ));
    assert_clean("the database", &database_text(&env.db).await);
}
