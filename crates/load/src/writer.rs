//! Writing one run's batches: skip what did not change, fence every commit,
//! reconcile what vanished.
//!
//! At the start of an attempt the writer reads `(natural key hash, row
//! hash)` of every live row of the run key. A typed row whose hash matches
//! is not written at all: an unchanged re-sync issues no row writes. The
//! natural keys of every batch are stored with the batch, so a resumed
//! attempt still knows every key the run has seen and reconciliation can
//! tell vanished rows from rows read before a crash.

use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, Hash128, Row, RunKey};
use tidemark_core::{KeyMap, KeySet};

use crate::durable::{Commit, Durable};
use crate::ledger::flow::Finished;
use crate::ledger::{encode_hashes, Claim, ClaimedRun, Counts, Lease, NextClaim};
use crate::schema::TableSchema;
use crate::stored::{Builder, Found, Hashes, StoredHashes};
use crate::Store;

/// A rejected record, kept in `_tm_rejects`.
#[derive(Debug, Clone)]
pub struct Reject {
    /// Where it came from.
    pub location: String,
    /// The field at fault, when known.
    pub field: Option<String>,
    /// The raw value at fault.
    pub value: Option<String>,
    /// Why it was rejected.
    pub reason: String,
    /// The raw record.
    pub record: serde_json::Value,
}

/// How the final reconciliation treats rows that vanished from the source.
#[derive(Debug, Clone, Copy)]
pub struct Reconcile {
    /// keep, delete or soft_delete.
    pub on_missing: OnMissing,
    /// Refuse when more than this fraction of the run key's rows would go.
    pub max_delete_fraction: f64,
    /// The operator's `--force-deletes`.
    pub force_deletes: bool,
}

/// How a row is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// The run key holds this key with other values: update in place.
    Update,
    /// Not in this run key: insert, or take it over from another run key.
    Upsert,
}

/// What a batch's writes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WriteCounts {
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    /// Rows not written because a later period holds their key (ADR 0006).
    pub superseded: u64,
}

impl WriteCounts {
    /// Adds these to run counts.
    pub fn apply(&self, counts: &mut Counts) {
        counts.rows_inserted += self.inserted;
        counts.rows_updated += self.updated;
        counts.rows_unchanged += self.unchanged;
        counts.rows_superseded += self.superseded;
    }

    /// Whether every row handed to the database was written.
    pub fn all_written(&self) -> bool {
        self.unchanged == 0 && self.superseded == 0
    }
}

/// What committing a batch reports back.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BatchOutcome {
    pub written: WriteCounts,
    /// The optimistic direct `COPY` into the table hit an existing key:
    /// the transaction is aborted and must be run again without it
    /// ([`BatchWrite::merged`]), and later batches of this run go through
    /// the staging table.
    pub direct_copy_conflict: bool,
}

/// One stored row of a run key, as read when an attempt starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoredRow {
    pub key: Hash128,
    pub row_hash: Hash128,
    /// The raw-record hash the row was written with, if any.
    pub raw_hash: Option<Hash128>,
    /// The row carries this run's id: a resumed run wrote it before.
    pub written_by_run: bool,
}

/// Lineage values stamped on every row a batch writes.
pub(crate) struct Stamp<'a> {
    pub lineage: &'a Lineage,
    pub run_id: &'a str,
    pub loaded_at: chrono::DateTime<chrono::Utc>,
}

/// The run key's identity as stored in lineage columns.
#[derive(Debug, Clone)]
pub(crate) struct Lineage {
    pub pipeline: String,
    pub source: String,
    pub export_type: String,
    pub period_start: String,
    pub period_end: String,
}

/// One batch, ready to commit.
pub(crate) struct BatchWrite<'a> {
    pub rows: Vec<(&'a Row, Write)>,
    /// Keys of rows skipped as unchanged: seen, but not written.
    pub skipped: Vec<Hash128>,
    pub rejects: &'a [Reject],
    pub checkpoint: &'a serde_json::Value,
    pub counts: Counts,
    pub batch_no: i64,
    /// Every row is new to the run key: try a plain `COPY` first.
    pub try_direct_copy: bool,
}

