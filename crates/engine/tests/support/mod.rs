//! What the engine's in-process tests share: a scripted source read
//! through the engine's source seam (`transport = "custom"`), a pipeline
//! file written into a temporary folder, and a SQLite destination read
//! back with sqlx.
//!
//! The fake source keeps the seam's contract as a real one must: batches
//! of at most `load.batch_size` records, each with the checkpoint after its
//! last record (`{"v": 1, "next": N}`, N the index of the next record), a
//! resume continuing after the checkpoint it is handed, and
//! [`Error::StaleCheckpoint`] for a checkpoint that does not fit.

#![allow(dead_code)] // each test binary uses part of it

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use sqlx::sqlite::SqliteRow;
use sqlx::Connection as _;
use tempfile::TempDir;
use tidemark_core::{Origin, RawData, RawRecord};
use tidemark_engine::{
    Batch, BatchSource, Checkpoint, Engine, Error, OpenRequest, OpenSource, Pipeline, RunKey, Store,
};
use tokio::sync::Notify;

#[path = "../../../../tests/support/pg.rs"]
mod pg;

use pg::PgDatabase;

/// The id of the custom source every test pipeline declares.
pub const SOURCE: &str = "feed";

/// A pipeline of day periods (UTC, from 2024-01-01) reading the custom
/// source [`SOURCE`] into table `name`: text key `id`, integer `n`.
/// `load` adds lines to `[load]`; `extra` adds tables (a `[schedule]`).
pub fn pipeline_text(name: &str, batch_size: usize, load: &str, extra: &str) -> String {
    format!(
        r#"name = "{name}"
export_type = "{name}_daily"

[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"

[[sources]]
id = "{SOURCE}"
transport = "custom"

[fields]
id = {{ type = "text", required = true }}
n  = {{ type = "int" }}

[load]
table = "{name}"
key = ["id"]
batch_size = {batch_size}
{load}

[retry]
max_attempts = 2
base_delay = "1ms"
max_delay = "2ms"

{extra}
"#
    )
}

/// The rows of `$sql` on a connection of type `$conn` to `$url`, each
/// column read as optional text: one body for both databases, whose row
/// types differ.
macro_rules! text_rows {
    ($conn:ty, $url:expr, $sql:expr) => {{
        use sqlx::Row as _;
        let mut conn = <$conn>::connect($url)
            .await
            .expect("connect to the database");
        let rows = sqlx::query($sql)
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", $sql));
        let _ = conn.close().await;
        rows.iter()
            .map(|row| (0..row.len()).map(|i| row.get(i)).collect())
            .collect()
    }};
}

/// A temporary folder holding the pipeline files and the destination
/// database: a SQLite file (`t.db`), or a PostgreSQL database of its own
/// on the test server ([`Env::postgres`]), dropped with this value.
pub struct Env {
    pub dir: TempDir,
    pub store: Store,
    /// Dropped after the store's connections are gone (fields drop in
    /// order, and the database is dropped `WITH (FORCE)` anyway).
    pg: Option<PgDatabase>,
}

impl Env {
    /// A fresh folder and SQLite database, migrated.
    pub async fn new() -> Env {
        let dir = tempfile::tempdir().expect("temporary folder");
        let store = Store::connect(&db_url(dir.path()))
            .await
            .expect("connect to the SQLite store");
        Env {
            dir,
            store,
            pg: None,
        }
    }

    /// A fresh folder and a fresh PostgreSQL database, migrated: for the
    /// few tests whose moment must also be seen on the production
    /// database (most engine behaviour is written once above the ledger's
    /// driver boundary, and the end-to-end suite runs both databases).
    pub async fn postgres() -> Env {
        let dir = tempfile::tempdir().expect("temporary folder");
        let pg = PgDatabase::create("tm_engine").await;
        let store = Store::connect(&pg.url)
            .await
            .expect("connect to the PostgreSQL store");
        Env {
            dir,
            store,
            pg: Some(pg),
        }
    }

    /// A fresh database of either kind.
    pub async fn on(postgres: bool) -> Env {
        if postgres {
            Env::postgres().await
        } else {
            Env::new().await
        }
    }

    /// The database's URL.
    pub fn url(&self) -> String {
        match &self.pg {
            Some(pg) => pg.url.clone(),
            None => db_url(self.dir.path()),
        }
    }

    /// Every row `sql` returns, each column read as text (NULL as `None`),
    /// on either database: the query casts what is not text
    /// (`CAST(attempt AS TEXT)` reads the same on both).
    pub async fn texts(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        match &self.pg {
            Some(pg) => text_rows!(sqlx::PgConnection, &pg.url, sql),
            None => text_rows!(sqlx::SqliteConnection, &self.url(), sql),
        }
    }

    /// Writes `text` as `file` of the folder.
    pub fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(file);
        std::fs::write(&path, text).expect("write pipeline file");
        path
    }

    /// Writes and loads a pipeline file.
    pub fn pipeline(&self, file: &str, text: &str) -> Arc<Pipeline> {
        let path = self.write(file, text);
        Arc::new(Pipeline::load(&path).expect("pipeline loads"))
    }

    /// An engine over this database reading [`SOURCE`] through `source`.
    pub fn engine(&self, source: FakeSource) -> Engine {
        Engine::builder(self.store.clone())
            .source(SOURCE, Arc::new(source))
            .build()
    }

    /// Every row `sql` returns, on a connection of its own.
    pub async fn fetch<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, SqliteRow> + Send + Unpin,
    {
        let mut conn = sqlx::SqliteConnection::connect(&self.url())
            .await
            .expect("open the database");
        let rows = sqlx::query_as::<_, T>(sql)
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let _ = conn.close().await;
        rows
    }

    /// `(id, n)` of every row of `table`, by id.
    pub async fn rows(&self, table: &str) -> Vec<(String, Option<i64>)> {
        self.fetch(&format!("SELECT id, n FROM {table} ORDER BY id"))
            .await
    }

    /// Polls `sql` (one integer) until it is at least `at_least`; panics
    /// after 20 s.
    pub async fn wait_for(&self, sql: &str, at_least: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now: Vec<(i64,)> = self.fetch(sql).await;
            if now.first().is_some_and(|(n,)| *n >= at_least) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{sql} never reached {at_least}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn db_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("t.db").display())
}

