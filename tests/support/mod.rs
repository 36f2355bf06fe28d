//! Shared helpers for the end-to-end tests.
//!
//! Every test gets an [`Env`]: a fresh temporary working directory holding
//! copies of the example pipelines and their sample data (so a test may
//! edit them freely), and a [`TestDb`]: a fresh destination database on the
//! chosen [`Backend`]. The real `tidemark` binary runs in that directory
//! with `--database-url` given explicitly and no `TIDEMARK_*` variables
//! inherited from the caller.
//!
//! Database reads go through sqlx and come back as text
//! (`Vec<Vec<Option<String>>>`, every selected expression cast to TEXT), so
//! assertions read the same on both backends; [`norm_decimal`] and
//! [`norm_timestamp`] turn the few values whose text differs (numeric
//! scale, timestamptz rendering) into one canonical form.
//!
//! [`backend_tests!`] turns one `async fn scenario(backend: Backend)` into a
//! `#[tokio::test]` per backend.

#![allow(dead_code)] // not every test module uses every helper

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection as _, Executor as _, Row as _};
use tempfile::TempDir;

/// The tidemark binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

/// The repository root, where the example pipelines live.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Server used for PostgreSQL test databases (each test creates its own).
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The destination database kind a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// One `async fn scenario(backend: Backend)` becomes two `#[tokio::test]`s:
///
/// ```ignore
/// backend_tests! {
///     backfill_loads_january: backfill_loads_january_sqlite, backfill_loads_january_postgres;
/// }
/// ```
macro_rules! backend_tests {
    ($($scenario:ident: $sqlite:ident, $postgres:ident;)+) => {$(
        #[tokio::test]
        async fn $sqlite() {
            $scenario($crate::support::Backend::Sqlite).await;
        }

        #[tokio::test]
        async fn $postgres() {
            $scenario($crate::support::Backend::Postgres).await;
        }
    )+};
}
pub(crate) use backend_tests;

// ---------------------------------------------------------------------------
// Databases
// ---------------------------------------------------------------------------

/// A fresh destination database for one test. PostgreSQL databases are
/// dropped (`WITH (FORCE)`) when this is dropped; SQLite files go with the
/// temporary directory.
#[derive(Debug)]
pub enum TestDb {
    Sqlite {
        path: PathBuf,
    },
    Postgres {
        name: String,
        admin_url: String,
        url: String,
    },
}

