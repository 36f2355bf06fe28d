//! The PostgreSQL backend: production, and the coordinator many workers on
//! many hosts share.
//!
//! Claims lock the run key's ledger row (`INSERT … ON CONFLICT DO NOTHING`,
//! then `SELECT … FOR UPDATE`), so two workers can never both take it.
//! Every batch transaction starts with the fencing `UPDATE` of that row,
//! which also holds its lock until commit: a claim racing a batch waits for
//! the batch, then supersedes the attempt, and the old attempt's next batch
//! finds `attempt` changed and rolls back. Lease times use the database's
//! clock, so hosts with skewed clocks agree.

mod copy_binary;
mod stored_copy;
mod table;

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row as _, Transaction};
use tidemark_core::spec::OnMissing;
use tidemark_core::KeySet;
use tidemark_core::{Error, RunKey};

use crate::db_error::DbResultExt;
use crate::ledger::{
    counts_of, decide, decode_hashes, new_run_id, BindCounts, Claim, ClaimRequest, ClaimedRun,
    Counts, Decision, Lease, LedgerEntry, Snapshot,
};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::timestamp_text;
use crate::writer::{
    refuse_deletes, result_json, BatchOutcome, BatchWrite, Lineage, Reconcile, StoredRow,
};

/// A pool of connections to one PostgreSQL database.
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub(crate) async fn connect(url: &str) -> Result<Self, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(60))
            .connect(url)
            .await
            .map_err(|e| Error::Database {
                message: format!("cannot connect to {}: {e}", crate::redact_url(url)),
                transient: false,
            })?;
        let store = PgStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) async fn migrate(&self) -> Result<(), Error> {
        sqlx::migrate!("../../migrations/postgres")
            .run(&self.pool)
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
        let mut tx = self.pool.begin().await.db()?;
        sqlx::query(
            "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, now(), now())
             ON CONFLICT (pipeline, source, export_type, period_start) DO NOTHING",
        )
        .bind(&key.pipeline)
        .bind(&key.source)
        .bind(&key.export_type)
        .bind(key.period.start_rfc3339())
        .bind(key.period.end_rfc3339())
        .execute(&mut *tx)
        .await
        .db()?;
        let row = sqlx::query(
            "SELECT id, status, attempt, run_id, lease_owner, lease_host, lease_pid, lease_expires_at,
                    COALESCE(lease_expires_at > now(), false) AS lease_live, checkpoint, batches, result,
                    rows_read, rows_inserted, rows_updated, rows_unchanged, rows_deleted, rows_rejected
             FROM _tm_runs WHERE pipeline = $1 AND source = $2 AND export_type = $3 AND period_start = $4
             FOR UPDATE",
        )
        .bind(&key.pipeline)
        .bind(&key.source)
        .bind(&key.export_type)
        .bind(key.period.start_rfc3339())
        .fetch_one(&mut *tx)
        .await
        .db()?;
        let run_ref: i64 = row.get("id");
        let snapshot = Snapshot {
            status: row.get("status"),
            run_id: row.get("run_id"),
            lease_owner: row.get("lease_owner"),
            lease_host: row.get("lease_host"),
            lease_pid: row.get("lease_pid"),
            lease_expires_at: time_text(row.get("lease_expires_at")),
            lease_live: row.get("lease_live"),
            checkpoint: row.get("checkpoint"),
            result: row.get("result"),
        };
        let resume = match decide(snapshot, request) {
            Decision::Done(result) => return Ok(Claim::Done(result)),
            Decision::Held { owner, expires_at } => return Ok(Claim::Held { owner, expires_at }),
            Decision::Take {
                resume,
                previous_lost,
            } => {
                if previous_lost {
                    sqlx::query(
                        "UPDATE _tm_attempts SET status = 'lost', finished_at = now() WHERE run_ref = $1 AND status = 'running'",
                    )
                    .bind(run_ref)
                    .execute(&mut *tx)
                    .await
                    .db()?;
                }
                resume
            }
        };
        let attempt: i64 = row.get::<i64, _>("attempt") + 1;
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
                sqlx::query("DELETE FROM _tm_batches WHERE run_ref = $1")
                    .bind(run_ref)
                    .execute(&mut *tx)
                    .await
                    .db()?;
                (new_run_id(), Counts::default(), 0, KeySet::default(), None)
            }
        };
        let fresh = resume_cp.is_none();
        sqlx::query(
            "UPDATE _tm_runs SET status = 'running', attempt = $1, run_id = $2, lease_owner = $3, lease_host = $4,
                    lease_pid = $5, lease_expires_at = now() + make_interval(secs => $6),
                    checkpoint = CASE WHEN $7 THEN NULL ELSE checkpoint END,
                    batches = $8, rows_read = $9, rows_inserted = $10, rows_updated = $11, rows_unchanged = $12,
                    rows_deleted = $13, rows_rejected = $14, error_class = NULL, error_message = NULL, result = NULL,
                    handler_version = $15, started_at = CASE WHEN $7 THEN now() ELSE started_at END,
                    finished_at = NULL, updated_at = now()
             WHERE id = $16",
        )
        .bind(attempt)
        .bind(&run_id)
        .bind(request.worker.owner())
        .bind(&request.worker.host)
        .bind(i64::from(request.worker.pid))
        .bind(request.lease_ttl.as_secs_f64())
        .bind(fresh)
        .bind(batches)
        .bind_counts(&counts)
        .bind(&request.handler_version)
        .bind(run_ref)
        .execute(&mut *tx)
        .await
        .db()?;
        sqlx::query(
            "INSERT INTO _tm_attempts (run_ref, attempt, run_id, worker, status, resumed, started_at)
             VALUES ($1, $2, $3, $4, 'running', $5, now())",
        )
        .bind(run_ref)
        .bind(attempt)
        .bind(&run_id)
        .bind(request.worker.owner())
        .bind(!fresh)
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
        let done = sqlx::query(
            "UPDATE _tm_runs SET lease_expires_at = now() + make_interval(secs => $1)
             WHERE id = $2 AND attempt = $3 AND status = 'running'",
        )
        .bind(ttl.as_secs_f64())
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
        let mut tx = self.pool.begin().await.db()?;
        let updated = sqlx::query(
            "UPDATE _tm_runs SET status = 'failed', error_class = $1, error_message = $2, finished_at = now(),
                    lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL, updated_at = now()
             WHERE id = $3 AND attempt = $4 AND status = 'running'",
        )
        .bind(error.class().as_str())
        .bind(error.to_string())
        .bind(lease.run_ref)
        .bind(lease.attempt)
        .execute(&mut *tx)
        .await
        .db()?;
        if updated.rows_affected() == 1 {
            finish_attempt(&mut tx, lease, "failed", counts, Some(error)).await?;
        }
        tx.commit().await.db()
    }

    pub(crate) async fn restart_fresh(&self, lease: &Lease) -> Result<String, Error> {
        let run_id = new_run_id();
        let mut tx = self.pool.begin().await.db()?;
        fence(&mut tx, lease).await?;
        sqlx::query(
            "UPDATE _tm_runs SET checkpoint = NULL, batches = 0, rows_read = 0, rows_inserted = 0, rows_updated = 0,
                    rows_unchanged = 0, rows_deleted = 0, rows_rejected = 0, run_id = $1 WHERE id = $2",
        )
        .bind(&run_id)
        .bind(lease.run_ref)
        .execute(&mut *tx)
        .await
        .db()?;
        sqlx::query("UPDATE _tm_attempts SET run_id = $1 WHERE run_ref = $2 AND attempt = $3")
            .bind(&run_id)
            .bind(lease.run_ref)
            .bind(lease.attempt)
            .execute(&mut *tx)
            .await
            .db()?;
        sqlx::query("DELETE FROM _tm_batches WHERE run_ref = $1")
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
            "SELECT * FROM _tm_runs WHERE pipeline = $1 AND ($2::text IS NULL OR period_start = $2)
             ORDER BY period_start, source, export_type",
        )
        .bind(pipeline)
        .bind(period_start)
        .fetch_all(&self.pool)
        .await
        .db()?;
        Ok(rows.iter().map(entry_of).collect())
    }

    pub(crate) async fn prune(&self, age: Duration) -> Result<(u64, u64), Error> {
        let secs = age.as_secs_f64();
        let attempts = sqlx::query(
            "DELETE FROM _tm_attempts WHERE finished_at IS NOT NULL AND finished_at < now() - make_interval(secs => $1)",
        )
        .bind(secs)
        .execute(&self.pool)
        .await
        .db()?;
        let rejects = sqlx::query(
            "DELETE FROM _tm_rejects WHERE created_at < now() - make_interval(secs => $1)",
        )
        .bind(secs)
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
        let mut tx = self.pool.begin().await.db()?;
        let hashes = stored_copy::stored_rows(&mut tx, schema, lineage, run_id).await?;
        tx.commit().await.db()?;
        Ok(hashes)
    }

    pub(crate) async fn apply_batch(
        &self,
        lease: &Lease,
        schema: &TableSchema,
        lineage: &Lineage,
        batch: &BatchWrite<'_>,
    ) -> Result<BatchOutcome, Error> {
        let mut tx = self.pool.begin().await.db()?;
        fence(&mut tx, lease).await?;
        let stamp = table::Stamp {
            lineage,
            run_id: &lease.run_id,
            loaded_at: Utc::now(),
        };
        let outcome = table::write_rows(&mut tx, schema, &stamp, batch).await?;
        for reject in batch.rejects {
            table::insert_reject(&mut tx, lineage, &lease.run_id, reject).await?;
        }
        if let Some(keys) = batch.remembered_keys(&outcome.written) {
            sqlx::query("INSERT INTO _tm_batches (run_ref, run_id, batch_no, key_hashes) VALUES ($1, $2, $3, $4)")
                .bind(lease.run_ref)
                .bind(&lease.run_id)
                .bind(batch.batch_no)
                .bind(keys)
                .execute(&mut *tx)
                .await
                .db()?;
        }
        let mut counts = batch.counts;
        outcome.written.apply(&mut counts);
        save_progress(
            &mut tx,
            lease,
            &counts,
            Some(batch.checkpoint),
            batch.batch_no,
        )
        .await?;
        tx.commit().await.db()?;
        Ok(outcome)
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
        let mut tx = self.pool.begin().await.db()?;
        fence(&mut tx, lease).await?;
        if reconcile.on_missing != OnMissing::Keep {
            let (live, vanished) =
                stored_copy::vanished_keys(&mut tx, schema, lineage, existing).await?;
            if let Some(why) =
                refuse_deletes(vanished.len() as u64, live, counts.rows_read, reconcile)
            {
                return Err(Error::Invariant(why));
            }
            counts.rows_deleted =
                table::delete_keys(&mut tx, schema, lineage, reconcile.on_missing, &vanished)
                    .await?;
        }
        let finished_at = timestamp_text(Utc::now());
        let result = result_json(lineage, lease, &counts, &finished_at);
        save_progress(&mut tx, lease, &counts, None, 0).await?;
        sqlx::query(
            "UPDATE _tm_runs SET status = 'done', result = $1, finished_at = now(), checkpoint = NULL,
                    lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_at = NULL WHERE id = $2",
        )
        .bind(&result)
        .bind(lease.run_ref)
        .execute(&mut *tx)
        .await
        .db()?;
        finish_attempt(&mut tx, lease, "done", &counts, None).await?;
        sqlx::query("DELETE FROM _tm_batches WHERE run_ref = $1")
            .bind(lease.run_ref)
            .execute(&mut *tx)
            .await
            .db()?;
        tx.commit().await.db()?;
        Ok(result)
    }
}

