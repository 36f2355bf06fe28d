//! Databases as sources (issue 22): `transport = "sql"` reading a period's
//! window from a real PostgreSQL, MariaDB or SQLite source database into
//! both destinations, through the real binary.

use std::path::Path;
use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection as _, Executor as _};

use crate::support::pg::PgDatabase;
use crate::support::{Backend, Env};

/// The MariaDB test server (`scripts/start-mariadb.sh`).
const MARIADB_URL: &str = "mysql://root@127.0.0.1:3306";

/// The source database kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
    MariaDb,
}

/// A source database of one test, dropped with it.
struct Source {
    kind: Kind,
    url: String,
    _pg: Option<PgDatabase>,
    mariadb: Option<String>,
}

impl Source {
    async fn new(kind: Kind, dir: &Path) -> Source {
        match kind {
            Kind::Sqlite => {
                let path = dir.join("source.db");
                let options = SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true);
                let conn = SqliteConnection::connect_with(&options).await.unwrap();
                conn.close().await.unwrap();
                Source {
                    kind,
                    url: format!("sqlite://{}", path.display()),
                    _pg: None,
                    mariadb: None,
                }
            }
            Kind::Postgres => {
                let pg = PgDatabase::create("tmsrc").await;
                Source {
                    kind,
                    url: pg.url.clone(),
                    _pg: Some(pg),
                    mariadb: None,
                }
            }
            Kind::MariaDb => {
                let name = format!("tmsrc_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
                let mut admin = MySqlConnection::connect(MARIADB_URL)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("MariaDB at {MARIADB_URL} (scripts/start-mariadb.sh): {e}")
                    });
                admin
                    .execute(format!("CREATE DATABASE {name}").as_str())
                    .await
                    .unwrap();
                admin.close().await.unwrap();
                Source {
                    kind,
                    url: format!("{MARIADB_URL}/{name}"),
                    _pg: None,
                    mariadb: Some(name),
                }
            }
        }
    }

    /// Runs statements separated by `;`.
    async fn exec(&self, sql: &str) {
        let statements = sql.split(';').map(str::trim).filter(|s| !s.is_empty());
        match self.kind {
            Kind::Sqlite => {
                let path = self.url.trim_start_matches("sqlite://");
                let options = SqliteConnectOptions::new().filename(path);
                let mut c = SqliteConnection::connect_with(&options).await.unwrap();
                for s in statements {
                    c.execute(s).await.unwrap_or_else(|e| panic!("{s}: {e}"));
                }
                c.close().await.unwrap();
            }
            Kind::Postgres => {
                let mut c = PgConnection::connect(&self.url).await.unwrap();
                for s in statements {
                    c.execute(s).await.unwrap_or_else(|e| panic!("{s}: {e}"));
                }
                c.close().await.unwrap();
            }
            Kind::MariaDb => {
                let mut c = MySqlConnection::connect(&self.url).await.unwrap();
                for s in statements {
                    c.execute(s).await.unwrap_or_else(|e| panic!("{s}: {e}"));
                }
                c.close().await.unwrap();
            }
        }
    }

    /// The `orders` table: `created_at` holds instants (UTC where the
    /// database has no zone).
    async fn create_orders(&self) {
        let created = match self.kind {
            Kind::Sqlite => "TEXT",
            Kind::Postgres => "TIMESTAMPTZ",
            Kind::MariaDb => "DATETIME(6)",
        };
        self.exec(&format!(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer VARCHAR(40) NOT NULL, \
             total DECIMAL(12,2), created_at {created} NOT NULL)"
        ))
        .await;
    }

    /// A UTC instant as a literal of this database.
    fn instant(&self, utc: &str) -> String {
        match self.kind {
            Kind::Postgres => format!("'{utc}+00'"),
            Kind::Sqlite | Kind::MariaDb => format!("'{utc}'"),
        }
    }

    /// Inserts orders `(id, "YYYY-MM-DD HH:MM:SS" UTC)` in one statement.
    async fn insert(&self, rows: &[(i64, String)]) {
        for chunk in rows.chunks(500) {
            let values: Vec<String> = chunk
                .iter()
                .map(|(id, at)| {
                    format!(
                        "({id}, 'c{id}', {}.{:02}, {})",
                        id * 3,
                        id % 100,
                        self.instant(at)
                    )
                })
                .collect();
            self.exec(&format!(
                "INSERT INTO orders (id, customer, total, created_at) VALUES {}",
                values.join(", ")
            ))
            .await;
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        if let Some(name) = self.mariadb.take() {
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                runtime.block_on(async {
                    let mut admin = MySqlConnection::connect(MARIADB_URL).await.ok()?;
                    let _ = admin
                        .execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
                        .await;
                    admin.close().await.ok()
                })
            })
            .join();
        }
    }
}

/// The pipeline `shop` reading `orders` of the source in `TM_SQL_SOURCE_URL`.
fn pipeline(extra_source: &str, timezone: &str) -> String {
    format!(
        r#"name = "shop"
export_type = "orders_daily"

[period]
granularity = "day"
timezone = "{timezone}"
start = "2024-01-01"
lag = "0s"

[[sources]]
id = "shop_db"
transport = "sql"
url = "${{TM_SQL_SOURCE_URL}}"
query = """
select id, customer, total, created_at
from orders
where created_at >= :period_start and created_at < :period_end
-- the period's window: a trailing comment must not swallow the keyset wrapper
"""
{extra_source}

[fields]
id = {{ type = "int", required = true }}
customer = {{ type = "text", required = true }}
total = {{ type = "decimal" }}
created_at = {{ type = "timestamptz", required = true }}

[load]
table = "orders"
key = ["id"]
on_missing = "delete"
max_delete_fraction = 0.5
batch_size = 5

[retry]
max_attempts = 3
base_delay = "10ms"
max_delay = "50ms"
"#
    )
}

const KEYSET: &str = "resume_key = [\"created_at\", \"id\"]\nchunk_size = 7\ntime_columns = { created_at = \"instant\" }";

async fn env_with(backend: Backend, source: &Source, text: &str) -> Env {
    let mut env = Env::new(backend).await;
    env.write("pipelines/shop.toml", text);
    env.set_var("TM_SQL_SOURCE_URL", &source.url);
    env
}

/// January 2024: day `d` has `d % 4 + 2` orders, the first at the day's
/// very start (a period bound) and the last a second before its end.
fn january() -> Vec<(i64, String)> {
    let mut rows = Vec::new();
    let mut id = 0;
    for day in 1..=31 {
        let n = day % 4 + 2;
        for i in 0..n {
            id += 1;
            let time = match i {
                0 => "00:00:00".to_string(),
                i if i == n - 1 => "23:59:59".to_string(),
                i => format!("{:02}:{:02}:00", 1 + i * 3, (id * 7) % 60),
            };
            rows.push((id, format!("2024-01-{day:02} {time}")));
        }
    }
    rows
}

async fn dest_count(env: &Env) -> usize {
    usize::try_from(env.db.count("FROM orders").await).unwrap()
}

