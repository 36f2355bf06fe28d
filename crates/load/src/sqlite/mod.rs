//! The SQLite backend: the embedded default.
//!
//! SQLite allows one writer at a time. Every write transaction here starts
//! with a write (the fencing `UPDATE` or the ledger `INSERT`), so it takes
//! the write lock first and waits on the busy timeout instead of failing
//! with a stale read snapshot.

mod raw;
mod table;

use raw::WalSignal;

use std::ffi::c_int;
use std::str::FromStr;
use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row as _, Sqlite, Transaction};
use tidemark_core::spec::OnMissing;
use tidemark_core::KeySet;
use tidemark_core::{Error, RunKey};

use crate::db_error::{is_sqlite_busy, DbResultExt};
use crate::ledger::{
    counts_of, decide, decode_hashes, new_run_id, BindCounts, Claim, ClaimRequest, ClaimedRun,
    Counts, Decision, Lease, LedgerEntry, Snapshot,
};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{
    refuse_deletes, result_json, BatchOutcome, BatchWrite, Lineage, Reconcile, StoredRow,
};
use crate::{now_text, timestamp_text};

/// How long opening waits for a busy file, as long as the busy timeout.
const OPEN_DEADLINE: Duration = Duration::from_secs(60);

/// How long the ledger migration is retried after losing a race.
const MIGRATE_DEADLINE: Duration = Duration::from_secs(2);

/// Runs `op` until it succeeds, fails with an error `retryable` rejects, or
/// `deadline` has passed, sleeping with jittered exponential backoff
/// (10 ms doubling to 500 ms) in between. For start-up steps that race
/// other processes opening the same file.
async fn retry_while<T, E, Fut>(
    what: &str,
    deadline: Duration,
    retryable: impl Fn(&E) -> bool,
    mut op: impl FnMut() -> Fut,
) -> Result<T, E>
where
    E: std::fmt::Display,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    // Bounded by the deadline, not by a count of tries.
    let backoff = tidemark_core::spec::RetryPolicy {
        max_attempts: u32::MAX,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(500),
    };
    let deadline = tokio::time::Instant::now() + deadline;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match op().await {
            Err(e) if retryable(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, attempt, "{what}: trying again");
                tokio::time::sleep(backoff.delay(attempt, None, rand::random::<f64>())).await;
            }
            other => return other,
        }
    }
}

/// Opens the pool, waiting while another process holds the file.
///
/// The busy timeout covers almost every lock wait, but not one: a file
/// not yet in WAL mode (just created by another `tidemark`) is switched to
/// WAL by a read of its header followed by a write, and SQLite refuses that
/// upgrade at once with `SQLITE_BUSY` when another connection holds the
/// write lock, because waiting inside it could deadlock. Two schedulers and
/// a `status` started together on a new file hit exactly that, so opening
/// is retried with bounded, jittered backoff while the error is a busy one.
async fn open_pool(
    options: SqliteConnectOptions,
    wal_signal: &'static WalSignal,
) -> Result<SqlitePool, Error> {
    retry_while(
        "database busy while opening",
        OPEN_DEADLINE,
        is_sqlite_busy,
        || {
            SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(120))
                .after_connect(move |conn, _| {
                    Box::pin(async move { raw::install_wal_hook(conn, wal_signal).await })
                })
                .connect_with(options.clone())
        },
    )
    .await
    .db()
}

/// WAL size, in pages, at which a commit wakes the background checkpointer:
/// 80 MB at 8 KiB pages. SQLite's own default of 1,000 pages was measured
/// slower (ADR 0003, decision 5).
const WAL_CHECKPOINT_FRAMES: c_int = 10_000;

/// Copies the WAL into the database file on its own connection whenever a
/// commit has left the WAL at [`WAL_CHECKPOINT_FRAMES`] or more, and ends
/// when the pool is closed.
///
/// SQLite's automatic checkpoint ran inside `COMMIT` on the committing
/// connection: the run waited for 80 MB of copying and two `fsync`s before
/// it could write its next batch. Here the run goes on writing while the
/// pages are copied (`PASSIVE`: never waits for, nor blocks, a writer or a
/// reader). A single 1,000,000-row period: 2.85-3.18 s -> 2.51-2.67 s
/// (ADR 0003, decision 16). Wake-ups that arrive during a checkpoint fold
/// into one more pass.
async fn checkpoint_in_background(pool: SqlitePool, signal: &'static WalSignal) {
    loop {
        signal.notify.notified().await;
        if pool.is_closed() {
            return;
        }
        let Ok(mut conn) = pool.acquire().await else {
            return;
        };
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&mut *conn)
            .await
        {
            tracing::debug!(error = %e, "background WAL checkpoint failed");
        }
    }
}

