//! Reading a run key's stored rows on a thread of their own, while the run
//! reads and compares the source (ADR 0021, "Overlapping the stored scan").
//!
//! A forced re-sync of an unchanged 4,000,000-row period spent its first
//! 2.05 s in this scan on the writer, one core busy and the reader held one
//! batch ahead; the stored order is the order the source lists the rows,
//! so the writer can compare a batch as soon as the scan has passed its
//! rows. The scan runs on its own read-only connection (a pooled one would
//! be held by a thread outside the pool's reach for the whole scan), with a
//! small page cache: it reads each page once, in order, and the 16 MiB of
//! the pool's connections showed up in the peak RSS of an earlier attempt.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};
use tidemark_core::Error;

use super::{raw, SqliteStore, BUSY_TIMEOUT};
use crate::db_error::DbResultExt;
use crate::schema::TableSchema;
use crate::stored::{self, Hashes, Scanned, StoredHashes};
use crate::writer::Lineage;

/// Pairs per message: 256 KiB, one write of the arrival file.
const CHUNK: usize = 8192;

/// Messages the scan may be ahead of the writer's last look: 2 MiB in
/// flight at most. The writer takes in what was sent at every batch, so the
/// scan, faster than reading the source, is held back only this far ahead.
const IN_FLIGHT: usize = 8;

/// The scan connection's page cache, in KiB (SQLite's negative
/// `cache_size`).
const SCAN_CACHE_KIB: i64 = 1024;

/// Scan connections kept between runs: as many as periods run at once by
/// default on two cores.
const KEPT: usize = 2;

/// The read-only connections the scans use, opened on first need and kept
/// between runs (a backfill of many small periods opens two, not one per
/// period).
#[derive(Debug)]
pub(super) struct ScanConnections {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ScanConnections {
    /// For the database file at `path`; `None` for an in-memory database,
    /// which no other connection can open.
    pub(super) fn for_file(path: &Path) -> Option<Arc<ScanConnections>> {
        let shown = path.to_string_lossy();
        if shown.is_empty() || shown == ":memory:" || shown.starts_with("file:") {
            return None;
        }
        Some(Arc::new(ScanConnections {
            path: path.to_path_buf(),
            idle: Mutex::new(Vec::new()),
        }))
    }

    fn take(&self) -> Result<Connection, Error> {
        if let Some(conn) = self.idle.lock().ok().and_then(|mut idle| idle.pop()) {
            return Ok(conn);
        }
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .db()?;
        conn.busy_timeout(BUSY_TIMEOUT).db()?;
        conn.pragma_update(None, "cache_size", -SCAN_CACHE_KIB)
            .db()?;
        Ok(conn)
    }

    fn keep(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < KEPT {
                idle.push(conn);
            }
        }
    }

    /// Closes the idle connections (the store closes).
    pub(super) fn close(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }
}

impl SqliteStore {
    /// The run key's stored hashes, read by a scan on a blocking thread
    /// that the run's lookups follow (see [`stored::streamed`]); `None`
    /// where that cannot be (an in-memory database, a single-threaded
    /// runtime, where a waiting writer would stall the scan's sender): the
    /// caller then scans serially. Only for a fresh attempt with
    /// `on_duplicate_key = "last"`: a resumed one must know every key it
    /// wrote before it compares, and "first"/"error" look keys up that the
    /// stored order does not predict.
    pub(crate) async fn streamed_stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &Lineage,
        budget: u64,
    ) -> Result<Option<StoredHashes>, Error> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let Some(scans) = &self.scans else {
            return Ok(None);
        };
        if !Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread) {
            return Ok(None);
        }
        // A period never loaded holds nothing: no thread for it.
        let mut conn = self.kept.take(&self.pool).await?;
        let holds = raw::holds_live_rows(conn.raw().await?, schema, lineage)?;
        self.kept.keep(conn);
        if !holds {
            return Ok(Some(StoredHashes::default()));
        }
        let (sender, incoming) = sync_channel(IN_FLIGHT);
        let (scans, schema, lineage) = (Arc::clone(scans), schema.clone(), lineage.clone());
        tokio::task::spawn_blocking(move || scan(&scans, &schema, &lineage, &sender));
        stored::streamed(incoming, budget).map(Some)
    }
}

/// Reads the run key's stored pairs and sends them in chunks, then
/// [`Scanned::End`], or [`Scanned::Failed`]. Stops early, quietly, when
/// the run no longer listens (it failed, or ended without reconciling).
fn scan(
    scans: &ScanConnections,
    schema: &TableSchema,
    lineage: &Lineage,
    to: &SyncSender<Scanned>,
) {
    let conn = match scans.take() {
        Ok(conn) => conn,
        Err(e) => {
            let _ = to.send(Scanned::Failed(e));
            return;
        }
    };
    let mut gone = false;
    let mut chunk = Vec::with_capacity(CHUNK);
    let read = raw::stored_rows(&conn, schema, lineage, None, |row| {
        chunk.push((row.key, Hashes::new(row.row_hash, row.raw_hash)));
        if chunk.len() == CHUNK {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
            if to.send(Scanned::Rows(full)).is_err() {
                gone = true;
                return Err(Error::Invariant("the run stopped listening".into()));
            }
        }
        Ok(())
    });
    match read {
        Ok(()) => {
            let _ = to.send(Scanned::Rows(chunk));
            let _ = to.send(Scanned::End);
            scans.keep(conn);
        }
        Err(_) if gone => scans.keep(conn),
        // The connection may be what failed: not kept.
        Err(e) => {
            let _ = to.send(Scanned::Failed(e));
        }
    }
}