impl BatchWrite<'_> {
    /// The same batch, written through the staging table (after a direct
    /// `COPY` met an existing key).
    pub(crate) fn merged(&self) -> Self {
        BatchWrite {
            rows: self.rows.clone(),
            skipped: self.skipped.clone(),
            try_direct_copy: false,
            ..*self
        }
    }

    /// The keys a resumed attempt must be told were seen, encoded for
    /// `_tm_batches`; `None` when there are none. A row this batch wrote
    /// carries this run's id, so the table itself says it was seen; rows
    /// skipped as unchanged, or left as they were by the database's "only
    /// if different" write, do not. A first backfill usually has none.
    pub(crate) fn remembered_keys(&self, written: &WriteCounts) -> Option<Vec<u8>> {
        let all_written = written.all_written();
        if all_written && self.skipped.is_empty() {
            return None;
        }
        let unwritten = self.rows.iter().map(|(row, _)| &row.key_hash);
        let keys = self
            .skipped
            .iter()
            .chain(unwritten.filter(|_| !all_written));
        Some(encode_hashes(keys))
    }
}

/// What a run asks of its writer besides the run key.
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// `load.memory_budget` in bytes: above it the stored hashes go to a
    /// temporary file.
    pub memory_budget: u64,
    /// Remember every key new to the run key that the run writes, so that
    /// [`RunWriter::seen_before`] knows them: needed only to drop or refuse
    /// duplicates across batches (`on_duplicate_key = "first"` or
    /// `"error"`). With `"last"` a later duplicate is simply written again
    /// and the UNIQUE constraint settles it, so a first load builds no set.
    pub track_new_keys: bool,
}

/// Writes the batches of one claimed run.
#[derive(Debug)]
pub struct RunWriter {
    store: Store,
    schema: TableSchema,
    lease: Lease,
    lineage: Lineage,
    /// What the run key held at the start, and which of it was seen.
    existing: StoredHashes,
    /// Keys new to the run key that this run has written (only with
    /// [`WriterOptions::track_new_keys`]).
    seen_new: KeySet,
    track_new_keys: bool,
    counts: Counts,
    batches: i64,
    direct_copy: bool,
    /// What [`RunWriter::raw_unchanged`] found for the batch's keys it did
    /// not skip: `plan` takes them from here instead of looking again (the
    /// spill file's cursor passes each key once).
    looked_up: KeyMap<Option<Found>>,
    /// Keys of the batch whose raw record matched the stored raw hash, with
    /// their positions: counted unchanged, and seen once the batch commits.
    raw_skipped: Vec<(Hash128, usize)>,
    /// How a one-batch period's finishing transaction commits (see
    /// [`RunWriter::share_commit`]).
    commit: Commit,
    /// When the last finishing transaction is on disk.
    durable: Durable,
}

impl RunWriter {
    pub(crate) async fn start(
        store: Store,
        schema: TableSchema,
        run: &ClaimedRun,
        key: &RunKey,
        options: WriterOptions,
    ) -> Result<Self, Error> {
        let lineage = Lineage {
            pipeline: key.pipeline.clone(),
            source: key.source.clone(),
            export_type: key.export_type.clone(),
            period_start: key.period.start_rfc3339(),
            period_end: key.period.end_rfc3339(),
        };
        // Only a resumed run can find rows it wrote itself; a fresh run's id
        // is new, so the per-row comparison is skipped.
        let run_id = (run.batches > 0).then_some(run.lease.run_id.as_str());
        // On SQLite a fresh attempt compares while the stored rows are read
        // (ADR 0021); anything else reads them first.
        let streamed = match &store.backend {
            crate::Backend::Sqlite(s)
                if run_id.is_none() && run.seen.is_empty() && !options.track_new_keys =>
            {
                s.streamed_stored_rows(&schema, &lineage, options.memory_budget)
                    .await?
            }
            _ => None,
        };
        let mut existing = match streamed {
            Some(existing) => existing,
            None => {
                let mut builder = Builder::new(options.memory_budget);
                // Rows this run wrote before a crash were seen.
                store
                    .stored_rows(&schema, &lineage, run_id, |stored| {
                        let hashes = Hashes::new(stored.row_hash, stored.raw_hash);
                        builder.push(stored.key, hashes, stored.written_by_run)
                    })
                    .await?;
                builder.finish()?
            }
        };
        // A resumed attempt: the keys its committed batches remembered were seen.
        let mut seen_new = KeySet::default();
        for &key in &run.seen {
            if !existing.mark_seen(key)? && options.track_new_keys {
                seen_new.insert(key);
            }
        }
        tracing::debug!(
            existing = existing.len(),
            spilled = existing.spilled(),
            seen = run.seen.len(),
            "writer ready"
        );
        Ok(RunWriter {
            store,
            schema,
            lease: run.lease.clone(),
            lineage,
            existing,
            seen_new,
            track_new_keys: options.track_new_keys,
            counts: run.counts,
            batches: run.batches,
            direct_copy: true,
            looked_up: KeyMap::default(),
            raw_skipped: Vec::new(),
            commit: Commit::Alone,
            durable: Durable::now(),
        })
    }