/// A pool of connections to one SQLite file.
#[derive(Debug, Clone)]
pub(crate) struct SqliteStore {
    pool: SqlitePool,
    wal_signal: &'static WalSignal,
}

impl SqliteStore {
    /// Opens the database, creating it when missing, and migrates the
    /// ledger.
    ///
    /// Each connection gets a 16 MiB page cache, new files 8 KiB pages, and
    /// the WAL is checkpointed in the background once it holds 10,000
    /// pages (see [`checkpoint_in_background`]). Concurrent writers wait on
    /// the busy handler; funnelling them through one connection was measured
    /// slower, because strictly alternating periods defeat the page cache's
    /// locality, while the busy handler lets one period commit several
    /// batches in a row.
    pub(crate) async fn connect(url: &str) -> Result<Self, Error> {
        Self::open(url, WAL_CHECKPOINT_FRAMES).await
    }

    async fn open(url: &str, checkpoint_frames: c_int) -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::config("command line", "--database-url", e.to_string()))?
            .create_if_missing(true)
            .page_size(8192)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(60))
            .foreign_keys(true)
            .pragma("cache_size", "-16384");
        // One signal per store, alive for the rest of the program: the
        // hook of every connection points to it, and a connection may be
        // closed after the store is gone.
        let wal_signal: &'static WalSignal = Box::leak(Box::new(WalSignal {
            threshold: checkpoint_frames,
            notify: tokio::sync::Notify::new(),
        }));
        let pool = open_pool(options, wal_signal).await?;
        tokio::spawn(checkpoint_in_background(pool.clone(), wal_signal));
        let store = SqliteStore { pool, wal_signal };
        store.migrate().await?;
        Ok(store)
    }

    /// Checkpoints the WAL into the database file and empties it, then
    /// closes the pool. SQLite does this on its own only when the last
    /// connection closes, and the pool closes its connections at once, so
    /// none of them may be "last". Waits at most 1 s for another process's
    /// transaction; its own last close checkpoints then.
    pub(crate) async fn close(&self) {
        if let Ok(mut conn) = self.pool.acquire().await {
            let checkpoint = async {
                sqlx::query("PRAGMA busy_timeout = 1000")
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(&mut *conn)
                    .await
            };
            if let Err(e) = checkpoint.await {
                tracing::debug!(error = %e, "WAL checkpoint on close skipped");
            }
        }
        self.pool.close().await;
        // Lets the background checkpointer see the closed pool and end.
        self.wal_signal.notify.notify_one();
    }

    /// Applies the ledger migrations. SQLite has no advisory lock, so two
    /// processes starting on a fresh file can both try to apply the same
    /// migration; the loser fails on "already exists" after the winner
    /// committed, and simply tries again (and then finds nothing to do).
    pub(crate) async fn migrate(&self) -> Result<(), Error> {
        let migrator = sqlx::migrate!("../../migrations/sqlite");
        retry_while(
            "ledger migration raced another process",
            MIGRATE_DEADLINE,
            |_| true,
            || migrator.run(&self.pool),
        )
        .await
        .map_err(|e| Error::Database {
            message: format!("ledger migration failed: {e}"),
            transient: false,
        })
    }

    pub(crate) async fn ensure_table(&self, schema: &TableSchema) -> Result<(), Error> {
        table::ensure_table(&self.pool, schema).await
    }

    pub(crate) async fn claim(&self, key: &RunKey, request: &ClaimRequest) -> Result<Claim, Error> {
        let now = chrono::Utc::now();
        let now_s = timestamp_text(now);
        let mut tx = self.pool.begin().await.db()?;
        sqlx::query(
            "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, created_at, updated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (pipeline, source, export_type, period_start) DO NOTHING",
        )
        .bind(&key.pipeline)
        .bind(&key.source)
        .bind(&key.export_type)
        .bind(key.period.start_rfc3339())
        .bind(key.period.end_rfc3339())
        .bind(&now_s)
        .bind(&now_s)
        .execute(&mut *tx)
        .await
        .db()?;
        let row = sqlx::query(
            "SELECT id, status, attempt, run_id, lease_owner, lease_host, lease_pid, lease_expires_at,
                    checkpoint, batches, result, rows_read, rows_inserted, rows_updated, rows_unchanged,
                    rows_deleted, rows_rejected
             FROM _tm_runs WHERE pipeline = ? AND source = ? AND export_type = ? AND period_start = ?",
        )
        .bind(&key.pipeline)
        .bind(&key.source)
        .bind(&key.export_type)
        .bind(key.period.start_rfc3339())
        .fetch_one(&mut *tx)
        .await
        .db()?;
        let run_ref: i64 = row.get("id");
        let expires: Option<String> = row.get("lease_expires_at");
        let snapshot = Snapshot {
            status: row.get("status"),
            run_id: row.get("run_id"),
            lease_owner: row.get("lease_owner"),
            lease_host: row.get("lease_host"),
            lease_pid: row.get("lease_pid"),
            lease_live: expires
                .as_deref()
                .and_then(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
                .is_some_and(|e| e > now),
            lease_expires_at: expires,
            checkpoint: json_column(&row, "checkpoint"),
            result: json_column(&row, "result"),
        };
        let resume = match decide(snapshot, request) {
            Decision::Done(result) => return Ok(Claim::Done(result)),
            Decision::Held { owner, expires_at } => return Ok(Claim::Held { owner, expires_at }),
            Decision::Take {
                resume,
                previous_lost,
            } => {
                if previous_lost {
                    sqlx::query("UPDATE _tm_attempts SET status = 'lost', finished_at = ? WHERE run_ref = ? AND status = 'running'")
                        .bind(&now_s)
                        .bind(run_ref)
                        .execute(&mut *tx)
                        .await
                        .db()?;
                }
                resume
            }
        };
        let attempt: i64 = row.get::<i64, _>("attempt") + 1;
        let lease_expires =
            timestamp_text(now + chrono::Duration::from_std(request.lease_ttl).unwrap_or_default());
        let (run_id, counts, batches, seen, resume_cp) = match resume {
            Some((cp, run_id)) => {
                let seen = load_seen(&mut tx, run_ref, &run_id).await?;
                (
                    run_id,
                    counts_of(&row),
                    row.get::<i64, _>("batches"),
                    seen,
                    Some(cp),
                )
            }
            None => {
                sqlx::query("DELETE FROM _tm_batches WHERE run_ref = ?")
                    .bind(run_ref)
                    .execute(&mut *tx)
                    .await
                    .db()?;
                (new_run_id(), Counts::default(), 0, KeySet::default(), None)
            }
        };
        let fresh = resume_cp.is_none();
        sqlx::query(
            "UPDATE _tm_runs SET status = 'running', attempt = ?, run_id = ?, lease_owner = ?, lease_host = ?,
                    lease_pid = ?, lease_expires_at = ?, checkpoint = CASE WHEN ? THEN NULL ELSE checkpoint END,
                    batches = ?, rows_read = ?, rows_inserted = ?, rows_updated = ?, rows_unchanged = ?,
                    rows_deleted = ?, rows_rejected = ?, error_class = NULL, error_message = NULL, result = NULL,
                    handler_version = ?, started_at = CASE WHEN ? THEN ? ELSE started_at END,
                    finished_at = NULL, updated_at = ?
             WHERE id = ?",
        )
        .bind(attempt)
        .bind(&run_id)
        .bind(request.worker.owner())
        .bind(&request.worker.host)
        .bind(i64::from(request.worker.pid))
        .bind(&lease_expires)
        .bind(fresh)
        .bind(batches)
        .bind_counts(&counts)
        .bind(&request.handler_version)
        .bind(fresh)
        .bind(&now_s)
        .bind(&now_s)
        .bind(run_ref)
        .execute(&mut *tx)
        .await
        .db()?;
        sqlx::query(
            "INSERT INTO _tm_attempts (run_ref, attempt, run_id, worker, status, resumed, started_at)
             VALUES (?, ?, ?, ?, 'running', ?, ?)",
        )
        .bind(run_ref)
        .bind(attempt)
        .bind(&run_id)
        .bind(request.worker.owner())
        .bind(!fresh)
        .bind(&now_s)
        .execute(&mut *tx)
        .await
        .db()?;
        tx.commit().await.db()?;
        Ok(Claim::Claimed(Box::new(ClaimedRun {
            lease: Lease {
                run_ref,
                attempt,
                run_id,
                owner: request.worker.owner(),
            },
            resume: resume_cp,
            counts,
            batches,
            seen,
        })))
    }

    pub(crate) async fn heartbeat(&self, lease: &Lease, ttl: Duration) -> Result<bool, Error> {
        let expires = timestamp_text(
            chrono::Utc::now() + chrono::Duration::from_std(ttl).unwrap_or_default(),
        );
        let done = sqlx::query(
            "UPDATE _tm_runs SET lease_expires_at = ? WHERE id = ? AND attempt = ? AND status = 'running'",
        )
        .bind(expires)
        .bind(lease.run_ref)
        .bind(lease.attempt)
        .execute(&self.pool)
        .await
        .db()?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn mark_failed(
        &self,
        lease: &Lease,
        counts: &Counts,
        error: &Error,
    ) -> Result<(), Error> {
        let now = now_text();
        let mut tx = self.pool.begin().await.db()?;
        let updated = sqlx::query(
            "UPDATE _tm_runs SET status = 'failed', error_class = ?, error_message = ?, finished_at = ?,
                    lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL, updated_at = ?
             WHERE id = ? AND attempt = ? AND status = 'running'",
        )
        .bind(error.class().as_str())
        .bind(error.to_string())
        .bind(&now)
        .bind(&now)
        .bind(lease.run_ref)
        .bind(lease.attempt)
        .execute(&mut *tx)
        .await
        .db()?;
        if updated.rows_affected() == 1 {
            finish_attempt(&mut tx, lease, "failed", counts, Some(error), &now).await?;
        }
        tx.commit().await.db()
    }

    pub(crate) async fn restart_fresh(&self, lease: &Lease) -> Result<String, Error> {
        let run_id = new_run_id();
        let mut tx = self.pool.begin().await.db()?;
        fence(&mut tx, lease).await?;
        sqlx::query(
            "UPDATE _tm_runs SET checkpoint = NULL, batches = 0, rows_read = 0, rows_inserted = 0, rows_updated = 0,
                    rows_unchanged = 0, rows_deleted = 0, rows_rejected = 0, run_id = ? WHERE id = ?",
        )
        .bind(&run_id)
        .bind(lease.run_ref)
        .execute(&mut *tx)
        .await
        .db()?;
        sqlx::query("UPDATE _tm_attempts SET run_id = ? WHERE run_ref = ? AND attempt = ?")
            .bind(&run_id)
            .bind(lease.run_ref)
            .bind(lease.attempt)
            .execute(&mut *tx)
            .await
            .db()?;
        sqlx::query("DELETE FROM _tm_batches WHERE run_ref = ?")
            .bind(lease.run_ref)
            .execute(&mut *tx)
            .await
            .db()?;
        tx.commit().await.db()?;
        Ok(run_id)
    }

    pub(crate) async fn status(
        &self,
        pipeline: &str,
        period_start: Option<&str>,
    ) -> Result<Vec<LedgerEntry>, Error> {
        let rows = sqlx::query(
            "SELECT * FROM _tm_runs WHERE pipeline = ? AND (? IS NULL OR period_start = ?)
             ORDER BY period_start, source, export_type",
        )
        .bind(pipeline)
        .bind(period_start)
        .bind(period_start)
        .fetch_all(&self.pool)
        .await
        .db()?;
        Ok(rows.iter().map(entry_of).collect())
    }

    pub(crate) async fn prune(&self, age: Duration) -> Result<(u64, u64), Error> {
        let cutoff = timestamp_text(
            chrono::Utc::now() - chrono::Duration::from_std(age).unwrap_or_default(),
        );
        let attempts = sqlx::query(
            "DELETE FROM _tm_attempts WHERE finished_at IS NOT NULL AND finished_at < ?",
        )
        .bind(&cutoff)
        .execute(&self.pool)
        .await
        .db()?;
        let rejects = sqlx::query("DELETE FROM _tm_rejects WHERE created_at < ?")
            .bind(&cutoff)
            .execute(&self.pool)
            .await
            .db()?;
        Ok((attempts.rows_affected(), rejects.rows_affected()))
    }

    pub(crate) async fn stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &Lineage,
        run_id: Option<&str>,
    ) -> Result<Vec<StoredRow>, Error> {
        let mut conn = self.pool.acquire().await.db()?;
        raw::with_raw(&mut conn, |c| raw::stored_rows(c, schema, lineage, run_id)).await
    }

    pub(crate) async fn apply_batch(
        &self,
        lease: &Lease,
        schema: &TableSchema,
        lineage: &Lineage,
        batch: &BatchWrite<'_>,
    ) -> Result<BatchOutcome, Error> {
        let loaded_at = now_text();
        let rendered = raw::Rendered::new(&batch.rows);
        let mut tx = self.pool.begin().await.db()?;
        fence(&mut tx, lease).await?;
        let stamp = table::Stamp {
            lineage,
            run_id: &lease.run_id,
            loaded_at: &loaded_at,
        };
        let written = raw::with_raw(&mut tx, |c| {
            raw::write_rows(c, schema, &stamp, &batch.rows, &rendered)
        })
        .await?;
        for reject in batch.rejects {
            table::insert_reject(&mut tx, lineage, &lease.run_id, reject, &loaded_at).await?;
        }
        if let Some(keys) = batch.remembered_keys(&written) {
            sqlx::query("INSERT INTO _tm_batches (run_ref, run_id, batch_no, key_hashes) VALUES (?, ?, ?, ?)")
                .bind(lease.run_ref)
                .bind(&lease.run_id)
                .bind(batch.batch_no)
                .bind(keys)
                .execute(&mut *tx)
                .await
                .db()?;
        }
        let mut counts = batch.counts;
        written.apply(&mut counts);
        save_progress(
            &mut tx,
            lease,
            &counts,
            Some(batch.checkpoint),
            batch.batch_no,
        )
        .await?;
        tx.commit().await.db()?;
        Ok(BatchOutcome {
            written,
            direct_copy_conflict: false,
        })
    }

    pub(crate) async fn finish(
        &self,
        lease: &Lease,
        schema: &TableSchema,
        lineage: &Lineage,
        existing: &StoredHashes,
        reconcile: &Reconcile,
        mut counts: Counts,
    ) -> Result<serde_json::Value, Error> {
        let now = now_text();
        let mut tx = self.pool.begin().await.db()?;
        fence(&mut tx, lease).await?;
        if reconcile.on_missing != OnMissing::Keep {
            let (live, vanished) = raw::with_raw(&mut tx, |c| {
                raw::vanished_rows(c, schema, lineage, existing)
            })
            .await?;
            if let Some(why) =
                refuse_deletes(vanished.len() as u64, live, counts.rows_read, reconcile)
            {
                return Err(Error::Invariant(why));
            }
            counts.rows_deleted =
                table::delete_rows(&mut tx, schema, reconcile.on_missing, &vanished, &now).await?;
        }
        let result = result_json(lineage, lease, &counts, &now);
        save_progress(&mut tx, lease, &counts, None, 0).await?;
        sqlx::query(
            "UPDATE _tm_runs SET status = 'done', result = ?, finished_at = ?, checkpoint = NULL, lease_owner = NULL,
                    lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL WHERE id = ?",
        )
        .bind(result.to_string())
        .bind(&now)
        .bind(lease.run_ref)
        .execute(&mut *tx)
        .await
        .db()?;
        finish_attempt(&mut tx, lease, "done", &counts, None, &now).await?;
        sqlx::query("DELETE FROM _tm_batches WHERE run_ref = ?")
            .bind(lease.run_ref)
            .execute(&mut *tx)
            .await
            .db()?;
        tx.commit().await.db()?;
        Ok(result)
    }
}

