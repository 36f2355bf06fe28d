//! `transport = "sql"`: one period's window read from a database.
//!
//! One flow for every database; `dialect` holds the few things that
//! differ. The query selects `[:period_start, :period_end)`; both are bound
//! as typed parameters (the kind `time_columns` declares), never spliced.
//!
//! - With `resume_key`, the period is read in keyset chunks: the query is
//!   wrapped as `SELECT * FROM (query) AS _tm_q WHERE (k1, k2) > (last)
//!   ORDER BY k1, k2 LIMIT chunk_size + 1`, each chunk in its own read-only
//!   transaction. The checkpoint after a batch is its last key (typed, so
//!   it is bound again as itself), and a new attempt continues after it.
//!   The one row past the chunk is read only to see whether it ties with
//!   the chunk's last row: a key that is not unique would make `>` skip
//!   rows silently, so a tie anywhere is a configuration error.
//! - Without it, the period is one statement in one read-only snapshot
//!   transaction; there is no position to resume at, so a checkpoint from
//!   an earlier attempt is stale and the engine starts the period over.
//!
//! The source's password (a `${…}` value or a literal one in the URL) is
//! a secret: every message passes the source's redaction.
//!
//! A period borrows one connection of its source database's pool
//! (`pool`), sized by the periods the engine runs at once; a connection
//! that may still be inside a transaction is closed, never reused.

mod cell;
mod dialect;
mod pool;

pub use pool::close_pools;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, NaiveDateTime};
use chrono_tz::Tz;
use futures_util::StreamExt;
use indexmap::IndexMap;
use serde_json::json;
use tidemark_core::record::CsvHeaders;
use tidemark_core::spec::{split_query, SqlParam, SqlPiece, SqlSourceSpec, TimeKind};
use tidemark_core::template::TemplateContext;
use tidemark_core::{
    Error, FieldType, Location, Origin, Period, Pipeline, RateGate, RawData, RawRecord,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::http::secrets::Secrets;
use crate::{Batch, Checkpoint};
use cell::Cell;
use dialect::{Db, Dialect, Failure, FailureKind, SqlRow};

/// A result column `[fields]` reads.
struct ReadColumn {
    column: String,
    field: String,
    ty: FieldType,
}

/// The result's column names as the header row its text records share.
fn header_row(columns: &[String]) -> CsvHeaders {
    Arc::new(csv::StringRecord::from(columns.to_vec()))
}

/// The checkpoint format; a checkpoint of another version is stale.
const CHECKPOINT_VERSION: u64 = 1;

/// An opened period of a SQL source. The statements run in a task of
/// their own (a statement's row stream borrows its connection, which
/// outlives any one `next_batch`), one batch ahead of the engine.
#[derive(Debug)]
pub struct SqlReader {
    batches: mpsc::Receiver<Message>,
    task: JoinHandle<()>,
    expected: Option<u64>,
    done: bool,
}

#[derive(Debug)]
enum Message {
    Batch(Batch),
    Done(Option<u64>),
    Failed(Error),
}

impl Drop for SqlReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SqlReader {
    /// Opens `spec` of `pipeline` for `period`, continuing after `resume`.
    /// Connects in the background: the first [`next_batch`](Self::next_batch)
    /// reports a connection failure, classed as any other. `at_once` is
    /// how many periods the caller reads at once: the source database's
    /// pool holds at least that many connections.
    pub async fn open(
        pipeline: &Pipeline,
        spec: &SqlSourceSpec,
        period: &Period,
        resume: Option<&Checkpoint>,
        gate: Option<Arc<dyn RateGate>>,
        at_once: usize,
    ) -> Result<SqlReader, Error> {
        let plan = Plan::new(pipeline, spec, period, gate, at_once)?;
        let after = plan.resume_after(resume)?;
        let (tx, batches) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            let message = match plan.run(after, &tx).await {
                Ok(expected) => Message::Done(expected),
                Err(e) => Message::Failed(plan.secrets.redact_error(e)),
            };
            let _ = tx.send(message).await;
        });
        Ok(SqlReader {
            batches,
            task,
            expected: None,
            done: false,
        })
    }

    /// The next batch, or `None` once the period is read whole.
    pub async fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        if self.done {
            return Ok(None);
        }
        match self.batches.recv().await {
            Some(Message::Batch(batch)) => Ok(Some(batch)),
            Some(Message::Done(expected)) => {
                self.done = true;
                self.expected = expected;
                Ok(None)
            }
            Some(Message::Failed(e)) => {
                self.done = true;
                Err(e)
            }
            None => Err(Error::source_transient(
                "the SQL source's reader stopped before the period was read whole",
            )),
        }
    }

    /// The rows `count_query` counted, once the period is read whole.
    pub fn expected_count(&self) -> Option<u64> {
        self.expected
    }
}