impl TestDb {
    /// A database for `backend`; SQLite files are created (by tidemark,
    /// not here) inside `dir`.
    pub async fn new(backend: Backend, dir: &Path) -> TestDb {
        match backend {
            Backend::Sqlite => TestDb::Sqlite {
                path: dir.join("t.db"),
            },
            Backend::Postgres => {
                let admin_url = std::env::var("TIDEMARK_TEST_DATABASE_URL")
                    .unwrap_or_else(|_| DEFAULT_PG_URL.to_string());
                let name = format!("tm_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                let mut admin = PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
                    panic!("cannot connect to the PostgreSQL test server {admin_url} (set TIDEMARK_TEST_DATABASE_URL): {e}")
                });
                let mut tries = 0;
                loop {
                    match admin
                        .execute(format!("CREATE DATABASE \"{name}\"").as_str())
                        .await
                    {
                        Ok(_) => break,
                        // Concurrent CREATE DATABASE from one template can collide.
                        Err(e) if tries < 5 => {
                            tries += 1;
                            eprintln!("CREATE DATABASE {name} failed ({e}); retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => panic!("cannot create test database {name}: {e}"),
                    }
                }
                let _ = admin.close().await;
                let url = with_database(&admin_url, &name);
                TestDb::Postgres {
                    name,
                    admin_url,
                    url,
                }
            }
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            TestDb::Sqlite { .. } => Backend::Sqlite,
            TestDb::Postgres { .. } => Backend::Postgres,
        }
    }

    /// The `--database-url` for tidemark.
    pub fn url(&self) -> String {
        match self {
            TestDb::Sqlite { path } => format!("sqlite://{}", path.display()),
            TestDb::Postgres { url, .. } => url.clone(),
        }
    }

    /// Runs a query; every column must be text (cast with `CAST(x AS TEXT)`,
    /// which both backends understand), or NULL.
    pub async fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        match self {
            TestDb::Sqlite { path } => {
                assert!(
                    path.exists(),
                    "the SQLite database {} does not exist (query: {sql})",
                    path.display()
                );
                let options = SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(false);
                let mut conn = SqliteConnection::connect_with(&options)
                    .await
                    .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
                let rows = sqlx::query(sql)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("query failed: {sql}: {e}"));
                let out = rows
                    .iter()
                    .map(|r| (0..r.len()).map(|i| sqlite_text(r, i, sql)).collect())
                    .collect();
                let _ = conn.close().await;
                out
            }
            TestDb::Postgres { url, .. } => {
                let mut conn = PgConnection::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
                conn.execute("SET TIME ZONE 'UTC'")
                    .await
                    .expect("SET TIME ZONE");
                let rows = sqlx::query(sql)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("query failed: {sql}: {e}"));
                let out = rows
                    .iter()
                    .map(|r| {
                        (0..r.len())
                            .map(|i| {
                                r.try_get::<Option<String>, _>(i).unwrap_or_else(|e| {
                                    panic!("column {i} of {sql} is not text (CAST it): {e}")
                                })
                            })
                            .collect()
                    })
                    .collect();
                let _ = conn.close().await;
                out
            }
        }
    }

    /// `SELECT CAST(c AS TEXT), ... <rest>`: `rest` is `FROM ... WHERE ...`.
    /// Runs one statement that returns no rows (test set-up, fault injection).
    pub async fn execute(&self, sql: &str) {
        match self {
            TestDb::Sqlite { path } => {
                let url = format!("sqlite://{}", path.display());
                let mut conn = sqlx::SqliteConnection::connect(&url)
                    .await
                    .expect("connect");
                sqlx::query(sql)
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            TestDb::Postgres { url, .. } => {
                let mut conn = PgConnection::connect(url).await.expect("connect");
                sqlx::query(sql)
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
    }

    pub async fn select(&self, columns: &[&str], rest: &str) -> Vec<Vec<Option<String>>> {
        let list: Vec<String> = columns
            .iter()
            .map(|c| format!("CAST({c} AS TEXT)"))
            .collect();
        self.rows(&format!("SELECT {} {rest}", list.join(", ")))
            .await
    }

    /// `SELECT COUNT(*) <rest>`.
    pub async fn count(&self, rest: &str) -> i64 {
        let rows = self
            .rows(&format!("SELECT CAST(COUNT(*) AS TEXT) {rest}"))
            .await;
        let text = rows[0][0].clone().expect("COUNT(*) is never NULL");
        text.parse().expect("COUNT(*) is a number")
    }

    /// Whether a table exists (the database must exist).
    pub async fn table_exists(&self, table: &str) -> bool {
        let sql = match self {
            TestDb::Sqlite { .. } => {
                format!("SELECT CAST(COUNT(*) AS TEXT) FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
            }
            TestDb::Postgres { .. } => format!(
                "SELECT CAST(COUNT(*) AS TEXT) FROM information_schema.tables WHERE table_name = '{table}'"
            ),
        };
        self.rows(&sql).await[0][0].as_deref() != Some("0")
    }

    /// Whether nothing was ever written: no SQLite file, or a PostgreSQL
    /// database without a single table.
    pub async fn untouched(&self) -> bool {
        match self {
            TestDb::Sqlite { path } => !path.exists(),
            TestDb::Postgres { .. } => {
                let rows = self
                    .rows(
                        "SELECT CAST(COUNT(*) AS TEXT) FROM information_schema.tables
                         WHERE table_schema NOT IN ('pg_catalog', 'information_schema')",
                    )
                    .await;
                rows[0][0].as_deref() == Some("0")
            }
        }
    }

    /// A SQL condition true when the timestamp-like column `column` holds
    /// the instant `rfc3339`, whether stored as RFC 3339 text (SQLite) or
    /// as `timestamptz` (PostgreSQL).
    pub fn instant_is(&self, column: &str, rfc3339: &str) -> String {
        match self {
            TestDb::Sqlite { .. } => format!("{column} = '{rfc3339}'"),
            TestDb::Postgres { .. } => {
                format!("CAST({column} AS timestamptz) = CAST('{rfc3339}' AS timestamptz)")
            }
        }
    }
}

fn sqlite_text(row: &sqlx::sqlite::SqliteRow, i: usize, sql: &str) -> Option<String> {
    if let Ok(v) = row.try_get::<Option<String>, _>(i) {
        return v;
    }
    if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
        return v.map(|v| v.to_string());
    }
    if let Ok(v) = row.try_get::<Option<f64>, _>(i) {
        return v.map(|v| v.to_string());
    }
    panic!("column {i} of {sql} is not text (CAST it)")
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let TestDb::Postgres {
            name, admin_url, ..
        } = self
        else {
            return;
        };
        let (name, admin_url) = (name.clone(), admin_url.clone());
        // Drop may run inside a runtime: use a thread with its own.
        let dropped = thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url).await.ok()?;
                let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                let done = admin.execute(sql.as_str()).await;
                let _ = admin.close().await;
                done.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!("warning: could not drop a PostgreSQL test database");
        }
    }
}