/// A month of daily periods loads exactly the source's rows of each day;
/// then a forced re-sync after 3 updates, 2 deletes and 2 inserts in one
/// day writes exactly those.
async fn month_then_forced_resync(kind: Kind, backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(kind, dir.path()).await;
    source.create_orders().await;
    let rows = january();
    source.insert(&rows).await;
    let env = env_with(backend, &source, &pipeline(KEYSET, "UTC")).await;
    let out = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-31",
    ]);
    out.expect_code(0, "backfill");
    assert_eq!(dest_count(&env).await, rows.len(), "{out}");
    for day in [1, 15, 31] {
        let period = format!("2024-01-{day:02}");
        let status = env.status_of("shop", &period).unwrap();
        let expected = rows
            .iter()
            .filter(|(_, at)| at.starts_with(&period))
            .count();
        assert_eq!(status["rows_read"], expected as u64, "{period}: {status}");
        assert_eq!(status["status"], "done", "{status}");
    }
    let day15: Vec<i64> = rows
        .iter()
        .filter(|(_, at)| at.starts_with("2024-01-15"))
        .map(|(id, _)| *id)
        .collect();
    assert!(day15.len() >= 5, "{day15:?}");
    // 3 updated, 2 deleted, 2 inserted (one exactly at the period's start).
    source
        .exec(&format!(
            "UPDATE orders SET total = total + 1 WHERE id IN ({}, {}, {}); DELETE FROM orders WHERE id IN ({}, {})",
            day15[0], day15[1], day15[2], day15[3], day15[4]
        ))
        .await;
    source
        .insert(&[
            (9001, "2024-01-15 00:00:00".into()),
            (9002, "2024-01-15 12:30:00".into()),
        ])
        .await;
    let out = env.tidemark(&["run", "shop", "--period", "2024-01-15", "--force"]);
    out.expect_code(0, "forced re-sync");
    let result = out.json();
    assert_eq!(result["rows_updated"], 3, "{out}");
    assert_eq!(result["rows_deleted"], 2, "{out}");
    assert_eq!(result["rows_inserted"], 2, "{out}");
    assert_eq!(result["rows_unchanged"], (day15.len() - 5) as u64, "{out}");
    assert_eq!(dest_count(&env).await, rows.len(), "{out}");
    let totals = env
        .db
        .rows(&format!(
            "SELECT CAST(total AS TEXT) FROM orders WHERE id = {}",
            day15[0]
        ))
        .await;
    let total: f64 = totals[0][0].as_deref().unwrap().parse().unwrap();
    assert!((total - (day15[0] * 3 + 1) as f64 - (day15[0] % 100) as f64 / 100.0).abs() < 1e-9);
}

#[tokio::test]
async fn sqlite_source_month_into_sqlite_then_forced_resync() {
    month_then_forced_resync(Kind::Sqlite, Backend::Sqlite).await;
}

#[tokio::test]
async fn sqlite_source_month_into_postgres_then_forced_resync() {
    month_then_forced_resync(Kind::Sqlite, Backend::Postgres).await;
}