/// Everything one period's read needs, owned by its task (which outlives
/// the borrow of the pipeline that `open` got).
struct Plan {
    /// The pipeline file, for configuration errors.
    file: String,
    /// `sources[i]`, the key prefix configuration errors name.
    at: String,
    /// The source's id and the period's label, for every message.
    source: String,
    label: String,
    /// The rendered URL, secrets and all: only ever handed to the driver.
    url: String,
    /// The pipeline file's folder, for a relative SQLite path.
    base: PathBuf,
    /// The URL as shown ([`shown_url`]).
    resource: Arc<str>,
    /// The URL's password, redacted from every message.
    secrets: Secrets,
    query: Vec<SqlPiece>,
    count_query: Option<Vec<SqlPiece>>,
    resume_key: Vec<String>,
    /// Rows per keyset chunk and per batch.
    chunk: usize,
    batch: usize,
    /// `time_columns`, and the timezone a wall clock is read in.
    times: IndexMap<String, TimeKind>,
    tz: Tz,
    /// The period's start and end, of the kind `time_columns` declares.
    bounds: (Cell, Cell),
    /// The columns `[fields]` must find (drift), and their types.
    read: Vec<ReadColumn>,
    /// The columns `json` fields read.
    json_columns: HashSet<String>,
    /// Every field reads a column by name (none through a JSON pointer
    /// into a `json` column): records are then CSV-like rows of text
    /// sharing one header, typed as a file's, instead of a JSON object
    /// per row (a third of the time of a load, and most of its memory).
    as_text: bool,
    gate: Option<Arc<dyn RateGate>>,
    /// Periods the engine reads at once: the pool's size.
    at_once: usize,
}

impl Plan {
    fn new(
        pipeline: &Pipeline,
        spec: &SqlSourceSpec,
        period: &Period,
        gate: Option<Arc<dyn RateGate>>,
        at_once: usize,
    ) -> Result<Plan, Error> {
        let file = pipeline.file_name();
        let index = pipeline
            .spec
            .sources
            .iter()
            .position(|s| s.id() == spec.id)
            .unwrap_or_default();
        let at = format!("sources[{index}]");
        let template = tidemark_core::template::Template::parse(&spec.url)
            .map_err(|e| Error::config(&file, format!("{at}.url"), e))?;
        let ctx = TemplateContext {
            period,
            source_id: &spec.id,
            pipeline: &pipeline.spec.name,
        };
        let url = template
            .render(&ctx)
            .map_err(|e| Error::config(&file, format!("{at}.url"), e.to_string()))?;
        let mut secrets = Secrets::default();
        let resource = shown_url(&url, &mut secrets);
        let split = |key: &str, text: &str| {
            split_query(text).map_err(|e| Error::config(&file, format!("{at}.{key}"), e))
        };
        let query = split("query", &spec.query)?;
        let count_query = spec
            .count_query
            .as_deref()
            .map(|q| split("count_query", q))
            .transpose()?;
        let bounds = match spec.bound_kind() {
            TimeKind::Instant => (
                Cell::Timestamptz(period.start().to_utc()),
                Cell::Timestamptz(period.end().to_utc()),
            ),
            TimeKind::WallClock => (
                Cell::Timestamp(period.start().naive_local()),
                Cell::Timestamp(period.end().naive_local()),
            ),
        };
        let read: Vec<ReadColumn> = pipeline
            .spec
            .fields
            .iter()
            .filter(|(name, field)| field.value.is_none() && !pipeline.may_lack(name, period))
            .map(|(name, field)| {
                let from = field.from.as_deref().unwrap_or(name);
                let column = tidemark_core::Selector::parse(from)
                    .csv_column()
                    .to_string();
                ReadColumn {
                    column,
                    field: name.clone(),
                    ty: field.ty,
                }
            })
            .collect();
        let json_columns = read
            .iter()
            .filter(|c| c.ty == FieldType::Json)
            .map(|c| c.column.clone())
            .collect();
        let as_text = pipeline.spec.fields.values().all(|field| {
            field.value.is_some()
                || !matches!(
                    tidemark_core::Selector::parse(field.from.as_deref().unwrap_or_default()),
                    tidemark_core::Selector::Pointer(_)
                )
        });
        Ok(Plan {
            as_text,
            json_columns,
            at,
            source: spec.id.clone(),
            label: period.label(),
            base: pipeline.base_dir.clone(),
            url,
            resource,
            secrets,
            query,
            count_query,
            resume_key: spec.resume_key.clone(),
            chunk: usize::try_from(spec.chunk_size).unwrap_or(usize::MAX),
            batch: pipeline.spec.load.batch_size,
            times: spec.time_columns.clone(),
            tz: pipeline.spec.period.timezone,
            bounds,
            read,
            gate,
            at_once,
            file,
        })
    }

