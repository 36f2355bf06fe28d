//! A PostgreSQL database of its own for one test, created on the test
//! server and dropped (`WITH (FORCE)`) when the value is dropped: also
//! when the test panics, since `Drop` runs while the panic unwinds.
//!
//! Two test crates use this one file: the end-to-end suite
//! (`tests/support/db.rs`) and the tidemark-load tests
//! (`crates/load/tests/support/mod.rs` includes it with `#[path]`), so it
//! depends on nothing but sqlx, tokio and uuid, which both crates have.

use std::thread;
use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{Connection as _, Executor as _};

/// Server used for PostgreSQL test databases (each test creates its own).
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The test server: `TIDEMARK_TEST_DATABASE_URL`, else [`DEFAULT_PG_URL`].
pub fn admin_url() -> String {
    std::env::var("TIDEMARK_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string())
}

/// A database created for one test; dropped with this value.
#[derive(Debug)]
pub struct PgDatabase {
    pub name: String,
    pub admin_url: String,
    pub url: String,
}

impl PgDatabase {
    /// Creates `PREFIX_<16 hex digits>` on the test server.
    pub async fn create(prefix: &str) -> PgDatabase {
        let admin_url = admin_url();
        let name = format!(
            "{prefix}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..16]
        );
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
        PgDatabase {
            name,
            admin_url,
            url,
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if !admin_blocking(&self.admin_url, &sql) {
            eprintln!(
                "warning: could not drop the PostgreSQL test database {}",
                self.name
            );
        }
    }
}

/// A tablespace a test may create on the test server, dropped with this
/// value. Declare it before the [`PgDatabase`] (or the `Env`) that uses
/// it: locals drop in reverse order, and a tablespace in use cannot go.
#[derive(Debug)]
pub struct PgTablespace {
    pub name: String,
}

impl Drop for PgTablespace {
    fn drop(&mut self) {
        let sql = format!("DROP TABLESPACE IF EXISTS \"{}\"", self.name);
        if !admin_blocking(&admin_url(), &sql) {
            eprintln!("warning: could not drop the tablespace {}", self.name);
        }
    }
}

/// Runs one statement on the test server from `Drop`, which may run inside
/// a runtime (and during a panic): in a thread with a runtime of its own.
fn admin_blocking(admin_url: &str, sql: &str) -> bool {
    let (admin_url, sql) = (admin_url.to_string(), sql.to_string());
    let done = thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async {
            let mut admin = PgConnection::connect(&admin_url).await.ok()?;
            let done = admin.execute(sql.as_str()).await;
            let _ = admin.close().await;
            done.ok()
        })
    })
    .join();
    matches!(done, Ok(Some(_)))
}

/// `postgres://u@h:p/db?x` with the database name replaced.
pub fn with_database(url: &str, name: &str) -> String {
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