#[tokio::test]
async fn postgres_source_month_into_sqlite_then_forced_resync() {
    month_then_forced_resync(Kind::Postgres, Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_source_month_into_postgres_then_forced_resync() {
    month_then_forced_resync(Kind::Postgres, Backend::Postgres).await;
}

#[tokio::test]
async fn mariadb_source_month_into_sqlite_then_forced_resync() {
    month_then_forced_resync(Kind::MariaDb, Backend::Sqlite).await;
}

#[tokio::test]
async fn mariadb_source_month_into_postgres_then_forced_resync() {
    month_then_forced_resync(Kind::MariaDb, Backend::Postgres).await;
}

/// Without `resume_key` the period is one snapshot: the same rows.
#[tokio::test]
async fn without_resume_key_a_period_is_read_in_one_snapshot() {
    for kind in [Kind::Sqlite, Kind::Postgres, Kind::MariaDb] {
        let dir = tempfile::tempdir().unwrap();
        let source = Source::new(kind, dir.path()).await;
        source.create_orders().await;
        let rows = january();
        source.insert(&rows).await;
        let env = env_with(Backend::Sqlite, &source, &pipeline("", "UTC")).await;
        let out = env.tidemark(&[
            "backfill",
            "shop",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-10",
        ]);
        out.expect_code(0, "backfill");
        let expected = rows
            .iter()
            .filter(|(_, at)| at.as_str() < "2024-01-11")
            .count();
        assert_eq!(dest_count(&env).await, expected, "{kind:?}: {out}");
    }
}

/// 50 rows share one `created_at` across chunk boundaries (chunk_size 7):
/// all 50 load with the tie-breaker; without it the key is refused,
/// naming it, and nothing is written.
#[tokio::test]
async fn fifty_ties_across_chunks_load_and_a_key_without_tie_breaker_is_refused() {
    for kind in [Kind::Sqlite, Kind::Postgres, Kind::MariaDb] {
        let dir = tempfile::tempdir().unwrap();
        let source = Source::new(kind, dir.path()).await;
        source.create_orders().await;
        let mut rows: Vec<(i64, String)> = (1..=50)
            .map(|id| (id, "2024-01-05 10:00:00".into()))
            .collect();
        rows.push((51, "2024-01-05 09:00:00".into()));
        rows.push((52, "2024-01-05 11:00:00".into()));
        source.insert(&rows).await;
        let env = env_with(Backend::Sqlite, &source, &pipeline(KEYSET, "UTC")).await;
        let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
        out.expect_code(0, "run with the tie-breaker");
        assert_eq!(out.json()["rows_read"], 52, "{kind:?}: {out}");
        assert_eq!(dest_count(&env).await, 52);

        let lone = KEYSET.replace("[\"created_at\", \"id\"]", "[\"created_at\"]");
        let env = env_with(Backend::Sqlite, &source, &pipeline(&lone, "UTC")).await;
        let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
        out.expect_code(1, "run without the tie-breaker");
        let status = env.status_of("shop", "2024-01-05").unwrap();
        assert_eq!(status["error_class"], "config", "{status}");
        assert_eq!(status["attempts"], 1, "{status}");
        let message = status["error_message"].as_str().unwrap();
        assert!(
            message.contains("sources[0].resume_key") && message.contains("not unique"),
            "{message}"
        );
        assert_eq!(dest_count(&env).await, 0, "{kind:?}: nothing written");
    }
}

/// A syntax error: one attempt, class `config`, exit 1. An unknown column
/// in the query, or one `[fields]` reads that the result lacks: class
/// `contract`, nothing written.
#[tokio::test]
async fn syntax_errors_are_config_and_unknown_columns_are_contract() {
    for kind in [Kind::Sqlite, Kind::Postgres, Kind::MariaDb] {
        let dir = tempfile::tempdir().unwrap();
        let source = Source::new(kind, dir.path()).await;
        source.create_orders().await;
        source.insert(&january()).await;
        let cases = [
            (
                "selec id, customer, total, created_at\nfrom orders",
                "config",
            ),
            (
                "select id, customer, totl as total, created_at\nfrom orders",
                "contract",
            ),
            ("select id, total, created_at\nfrom orders", "contract"),
        ];
        for (to, class) in cases {
            let text = pipeline(KEYSET, "UTC")
                .replace("select id, customer, total, created_at\nfrom orders", to);
            assert!(text.contains(to), "{text}");
            let env = env_with(Backend::Sqlite, &source, &text).await;
            let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
            out.expect_code(1, to);
            let status = env.status_of("shop", "2024-01-05").unwrap();
            assert_eq!(status["error_class"], class, "{kind:?} {to}: {status}");
            assert_eq!(status["attempts"], 1, "{kind:?} {to}: {status}");
            assert_eq!(status["rows_read"], 0, "{status}");
            assert!(!env.db.table_exists("orders").await || dest_count(&env).await == 0);
        }
    }
}

/// The PostgreSQL test server as another user (trust auth: any password).
fn pg_url_as(source: &Source, user_and_password: &str) -> String {
    source.url.replacen(
        "postgres://postgres@",
        &format!("postgres://{user_and_password}@"),
        1,
    )
}

/// The URL's password, written literally or through `${…}`, appears in
/// no output, ledger entry or database file, on success and on failure.
#[tokio::test]
async fn the_url_password_appears_nowhere() {
    const PASSWORD: &str = "Pw-only-in-url-7731";
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Postgres, dir.path()).await;
    source.create_orders().await;
    source.insert(&january()).await;
    let literal = pg_url_as(&source, &format!("postgres:{PASSWORD}"));
    for (name, url_key, query) in [
        ("literal, failing", literal.as_str(), "selec id"),
        ("literal, loading", literal.as_str(), "select id"),
        ("env, failing", "${TM_SQL_SOURCE_URL}", "selec id"),
    ] {
        let text = pipeline(KEYSET, "UTC")
            .replace("${TM_SQL_SOURCE_URL}", url_key)
            .replace("select id", query);
        let mut env = Env::new(Backend::Sqlite).await;
        env.write("pipelines/shop.toml", &text);
        env.set_var("TM_SQL_SOURCE_URL", &literal);
        let out = env.tidemark_env(
            &[("TIDEMARK_LOG", "debug")],
            &["run", "shop", "--period", "2024-01-05"],
        );
        let failing = query.starts_with("selec ");
        out.expect_code(if failing { 1 } else { 0 }, name);
        let status = env.tidemark(&["status", "shop", "--json", "--period", "2024-01-05"]);
        let ledger = env.db.sqlite_bytes();
        let everywhere = format!(
            "{}{}{}{}",
            out.stdout, out.stderr, status.stdout, status.stderr
        );
        assert!(!everywhere.contains(PASSWORD), "{name}: {out}\n{status}");
        assert!(
            !ledger
                .windows(PASSWORD.len())
                .any(|w| w == PASSWORD.as_bytes()),
            "{name}: the password is in the database file"
        );
        if failing {
            let entry = env.status_of("shop", "2024-01-05").unwrap();
            let message = entry["error_message"].as_str().unwrap();
            assert!(message.contains("syntax"), "{name}: {message}");
            assert!(
                message.contains("***"),
                "{name}: the URL is shown redacted: {message}"
            );
        }
    }
}

/// The source role may only SELECT (a write of its own is refused, so any
/// write tidemark tried would fail the run): the month still loads.
#[tokio::test]
async fn a_source_role_with_only_select_is_enough() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Postgres, dir.path()).await;
    source.create_orders().await;
    let rows = january();
    source.insert(&rows).await;
    let role = format!("tm_ro_{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let db = source._pg.as_ref().unwrap().name.clone();
    source
        .exec(&format!(
            "CREATE ROLE {role} LOGIN; GRANT CONNECT ON DATABASE \"{db}\" TO {role}; \
             GRANT USAGE ON SCHEMA public TO {role}; GRANT SELECT ON orders TO {role}"
        ))
        .await;
    let reader_url = pg_url_as(&source, &role);
    let mut reader = PgConnection::connect(&reader_url).await.unwrap();
    let refused = reader.execute("DELETE FROM orders WHERE id = 1").await;
    assert!(refused.is_err(), "the role must not be able to write");
    reader.close().await.unwrap();

    let mut env = Env::new(Backend::Postgres).await;
    env.write("pipelines/shop.toml", &pipeline(KEYSET, "UTC"));
    env.set_var("TM_SQL_SOURCE_URL", &reader_url);
    let out = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-31",
    ]);
    drop(source);
    let mut admin = PgConnection::connect(&crate::support::pg::admin_url())
        .await
        .unwrap();
    let _ = admin
        .execute(format!("DROP ROLE IF EXISTS {role}").as_str())
        .await;
    let _ = admin.close().await;
    out.expect_code(0, "backfill as a SELECT-only role");
    assert_eq!(dest_count(&env).await, rows.len());
}

/// Europe/Berlin's 23 h and 25 h days, a `timestamp` column read as wall
/// clock and a `timestamptz` column as instants, with rows exactly at the
/// period bounds: each row lands in exactly one period, none lost.
#[tokio::test]
async fn dst_days_with_wall_clock_and_instant_columns_postgres() {
    dst_days_with_wall_clock_and_instant_columns(Kind::Postgres).await;
}

/// The same with MariaDB's `DATETIME` (wall clock) and `TIMESTAMP`.
#[tokio::test]
async fn dst_days_with_wall_clock_and_instant_columns_mariadb() {
    dst_days_with_wall_clock_and_instant_columns(Kind::MariaDb).await;
}

/// The same with SQLite's text times (wall clock, and UTC instants).
#[tokio::test]
async fn dst_days_with_wall_clock_and_instant_columns_sqlite() {
    dst_days_with_wall_clock_and_instant_columns(Kind::Sqlite).await;
}