    /// The key to continue after, from the last committed checkpoint.
    fn resume_after(&self, resume: Option<&Checkpoint>) -> Result<Option<Vec<Cell>>, Error> {
        let Some(checkpoint) = resume else {
            return Ok(None);
        };
        if self.resume_key.is_empty() {
            return Err(Error::StaleCheckpoint(format!(
                "source {} has no resume_key: period {} is read again from the start in a new snapshot",
                self.source, self.label
            )));
        }
        let after = (checkpoint.get("v").and_then(|v| v.as_u64()) == Some(CHECKPOINT_VERSION))
            .then(|| checkpoint.get("after").cloned())
            .flatten()
            .and_then(|after| serde_json::from_value::<Vec<Cell>>(after).ok())
            .filter(|after| after.len() == self.resume_key.len());
        match after {
            Some(after) => Ok(Some(after)),
            None => Err(Error::StaleCheckpoint(format!(
                "source {}: the checkpoint of period {} does not fit resume_key {:?} (edited since?); \
                 the period is read again from the start",
                self.source, self.label, self.resume_key
            ))),
        }
    }

    /// Reads the period into `tx`; the rows `count_query` counted.
    async fn run(
        &self,
        after: Option<Vec<Cell>>,
        tx: &mpsc::Sender<Message>,
    ) -> Result<Option<u64>, Error> {
        let pool = pool::pool_for(&self.url, &self.base, self.at_once)
            .map_err(|f| self.error(f, "url"))?;
        let mut db = pool.acquire().await.map_err(|f| self.error(f, "url"))?;
        let read = match self.resume_key.is_empty() {
            true => self.snapshot(&mut db, tx).await,
            false => self.keyset(&mut db, after, tx).await,
        };
        let expected = match (&read, &self.count_query) {
            (Ok(()), Some(count)) => Some(self.count(&mut db, count).await),
            _ => None,
        };
        // A read that failed may have left the session anywhere (inside a
        // transaction, mid-result): it is closed, never handed on.
        if read.is_err() || matches!(expected, Some(Err(_))) {
            db.discard();
        }
        // Back to the pool before the engine hears the period is read.
        drop(db);
        read?;
        expected.transpose()
    }