/// The fencing check, and the first write of every batch transaction: the
/// ledger must still hold this attempt, running.
async fn fence(tx: &mut Transaction<'_, Sqlite>, lease: &Lease) -> Result<(), Error> {
    let held = sqlx::query(
        "UPDATE _tm_runs SET updated_at = ? WHERE id = ? AND attempt = ? AND status = 'running'",
    )
    .bind(now_text())
    .bind(lease.run_ref)
    .bind(lease.attempt)
    .execute(&mut **tx)
    .await
    .db()?;
    if held.rows_affected() == 1 {
        Ok(())
    } else {
        Err(Error::LeaseLost(format!(
            "attempt {} no longer holds the run key (another attempt took it over)",
            lease.attempt
        )))
    }
}

async fn save_progress(
    tx: &mut Transaction<'_, Sqlite>,
    lease: &Lease,
    counts: &Counts,
    checkpoint: Option<&serde_json::Value>,
    batches: i64,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE _tm_runs SET checkpoint = COALESCE(?, checkpoint), batches = MAX(batches, ?), rows_read = ?,
                rows_inserted = ?, rows_updated = ?, rows_unchanged = ?, rows_deleted = ?, rows_rejected = ?
         WHERE id = ?",
    )
    .bind(checkpoint.map(serde_json::Value::to_string))
    .bind(batches)
    .bind_counts(counts)
    .bind(lease.run_ref)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

