//! Issue 11, the guards: open periods, schema evolution, `backfill --only`
//! and dry runs. Each scenario runs the real binary on both databases.
//!
//! Most scenarios load the `shop` pipeline written here: one CSV file per
//! UTC day (`pipelines/data/YYYY-MM-DD.csv`, columns `id,amount,note`), `lag = "2h"`,
//! two rows per batch; `TIDEMARK_NOW` sets the clock that decides what is
//! due.

mod dry_run;
mod open_periods;
mod schema;
mod selection;

use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value as Json;

use crate::support::{Env, Out, BIN};

/// Writes `pipelines/shop.toml` with these `[fields]` lines and extra
/// top-level lines (`version = "2"`), reading `data/DAY.csv`.
fn shop(env: &Env, fields: &str) {
    shop_with(
        env,
        fields,
        "",
        "path = \"data/{period.start:%Y-%m-%d}.csv\"",
    );
}

/// [`shop`] with `extra` lines at the top and the source's `path`-like
/// settings line(s) given.
fn shop_with(env: &Env, fields: &str, extra: &str, source: &str) {
    env.write(
        "pipelines/shop.toml",
        &format!(
            r#"name = "shop"
export_type = "shop_daily"
{extra}
[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"
lag = "2h"

[[sources]]
id = "files"
transport = "file"
format = "csv"
{source}

[fields]
{fields}

[load]
table = "shop"
key = ["id"]
batch_size = 2
"#
        ),
    );
}

/// The fields of the first `shop`: no `note` yet.
const FIELDS: &str = "id = { type = \"int\", required = true }\namount = { type = \"decimal\" }";

/// `pipelines/data/DAY.csv` (paths resolve against the pipeline's
/// folder) with `rows` of `(id, amount, note)`.
fn day_file(env: &Env, day: &str, rows: &[(i64, &str, &str)]) {
    env.write(day_path(day), &csv(rows));
}

/// Where `shop` reads the day `day`, relative to the working directory.
fn day_path(day: &str) -> String {
    format!("pipelines/data/{day}.csv")
}

fn csv(rows: &[(i64, &str, &str)]) -> String {
    let mut text = String::from("id,amount,note\n");
    for (id, amount, note) in rows {
        text.push_str(&format!("{id},{amount},{note}\n"));
    }
    text
}

/// Runs `tidemark ARGS` with `TIDEMARK_NOW = now` (or without it).
fn at(env: &Env, now: Option<&str>, args: &[&str]) -> Out {
    let started = Instant::now();
    let mut cmd = Command::new(BIN);
    cmd.current_dir(env.dir.path())
        .arg("--database-url")
        .arg(env.db.url())
        .args(args)
        .env_remove("TIDEMARK_LOG")
        .env_remove("TIDEMARK_DATABASE_URL")
        .env_remove("TIDEMARK_NOW")
        .stdin(Stdio::null());
    if let Some(now) = now {
        cmd.env("TIDEMARK_NOW", now);
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
    Out {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// `status shop --json` as `period_start (YYYY-MM-DD) -> entry`.
fn ledger(env: &Env) -> std::collections::BTreeMap<String, Json> {
    env.status("shop")
        .into_iter()
        .map(|e| (text(&e, "period_start")[..10].to_string(), e))
        .collect()
}

fn text<'a>(json: &'a Json, key: &str) -> &'a str {
    json.get(key)
        .and_then(Json::as_str)
        .unwrap_or_else(|| panic!("no string {key:?} in {json}"))
}

fn count(json: &Json, key: &str) -> u64 {
    json.get(key)
        .and_then(Json::as_u64)
        .unwrap_or_else(|| panic!("no count {key:?} in {json}"))
}

fn flag(json: &Json, key: &str) -> bool {
    json.get(key)
        .and_then(Json::as_bool)
        .unwrap_or_else(|| panic!("no bool {key:?} in {json}"))
}

/// `(id, _tm_loaded_at, _tm_row_hash)` of every row of `shop`, by id.
async fn lineage(env: &Env) -> std::collections::BTreeMap<String, (String, String)> {
    env.db
        .select(
            &["id", "_tm_loaded_at", "_tm_row_hash"],
            "FROM shop ORDER BY id",
        )
        .await
        .into_iter()
        .map(|r| {
            let cell = |i: usize| r[i].clone().unwrap_or_default();
            (cell(0), (cell(1), cell(2)))
        })
        .collect()
}
