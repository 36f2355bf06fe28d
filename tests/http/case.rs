//! One test's folder, `orders` pipeline over the fake API, and SQLite
//! database: the suite's [`Env`] (which runs the binary and owns the
//! database), plus what every `tests/http` scenario writes and reads.

use serde_json::Value;

use crate::support::{Env, Out, Running};

/// One test's folder, pipeline and database.
pub struct Case {
    env: Env,
}

/// How a pipeline reads the fake API.
pub struct Source<'a> {
    /// The source table's lines after `transport = "http"`.
    pub settings: &'a str,
    /// `load.batch_size`.
    pub batch_size: usize,
    /// The `[retry]` section's lines.
    pub retry: &'a str,
}

impl Case {
    pub fn new() -> Case {
        Case { env: Env::sqlite() }
    }

    /// An environment variable for every run.
    pub fn env(mut self, name: &str, value: &str) -> Case {
        self.env.set_var(name, value);
        self
    }

    /// Writes `pipelines/orders.toml` with `source`.
    pub fn pipeline(&self, source: &Source<'_>) {
        let text = format!(
            r#"name = "orders"
export_type = "orders_daily"

[period]
granularity = "day"

[[sources]]
id = "api"
transport = "http"
{settings}

[fields]
id = {{ type = "text", required = true }}
day = {{ type = "date" }}
amount = {{ type = "decimal" }}

[load]
table = "orders"
key = ["id"]
batch_size = {batch_size}

[retry]
{retry}
"#,
            settings = source.settings,
            batch_size = source.batch_size,
            retry = source.retry,
        );
        self.env.write("pipelines/orders.toml", &text);
    }

    /// Runs `tidemark ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Out {
        self.env.tidemark(args)
    }

    /// Starts `tidemark ARGS` in the background.
    pub fn spawn(&self, args: &[&str]) -> Running {
        self.env.spawn(args)
    }

    /// The ledger entry of the period starting on `day`.
    pub fn status_of(&self, day: &str) -> Value {
        self.env
            .status("orders")
            .into_iter()
            .find(|s| {
                s["period_start"]
                    .as_str()
                    .is_some_and(|p| p.starts_with(day))
            })
            .unwrap_or_else(|| panic!("no ledger entry for {day}"))
    }

    /// The loaded ids of `day`, sorted.
    pub fn ids(&self, day: &str) -> Vec<String> {
        self.query(&format!(
            "SELECT id FROM orders WHERE day = '{day}' ORDER BY id"
        ))
    }

    /// One text column of a query on the destination database.
    pub fn query(&self, sql: &str) -> Vec<String> {
        self.env
            .db
            .rows_blocking(sql)
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .next()
                    .flatten()
                    .unwrap_or_else(|| panic!("{sql}: NULL or no column"))
            })
            .collect()
    }

    /// Every byte of the database files (main file, WAL, shared memory).
    pub fn database_bytes(&self) -> Vec<u8> {
        self.env.db.sqlite_bytes()
    }
}

/// `[retry]` with quick backoff for tests.
pub const QUICK_RETRY: &str = "max_attempts = 6\nbase_delay = \"10ms\"\nmax_delay = \"5s\"";
