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
use dialect::{Db, Dialect, Failure, FailureKind, Layout, RawRow};

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

/// What a period's reader decides once, from its result's first row:
/// how each column decodes, the header row its text records share, and
/// what each column is to the pipeline. Every later row (and chunk) of the
/// period is read with it: no name is looked up per cell.
struct Shape {
    layout: Layout,
    headers: CsvHeaders,
    /// Per column, the kind `time_columns` declares for it.
    times: Vec<Option<TimeKind>>,
    /// Per column, whether a `json` field reads it.
    json: Vec<bool>,
    /// The result's place of each resume_key column.
    keys: Vec<usize>,
}

/// One period's decoding state, reused row after row: a row is decoded
/// into the same cells (and their text buffers) and turned into a record
/// as it arrives.
#[derive(Default)]
struct Rows {
    shape: Option<Shape>,
    cells: Vec<Cell>,
    /// The row's cells that are not text already, as text, one after
    /// another.
    text: String,
    /// Where each of them ends in `text`.
    ends: Vec<usize>,
}

/// A keyset chunk read whole: its batches, each with the key of its last
/// record, and whether it was the period's last.
struct Chunk {
    batches: Vec<(Vec<RawRecord>, Vec<Cell>)>,
    /// The key of the chunk's last record (not of the row past it).
    last: Vec<Cell>,
    complete: bool,
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
        let mut rows = Rows::default();
        {
            let mut stream = db.fetch_raw(&sql, &binds);
            while let Some(row) = stream.next().await {
                let row = row.map_err(|f| self.error(f, "query"))?;
                self.decode(&mut rows, &row, None, read + 1)?;
                drop(row);
                read += 1;
                records.push(self.record(&mut rows, None, read));
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
        let mut rows = Rows::default();
        for chunk_no in 1.. {
            tracing::debug!(
                source = %self.source,
                period = %self.label,
                chunk = chunk_no,
                after = %after.as_ref().map_or_else(|| "the period's start".to_string(), |k| show_key(k)),
                "sql source: reading a chunk"
            );
            let (sql, binds) = self.chunk_statement(db, after.as_deref());
            let Some(chunk) = self
                .read_chunk(db, &sql, &binds, &mut rows, chunk_no)
                .await?
            else {
                return Ok(());
            };
            for (records, key) in chunk.batches {
                send(tx, records, self.checkpoint(Some(&key))).await?;
            }
            if chunk.complete {
                return Ok(());
            }
            after = Some(chunk.last);
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

    /// One chunk, read in a read-only transaction of its own, each row
    /// turned into a record as it arrives (no chunk of rows is held, only
    /// its records); `None` when it is empty. Its batches are handed back,
    /// not sent: none leaves before the chunk and the row past it are read
    /// (no tie across the boundary) and the transaction is committed.
    async fn read_chunk(
        &self,
        db: &mut Db,
        sql: &str,
        binds: &[Cell],
        rows: &mut Rows,
        chunk_no: u64,
    ) -> Result<Option<Chunk>, Error> {
        self.pass_gate().await?;
        db.begin().await.map_err(|f| self.error(f, "query"))?;
        let mut batches = Vec::new();
        let mut records = Vec::with_capacity(self.batch.min(self.chunk).min(100_000));
        // The row's key and the previous row's, swapped row after row.
        let (mut key, mut previous) = (Vec::new(), Vec::new());
        // The key of the chunk's last record, once a row past it came.
        let mut last = None;
        let mut read = 0usize;
        {
            let mut stream = db.fetch_raw(sql, binds);
            while let Some(row) = stream.next().await {
                let row = row.map_err(|f| self.error(f, "query"))?;
                let record_no = u64::try_from(read + 1).unwrap_or(u64::MAX);
                self.decode(rows, &row, Some(chunk_no), record_no)?;
                drop(row);
                self.key_into(rows, &mut key)?;
                // Includes the row past the chunk: a tie across the boundary.
                if read > 0 && key == previous {
                    return Err(self.tie(&key));
                }
                read += 1;
                if read <= self.chunk {
                    let record_no = u64::try_from(read).unwrap_or(u64::MAX);
                    records.push(self.record(rows, Some(chunk_no), record_no));
                    if records.len() >= self.batch {
                        batches.push((std::mem::take(&mut records), key.clone()));
                    }
                    if read == self.chunk {
                        last = Some(key.clone());
                    }
                }
                std::mem::swap(&mut key, &mut previous);
            }
        }
        db.commit().await.map_err(|f| self.error(f, "query"))?;
        if read == 0 {
            return Ok(None);
        }
        // Fewer rows than chunk_size + 1: the last row is the last record.
        let last = last.unwrap_or(previous);
        if !records.is_empty() {
            batches.push((records, last.clone()));
        }
        Ok(Some(Chunk {
            batches,
            last,
            complete: read <= self.chunk,
        }))
    }

    /// Decodes `row` into `rows`' cells. The first row of the period
    /// fixes its shape, and is checked for drift and for the key columns.
    /// A value that cannot be read names its record: `record` of `chunk`
    /// (of the period's one snapshot without a chunk).
    fn decode(
        &self,
        rows: &mut Rows,
        row: &RawRow,
        chunk: Option<u64>,
        record: u64,
    ) -> Result<(), Error> {
        let at = |mut failure: Failure| {
            failure.message = match chunk {
                Some(chunk) => format!("{} (record {record} of chunk {chunk})", failure.message),
                None => format!("{} (record {record})", failure.message),
            };
            self.error(failure, "query")
        };
        if let Some(shape) = &rows.shape {
            return shape.layout.decode(row, &mut rows.cells).map_err(at);
        }
        let layout = Layout::new(row);
        layout.decode(row, &mut rows.cells).map_err(at)?;
        self.check_columns(&layout.columns, &rows.cells)?;
        let keys = self.key_positions(&layout.columns)?;
        rows.shape = Some(Shape {
            headers: header_row(&layout.columns),
            times: layout
                .columns
                .iter()
                .map(|c| self.times.get(c).copied())
                .collect(),
            json: layout
                .columns
                .iter()
                .map(|c| self.json_columns.contains(c))
                .collect(),
            keys,
            layout,
        });
        Ok(())
    }

    fn checkpoint(&self, after: Option<&[Cell]>) -> Checkpoint {
        json!({ "v": CHECKPOINT_VERSION, "after": after })
    }

    /// Where each resume_key column is in the result.
    fn key_positions(&self, columns: &[String]) -> Result<Vec<usize>, Error> {
        self.resume_key
            .iter()
            .map(|k| {
                columns.iter().position(|c| c == k).ok_or_else(|| {
                    Error::config(
                        &self.file,
                        format!("{}.resume_key", self.at),
                        format!(
                            "the query's result has no column `{k}` (columns: {}); resume_key names result columns",
                            columns.join(", ")
                        ),
                    )
                })
            })
            .collect()
    }

    /// The decoded row's resume key into `key`, as the database holds it.
    fn key_into(&self, rows: &Rows, key: &mut Vec<Cell>) -> Result<(), Error> {
        key.clear();
        let Some(shape) = &rows.shape else {
            return Ok(());
        };
        for &i in &shape.keys {
            match &rows.cells[i] {
                Cell::Null => {
                    return Err(Error::config(
                        &self.file,
                        format!("{}.resume_key", self.at),
                        format!(
                            "column `{}` of resume_key is NULL in a row of period {}: a key that \
                             orders the rows must never be NULL",
                            shape.layout.columns[i], self.label
                        ),
                    ))
                }
                cell => key.push(cell.clone()),
            }
        }
        Ok(())
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
    fn check_columns(&self, columns: &[String], cells: &[Cell]) -> Result<(), Error> {
        let missing: Vec<String> = self
            .read
            .iter()
            .filter(|c| !columns.contains(&c.column))
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
                columns.join(", ")
            )));
        }
        for read in &self.read {
            let Some(i) = columns.iter().position(|c| *c == read.column) else {
                continue;
            };
            let Some(cell) = cells.get(i) else {
                continue;
            };
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

    /// The decoded row as a record: CSV-like text under the shared header
    /// row when every field reads a column by name, else a JSON object;
    /// time columns read as their kind. Text a `json` field reads is
    /// parsed (MySQL's JSON arrives as text, and a text column is JSON
    /// text for a `json` field, as a CSV cell is); a row whose text is no
    /// JSON is malformed, a reject like a bad CSV row.
    fn record(&self, rows: &mut Rows, chunk: Option<u64>, record: u64) -> RawRecord {
        let origin = Origin {
            resource: Arc::clone(&self.resource),
            page: chunk,
            record,
            line: None,
        };
        let Some(shape) = &rows.shape else {
            // Never: a row is decoded (and the shape fixed) first.
            return RawRecord {
                data: RawData::Json(serde_json::Value::Object(serde_json::Map::new())),
                origin,
            };
        };
        if self.as_text {
            let row = self.text_row(shape, &rows.cells, &mut rows.text, &mut rows.ends);
            return RawRecord {
                data: RawData::Csv {
                    headers: Arc::clone(&shape.headers),
                    row,
                },
                origin,
            };
        }
        let mut object = serde_json::Map::with_capacity(rows.cells.len());
        let mut bad_json = None;
        let columns = shape
            .layout
            .columns
            .iter()
            .zip(&shape.times)
            .zip(&shape.json);
        for (((name, time), &json), cell) in columns.zip(rows.cells.iter_mut()) {
            let cell = std::mem::replace(cell, Cell::Null);
            let cell = match time {
                Some(kind) => cell.into_time(*kind, self.tz),
                None => cell,
            };
            let value = match cell {
                Cell::Text(text) if json => serde_json::from_str(&text).unwrap_or_else(|e| {
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

    /// The decoded row's cells as the text of a CSV row (time columns read
    /// as their kind first). Text a `json` field reads that is no JSON
    /// fails its field, a reject. The cells that are not text are written
    /// one after another into `text` (their ends into `ends`) and the
    /// record is then made at its exact size: a chunk of records is held
    /// at once, and a buffer sized by guess is either grown by doubling
    /// or, sized by the widest row so far, lets one wide row inflate every
    /// record after it. (Writing the row into a reused record and copying
    /// that was 4 % of a SQL re-sync's CPU.)
    fn text_row(
        &self,
        shape: &Shape,
        cells: &[Cell],
        text: &mut String,
        ends: &mut Vec<usize>,
    ) -> csv::StringRecord {
        text.clear();
        ends.clear();
        let mut size = 0;
        for (cell, time) in cells.iter().zip(&shape.times) {
            match (cell, time) {
                (Cell::Text(s), None) => size += s.len(),
                (cell, time) => {
                    match time {
                        Some(kind) => cell.push_time_text(*kind, self.tz, text),
                        None => cell.push_text(text),
                    }
                    ends.push(text.len());
                }
            }
        }
        let mut row = csv::StringRecord::with_capacity(size + text.len(), cells.len());
        let (mut start, mut ends) = (0, ends.iter());
        for (cell, time) in cells.iter().zip(&shape.times) {
            match (cell, time) {
                (Cell::Text(s), None) => row.push_field(s),
                _ => {
                    let end = ends.next().copied().unwrap_or(start);
                    row.push_field(&text[start..end]);
                    start = end;
                }
            }
        }
        row
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