/// `postgres://u@h:p/db?x` with the database name replaced.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let prefix = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}

// ---------------------------------------------------------------------------
// Value normalisation (backend-neutral comparisons)
// ---------------------------------------------------------------------------

/// `10.50`, `10.5` and `10.500` → `10.5`; `12.00` → `12`.
pub fn norm_decimal(text: &str) -> String {
    let t = text.trim();
    if !t.contains('.') || t.contains(['e', 'E']) {
        return t.to_string();
    }
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Any rendering of an instant (RFC 3339 or PostgreSQL's
/// `2024-01-01 13:25:00+00`) → `2024-01-01T13:25:00Z`.
pub fn norm_timestamp(text: &str) -> String {
    use chrono::{DateTime, SecondsFormat, Utc};
    let parsed = DateTime::parse_from_rfc3339(text)
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .unwrap_or_else(|e| panic!("{text:?} is not a timestamp with an offset: {e}"));
    parsed
        .with_timezone(&Utc)
        .to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

// ---------------------------------------------------------------------------
// CSV files (enough of RFC 4180 for the sample data and test edits)
// ---------------------------------------------------------------------------

/// A CSV file with a header row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Csv {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Csv {
    pub fn read(path: &Path) -> Csv {
        let text = fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        Csv::parse(&text)
    }

    pub fn parse(text: &str) -> Csv {
        let mut lines = text.lines().filter(|l| !l.is_empty()).map(parse_csv_line);
        let header = lines.next().unwrap_or_default();
        Csv {
            header,
            rows: lines.collect(),
        }
    }

    pub fn write(&self, path: &Path) {
        fs::write(path, self.to_text())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    pub fn to_text(&self) -> String {
        let mut out = csv_line(&self.header);
        for row in &self.rows {
            out.push_str(&csv_line(row));
        }
        out
    }

    /// Index of a header column.
    pub fn col(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.header))
    }

    /// The row whose first column is `id`.
    pub fn row_mut(&mut self, id: &str) -> &mut Vec<String> {
        self.rows
            .iter_mut()
            .find(|r| r[0] == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    }

    /// Sets `column` of the row whose first column is `id`.
    pub fn set(&mut self, id: &str, column: &str, value: &str) {
        let c = self.col(column);
        self.row_mut(id)[c] = value.to_string();
    }

    /// Removes the row whose first column is `id`.
    pub fn remove(&mut self, id: &str) {
        let before = self.rows.len();
        self.rows.retain(|r| r[0] != id);
        assert_eq!(
            self.rows.len() + 1,
            before,
            "row {id} should have been removed once"
        );
    }
}

fn parse_csv_line(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if field.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

fn csv_line(fields: &[String]) -> String {
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| {
            if f.contains([',', '"', '\n']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.clone()
            }
        })
        .collect();
    format!("{}\n", quoted.join(","))
}

// ---------------------------------------------------------------------------
// The working directory and the binary
// ---------------------------------------------------------------------------

/// What one tidemark invocation did.
#[derive(Debug, Clone)]
pub struct Out {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Out {
    /// Panics with the full output unless the exit code is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32, what: &str) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "{what}: expected exit code {code}\n{self}"
        );
        self
    }

    /// stdout lines that are JSON objects.
    pub fn json_lines(&self) -> Vec<Json> {
        self.stdout
            .lines()
            .filter(|l| l.trim_start().starts_with('{'))
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
            })
            .collect()
    }

    /// The single JSON object printed on stdout (the result of `run`).
    #[track_caller]
    pub fn json(&self) -> Json {
        let mut lines = self.json_lines();
        assert_eq!(lines.len(), 1, "expected one JSON line on stdout\n{self}");
        lines.remove(0)
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--- exit code: {:?} after {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// A test's working directory and destination database.
pub struct Env {
    pub dir: TempDir,
    pub db: TestDb,
    spawned: AtomicUsize,
}

impl Env {
    /// An empty working directory (with an empty `pipelines/`) and a fresh database.
    pub async fn new(backend: Backend) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("tidemark-test-")
            .tempdir()
            .expect("temp dir");
        fs::create_dir_all(dir.path().join("pipelines")).expect("pipelines dir");
        let db = TestDb::new(backend, dir.path()).await;
        Env {
            dir,
            db,
            spawned: AtomicUsize::new(0),
        }
    }

    /// A working directory holding a copy of the shipped `orders` example
    /// (`pipelines/orders.toml` and `pipelines/data/orders/`).
    pub async fn orders(backend: Backend) -> Env {
        let env = Env::new(backend).await;
        env.copy_example("orders");
        env
    }

    pub fn backend(&self) -> Backend {
        self.db.backend()
    }

    /// Copies `pipelines/NAME.toml` and `pipelines/data/NAME/` of the repository.
    pub fn copy_example(&self, name: &str) {
        let from = repo_root().join("pipelines");
        let to = self.path("pipelines");
        fs::copy(
            from.join(format!("{name}.toml")),
            to.join(format!("{name}.toml")),
        )
        .unwrap_or_else(|e| panic!("cannot copy pipelines/{name}.toml: {e}"));
        let data = from.join("data").join(name);
        if data.exists() {
            copy_dir(&data, &to.join("data").join(name));
        }
    }

    /// A path inside the working directory.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn pipeline_file(&self, name: &str) -> PathBuf {
        self.path(format!("pipelines/{name}.toml"))
    }

    /// Rewrites a pipeline file.
    pub fn edit_pipeline(&self, name: &str, edit: impl FnOnce(String) -> String) {
        let path = self.pipeline_file(name);
        let text = fs::read_to_string(&path).expect("read pipeline");
        fs::write(&path, edit(text)).expect("write pipeline");
    }

    /// Sets `key = value` (value as TOML) in `[section]` of a pipeline
    /// file, replacing the key's line or adding it under the header.
    pub fn set_option(&self, name: &str, section: &str, key: &str, value: &str) {
        self.edit_pipeline(name, |text| set_toml_key(&text, section, key, value));
    }

    /// Writes a file (creating folders) in the working directory.
    pub fn write(&self, rel: impl AsRef<Path>, contents: &str) {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create folders");
        }
        fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    fn command(&self, args: &[&str]) -> Command {
        self.command_at(&self.db.url(), args)
    }

    /// `tidemark --database-url URL ARGS...`, for a URL other than the test
    /// database's own (connection options, a server that is not there).
    fn command_at(&self, url: &str, args: &[&str]) -> Command {
        self.command_on(None, url, args)
    }

    /// The command, run on its own host name when `host` is given: in a new
    /// UTS namespace (`unshare --uts`, as root), so that its worker id names
    /// another host and the lease path is exercised, not the same-host
    /// dead-holder shortcut.
    fn command_on(&self, host: Option<&str>, url: &str, args: &[&str]) -> Command {
        let mut cmd = match host {
            None => Command::new(BIN),
            Some(host) => {
                let mut cmd = Command::new("unshare");
                cmd.args([
                    "--uts",
                    "sh",
                    "-c",
                    "hostname \"$0\" && exec \"$@\"",
                    host,
                    BIN,
                ]);
                cmd
            }
        };
        cmd.current_dir(self.dir.path())
            .arg("--database-url")
            .arg(url)
            .args(args)
            .env_remove("TIDEMARK_LOG")
            .env_remove("TIDEMARK_DATABASE_URL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `tidemark --database-url URL ARGS...` to completion.
    pub fn tidemark(&self, args: &[&str]) -> Out {
        self.tidemark_at(&self.db.url(), args)
    }

    /// Runs tidemark against `url` instead of the test database's own URL.
    pub fn tidemark_at(&self, url: &str, args: &[&str]) -> Out {
        let started = Instant::now();
        let output = self
            .command_at(url, args)
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// Starts tidemark against `url` in the background.
    pub fn spawn_at(&self, url: &str, args: &[&str]) -> Running {
        self.spawn_on(None, url, args)
    }

    /// Starts tidemark in the background as if on another host (see
    /// [`Env::command_on`]).
    pub fn spawn_on_host(&self, host: &str, args: &[&str]) -> Running {
        self.spawn_on(Some(host), &self.db.url(), args)
    }

    fn spawn_on(&self, host: Option<&str>, url: &str, args: &[&str]) -> Running {
        let n = self.spawned.fetch_add(1, Ordering::SeqCst);
        let stdout = self.path(format!("proc-{n}.stdout"));
        let stderr = self.path(format!("proc-{n}.stderr"));
        let child = self
            .command_on(host, url, args)
            .stdout(fs::File::create(&stdout).expect("stdout file"))
            .stderr(fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Running {
            child,
            stdout,
            stderr,
            started: Instant::now(),
            args: args.join(" "),
        }
    }

    /// Runs tidemark with extra environment variables (`TIDEMARK_LOG`, say).
    pub fn tidemark_env(&self, vars: &[(&str, &str)], args: &[&str]) -> Out {
        let started = Instant::now();
        let mut command = self.command(args);
        command.envs(vars.iter().copied());
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// Runs tidemark with the environment variables `unset` removed (other
    /// tests of this process may have set them).
    pub fn tidemark_without(&self, unset: &[&str], args: &[&str]) -> Out {
        let started = Instant::now();
        let mut command = self.command(args);
        for name in unset {
            command.env_remove(name);
        }
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// `tidemark backfill orders` over January 2024's days `from..=to`.
    pub fn backfill_orders(&self, from: u32, to: u32) -> Out {
        let (from, to) = (format!("2024-01-{from:02}"), format!("2024-01-{to:02}"));
        self.tidemark(&["backfill", "orders", "--from", &from, "--to", &to])
    }

    /// Runs tidemark with neither `--database-url` nor any environment
    /// override: for commands that must not need a database.
    pub fn tidemark_bare(&self, args: &[&str]) -> Out {
        let started = Instant::now();
        let output = Command::new(BIN)
            .current_dir(self.dir.path())
            .args(args)
            .env_remove("TIDEMARK_LOG")
            .env_remove("TIDEMARK_DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// Starts tidemark in the background; its output goes to files.
    pub fn spawn(&self, args: &[&str]) -> Running {
        self.spawn_at(&self.db.url(), args)
    }

    /// `status PIPELINE --json`: one object per run key.
    #[track_caller]
    pub fn status(&self, pipeline: &str) -> Vec<Json> {
        let out = self.tidemark(&["status", pipeline, "--json"]);
        out.expect_code(0, "status --json");
        out.json_lines()
    }

    /// The ledger entry of one period (`2024-01-05`), if the ledger has one.
    #[track_caller]
    pub fn status_of(&self, pipeline: &str, period: &str) -> Option<Json> {
        let out = self.tidemark(&["status", pipeline, "--period", period, "--json"]);
        out.expect_code(0, "status --period --json");
        // A period the ledger has no row for is a `missing` (or, not due
        // yet, a `not_due`) line.
        let mut lines: Vec<Json> = out
            .json_lines()
            .into_iter()
            .filter(|line| line["status"] != "missing" && line["status"] != "not_due")
            .collect();
        assert!(lines.len() <= 1, "one run key per period expected\n{out}");
        lines.pop()
    }

    /// Polls `status_of` until `pred` holds or `timeout` passes.
    pub fn wait_for_status(
        &self,
        pipeline: &str,
        period: &str,
        timeout: Duration,
        pred: impl Fn(&Json) -> bool,
    ) -> Json {
        let deadline = Instant::now() + timeout;
        loop {
            let entry = self.status_of(pipeline, period);
            if let Some(entry) = &entry {
                if pred(entry) {
                    return entry.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "status of {pipeline} {period} did not reach the expected state within {timeout:?}; last: {entry:?}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A tidemark process running in the background.
pub struct Running {
    pub child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    started: Instant,
    args: String,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the exit (killing it after `timeout`) and returns its output.
    pub fn finish(mut self, timeout: Duration) -> Out {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "`tidemark {}` did not finish within {timeout:?}\n{}",
                    self.args,
                    self.output(None)
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.output(status.code())
    }

    /// Sends a signal by name (`TERM`, `INT`, `HUP`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {}", self.child.id());
    }

    /// The output so far, while it runs.
    pub fn output_so_far(&self) -> Out {
        self.output(None)
    }

    /// Waits until its stderr contains `text`, or panics after `timeout`.
    pub fn wait_for_stderr(&self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !fs::read_to_string(&self.stderr)
            .unwrap_or_default()
            .contains(text)
        {
            assert!(
                Instant::now() < deadline,
                "`tidemark {}` did not log {text:?} within {timeout:?}\n{}",
                self.args,
                self.output(None)
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9`, reaped (a zombie would still look alive in /proc).
    pub fn kill9(mut self) -> Out {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("wait");
        self.output(status.code())
    }

    fn output(&self, code: Option<i32>) -> Out {
        Out {
            code,
            stdout: fs::read_to_string(&self.stdout).unwrap_or_default(),
            stderr: fs::read_to_string(&self.stderr).unwrap_or_default(),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Writes into a named pipe from a thread, so the test controls when a
/// reader gets its records and when it sees the end of the input.
pub struct FifoWriter {
    sender: Option<mpsc::Sender<Vec<u8>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FifoWriter {
    /// Creates the FIFO at `path` (replacing any file there).
    pub fn create(path: &Path) -> FifoWriter {
        let _ = fs::remove_file(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("fifo folder");
        }
        let status = Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("run mkfifo");
        assert!(status.success(), "mkfifo {} failed", path.display());
        let (sender, receiver) = mpsc::channel::<Vec<u8>>();
        let path = path.to_path_buf();
        let thread = thread::spawn(move || {
            // Blocks until a reader opens the FIFO.
            let Ok(mut fifo) = fs::OpenOptions::new().write(true).open(&path) else {
                return;
            };
            for chunk in receiver {
                if fifo.write_all(&chunk).and_then(|()| fifo.flush()).is_err() {
                    return;
                }
            }
        });
        FifoWriter {
            sender: Some(sender),
            thread: Some(thread),
        }
    }

    /// Queues bytes for the reader.
    pub fn write(&self, text: &str) {
        if let Some(sender) = &self.sender {
            let _ = sender.send(text.as_bytes().to_vec());
        }
    }

    /// Closes the writing end (the reader then sees end of file) once a
    /// reader has opened the FIFO and got everything written.
    pub fn close(mut self, timeout: Duration) {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + timeout;
            while !thread.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "no reader opened the FIFO within {timeout:?}"
                );
                thread::sleep(Duration::from_millis(20));
            }
            let _ = thread.join();
        }
    }
}

impl Drop for FifoWriter {
    fn drop(&mut self) {
        // Closing the channel lets the thread end once a reader opened the
        // FIFO; a thread still blocked in open() is left behind.
        self.sender.take();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create dir");
    for entry in fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Sets `key = value` in `[section]` of TOML text (line-based: the example
/// pipelines keep one key per line).
pub fn set_toml_key(text: &str, section: &str, key: &str, value: &str) -> String {
    let (header, array_header) = (format!("[{section}]"), format!("[[{section}]]"));
    let mut out = Vec::new();
    let mut in_section = false;
    let mut done = false;
    let lines: Vec<&str> = text.lines().collect();
    for line in &lines {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            if in_section && !done {
                // Key absent: insert before the next section.
                out.push(format!("{key} = {value}"));
                done = true;
            }
            in_section = trimmed == header || trimmed == array_header;
        }
        if in_section && !done {
            let name = trimmed.split('=').next().unwrap_or("").trim();
            if name == key && trimmed.contains('=') {
                out.push(format!("{key} = {value}"));
                done = true;
                continue;
            }
        }
        out.push((*line).to_string());
    }
    if !done {
        if !in_section {
            out.push(header);
        }
        out.push(format!("{key} = {value}"));
    }
    let mut joined = out.join("\n");
    joined.push('\n');
    joined
}