    /// Counts so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Records the total the source declared for the period
    /// (`expect_count`), written with the counts from now on: in the
    /// result and the ledger of a done run, and of a failed one.
    pub fn expect_rows(&mut self, expected: u64) {
        self.counts.rows_expected = Some(expected);
    }

    /// The row hash the run key held for this key when the attempt started
    /// (or `None`, also once this run has rewritten a row it keeps in a
    /// file): what an incoming row is compared with to skip it unwritten.
    pub fn stored_hash(&mut self, key: Hash128) -> Result<Option<Hash128>, Error> {
        Ok(self.existing.find_all(&[key])?[0].and_then(|found| found.row_hash))
    }

    /// Whether earlier committed batches of this run had these keys (for
    /// `on_duplicate_key = "first"` or `"error"`; keys new to the run key
    /// are known only with [`WriterOptions::track_new_keys`]).
    pub fn seen_before(&mut self, keys: &[Hash128]) -> Result<Vec<bool>, Error> {
        let found = self.existing.find_all(keys)?;
        Ok(keys
            .iter()
            .zip(found)
            .map(|(key, found)| match found {
                Some(found) => self.existing.was_seen(found.position),
                None => self.seen_new.contains(key),
            })
            .collect())
    }

    /// Batches committed so far by this run.
    pub fn batches(&self) -> i64 {
        self.batches
    }

    /// Whether the run key holds rows with a raw-record hash (of those read
    /// so far): only then can a record skip its typing
    /// ([`RunWriter::raw_unchanged`]).
    pub fn has_raw_hashes(&self) -> bool {
        self.existing.has_raw_hashes()
    }

    /// The raw-record shortcut (ADR 0021, "The raw-record hash"). `batch`
    /// holds every record of the next batch that will be written, in
    /// source order: its key hash, and its raw hash when its typing was
    /// deferred (those keys must be unique in the batch). Returns, for each,
    /// whether it is unchanged: the run key holds the key with the same raw
    /// hash, and this run has not written that row since it started. Such
    /// a record is counted unchanged and seen when the batch commits (the
    /// caller does not type or pass it); every other key's lookup is kept
    /// for the batch's rows, so each key is looked up once, in order.
    pub fn raw_unchanged(
        &mut self,
        batch: &[(Hash128, Option<Hash128>)],
    ) -> Result<Vec<bool>, Error> {
        let keys: Vec<Hash128> = batch.iter().map(|(key, _)| *key).collect();
        let found = self.existing.find_all(&keys)?;
        self.looked_up.clear();
        self.raw_skipped.clear();
        let mut unchanged = Vec::with_capacity(batch.len());
        for ((key, raw), found) in batch.iter().zip(found) {
            let same = match (raw, found) {
                (Some(raw), Some(f)) => f.row_hash.is_some() && f.raw_hash == Some(*raw),
                _ => false,
            };
            match found {
                Some(f) if same => self.raw_skipped.push((*key, f.position)),
                _ => {
                    self.looked_up.insert(*key, found);
                }
            }
            unchanged.push(same);
        }
        Ok(unchanged)
    }