    /// The query's SQL with the database's placeholders, and its binds.
    fn statement(&self, db: &Db, pieces: &[SqlPiece]) -> (String, Vec<Cell>) {
        let mut sql = String::new();
        let mut binds = Vec::new();
        for piece in pieces {
            match piece {
                SqlPiece::Text(text) => sql.push_str(text),
                SqlPiece::Param(param) => {
                    let bound = match param {
                        SqlParam::PeriodStart => &self.bounds.0,
                        SqlParam::PeriodEnd => &self.bounds.1,
                    };
                    binds.push(db_time(db, bound.clone()));
                    sql.push_str(&db.placeholder(binds.len()));
                }
            }
        }
        (sql, binds)
    }

    async fn pass_gate(&self) -> Result<(), Error> {
        match &self.gate {
            Some(gate) => gate.acquire().await,
            None => Ok(()),
        }
    }

    /// The whole period in one snapshot, `batch` rows at a time.
    async fn snapshot(&self, db: &mut Db, tx: &mpsc::Sender<Message>) -> Result<(), Error> {
        let (sql, binds) = self.statement(db, &self.query);
        self.pass_gate().await?;
        db.begin().await.map_err(|f| self.error(f, "query"))?;
        let mut records = Vec::new();
        let mut read = 0u64;
        let mut headers = None;
        {
            let mut rows = db.fetch(&sql, &binds);
            while let Some(row) = rows.next().await {
                let row = row.map_err(|f| self.error(f, "query"))?;
                if read == 0 {
                    self.check_columns(&row)?;
                }
                read += 1;
                let headers = headers.get_or_insert_with(|| header_row(&row.columns));
                records.push(self.record(row, headers, None, read));
                if records.len() >= self.batch {
                    let checkpoint = json!({ "v": CHECKPOINT_VERSION, "snapshot_rows": read });
                    send(tx, std::mem::take(&mut records), checkpoint).await?;
                }
            }
        }
        db.commit().await.map_err(|f| self.error(f, "query"))?;
        if !records.is_empty() {
            let checkpoint = json!({ "v": CHECKPOINT_VERSION, "snapshot_rows": read });
            send(tx, records, checkpoint).await?;
        }
        Ok(())
    }