async fn finish_attempt(
    tx: &mut Transaction<'_, Sqlite>,
    lease: &Lease,
    status: &str,
    counts: &Counts,
    error: Option<&Error>,
    now: &str,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE _tm_attempts SET status = ?, rows_read = ?, rows_inserted = ?, rows_updated = ?, rows_unchanged = ?,
                rows_deleted = ?, rows_rejected = ?, error_class = ?, error_message = ?, finished_at = ?
         WHERE run_ref = ? AND attempt = ?",
    )
    .bind(status)
    .bind_counts(counts)
    .bind(error.map(|e| e.class().as_str()))
    .bind(error.map(ToString::to_string))
    .bind(now)
    .bind(lease.run_ref)
    .bind(lease.attempt)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

async fn load_seen(
    tx: &mut Transaction<'_, Sqlite>,
    run_ref: i64,
    run_id: &str,
) -> Result<KeySet, Error> {
    let mut seen = KeySet::default();
    let mut rows =
        sqlx::query("SELECT key_hashes FROM _tm_batches WHERE run_ref = ? AND run_id = ?")
            .bind(run_ref)
            .bind(run_id)
            .fetch(&mut **tx);
    while let Some(row) = rows.try_next().await.db()? {
        let blob: Vec<u8> = row.try_get(0).db()?;
        decode_hashes(&blob, &mut seen);
    }
    Ok(seen)
}

