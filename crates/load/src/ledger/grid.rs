//! The page's grid (`serve --listen`, `GET /`): the state of every run key
//! of a pipeline over a range of period starts, in one read. Only the
//! columns a cell needs (no result document, no counts, no error text):
//! a grid of 10,000 periods reads a few hundred kilobytes, not megabytes.

use std::sync::OnceLock;

use tidemark_core::Error;

use super::driver::{Arg, Dialect, Driver, LedgerTx, Record};
use super::{RunStatus, StartRange};

/// One run key, as a cell of the grid needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridRow {
    /// Source id.
    pub source: String,
    /// Export type.
    pub export_type: String,
    /// Period start (RFC 3339, as stored).
    pub period_start: String,
    /// The run key's state.
    pub status: RunStatus,
    /// Done while its period was still open.
    pub provisional: bool,
    /// Recorded by `tidemark mark` (`done` or `skipped`), not run.
    pub marked: Option<String>,
    /// The handler version of the latest run (for staleness).
    pub handler_version: Option<String>,
    /// The `[fields]` fingerprint of the latest run (for staleness).
    pub fields_fingerprint: Option<String>,
    /// When a failed key may run again.
    pub not_before: Option<String>,
    /// Its `not_before` has not passed yet by the database's clock.
    pub backing_off: bool,
}

/// The statement of `dialect`, built on first use.
fn statement(d: Dialect) -> &'static str {
    static POSTGRES: OnceLock<String> = OnceLock::new();
    static SQLITE: OnceLock<String> = OnceLock::new();
    let cell = match d {
        Dialect::Postgres => &POSTGRES,
        Dialect::Sqlite => &SQLITE,
    };
    cell.get_or_init(|| {
        // Compared as instants, like `status`: the text of a start carries
        // its local offset.
        format!(
            "SELECT source, export_type, period_start, status, provisional, marked,
                    handler_version, fields_fingerprint, not_before,
                    CAST(CASE WHEN not_before > {now} THEN 1 ELSE 0 END AS BIGINT) AS backing_off
             FROM _tm_runs WHERE pipeline = $1
               AND ($2 IS NULL OR {start} >= {from}) AND ($3 IS NULL OR {start} <= {to})",
            now = d.now(),
            start = d.instant("period_start"),
            from = d.instant("$2"),
            to = d.instant("$3"),
        )
    })
}

/// The grid rows of `pipeline` whose period starts lie in `range`, handed
/// to `each` as they are read, in no particular order.
pub(crate) async fn grid_each<D: Driver>(
    driver: &D,
    pipeline: &str,
    range: StartRange<'_>,
    mut each: impl FnMut(GridRow) -> Result<(), Error> + Send,
) -> Result<(), Error> {
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(
        statement(D::DIALECT),
        &[
            Arg::Text(pipeline),
            Arg::OptText(range.from),
            Arg::OptText(range.to),
        ],
        |row| each(row_of(&row)?),
    )
    .await?;
    tx.commit().await
}

fn row_of(row: &Record) -> Result<GridRow, Error> {
    let status: RunStatus = row.state("status")?;
    Ok(GridRow {
        source: row.text("source")?,
        export_type: row.text("export_type")?,
        period_start: row.text("period_start")?,
        status,
        provisional: status == RunStatus::Done && bool_of(row, "provisional")?,
        marked: row.opt_text("marked")?,
        handler_version: row.opt_text("handler_version")?,
        fields_fingerprint: row.opt_text("fields_fingerprint")?,
        not_before: row.opt_text("not_before")?,
        backing_off: row.int("backing_off")? != 0,
    })
}

/// A boolean column: an integer on SQLite, a boolean on PostgreSQL (read
/// as an integer by the driver's type mapping).
fn bool_of(row: &Record, name: &str) -> Result<bool, Error> {
    Ok(row.int(name)? != 0)
}
