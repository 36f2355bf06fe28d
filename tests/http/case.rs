//! A temporary working folder with one pipeline file and one SQLite
//! database, and the real `tidemark` binary run in it.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

/// One test's folder, pipeline and database.
pub struct Case {
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
    env: Vec<(String, String)>,
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
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("t.db");
        Case {
            dir,
            db,
            env: Vec::new(),
        }
    }

    /// An environment variable for every run.
    pub fn env(mut self, name: &str, value: &str) -> Case {
        self.env.push((name.into(), value.into()));
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
        let dir = self.dir.path().join("pipelines");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("orders.toml"), text).unwrap();
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(self.dir.path())
            .arg("--database-url")
            .arg(format!("sqlite://{}", self.db.display()))
            .args(args)
            .env_remove("TIDEMARK_DATABASE_URL")
            .env_remove("TIDEMARK_LOG")
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs `tidemark ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_with(args, &[])
    }

    /// Runs `tidemark ARGS` with extra environment variables.
    pub fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Out {
        let mut cmd = self.command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Out::from(cmd.output().expect("run tidemark"))
    }

    /// Starts `tidemark ARGS` in the background.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tidemark")
    }

    /// `status orders --json`, one object per run key.
    pub fn status(&self) -> Vec<Value> {
        let out = self.run(&["status", "orders", "--json"]);
        assert_eq!(out.code, Some(0), "status failed: {out}");
        out.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad status line {l:?}: {e}"))
            })
            .collect()
    }

    /// The ledger entry of the period starting on `day`.
    pub fn status_of(&self, day: &str) -> Value {
        self.status()
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
        let url = format!("sqlite://{}", self.db.display());
        let sql = sql.to_string();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                use sqlx::Connection;
                let mut conn = sqlx::SqliteConnection::connect(&url)
                    .await
                    .expect("open test database");
                let rows: Vec<String> = sqlx::query_scalar(&sql)
                    .fetch_all(&mut conn)
                    .await
                    .expect("query");
                let _ = conn.close().await;
                rows
            })
    }

    /// Every byte of the database files (main file, WAL, shared memory).
    pub fn database_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let path = PathBuf::from(format!("{}{suffix}", self.db.display()));
            if let Ok(b) = std::fs::read(&path) {
                bytes.extend(b);
            }
        }
        bytes
    }
}

/// A finished process.
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Out {
    fn from(output: Output) -> Out {
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Out {
    #[track_caller]
    pub fn expect(&self, code: i32) -> &Out {
        assert_eq!(self.code, Some(code), "{self}");
        self
    }
}

/// `[retry]` with quick backoff for tests.
pub const QUICK_RETRY: &str = "max_attempts = 6\nbase_delay = \"10ms\"\nmax_delay = \"5s\"";