fn json_column(row: &SqliteRow, name: &str) -> Option<serde_json::Value> {
    row.get::<Option<String>, _>(name)
        .and_then(|text| serde_json::from_str(&text).ok())
}

fn entry_of(row: &SqliteRow) -> LedgerEntry {
    LedgerEntry {
        pipeline: row.get("pipeline"),
        source: row.get("source"),
        export_type: row.get("export_type"),
        period_start: row.get("period_start"),
        period_end: row.get("period_end"),
        status: row.get("status"),
        attempts: row.get("attempt"),
        run_id: row.get("run_id"),
        counts: counts_of(row),
        error_class: row.get("error_class"),
        error_message: row.get("error_message"),
        started_at: row.get("started_at"),
        finished_at: row.get("finished_at"),
        handler_version: row.get("handler_version"),
        lease_owner: row.get("lease_owner"),
        lease_expires_at: row.get("lease_expires_at"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit that leaves the WAL at the threshold or over it has the WAL
    /// copied into the database file in the background, while the store is
    /// still open; SQLite's own automatic checkpoint is off.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_wal_is_checkpointed_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = SqliteStore::open(&format!("sqlite://{}", path.display()), 50)
            .await
            .unwrap();
        let file_size = || std::fs::metadata(&path).map_or(0, |m| m.len());
        let before = file_size();
        let mut conn = store.pool.acquire().await.unwrap();
        // About 200 pages of 8 KiB, committed in four transactions.
        sqlx::query("CREATE TABLE t (a TEXT)")
            .execute(&mut *conn)
            .await
            .unwrap();
        for _ in 0..4 {
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50)
                 INSERT INTO t SELECT hex(randomblob(4000)) FROM n",
            )
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        drop(conn);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while file_size() < before + 1_000_000 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            file_size() >= before + 1_000_000,
            "database file still {} bytes (was {before}): the WAL was not checkpointed",
            file_size()
        );
        store.close().await;
    }
}