/// The scenario of the three tests above.
async fn dst_days_with_wall_clock_and_instant_columns(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(kind, dir.path()).await;
    // Local wall-clock times (wall table) and instants (instant table).
    let wall = [
        "2024-03-30 00:00:00",
        "2024-03-30 23:59:59.999999",
        "2024-03-31 00:00:00",
        "2024-03-31 01:59:59",
        "2024-03-31 03:00:00",
        "2024-03-31 23:59:59",
        "2024-04-01 00:00:00",
        "2024-10-26 00:00:00",
        "2024-10-27 00:00:00",
        "2024-10-27 02:30:00",
        "2024-10-27 23:59:59.999999",
        "2024-10-28 00:00:00",
        "2024-10-28 23:59:59",
    ];
    // UTC instants; the local day in Berlin follows each.
    let instants = [
        ("2024-03-29 23:00:00", "2024-03-30"), // local midnight (+01)
        ("2024-03-30 22:59:59", "2024-03-30"),
        ("2024-03-30 23:00:00", "2024-03-31"), // the 23 h day starts
        ("2024-03-31 00:59:59", "2024-03-31"), // 01:59:59 +01
        ("2024-03-31 01:00:00", "2024-03-31"), // 03:00 +02
        ("2024-03-31 21:59:59", "2024-03-31"),
        ("2024-03-31 22:00:00", "2024-04-01"), // local midnight (+02)
        ("2024-10-25 22:00:00", "2024-10-26"),
        ("2024-10-26 22:00:00", "2024-10-27"), // the 25 h day starts
        ("2024-10-27 00:30:00", "2024-10-27"), // 02:30 +02
        ("2024-10-27 01:30:00", "2024-10-27"), // 02:30 +01, the repeated hour
        ("2024-10-27 22:59:59", "2024-10-27"),
        ("2024-10-27 23:00:00", "2024-10-28"), // local midnight (+01)
    ];
    let wall_values: Vec<String> = wall
        .iter()
        .enumerate()
        .map(|(i, t)| format!("({i}, '{t}')"))
        .collect();
    let instant_values: Vec<String> = instants
        .iter()
        .enumerate()
        .map(|(i, (t, _))| format!("({i}, {})", source.instant(t)))
        .collect();
    // MariaDB's TIMESTAMP is an instant (kept in UTC, read in the
    // session's zone, which sqlx sets to UTC); SQLite keeps text.
    let (wall_type, instant_type) = match kind {
        Kind::Postgres => ("TIMESTAMP", "TIMESTAMPTZ"),
        Kind::MariaDb => ("DATETIME(6)", "TIMESTAMP(6)"),
        Kind::Sqlite => ("TEXT", "TEXT"),
    };
    source
        .exec(&format!(
            "CREATE TABLE ev_wall (id INT PRIMARY KEY, at {wall_type} NOT NULL); \
             CREATE TABLE ev_inst (id INT PRIMARY KEY, at {instant_type} NOT NULL); \
             INSERT INTO ev_wall VALUES {}; INSERT INTO ev_inst VALUES {}",
            wall_values.join(", "),
            instant_values.join(", ")
        ))
        .await;
    let mut env = Env::new(Backend::Sqlite).await;
    env.set_var("TM_SQL_SOURCE_URL", &source.url);
    for (name, table, kind, ty) in [
        ("wall", "ev_wall", "wall_clock", "timestamp"),
        ("inst", "ev_inst", "instant", "timestamptz"),
    ] {
        env.write(
            format!("pipelines/{name}.toml"),
            &format!(
                r#"name = "{name}"
export_type = "events"
[period]
granularity = "day"
timezone = "Europe/Berlin"
start = "2024-01-01"
lag = "0s"
[[sources]]
id = "db"
transport = "sql"
url = "${{TM_SQL_SOURCE_URL}}"
query = "select id, at from {table} where at >= :period_start and at < :period_end"
resume_key = ["at", "id"]
chunk_size = 2
time_columns = {{ at = "{kind}" }}
[fields]
id = {{ type = "int", required = true }}
at = {{ type = "{ty}", required = true }}
[load]
table = "{table}"
key = ["id"]
"#
            ),
        );
        for (from, to) in [("2024-03-30", "2024-04-01"), ("2024-10-26", "2024-10-28")] {
            env.tidemark(&["backfill", name, "--from", from, "--to", to])
                .expect_code(0, name);
        }
    }
    let days = [
        "2024-03-30",
        "2024-03-31",
        "2024-04-01",
        "2024-10-26",
        "2024-10-27",
        "2024-10-28",
    ];
    for day in days {
        let wall_expected = wall.iter().filter(|t| t.starts_with(day)).count();
        let inst_expected = instants.iter().filter(|(_, d)| *d == day).count();
        let wall_status = env.status_of("wall", day).unwrap();
        let inst_status = env.status_of("inst", day).unwrap();
        assert_eq!(
            wall_status["rows_read"], wall_expected as u64,
            "wall {day}: {wall_status}"
        );
        assert_eq!(
            inst_status["rows_read"], inst_expected as u64,
            "instant {day}: {inst_status}"
        );
    }
    let loaded = |table: &str| format!("FROM {table}");
    let len = |n: usize| i64::try_from(n).unwrap();
    assert_eq!(env.db.count(&loaded("ev_wall")).await, len(wall.len()));
    assert_eq!(env.db.count(&loaded("ev_inst")).await, len(instants.len()));
    // The repeated hour's two instants are two rows of the 25 h day.
    let repeated = env
        .db
        .rows("SELECT CAST(at AS TEXT) FROM ev_inst WHERE id IN (9, 10) ORDER BY id")
        .await;
    assert_eq!(repeated.len(), 2, "{repeated:?}");
    assert_ne!(repeated[0][0], repeated[1][0], "{repeated:?}");
}

/// `kill -9` after the third committed chunk, then a new run: its first
/// statement continues after the checkpoint's key (tidemark's statement
/// log at debug), and the end state is that of an uninterrupted run.
#[tokio::test]
async fn kill_9_after_the_third_chunk_resumes_after_the_checkpoint_postgres() {
    kill_9_after_the_third_chunk_resumes_after_the_checkpoint(Kind::Postgres).await;
}

/// The same with a MariaDB source.
#[tokio::test]
async fn kill_9_after_the_third_chunk_resumes_after_the_checkpoint_mariadb() {
    kill_9_after_the_third_chunk_resumes_after_the_checkpoint(Kind::MariaDb).await;
}

/// A condition that costs 20 ms per row read, so that a chunk of 10 takes
/// a good part of a second: time for a test to act between chunks.
async fn slow_rows(source: &Source) -> &'static str {
    match source.kind {
        Kind::Postgres => {
            source
                .exec("CREATE FUNCTION tm_slow() RETURNS boolean LANGUAGE sql VOLATILE AS 'SELECT true FROM pg_sleep(0.02)'")
                .await;
            "tm_slow()"
        }
        Kind::MariaDb => "sleep(0.02) = 0",
        Kind::Sqlite => panic!("SQLite has no sleep"),
    }
}