/// The fencing check: the first statement of every batch transaction. It
/// also locks the ledger row until commit, so a concurrent claim waits.
async fn fence(tx: &mut Transaction<'_, Postgres>, lease: &Lease) -> Result<(), Error> {
    let held = sqlx::query("UPDATE _tm_runs SET updated_at = now() WHERE id = $1 AND attempt = $2 AND status = 'running'")
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
    tx: &mut Transaction<'_, Postgres>,
    lease: &Lease,
    counts: &Counts,
    checkpoint: Option<&serde_json::Value>,
    batches: i64,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE _tm_runs SET checkpoint = COALESCE($1, checkpoint), batches = GREATEST(batches, $2), rows_read = $3,
                rows_inserted = $4, rows_updated = $5, rows_unchanged = $6, rows_deleted = $7, rows_rejected = $8
         WHERE id = $9",
    )
    .bind(checkpoint)
    .bind(batches)
    .bind_counts(counts)
    .bind(lease.run_ref)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

async fn finish_attempt(
    tx: &mut Transaction<'_, Postgres>,
    lease: &Lease,
    status: &str,
    counts: &Counts,
    error: Option<&Error>,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE _tm_attempts SET status = $1, rows_read = $2, rows_inserted = $3, rows_updated = $4,
                rows_unchanged = $5, rows_deleted = $6, rows_rejected = $7, error_class = $8, error_message = $9,
                finished_at = now()
         WHERE run_ref = $10 AND attempt = $11",
    )
    .bind(status)
    .bind_counts(counts)
    .bind(error.map(|e| e.class().as_str()))
    .bind(error.map(ToString::to_string))
    .bind(lease.run_ref)
    .bind(lease.attempt)
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

async fn load_seen(
    tx: &mut Transaction<'_, Postgres>,
    run_ref: i64,
    run_id: &str,
) -> Result<KeySet, Error> {
    let mut seen = KeySet::default();
    let mut rows =
        sqlx::query("SELECT key_hashes FROM _tm_batches WHERE run_ref = $1 AND run_id = $2")
            .bind(run_ref)
            .bind(run_id)
            .fetch(&mut **tx);
    while let Some(row) = rows.try_next().await.db()? {
        let blob: Vec<u8> = row.try_get(0).db()?;
        decode_hashes(&blob, &mut seen);
    }
    Ok(seen)
}

fn time_text(at: Option<DateTime<Utc>>) -> Option<String> {
    at.map(timestamp_text)
}

fn entry_of(row: &PgRow) -> LedgerEntry {
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
        started_at: time_text(row.get("started_at")),
        finished_at: time_text(row.get("finished_at")),
        handler_version: row.get("handler_version"),
        lease_owner: row.get("lease_owner"),
        lease_expires_at: time_text(row.get("lease_expires_at")),
    }
}