    /// Each row's stored entry: from [`RunWriter::raw_unchanged`]'s lookups
    /// when it made them, else looked up now.
    fn find_rows(&mut self, keys: &[Hash128]) -> Result<Vec<Option<Found>>, Error> {
        if self.looked_up.is_empty() {
            return self.existing.find_all(keys);
        }
        let mut found = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match self.looked_up.get(key) {
                Some(known) => found.push(*known),
                None => {
                    missing.push(i);
                    found.push(None);
                }
            }
        }
        if !missing.is_empty() {
            let asked: Vec<Hash128> = missing.iter().map(|&i| keys[i]).collect();
            for (i, hit) in missing.into_iter().zip(self.existing.find_all(&asked)?) {
                found[i] = hit;
            }
        }
        Ok(found)
    }

    /// The batch committed: its raw-skipped keys are seen, and its lookups
    /// done with.
    fn raw_committed(&mut self) {
        for (_, position) in std::mem::take(&mut self.raw_skipped) {
            self.existing.see(position);
        }
        self.looked_up.clear();
    }

    /// What to write of a batch, and where its keys are in the stored set.
    fn plan<'r>(
        &mut self,
        rows: &'r [Row],
        rejects: &'r [Reject],
        rows_read: u64,
        checkpoint: &'r serde_json::Value,
    ) -> Result<(BatchWrite<'r>, Vec<Option<Found>>), Error> {
        let keys: Vec<Hash128> = rows.iter().map(|row| row.key_hash).collect();
        let found = self.find_rows(&keys)?;
        let mut skipped: Vec<Hash128> = self.raw_skipped.iter().map(|(key, _)| *key).collect();
        let mut writes = Vec::with_capacity(rows.len());
        for (row, found) in rows.iter().zip(&found) {
            match found {
                Some(Found {
                    row_hash: Some(stored),
                    ..
                }) if *stored == row.row_hash => skipped.push(row.key_hash),
                Some(Found {
                    row_hash: Some(_), ..
                }) => writes.push((row, Write::Update)),
                // Written by this run since: the database compares.
                Some(_) | None => writes.push((row, Write::Upsert)),
            }
        }
        let mut counts = self.counts;
        counts.rows_read += rows_read;
        counts.rows_unchanged += skipped.len() as u64;
        counts.rows_rejected += rejects.len() as u64;
        let try_direct_copy = self.direct_copy && writes.iter().all(|(_, w)| *w == Write::Upsert);
        let batch = BatchWrite {
            rows: writes,
            skipped,
            rejects,
            checkpoint,
            counts,
            batch_no: self.batches + 1,
            try_direct_copy,
        };
        Ok((batch, found))
    }

    /// Commits the batch of a period that has no other (the source ended
    /// within its first batch) together with the reconciliation and
    /// `done`: one transaction instead of two. On error nothing changed,
    /// so the same call may be retried. Returns the canonical result.
    pub async fn write_last_batch(
        &mut self,
        rows: &[Row],
        rejects: &[Reject],
        rows_read: u64,
        checkpoint: &serde_json::Value,
        reconcile: &Reconcile,
    ) -> Result<serde_json::Value, Error> {
        let last = (rows, rejects, rows_read, checkpoint);
        let (result, _) = self
            .write_last_batch_then_claim(last, reconcile, None)
            .await?;
        Ok(result)
    }

    /// [`RunWriter::write_last_batch`], whose transaction then claims the
    /// worker's `next` key (the claim piggy-back, ADR 0022): the answer of
    /// that claim comes back with the result. On error nothing was
    /// committed, and nothing claimed.
    pub async fn write_last_batch_then_claim(
        &mut self,
        (rows, rejects, rows_read, checkpoint): (&[Row], &[Reject], u64, &serde_json::Value),
        reconcile: &Reconcile,
        next: Option<&NextClaim>,
    ) -> Result<(serde_json::Value, Option<Claim>), Error> {
        // Every stored row must be known before any is counted as vanished.
        self.existing.complete()?;
        let (batch, found) = self.plan(rows, rejects, rows_read, checkpoint)?;
        // Reconciliation must count this batch's keys as seen; taken back
        // if the transaction does not commit.
        let positions = found.iter().flatten().map(|f| f.position);
        let raw_skipped = self.raw_skipped.iter().map(|(_, position)| *position);
        let newly: Vec<usize> = positions
            .chain(raw_skipped)
            .collect::<Vec<_>>()
            .into_iter()
            .filter(|&position| self.existing.see(position))
            .collect();
        let reconcile = self.effective(reconcile);
        let prepared = if reconcile.on_missing == OnMissing::Keep {
            Ok(())
        } else {
            self.existing.prepare_reconcile()
        };
        let committed = match prepared {
            Ok(()) => {
                self.store
                    .apply_and_finish(
                        &self.lease,
                        &self.schema,
                        &self.lineage,
                        &batch,
                        &self.existing,
                        &reconcile,
                        next,
                        self.commit,
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        let Finished {
            outcome,
            result,
            claim,
            durable,
        } = match committed {
            Ok(done) => done,
            Err(e) => {
                for position in newly {
                    self.existing.unsee(position);
                }
                return Err(e);
            }
        };
        self.raw_committed();
        let mut counts = batch.counts;
        outcome.written.apply(&mut counts);
        if let Some(deleted) = result
            .get("rows_deleted")
            .and_then(serde_json::Value::as_u64)
        {
            counts.rows_deleted = deleted;
        }
        self.counts = counts;
        self.batches = batch.batch_no;
        self.durable = durable;
        Ok((result, claim))
    }

    /// Lets a one-batch period's finishing transaction share its commit
    /// with the next periods' (ADR 0022, SQLite): for a worker whose
    /// reporter waits for [`RunWriter::take_durable`] before it calls the
    /// period done.
    pub fn share_commit(&mut self) {
        self.commit = Commit::Shared;
    }

    /// When the period's finishing transaction is on disk: at once unless
    /// its commit is shared ([`RunWriter::share_commit`]).
    pub fn take_durable(&mut self) -> Durable {
        std::mem::take(&mut self.durable)
    }

    /// Commits one batch: changed rows, the batch's keys, rejects, counts
    /// and checkpoint, in one fenced transaction. On error nothing changed,
    /// so the same call may be retried.
    pub async fn write_batch(
        &mut self,
        rows: &[Row],
        rejects: &[Reject],
        rows_read: u64,
        checkpoint: &serde_json::Value,
    ) -> Result<(), Error> {
        let (batch, found) = self.plan(rows, rejects, rows_read, checkpoint)?;
        let outcome = self
            .store
            .apply_batch(&self.lease, &self.schema, &self.lineage, &batch)
            .await?;
        // Committed: only now does in-memory state move forward.
        self.raw_committed();
        let mut counts = batch.counts;
        outcome.written.apply(&mut counts);
        self.counts = counts;
        if outcome.direct_copy_conflict {
            self.direct_copy = false;
        }
        self.batches = batch.batch_no;
        for (row, found) in rows.iter().zip(found) {
            // Keep stored hashes current for keys the run key already had, so
            // a later duplicate is compared with what is now in the table.
            // Keys new to the run key need no hash: a later duplicate goes
            // through the database's own "only if different" upsert.
            match found {
                Some(found) => {
                    let written = found.row_hash != Some(row.row_hash);
                    self.existing.saw(found.position, row.row_hash, written);
                }
                None if self.track_new_keys => {
                    self.seen_new.insert(row.key_hash);
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Reconciles vanished rows per `reconcile` and marks the run done, in
    /// one fenced transaction. Returns the canonical result.
    pub async fn finish(&mut self, reconcile: &Reconcile) -> Result<serde_json::Value, Error> {
        let (result, _) = self.finish_then_claim(reconcile, None).await?;
        Ok(result)
    }

    /// [`RunWriter::finish`], whose transaction then claims the worker's
    /// `next` key (the claim piggy-back, ADR 0022): the answer of that
    /// claim comes back with the result. On error nothing was committed,
    /// and nothing claimed.
    pub async fn finish_then_claim(
        &mut self,
        reconcile: &Reconcile,
        next: Option<&NextClaim>,
    ) -> Result<(serde_json::Value, Option<Claim>), Error> {
        // Every stored row must be known before any is counted as vanished.
        self.existing.complete()?;
        let reconcile = self.effective(reconcile);
        if reconcile.on_missing != OnMissing::Keep {
            self.existing.prepare_reconcile()?;
        }
        let (result, claim) = self
            .store
            .finish_run(
                &self.lease,
                &self.schema,
                &self.lineage,
                &self.existing,
                &reconcile,
                self.counts,
                self.batches,
                next,
            )
            .await?;
        if let Some(deleted) = result
            .get("rows_deleted")
            .and_then(serde_json::Value::as_u64)
        {
            self.counts.rows_deleted = deleted;
        }
        Ok((result, claim))
    }
}

impl RunWriter {
    /// `reconcile`, or "keep" when every row of the run key present at the
    /// start has been seen: reconciliation then has nothing to look for.
    fn effective(&self, reconcile: &Reconcile) -> Reconcile {
        let maybe_vanished = self.existing.unseen() > 0;
        Reconcile {
            on_missing: if maybe_vanished {
                reconcile.on_missing
            } else {
                OnMissing::Keep
            },
            ..*reconcile
        }
    }
}

/// The canonical result of a done run, stored in the ledger and printed on
/// a re-run.
/// The canonical result of a done run, but for its `finished_at`, which the
/// ledger stamps from the database's clock as it stores the result.
pub(crate) fn result_json(lineage: &Lineage, lease: &Lease, counts: &Counts) -> serde_json::Value {
    let mut result = serde_json::json!({
        "pipeline": lineage.pipeline,
        "source": lineage.source,
        "export_type": lineage.export_type,
        "period_start": lineage.period_start,
        "period_end": lineage.period_end,
        "status": "done",
        "attempts": lease.attempt,
        "run_id": lease.run_id,
    });
    if let (Some(map), Ok(serde_json::Value::Object(c))) =
        (result.as_object_mut(), serde_json::to_value(counts))
    {
        map.extend(c);
    }
    result
}

/// Whether a reconciliation deleting `to_delete` of `live` rows must be
/// refused. An empty source may never wipe a period unless forced.
pub(crate) fn refuse_deletes(
    to_delete: u64,
    live: u64,
    rows_read: u64,
    reconcile: &Reconcile,
) -> Option<String> {
    if to_delete == 0 || reconcile.force_deletes {
        return None;
    }
    if rows_read == 0 {
        return Some(format!(
            "refused to delete all {to_delete} rows of this period because the source returned no records; re-run with --force-deletes if that is intended"
        ));
    }
    #[allow(clippy::cast_precision_loss)] // a ratio of row counts
    let fraction = to_delete as f64 / live.max(1) as f64;
    (fraction > reconcile.max_delete_fraction).then(|| {
        format!(
            "refused to delete {to_delete} of {live} rows ({:.0}%), more than load.max_delete_fraction = {}; re-run with --force-deletes if that is intended",
            fraction * 100.0,
            reconcile.max_delete_fraction
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(fraction: f64, force: bool) -> Reconcile {
        Reconcile {
            on_missing: OnMissing::Delete,
            max_delete_fraction: fraction,
            force_deletes: force,
        }
    }

    #[test]
    fn delete_guard() {
        assert!(refuse_deletes(0, 10, 0, &rec(0.5, false)).is_none());
        assert!(refuse_deletes(5, 10, 5, &rec(0.5, false)).is_none());
        assert!(refuse_deletes(6, 10, 4, &rec(0.5, false)).is_some());
        assert!(refuse_deletes(6, 10, 4, &rec(0.5, true)).is_none());
        // An empty source never wipes a period, whatever the fraction allows.
        assert!(refuse_deletes(10, 10, 0, &rec(1.0, false))
            .unwrap()
            .contains("no records"));
        assert!(refuse_deletes(10, 10, 0, &rec(1.0, true)).is_none());
    }
}