async fn kill_9_after_the_third_chunk_resumes_after_the_checkpoint(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(kind, dir.path()).await;
    source.create_orders().await;
    let rows: Vec<(i64, String)> = (1..=60)
        .map(|id| {
            (
                id,
                format!("2024-01-05 {:02}:{:02}:00", id / 60 + 8, id % 60),
            )
        })
        .collect();
    source.insert(&rows).await;
    let slow = slow_rows(&source).await;
    let text = pipeline(
        "resume_key = [\"created_at\", \"id\"]\nchunk_size = 10",
        "UTC",
    )
    .replace(
        "created_at < :period_end",
        &format!("created_at < :period_end and {slow}"),
    )
    .replace("batch_size = 5", "batch_size = 10");
    let env = env_with(Backend::Postgres, &source, &text).await;
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let run = env.spawn(&["run", "shop", "--period", "2024-01-05"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let batches = if env.db.table_exists("_tm_runs").await {
            env.db.select(&["batches"], "FROM _tm_runs").await
        } else {
            Vec::new()
        };
        if batches.first().and_then(|r| r[0].as_deref()) == Some("3") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "3 chunks were not committed: {batches:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.kill9();
    let committed = dest_count(&env).await;
    assert_eq!(
        committed, 30,
        "three chunks of 10 committed before the kill"
    );

    let out = env.tidemark_env(
        &[("TIDEMARK_LOG", "tidemark_extract=debug")],
        &["run", "shop", "--period", "2024-01-05"],
    );
    out.expect_code(0, "run after kill -9");
    let chunks: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("sql source: reading a chunk"))
        .collect();
    assert!(
        chunks
            .first()
            .is_some_and(|l| l.contains("2024-01-05T08:30:00") && l.contains(", 30)")),
        "the first statement continues after the 30th row's key:\n{out}"
    );
    // Chunks 4, 5 and 6; the 6th, with fewer than chunk_size + 1 rows, is
    // known to be the last.
    assert_eq!(chunks.len(), 3, "{out}");
    assert_eq!(dest_count(&env).await, 60);
    let status = env.status_of("shop", "2024-01-05").unwrap();
    assert_eq!(status["status"], "done", "{status}");
}

/// `validate --check-source` shows the first mapped row; `--dry-run`
/// never connects to the source (here: nothing listens).
#[tokio::test]
async fn validate_shows_the_first_row_and_dry_run_never_connects() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Sqlite, dir.path()).await;
    source.create_orders().await;
    source.insert(&january()).await;
    let mut env = env_with(Backend::Sqlite, &source, &pipeline(KEYSET, "UTC")).await;
    let out = env.tidemark(&[
        "validate",
        "shop",
        "--check-source",
        "--period",
        "2024-01-05",
    ]);
    out.expect_code(0, "validate --check-source");
    assert!(
        out.stdout
            .contains("source shop_db: 3 record(s) on the first chunk of 2024-01-05"),
        "{out}"
    );
    assert!(out.stdout.contains("customer = c"), "{out}");
    assert!(
        out.stdout.contains("created_at = 2024-01-05T00:00:00"),
        "{out}"
    );

    env.set_var("TM_SQL_SOURCE_URL", "postgres://postgres@127.0.0.1:1/none");
    let out = env.tidemark(&["run", "shop", "--period", "2024-01-05", "--dry-run"]);
    out.expect_code(0, "dry run");
    let out = env.tidemark(&[
        "validate",
        "shop",
        "--check-source",
        "--period",
        "2024-01-05",
    ]);
    out.expect_code(1, "validate --check-source against nothing");
}

/// A refused connection is transient: retried up to `max_attempts`, then
/// failed as `source`, naming the URL (which has no password to hide).
#[tokio::test]
async fn a_refused_connection_is_retried() {
    let mut env = Env::new(Backend::Sqlite).await;
    env.write("pipelines/shop.toml", &pipeline(KEYSET, "UTC"));
    env.set_var("TM_SQL_SOURCE_URL", "postgres://postgres@127.0.0.1:1/none");
    let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
    out.expect_code(1, "run against nothing");
    let status = env.status_of("shop", "2024-01-05").unwrap();
    assert_eq!(status["error_class"], "source", "{status}");
    let message = status["error_message"].as_str().unwrap();
    // The pool's own "pool timed out" is replaced by the server's answer.
    assert!(
        message.contains("postgres://postgres@127.0.0.1:1/none")
            && message.contains("could not be reached")
            && message.contains("refused")
            && !message.contains("timed out"),
        "{message}"
    );
    let retries = out
        .stderr
        .lines()
        .filter(|l| l.contains("retrying"))
        .count();
    assert_eq!(retries, 2, "max_attempts = 3: two retries\n{out}");
}

/// `count_query` gives `rows_expected`; a count that disagrees fails the
/// period as `incomplete`.
#[tokio::test]
async fn count_query_checks_completeness() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::MariaDb, dir.path()).await;
    source.create_orders().await;
    source.insert(&january()).await;
    let count = "count_query = \"select count(*) from orders where created_at >= :period_start and created_at < :period_end\"";
    let env = env_with(
        Backend::Sqlite,
        &source,
        &pipeline(&format!("{KEYSET}\n{count}"), "UTC"),
    )
    .await;
    let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
    out.expect_code(0, "run");
    assert_eq!(out.json()["rows_expected"], 3, "{out}");
    let wrong = count.replace("count(*)", "count(*) + 1");
    let env = env_with(
        Backend::Sqlite,
        &source,
        &pipeline(&format!("{KEYSET}\n{wrong}"), "UTC"),
    )
    .await;
    let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
    out.expect_code(1, "run with a wrong count");
    let status = env.status_of("shop", "2024-01-05").unwrap();
    assert_eq!(status["error_class"], "incomplete", "{status}");
}

/// A query that would write is refused by the database: in a read-only
/// transaction (one snapshot), or inside the keyset wrapper (PostgreSQL
/// allows a data-modifying WITH only at the top level). Class `config`,
/// one attempt, the source untouched.
#[tokio::test]
async fn a_query_that_would_write_is_refused_by_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Postgres, dir.path()).await;
    source.create_orders().await;
    let rows = january();
    source.insert(&rows).await;
    for (extra, says) in [("", "read-only"), (KEYSET, "top level")] {
        let text = pipeline(extra, "UTC").replace(
            "select id, customer, total, created_at\nfrom orders\nwhere created_at >= :period_start and created_at < :period_end",
            "with gone as (delete from orders where created_at >= :period_start and created_at < :period_end \
             returning id, customer, total, created_at) select * from gone",
        );
        assert!(text.contains("delete from orders"), "{text}");
        let env = env_with(Backend::Sqlite, &source, &text).await;
        let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
        out.expect_code(1, "a writing query");
        let status = env.status_of("shop", "2024-01-05").unwrap();
        assert_eq!(status["error_class"], "config", "{status}");
        assert_eq!(status["attempts"], 1, "{status}");
        assert!(
            status["error_message"].as_str().unwrap().contains(says),
            "{status}"
        );
        let mut c = PgConnection::connect(&source.url).await.unwrap();
        let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM orders")
            .fetch_one(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
        assert_eq!(
            usize::try_from(left).unwrap(),
            rows.len(),
            "nothing deleted"
        );
    }
}

/// 80 % of a loaded day deleted at the source, or all of it: the delete
/// guard refuses the forced re-sync, as for files; nothing is deleted.
#[tokio::test]
async fn the_delete_guard_refuses_a_source_mostly_or_wholly_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Sqlite, dir.path()).await;
    source.create_orders().await;
    let rows = january();
    source.insert(&rows).await;
    let env = env_with(Backend::Sqlite, &source, &pipeline(KEYSET, "UTC")).await;
    env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-15",
        "--to",
        "2024-01-16",
    ])
    .expect_code(0, "backfill");
    // Day 15 has 5 orders (15 % 4 + 2): 4 deleted is 80 %; day 16 emptied.
    let day15: Vec<i64> = rows
        .iter()
        .filter(|(_, at)| at.starts_with("2024-01-15"))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(day15.len(), 5);
    source
        .exec(&format!(
            "DELETE FROM orders WHERE id IN ({}, {}, {}, {}); DELETE FROM orders WHERE created_at LIKE '2024-01-16%'",
            day15[0], day15[1], day15[2], day15[3]
        ))
        .await;
    let loaded = dest_count(&env).await;
    for day in ["2024-01-15", "2024-01-16"] {
        let out = env.tidemark(&["run", "shop", "--period", day, "--force"]);
        out.expect_code(1, day);
        let status = env.status_of("shop", day).unwrap();
        assert_eq!(status["error_class"], "invariant", "{day}: {status}");
    }
    assert_eq!(dest_count(&env).await, loaded, "nothing deleted");
}