/// The run key of [`SOURCE`] for the period `label` of `pipeline`.
pub fn key(pipeline: &Pipeline, label: &str) -> RunKey {
    let period = pipeline.period(label).expect("period");
    RunKey::new(
        &pipeline.spec.name,
        SOURCE,
        &pipeline.spec.export_type,
        period,
    )
}

/// Records `{"id": ID, "n": N}`.
pub fn records(items: &[(&str, i64)]) -> Vec<Value> {
    items
        .iter()
        .map(|(id, n)| json!({"id": id, "n": n}))
        .collect()
}

/// Stops the fake source before it returns a given batch until released:
/// lets a test act while the run is between batches.
#[derive(Default)]
pub struct Hold {
    /// The call of `next_batch` (1-based) that waits.
    pub at_call: usize,
    /// Notified (one permit) when that call is reached.
    pub reached: Notify,
    /// Notify (one permit) to let that call go on.
    pub release: Notify,
}

/// One open of a [`FakeSource`]: the period's label and the checkpoint
/// it resumed from.
pub type Opened = (String, Option<Checkpoint>);

/// One period's reading as scripted: what the source holds for it.
#[derive(Clone, Default)]
pub struct FakeSource {
    /// The records of every period.
    pub records: Vec<Value>,
    /// The total `expected_count()` declares, once read (`None`: none).
    pub expected: Option<u64>,
    /// Any checkpoint handed back no longer fits (the data changed).
    pub stale_on_resume: bool,
    /// Opening this period (its label) fails with the error.
    pub fail_period: Option<(String, Error)>,
    /// Waits before one batch.
    pub hold: Option<Arc<Hold>>,
    /// Each id gets the period's label (`a@2024-01-02`), so the periods'
    /// rows have distinct keys.
    pub ids_per_period: bool,
    /// Every open: the period's label and the checkpoint resumed from.
    pub opened: Arc<Mutex<Vec<Opened>>>,
}

impl FakeSource {
    /// A source holding `records` for every period.
    pub fn with(records: Vec<Value>) -> FakeSource {
        FakeSource {
            records,
            ..FakeSource::default()
        }
    }

    /// The opens so far.
    pub fn opens(&self) -> Vec<Opened> {
        self.opened.lock().expect("opens").clone()
    }
}

#[async_trait]
impl OpenSource for FakeSource {
    async fn open(&self, request: OpenRequest<'_>) -> Result<Box<dyn BatchSource>, Error> {
        let label = request.period.label();
        self.opened
            .lock()
            .expect("opens")
            .push((label.clone(), request.resume.cloned()));
        if let Some((failing, error)) = &self.fail_period {
            if *failing == label {
                return Err(error.clone());
            }
        }
        let next = match request.resume {
            None => 0,
            Some(_) if self.stale_on_resume => {
                return Err(Error::StaleCheckpoint(
                    "the feed was rewritten since this checkpoint".to_string(),
                ))
            }
            Some(checkpoint) => resume_at(checkpoint, self.records.len())?,
        };
        let mut records = self.records.clone();
        if self.ids_per_period {
            for record in &mut records {
                let id = record["id"].as_str().unwrap_or_default().to_string();
                record["id"] = Value::String(format!("{id}@{label}"));
            }
        }
        Ok(Box::new(FakeBatches {
            records,
            next,
            batch: request.batch_size().max(1),
            expected: self.expected,
            hold: self.hold.clone(),
            calls: 0,
            resource: Arc::from(format!("fake://{SOURCE}/{label}")),
        }))
    }
}

/// The record index a `{"v": 1, "next": N}` checkpoint continues at.
fn resume_at(checkpoint: &Checkpoint, len: usize) -> Result<usize, Error> {
    let version = checkpoint.get("v").and_then(Value::as_u64);
    let next = checkpoint
        .get("next")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok());
    match (version, next) {
        (Some(1), Some(next)) if next <= len => Ok(next),
        _ => Err(Error::StaleCheckpoint(format!(
            "checkpoint {checkpoint} does not fit a feed of {len} records"
        ))),
    }
}

/// An opened period of a [`FakeSource`].
struct FakeBatches {
    records: Vec<Value>,
    next: usize,
    batch: usize,
    expected: Option<u64>,
    hold: Option<Arc<Hold>>,
    calls: usize,
    resource: Arc<str>,
}

#[async_trait]
impl BatchSource for FakeBatches {
    async fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        self.calls += 1;
        if let Some(hold) = self.hold.as_ref().filter(|h| h.at_call == self.calls) {
            hold.reached.notify_one();
            hold.release.notified().await;
        }
        if self.next >= self.records.len() {
            return Ok(None);
        }
        let end = (self.next + self.batch).min(self.records.len());
        let records = (self.next..end)
            .map(|i| RawRecord {
                data: RawData::Json(self.records[i].clone()),
                origin: Origin {
                    resource: Arc::clone(&self.resource),
                    page: None,
                    record: i as u64 + 1,
                    line: None,
                },
            })
            .collect();
        self.next = end;
        Ok(Some(Batch {
            records,
            checkpoint: json!({"v": 1, "next": end}),
        }))
    }

    fn expected_count(&self) -> Option<u64> {
        self.expected
    }
}