    /// The period in keyset chunks after `after`.
    async fn keyset(
        &self,
        db: &mut Db,
        mut after: Option<Vec<Cell>>,
        tx: &mpsc::Sender<Message>,
    ) -> Result<(), Error> {
        let mut positions: Option<Vec<usize>> = None;
        for chunk_no in 1.. {
            tracing::debug!(
                source = %self.source,
                period = %self.label,
                chunk = chunk_no,
                after = %after.as_ref().map_or_else(|| "the period's start".to_string(), |k| show_key(k)),
                "sql source: reading a chunk"
            );
            let (sql, binds) = self.chunk_statement(db, after.as_deref());
            let mut rows = self.read_chunk(db, &sql, &binds).await?;
            let Some(first) = rows.first() else {
                return Ok(());
            };
            if positions.is_none() {
                self.check_columns(first)?;
                positions = Some(self.key_positions(first)?);
            }
            let positions = positions.as_deref().unwrap_or_default();
            let keys = rows
                .iter()
                .map(|row| self.key(row, positions))
                .collect::<Result<Vec<_>, Error>>()?;
            // Includes the row past the chunk: a tie across the boundary.
            if let Some(pair) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
                return Err(self.tie(&pair[0]));
            }
            let headers = header_row(&first.columns);
            let last_chunk = rows.len() <= self.chunk;
            rows.truncate(self.chunk);
            let mut records = Vec::new();
            for ((row, key), record_no) in rows.into_iter().zip(keys).zip(1..) {
                records.push(self.record(row, &headers, Some(chunk_no), record_no));
                after = Some(key);
                if records.len() >= self.batch {
                    let checkpoint = self.checkpoint(after.as_deref());
                    send(tx, std::mem::take(&mut records), checkpoint).await?;
                }
            }
            if !records.is_empty() {
                send(tx, records, self.checkpoint(after.as_deref())).await?;
            }
            if last_chunk {
                return Ok(());
            }
        }
        Ok(())
    }

    /// `SELECT * FROM (query) AS _tm_q WHERE (keys) > (after) ORDER BY
    /// keys LIMIT chunk + 1`, and its binds: the query's, then the key's.
    fn chunk_statement(&self, db: &Db, after: Option<&[Cell]>) -> (String, Vec<Cell>) {
        let (inner, mut binds) = self.statement(db, &self.query);
        let order: Vec<String> = self.resume_key.iter().map(|k| db.quote(k)).collect();
        let order = order.join(", ");
        // On lines of their own: a query ending in a `--` comment would
        // otherwise comment the wrapper's end out.
        let mut sql = format!("SELECT * FROM (\n{inner}\n) AS _tm_q");
        if let Some(after) = after {
            let holders: Vec<String> = after
                .iter()
                .map(|cell| {
                    binds.push(cell.clone());
                    db.placeholder(binds.len())
                })
                .collect();
            sql.push_str(&format!(" WHERE ({order}) > ({})", holders.join(", ")));
        }
        sql.push_str(&format!(" ORDER BY {order} LIMIT {}", self.chunk + 1));
        (sql, binds)
    }

    /// One chunk's rows, read in a read-only transaction of its own.
    async fn read_chunk(
        &self,
        db: &mut Db,
        sql: &str,
        binds: &[Cell],
    ) -> Result<Vec<SqlRow>, Error> {
        self.pass_gate().await?;
        db.begin().await.map_err(|f| self.error(f, "query"))?;
        let mut rows = Vec::with_capacity(self.chunk.min(100_000) + 1);
        {
            let mut stream = db.fetch(sql, binds);
            while let Some(row) = stream.next().await {
                rows.push(row.map_err(|f| self.error(f, "query"))?);
            }
        }
        db.commit().await.map_err(|f| self.error(f, "query"))?;
        Ok(rows)
    }

    fn checkpoint(&self, after: Option<&[Cell]>) -> Checkpoint {
        json!({ "v": CHECKPOINT_VERSION, "after": after })
    }

    /// Where each resume_key column is in the result.
    fn key_positions(&self, row: &SqlRow) -> Result<Vec<usize>, Error> {
        self.resume_key
            .iter()
            .map(|k| {
                row.columns.iter().position(|c| c == k).ok_or_else(|| {
                    Error::config(
                        &self.file,
                        format!("{}.resume_key", self.at),
                        format!(
                            "the query's result has no column `{k}` (columns: {}); resume_key names result columns",
                            row.columns.join(", ")
                        ),
                    )
                })
            })
            .collect()
    }

    /// A row's resume key, as the database holds it.
    fn key(&self, row: &SqlRow, positions: &[usize]) -> Result<Vec<Cell>, Error> {
        positions
            .iter()
            .map(|&i| match &row.cells[i] {
                Cell::Null => Err(Error::config(
                    &self.file,
                    format!("{}.resume_key", self.at),
                    format!(
                        "column `{}` of resume_key is NULL in a row of period {}: a key that orders \
                         the rows must never be NULL",
                        row.columns[i], self.label
                    ),
                )),
                cell => Ok(cell.clone()),
            })
            .collect()
    }

    fn tie(&self, key: &[Cell]) -> Error {
        Error::config(
            &self.file,
            format!("{}.resume_key", self.at),
            format!(
                "resume_key {:?} is not unique within period {}: two rows share the key {}, and \
                 continuing after a shared key would skip rows; add columns that make it unique, \
                 such as the primary key (resume_key = [{}, \"id\"])",
                self.resume_key,
                self.label,
                show_key(key),
                self.resume_key
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    }

    /// Source drift, on the first row: every column `[fields]` reads must
    /// be in the result, of a type its field can read.
    fn check_columns(&self, row: &SqlRow) -> Result<(), Error> {
        let missing: Vec<String> = self
            .read
            .iter()
            .filter(|c| !row.columns.contains(&c.column))
            .map(|c| match c.column == c.field {
                true => format!("`{}`", c.column),
                false => format!("`{}` (fields.{}.from)", c.column, c.field),
            })
            .collect();
        if !missing.is_empty() {
            return Err(self.drift(format!(
                "the query's result lacks the column(s) {} that [fields] reads; its columns are {}. \
                 If renamed upstream, point `from` at the new name",
                missing.join(", "),
                row.columns.join(", ")
            )));
        }
        for read in &self.read {
            let Some(i) = row.columns.iter().position(|c| *c == read.column) else {
                continue;
            };
            let cell = &row.cells[i];
            if !cell.fits(read.ty) {
                return Err(self.drift(format!(
                    "column `{}` holds {}, which field `{}` ({}) cannot read; cast it in the query \
                     or change the field's type",
                    read.column,
                    cell.describe(),
                    read.field,
                    read.ty
                )));
            }
        }
        Ok(())
    }

    /// A contract error about the result's shape: nothing of the period
    /// is written.
    fn drift(&self, what: String) -> Error {
        Error::SourceDrift {
            location: Location::resource(self.resource.to_string()),
            message: format!(
                "source drift: source {}, period {}: {what}; nothing of this period is written",
                self.source, self.label
            ),
        }
    }

    /// A row as a JSON record; time columns read as their kind. Text a
    /// `json` field reads is parsed (MySQL's JSON arrives as text, and a
    /// text column is JSON text for a `json` field, as a CSV cell is); a
    /// row whose text is no JSON is malformed, a reject like a bad CSV row.
    fn record(
        &self,
        row: SqlRow,
        headers: &CsvHeaders,
        chunk: Option<u64>,
        record: u64,
    ) -> RawRecord {
        let origin = Origin {
            resource: Arc::clone(&self.resource),
            page: chunk,
            record,
            line: None,
        };
        if self.as_text {
            return self.text_record(row, headers, origin);
        }
        let mut object = serde_json::Map::with_capacity(row.cells.len());
        let mut bad_json = None;
        for (name, cell) in row.columns.iter().zip(row.cells) {
            let cell = match self.times.get(name) {
                Some(kind) => cell.into_time(*kind, self.tz),
                None => cell,
            };
            let value = match cell {
                Cell::Text(text) if self.json_columns.contains(name) => serde_json::from_str(&text)
                    .unwrap_or_else(|e| {
                        bad_json.get_or_insert(format!("column `{name}` is not valid JSON: {e}"));
                        serde_json::Value::String(text)
                    }),
                cell => cell.into_json(),
            };
            object.insert(name.clone(), value);
        }
        let data = serde_json::Value::Object(object);
        match bad_json {
            None => RawRecord {
                data: RawData::Json(data),
                origin,
            },
            Some(message) => {
                let error = Error::Parse {
                    location: origin.location(),
                    message,
                };
                RawRecord::malformed(data.to_string(), error, origin)
            }
        }
    }

    /// A row as a CSV-like record: each cell's text (time columns read as
    /// their kind first) under the result's shared header row. Text a
    /// `json` field reads that is no JSON fails its field, a reject.
    fn text_record(&self, row: SqlRow, headers: &CsvHeaders, origin: Origin) -> RawRecord {
        let mut text = String::new();
        let mut cells = csv::StringRecord::with_capacity(64, row.cells.len());
        for (name, cell) in row.columns.iter().zip(row.cells) {
            let cell = match self.times.get(name) {
                Some(kind) => cell.into_time(*kind, self.tz),
                None => cell,
            };
            text.clear();
            cell.push_text(&mut text);
            cells.push_field(&text);
        }
        RawRecord {
            data: RawData::Csv {
                headers: Arc::clone(headers),
                row: cells,
            },
            origin,
        }
    }

    /// The rows `count_query` counts for the period.
    async fn count(&self, db: &mut Db, pieces: &[SqlPiece]) -> Result<u64, Error> {
        let (sql, binds) = self.statement(db, pieces);
        self.pass_gate().await?;
        db.begin().await.map_err(|f| self.error(f, "count_query"))?;
        let first = db.fetch(&sql, &binds).next().await;
        db.commit()
            .await
            .map_err(|f| self.error(f, "count_query"))?;
        let cell = match first {
            Some(row) => row
                .map_err(|f| self.error(f, "count_query"))?
                .cells
                .into_iter()
                .next(),
            None => None,
        };
        match cell {
            Some(Cell::Int(n)) => u64::try_from(n).ok(),
            Some(Cell::Decimal(d)) => d.to_string().parse().ok(),
            Some(Cell::Text(t)) => t.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| {
            Error::config(
                &self.file,
                format!("{}.count_query", self.at),
                "must return one row whose first column is a count (a non-negative integer)",
            )
        })
    }

    /// A database failure as the engine's error, naming the source and
    /// period (redacted by the caller).
    fn error(&self, failure: Failure, key: &str) -> Error {
        let message = format!(
            "source {}, period {} ({}): {}",
            self.source, self.label, self.resource, failure.message
        );
        let message = self.secrets.redact(&message).into_owned();
        match failure.kind {
            FailureKind::Transient => Error::source_transient(message),
            FailureKind::Config => Error::config(&self.file, format!("{}.{key}", self.at), message),
            FailureKind::Drift => Error::SourceDrift {
                location: Location::resource(self.resource.to_string()),
                message,
            },
            FailureKind::Permanent => Error::source_permanent(message),
        }
    }
}

/// The URL as shown in origins and messages: scheme, user, host, port
/// and database, never the password nor the query's options. The
/// password (also one given as a `password` option) is the URL's secret,
/// whether written literally or in a `${…}` value: it joins the source's
/// secrets, which every message passes, in case a driver quotes it. The
/// rest of the URL is shown, so an operator sees which server failed.
fn shown_url(url: &str, secrets: &mut Secrets) -> Arc<str> {
    let Ok(parsed) = url::Url::parse(url) else {
        // Not a URL tidemark can take apart: all of it is secret.
        secrets.add("url", url);
        return Arc::from(crate::http::secrets::REDACTED);
    };
    let passwords = parsed.password().into_iter().map(str::to_string).chain(
        parsed
            .query_pairs()
            .filter(|(k, _)| k.contains("password"))
            .map(|(_, v)| v.into_owned()),
    );
    // Named apart: a name is added once.
    for (i, password) in passwords.enumerate() {
        let decoded = percent_encoding::percent_decode_str(&password)
            .decode_utf8_lossy()
            .into_owned();
        secrets.add(&format!("url password {i}"), &decoded);
        secrets.add(&format!("url password {i}, encoded"), &password);
    }
    let mut shown = format!("{}://", parsed.scheme());
    if !parsed.username().is_empty() {
        shown.push_str(parsed.username());
        if parsed.password().is_some() {
            shown.push_str(":***");
        }
        shown.push('@');
    }
    shown.push_str(parsed.host_str().unwrap_or_default());
    if let Some(port) = parsed.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(parsed.path());
    Arc::from(shown.as_str())
}

/// A key as shown in messages and logs: `("2024-01-01T10:00:00Z", 7)`.
fn show_key(key: &[Cell]) -> String {
    let shown: Vec<String> = key
        .iter()
        .map(|c| c.clone().into_json().to_string())
        .collect();
    format!("({})", shown.join(", "))
}

/// A period bound as the database compares it. SQLite keeps times as text
/// and compares text, so its bounds are text in SQLite's own `datetime()`
/// form (UTC for an instant).
fn db_time(db: &Db, cell: Cell) -> Cell {
    let text = |t: NaiveDateTime| Cell::Text(t.format("%Y-%m-%d %H:%M:%S").to_string());
    match (db.dialect(), cell) {
        (Dialect::Sqlite, Cell::Timestamp(t)) => text(t),
        (Dialect::Sqlite, Cell::Timestamptz(t)) => text(DateTime::naive_utc(&t)),
        (_, cell) => cell,
    }
}

async fn send(
    tx: &mpsc::Sender<Message>,
    records: Vec<RawRecord>,
    checkpoint: Checkpoint,
) -> Result<(), Error> {
    tx.send(Message::Batch(Batch {
        records,
        checkpoint,
    }))
    .await
    .map_err(|_| Error::source_transient("the period's reader was closed"))
}