/// A row committed late into a closed window (its transaction was open
/// during the period's first run, with an earlier `created_at`): the next
/// `sync` with `lookback = 1` reads the window again and loads it.
#[tokio::test]
async fn a_row_committed_late_into_a_closed_window_is_loaded_by_lookback() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Postgres, dir.path()).await;
    source.create_orders().await;
    let today = chrono::Utc::now().date_naive();
    let day = |n: i64| {
        (today - chrono::Duration::days(n))
            .format("%Y-%m-%d")
            .to_string()
    };
    source
        .insert(&[
            (1, format!("{} 10:00:00", day(2))),
            (2, format!("{} 09:00:00", day(1))),
        ])
        .await;
    let text = pipeline(KEYSET, "UTC").replace(
        "start = \"2024-01-01\"",
        &format!("start = \"{}\"\nlookback = 1", day(2)),
    );
    let env = env_with(Backend::Sqlite, &source, &text).await;
    // Open, not committed: invisible to the first sync.
    let mut late = PgConnection::connect(&source.url).await.unwrap();
    late.execute("BEGIN").await.unwrap();
    late.execute(
        format!(
            "INSERT INTO orders VALUES (3, 'late', 1.00, '{} 08:00:00+00')",
            day(1)
        )
        .as_str(),
    )
    .await
    .unwrap();
    env.tidemark(&["sync", "shop"]).expect_code(0, "first sync");
    assert_eq!(
        dest_count(&env).await,
        2,
        "the open transaction's row is not visible"
    );
    late.execute("COMMIT").await.unwrap();
    late.close().await.unwrap();
    env.tidemark(&["sync", "shop"])
        .expect_code(0, "second sync");
    assert_eq!(dest_count(&env).await, 3, "lookback read the window again");
    let late_row = env
        .db
        .rows("SELECT CAST(customer AS TEXT) FROM orders WHERE id = 3")
        .await;
    assert_eq!(late_row[0][0].as_deref(), Some("late"));
}

/// The shipped example `pipelines/shop.toml` runs as its comment says,
/// against the SQLite file built from `pipelines/data/shop/shop.sql`.
#[tokio::test]
async fn the_shipped_shop_example_loads_its_sqlite_source() {
    let env = Env::new(Backend::Sqlite).await;
    env.copy_example("shop");
    let script = std::fs::read_to_string(env.path("pipelines/data/shop/shop.sql")).unwrap();
    let options = SqliteConnectOptions::new()
        .filename(env.path("pipelines/data/shop/shop.db"))
        .create_if_missing(true);
    let mut c = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::raw_sql(&script).execute(&mut c).await.unwrap();
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM orders")
        .fetch_one(&mut c)
        .await
        .unwrap();
    c.close().await.unwrap();
    let out = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-07",
    ]);
    out.expect_code(0, "backfill shop");
    assert_eq!(env.db.count("FROM shop_orders").await, rows, "{out}");
    let first = env.status_of("shop", "2024-01-01").unwrap();
    assert_eq!(first["rows_expected"], 4, "count_query: {first}");
    assert_eq!(first["rows_read"], 4, "{first}");
}

/// A TCP proxy on loopback in front of the PostgreSQL test server whose
/// connections the test can cut, as a source server going away would.
struct Proxy {
    port: u16,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    fn start(upstream: &'static str) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let streams = std::sync::Arc::clone(&open);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                let mut all = streams.lock().unwrap();
                all.push(client.try_clone().unwrap());
                all.push(server.try_clone().unwrap());
                drop(all);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, open }
    }

    /// Resets every connection open now; new ones are still accepted.
    fn cut(&self) {
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The source server goes away mid-period (its connections cut after the
/// third committed chunk): the failure is transient, retried, and the
/// retry continues after the checkpoint; the end state is complete.
#[tokio::test]
async fn a_source_lost_mid_period_is_retried_and_resumed_postgres() {
    a_source_lost_mid_period_is_retried_and_resumed(Kind::Postgres).await;
}

/// The same with a MariaDB source.
#[tokio::test]
async fn a_source_lost_mid_period_is_retried_and_resumed_mariadb() {
    a_source_lost_mid_period_is_retried_and_resumed(Kind::MariaDb).await;
}

async fn a_source_lost_mid_period_is_retried_and_resumed(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(kind, dir.path()).await;
    source.create_orders().await;
    let rows: Vec<(i64, String)> = (1..=60)
        .map(|id| (id, format!("2024-01-05 08:{:02}:00", id % 60)))
        .collect();
    source.insert(&rows).await;
    let slow = slow_rows(&source).await;
    let upstream = match kind {
        Kind::MariaDb => "127.0.0.1:3306",
        _ => "127.0.0.1:5432",
    };
    let proxy = Proxy::start(upstream);
    let via_proxy = source
        .url
        .replacen(upstream, &format!("127.0.0.1:{}", proxy.port), 1);
    let text = pipeline(
        "resume_key = [\"created_at\", \"id\"]\nchunk_size = 10",
        "UTC",
    )
    .replace(
        "created_at < :period_end",
        &format!("created_at < :period_end and {slow}"),
    )
    .replace("batch_size = 5", "batch_size = 10");
    let mut env = Env::new(Backend::Postgres).await;
    env.write("pipelines/shop.toml", &text);
    env.set_var("TM_SQL_SOURCE_URL", &via_proxy);
    env.set_var("TIDEMARK_LOG", "tidemark_extract=debug,info");
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let run = env.spawn(&["run", "shop", "--period", "2024-01-05"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let batches = if env.db.table_exists("_tm_runs").await {
            env.db.select(&["batches"], "FROM _tm_runs").await
        } else {
            Vec::new()
        };
        if batches.first().and_then(|r| r[0].as_deref()) == Some("3") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "3 chunks were not committed: {batches:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.cut();
    let out = run.finish(Duration::from_secs(60));
    out.expect_code(0, "run with the source lost once");
    assert!(out.stderr.contains("retrying"), "{out}");
    let from_start = out
        .stderr
        .lines()
        .filter(|l| l.contains("sql source: reading a chunk") && l.contains("the period's start"))
        .count();
    assert_eq!(
        from_start, 1,
        "the retry continues after the checkpoint:\n{out}"
    );
    assert_eq!(dest_count(&env).await, 60);
    let status = env.status_of("shop", "2024-01-05").unwrap();
    assert_eq!(status["status"], "done", "{status}");
    assert_eq!(status["rows_read"], 60, "{status}");
}

/// `rate_limit` counts the source's queries: ten one-row chunks at five
/// queries a second take at least 1.8 s (nine waits of 200 ms).
#[tokio::test]
async fn rate_limit_paces_the_queries() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Sqlite, dir.path()).await;
    source.create_orders().await;
    let rows: Vec<(i64, String)> = (1..=10)
        .map(|id| (id, format!("2024-01-05 10:{id:02}:00")))
        .collect();
    source.insert(&rows).await;
    let text = pipeline(
        "resume_key = [\"created_at\", \"id\"]\nchunk_size = 1\nrate_limit = { per_second = 5 }",
        "UTC",
    );
    let env = env_with(Backend::Sqlite, &source, &text).await;
    let started = std::time::Instant::now();
    let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
    let took = started.elapsed();
    out.expect_code(0, "run");
    assert_eq!(dest_count(&env).await, 10);
    assert!(took >= Duration::from_millis(1700), "{took:?}\n{out}");
    let unlimited = pipeline(
        "resume_key = [\"created_at\", \"id\"]\nchunk_size = 1",
        "UTC",
    );
    let env = env_with(Backend::Sqlite, &source, &unlimited).await;
    let started = std::time::Instant::now();
    env.tidemark(&["run", "shop", "--period", "2024-01-05"])
        .expect_code(0, "run unlimited");
    eprintln!("rate limited: {took:?}; unlimited: {:?}", started.elapsed());
    assert!(started.elapsed() < took, "the limit is what took the time");
}

/// A column of a type its field cannot read (a timestamp into `int`) is a
/// `contract` error naming both, before anything is written.
#[tokio::test]
async fn a_column_its_field_cannot_read_is_contract() {
    for kind in [Kind::Postgres, Kind::MariaDb] {
        let dir = tempfile::tempdir().unwrap();
        let source = Source::new(kind, dir.path()).await;
        source.create_orders().await;
        source.insert(&january()).await;
        let text = pipeline(KEYSET, "UTC").replace(
            "created_at = { type = \"timestamptz\", required = true }",
            "created_at = { type = \"int\", required = true }",
        );
        assert!(
            text.contains("type = \"int\", required = true }\n\n[load]"),
            "{text}"
        );
        let env = env_with(Backend::Sqlite, &source, &text).await;
        let out = env.tidemark(&["run", "shop", "--period", "2024-01-05"]);
        out.expect_code(1, "run");
        let status = env.status_of("shop", "2024-01-05").unwrap();
        assert_eq!(status["error_class"], "contract", "{kind:?}: {status}");
        let message = status["error_message"].as_str().unwrap();
        assert!(
            message.contains("column `created_at`") && message.contains("field `created_at` (int)"),
            "{message}"
        );
        assert!(!env.db.table_exists("orders").await || dest_count(&env).await == 0);
    }
}

/// A selected row's values as text, NULL as `NULL`.
fn shown(row: &[Option<String>]) -> Vec<String> {
    row.iter()
        .map(|v| v.clone().unwrap_or_else(|| "NULL".into()))
        .collect()
}

/// Column types map to `[fields]` exactly: a 28-digit decimal stays
/// exact, JSON stays JSON, booleans, dates, floats and wall-clock times
/// keep their values; NULLs load as NULL.
#[tokio::test]
async fn column_types_map_to_fields_exactly() {
    for kind in [Kind::Postgres, Kind::MariaDb] {
        let dir = tempfile::tempdir().unwrap();
        let source = Source::new(kind, dir.path()).await;
        let (json, float, time) = match kind {
            Kind::MariaDb => ("JSON", "DOUBLE", "DATETIME(6)"),
            _ => ("JSONB", "DOUBLE PRECISION", "TIMESTAMP"),
        };
        source
            .exec(&format!(
                "CREATE TABLE kinds (id BIGINT PRIMARY KEY, d DECIMAL(28,10), b BOOLEAN, day DATE, \
                 j {json}, t VARCHAR(20), f {float}, at {time} NOT NULL); \
                 INSERT INTO kinds VALUES \
                 (1, 123456789012345678.1234567891, TRUE, '2024-02-29', '{{\"a\": [1, 2]}}', 'x', 1.5, '2024-01-05 10:00:00'), \
                 (2, NULL, NULL, NULL, NULL, NULL, NULL, '2024-01-05 11:00:00')"
            ))
            .await;
        let text = r#"name = "kinds"
export_type = "kinds"
[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"
lag = "0s"
[[sources]]
id = "db"
transport = "sql"
url = "${TM_SQL_SOURCE_URL}"
query = "select id, d, b, day, j, t, f, at from kinds where at >= :period_start and at < :period_end"
resume_key = ["at", "id"]
time_columns = { at = "wall_clock" }
[fields]
id = { type = "int", required = true }
d = { type = "decimal" }
b = { type = "bool" }
day = { type = "date" }
j = { type = "json" }
t = { type = "text" }
f = { type = "float" }
at = { type = "timestamp", required = true }
[load]
table = "kinds"
key = ["id"]
"#;
        let mut env = Env::new(Backend::Postgres).await;
        env.write("pipelines/kinds.toml", text);
        env.set_var("TM_SQL_SOURCE_URL", &source.url);
        let out = env.tidemark(&["run", "kinds", "--period", "2024-01-05"]);
        out.expect_code(0, "run");
        let rows = env
            .db
            .select(
                &["id", "d", "b", "day", "j", "t", "f", "at"],
                "FROM kinds ORDER BY id",
            )
            .await;
        assert_eq!(
            shown(&rows[0]),
            [
                "1",
                "123456789012345678.1234567891",
                "true",
                "2024-02-29",
                "{\"a\": [1, 2]}",
                "x",
                "1.5",
                "2024-01-05 10:00:00"
            ],
            "{kind:?}"
        );
        assert_eq!(
            shown(&rows[1]),
            [
                "2",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "2024-01-05 11:00:00"
            ],
            "{kind:?}"
        );
    }
}

/// Every PostgreSQL type tidemark reads, each decoded by the decoder its
/// type name chose (sqlx's per-value type check is skipped: it could only
/// agree), numerics by the fast path up to its ends: the values land
/// exactly, and a `NaN` numeric (left to sqlx) fails the period as drift
/// naming its column, with nothing written.
#[tokio::test]
async fn postgres_types_decode_exactly_without_sqlx_type_checks() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Postgres, dir.path()).await;
    source
        .exec(
            "CREATE TABLE kinds (id BIGINT PRIMARY KEY, s SMALLINT, i INTEGER, r REAL, \
             n NUMERIC, wide NUMERIC, c CHAR(3), v VARCHAR(5), nm NAME, j JSON, \
             at TIMESTAMPTZ NOT NULL); \
             INSERT INTO kinds VALUES \
             (1, -32768, 2147483647, 0.25, -0.0050, 79228162514264337593543950335, 'ab', 'xyz', 'pg', \
              '{\"k\": 1}', '2024-01-05 10:00:00+00'), \
             (2, 7, -1, -2.5, -0.0, -0.0000000000000000000000000001, 'abc', '', 'n', \
              '[1, 2]', '2024-01-05 11:00:00+00')",
        )
        .await;
    let text = r#"name = "kinds"
export_type = "kinds"
[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"
lag = "0s"
[[sources]]
id = "db"
transport = "sql"
url = "${TM_SQL_SOURCE_URL}"
query = "select id, s, i, r, n, wide, c, v, nm, j, at from kinds where at >= :period_start and at < :period_end"
resume_key = ["at", "id"]
time_columns = { at = "instant" }
[fields]
id = { type = "int", required = true }
s = { type = "int" }
i = { type = "int" }
r = { type = "float" }
n = { type = "decimal" }
wide = { type = "decimal" }
c = { type = "text" }
v = { type = "text" }
nm = { type = "text" }
j = { type = "json" }
at = { type = "timestamptz", required = true }
[load]
table = "kinds"
key = ["id"]
"#;
    let mut env = Env::new(Backend::Postgres).await;
    env.write("pipelines/kinds.toml", text);
    env.set_var("TM_SQL_SOURCE_URL", &source.url);
    env.tidemark(&["run", "kinds", "--period", "2024-01-05"])
        .expect_code(0, "run");
    let columns = ["id", "s", "i", "r", "n", "wide", "c", "v", "nm", "j"];
    let rows = env.db.select(&columns, "FROM kinds ORDER BY id").await;
    // The largest 96-bit mantissa, and 28 places: the ends of the fast path.
    assert_eq!(
        shown(&rows[0]),
        [
            "1",
            "-32768",
            "2147483647",
            "0.25",
            "-0.005",
            "79228162514264337593543950335",
            "ab ",
            "xyz",
            "pg",
            "{\"k\": 1}"
        ]
    );
    // An empty text is absent, as an empty CSV cell is.
    assert_eq!(
        shown(&rows[1]),
        [
            "2",
            "7",
            "-1",
            "-2.5",
            "0",
            "-0.0000000000000000000000000001",
            "abc",
            "NULL",
            "n",
            "[1, 2]"
        ]
    );
    source
        .exec("INSERT INTO kinds VALUES (3, 1, 1, 1, 'NaN', 1, 'a', 'a', 'a', '1', '2024-01-06 10:00:00+00')")
        .await;
    env.tidemark(&["run", "kinds", "--period", "2024-01-06"])
        .expect_code(1, "a NaN numeric");
    let status = env.status_of("kinds", "2024-01-06").unwrap();
    assert_eq!(status["error_class"], "contract", "{status}");
    let message = status["error_message"].as_str().unwrap();
    assert!(
        message.contains("column `n`")
            && message.contains("NaN")
            && message.contains("record 1 of chunk"),
        "{message}"
    );
    assert_eq!(
        env.db.count("FROM kinds").await,
        2,
        "nothing of the period written"
    );
}

/// The sessions PostgreSQL counted on `source`'s database so far, once
/// every other session on it has ended (a backend adds its count when it
/// exits), read on a connection of its own.
async fn sessions_when_quiet(source: &Source) -> i64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = PgConnection::connect(&source.url).await.unwrap();
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        let sessions: i64 = sqlx::query_scalar(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
        if others == 0 {
            return sessions;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sessions still open on the source database"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One small pool per source per process: a backfill of 20 daily periods
/// with `--concurrency 2` opens at most 2 sessions on the source database
/// (PostgreSQL's own count in `pg_stat_database.sessions`), where a
/// session per period would be 20.
#[tokio::test]
async fn a_backfill_reuses_a_pool_bounded_by_its_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Kind::Postgres, dir.path()).await;
    source.create_orders().await;
    let rows: Vec<(i64, String)> = january()
        .into_iter()
        .filter(|(_, at)| at.as_str() < "2024-01-21")
        .collect();
    source.insert(&rows).await;
    let env = env_with(Backend::Sqlite, &source, &pipeline(KEYSET, "UTC")).await;
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let before = sessions_when_quiet(&source).await;
    let out = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-20",
        "--concurrency",
        "2",
    ]);
    out.expect_code(0, "backfill");
    // The reading of `before` ended as a session too.
    let opened = sessions_when_quiet(&source).await - before - 1;
    eprintln!("sessions on the source for 20 periods at --concurrency 2: {opened}");
    assert_eq!(dest_count(&env).await, rows.len(), "{out}");
    for day in [1, 20] {
        let status = env.status_of("shop", &format!("2024-01-{day:02}")).unwrap();
        assert_eq!(status["status"], "done", "{status}");
    }
    assert!(
        (1..=2).contains(&opened),
        "20 periods at --concurrency 2 opened {opened} sessions on the source\n{out}"
    );
}

/// Rows are typed as text cells, so text that a `json` field reads and
/// that is no JSON fails that field: a reject naming the field and the
/// value (within `max_rejects`), while the other rows load with their JSON
/// parsed. On both destinations.
#[tokio::test]
async fn text_that_a_json_field_reads_and_is_no_json_is_a_reject_naming_it() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let dir = tempfile::tempdir().unwrap();
        let source = Source::new(Kind::Sqlite, dir.path()).await;
        source
            .exec(
                "CREATE TABLE docs (id INTEGER PRIMARY KEY, doc TEXT, at TEXT NOT NULL); \
                 INSERT INTO docs VALUES (1, '{\"a\": [1, 2]}', '2024-01-05 10:00:00'), \
                 (2, 'not json', '2024-01-05 11:00:00')",
            )
            .await;
        let text = r#"name = "docs"
export_type = "docs"
[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"
lag = "0s"
[[sources]]
id = "db"
transport = "sql"
url = "${TM_SQL_SOURCE_URL}"
query = "select id, doc, at from docs where at >= :period_start and at < :period_end"
resume_key = ["at", "id"]
[fields]
id = { type = "int", required = true }
doc = { type = "json" }
[load]
table = "docs"
key = ["id"]
max_rejects = 1
"#;
        let mut env = Env::new(backend).await;
        env.write("pipelines/docs.toml", text);
        env.set_var("TM_SQL_SOURCE_URL", &source.url);
        let out = env.tidemark(&["run", "docs", "--period", "2024-01-05"]);
        out.expect_code(0, "one bad row within max_rejects");
        let loaded = env.db.select(&["id"], "FROM docs ORDER BY id").await;
        assert_eq!(loaded, vec![vec![Some("1".to_string())]], "{out}");
        let rejects = env
            .db
            .select(&["field", "value", "reason"], "FROM _tm_rejects")
            .await;
        assert_eq!(rejects.len(), 1, "{out}");
        assert_eq!(rejects[0][0].as_deref(), Some("doc"));
        assert_eq!(rejects[0][1].as_deref(), Some("not json"));
        assert!(
            rejects[0][2].as_deref().is_some_and(|r| r.contains("JSON")),
            "{rejects:?}"
        );
    }
}
