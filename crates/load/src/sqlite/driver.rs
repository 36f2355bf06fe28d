//! SQLite behind the ledger's driver boundary: its transactions (their
//! statements run in `ledger_sql`) and the data plane on the raw handle.

use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqliteConnection;
use tidemark_core::spec::OnMissing;
use tidemark_core::Error;

use tokio::sync::{oneshot, OwnedMutexGuard};

use super::ffi::HeldConnection;
use super::kept::Kept;
use super::{ledger_sql, raw, table, SqliteStore, BUSY_TIMEOUT};
use crate::durable::Durable;
use crate::ledger::driver::{Arg, Dialect, Driver, LedgerTx, Record};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{BatchOutcome, BatchWrite, Lineage, Stamp, StoredRow};

/// A transaction on one SQLite connection, begun and ended by tidemark
/// itself rather than by sqlx's `Transaction`: after a failed statement or
/// `COMMIT` (a full disk, an I/O error) SQLite may or may not have rolled
/// the transaction back, and sqlx's count of open transactions then no
/// longer matches the connection; handed back to the pool, such a
/// connection went on holding the write lock (every other writer waited
/// 60 s) or ran later statements outside any transaction. A transaction
/// that is not committed therefore closes its connection instead of
/// returning it: SQLite rolls back what is left at once.
///
/// Its statements run on the connection's held raw handle
/// ([`HeldConnection`]), and a committed transaction leaves the connection,
/// still held and with its statements prepared, to the next one
/// ([`Kept`]). A `BEGIN` that finds another writer's lock taken waits on
/// the runtime's timer, not on a thread ([`begin_on`]).
pub(crate) struct SqliteTx {
    /// `None` once committed.
    conn: Option<HeldConnection>,
    kept: Arc<Kept>,
    /// A period's part of the shared transaction ([`Shared`]): the slot,
    /// held until the period's savepoint is released or rolled back.
    member: Option<OwnedMutexGuard<Shared>>,
}

/// The savepoint each period of a shared transaction writes behind.
const PERIOD_SAVEPOINT: &str = "period";

/// At most this many periods share one commit.
const SHARED_PERIODS: usize = 64;

/// A shared transaction commits at most this long after its first period
/// joined: bounds how long its periods wait to be reported done, and how
/// long another process waits for the write lock.
const SHARED_FOR: Duration = Duration::from_millis(20);

/// The transaction that the one-batch periods of a command's workers share
/// on SQLite (ADR 0022, "a worker's tiny periods share one commit").
///
/// A tiny period's finishing transaction writes about fifteen pages (the
/// run row's and the attempt's indexes, the rows' and their keys'); the
/// next period's writes the same pages again. Sharing one commit writes
/// them once per group. Each period writes behind a savepoint of its own,
/// so it commits or rolls back whole, with its checkpoint, fence and
/// `done`; a period that fails rolls back only its savepoint.
///
/// The shared transaction commits when [`SHARED_PERIODS`] joined, when
/// [`SHARED_FOR`] has passed since its first did (a timer), when the store
/// closes, and before any other write of this store begins
/// ([`SqliteTx::begin`]): the write lock it holds would otherwise keep that
/// write waiting (a failure record, a heartbeat, a hand-back, a claim of
/// its own). Every period in it learns the commit's outcome through its
/// [`Durable`], and is reported done only then.
#[derive(Default)]
pub(crate) struct Shared {
    open: Option<OpenShared>,
    /// Tells the timer which shared transaction it was started for.
    generation: u64,
}

struct OpenShared {
    /// `None` while one of its periods writes (the period's transaction
    /// holds it).
    conn: Option<HeldConnection>,
    periods: usize,
    since: std::time::Instant,
    generation: u64,
    /// One per period in it, told the commit's outcome.
    waiting: Vec<oneshot::Sender<Result<(), Error>>>,
}

impl Shared {
    /// Commits the open shared transaction, if any, and tells its periods.
    pub(super) async fn commit(&mut self, kept: &Kept) {
        // The connection stays in the slot until `COMMIT` answered: a
        // caller cancelled before that leaves it to the next commit, or to
        // the drop's rollback, never back in the pool inside a transaction.
        let Some(conn) = self.open.as_mut().and_then(|open| open.conn.as_mut()) else {
            return;
        };
        let committed = match conn.raw().await {
            Ok(raw) => ledger_sql::execute(raw, "COMMIT", &[]).map(drop),
            Err(e) => Err(e),
        };
        let Some(mut open) = self.open.take() else {
            return;
        };
        let Some(mut conn) = open.conn.take() else {
            return;
        };
        match committed {
            Ok(()) => {
                keep_outside(conn, kept);
                open.tell(&Ok(()));
            }
            Err(e) => {
                conn.close_on_drop();
                drop(conn);
                open.tell(&Err(e));
            }
        }
    }
}

/// Where the shared transaction keeps its savepoints' journals: in memory.
/// Each period's savepoint journals the pages it changes that were written
/// before it (about fifteen for a tiny period); past SQLite's 64 KiB they
/// went to a temporary file, written and truncated once per period: 13 %
/// of a backfill of tiny periods. In memory they are bounded by one
/// period's batch (only one-batch periods share commits), and freed as
/// its savepoint is released. Set for the shared transaction only (SQLite
/// reads it at `BEGIN`): a connection's other transactions, such as a
/// `cancel` of a million keys, keep journals on disk.
const JOURNALS_IN_MEMORY: &str = "PRAGMA temp_store = MEMORY";

/// Keeps a connection whose shared transaction ended, with SQLite's
/// default for where its journals live again; closes it if that fails.
fn keep_outside(mut conn: HeldConnection, kept: &Kept) {
    let reset = conn
        .raw_if_held()
        .is_some_and(|raw| ledger_sql::execute(raw, "PRAGMA temp_store = DEFAULT", &[]).is_ok());
    if reset {
        kept.keep(conn);
    } else {
        conn.close_on_drop();
    }
}

impl OpenShared {
    fn tell(&mut self, outcome: &Result<(), Error>) {
        for period in self.waiting.drain(..) {
            // A period nobody waits for any more: nothing to tell.
            let _ = period.send(outcome.clone());
        }
    }

    fn due(&self) -> bool {
        self.periods >= SHARED_PERIODS || self.since.elapsed() >= SHARED_FOR
    }
}

impl Drop for OpenShared {
    /// Dropped uncommitted (the runtime ends, a period's rollback failed):
    /// its connection is closed, which rolls it back, and its periods are
    /// told by their dropped senders.
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            conn.close_on_drop();
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("periods", &self.open.as_ref().map(|o| o.periods))
            .finish()
    }
}

impl SqliteTx {
    /// Begins on a kept connection or one of `pool`, which is closed if
    /// beginning fails (SQLite may have left a transaction on it).
    async fn begin(store: &SqliteStore, begin: &str) -> Result<SqliteTx, Error> {
        let conn = store.kept.take(&store.pool).await?;
        Ok(SqliteTx {
            conn: Some(Self::begin_on(conn, begin).await?),
            kept: Arc::clone(&store.kept),
            member: None,
        })
    }

    /// A write transaction of its own: the shared one, if open, commits
    /// first, and none opens until this one has the write lock (so a
    /// failure record, say, never waits behind a chain of shared ones).
    async fn begin_alone(store: &SqliteStore) -> Result<SqliteTx, Error> {
        let mut shared = store.shared.lock().await;
        shared.commit(&store.kept).await;
        let tx = Self::begin(store, "BEGIN IMMEDIATE").await;
        drop(shared);
        tx
    }

    /// A period's part of the shared transaction, which it opens if none is
    /// open: a savepoint on its connection.
    async fn begin_member(store: &SqliteStore) -> Result<SqliteTx, Error> {
        let mut shared = Arc::clone(&store.shared).lock_owned().await;
        let conn = match shared.open.as_mut().and_then(|open| open.conn.take()) {
            Some(conn) => conn,
            None => {
                let mut conn = store.kept.take(&store.pool).await?;
                // Before `BEGIN`, which decides where the transaction's
                // savepoint journals live.
                ledger_sql::execute(conn.raw().await?, JOURNALS_IN_MEMORY, &[])?;
                let conn = Self::begin_on(conn, "BEGIN IMMEDIATE").await?;
                shared.generation += 1;
                shared.open = Some(OpenShared {
                    conn: None,
                    periods: 0,
                    since: std::time::Instant::now(),
                    generation: shared.generation,
                    waiting: Vec::new(),
                });
                conn
            }
        };
        let mut tx = SqliteTx {
            conn: Some(conn),
            kept: Arc::clone(&store.kept),
            member: Some(shared),
        };
        let savepoint = format!("SAVEPOINT {PERIOD_SAVEPOINT}");
        // Failing here, the drop rolls back the shared transaction whole.
        ledger_sql::execute(tx.raw().await?, &savepoint, &[])?;
        Ok(tx)
    }

    /// `begin` on `conn`, which is closed if that fails (SQLite may have
    /// left a transaction on it).
    async fn begin_on(mut conn: HeldConnection, begin: &str) -> Result<HeldConnection, Error> {
        match begin_on(&mut conn, begin).await {
            Ok(()) => Ok(conn),
            Err(e) => {
                conn.close_on_drop();
                Err(e)
            }
        }
    }

    fn held(&mut self) -> &mut HeldConnection {
        self.conn
            .as_mut()
            .expect("a transaction is used only until it commits")
    }

    /// The connection for sqlx (table DDL and checks).
    fn connection(&mut self) -> &mut SqliteConnection {
        self.held().sqlx()
    }

    /// The transaction's raw connection.
    async fn raw(&mut self) -> Result<&rusqlite::Connection, Error> {
        self.held().raw().await
    }

    async fn commit_now(mut self) -> Result<(), Error> {
        if self.member.is_some() {
            // A period of the shared transaction asked to commit now: the
            // shared transaction commits, with it, and its outcome is this
            // commit's (already known: `now` commits before returning).
            return self.commit_member(true).await?.wait().await;
        }
        ledger_sql::execute(self.raw().await?, "COMMIT", &[])?;
        if let Some(conn) = self.conn.take() {
            self.kept.keep(conn);
        }
        Ok(())
    }

    /// Releases the period's savepoint; the shared transaction commits now
    /// when `now` or when it is due, else later (its first period starts
    /// the timer that commits it).
    async fn commit_member(mut self, now: bool) -> Result<Durable, Error> {
        let release = format!("RELEASE {PERIOD_SAVEPOINT}");
        // Failing, the drop rolls back the shared transaction whole.
        ledger_sql::execute(self.raw().await?, &release, &[])?;
        let (Some(conn), Some(mut shared)) = (self.conn.take(), self.member.take()) else {
            unreachable!("a member holds its connection and slot until it ends");
        };
        let (tell, made) = oneshot::channel();
        let open = shared
            .open
            .as_mut()
            .expect("the shared transaction is open while a member writes");
        open.conn = Some(conn);
        open.periods += 1;
        open.waiting.push(tell);
        if now || open.due() {
            shared.commit(&self.kept).await;
            return Ok(Durable::when(made));
        }
        if open.periods == 1 {
            let generation = open.generation;
            let slot = Arc::clone(OwnedMutexGuard::mutex(&shared));
            let kept = Arc::clone(&self.kept);
            tokio::spawn(async move {
                tokio::time::sleep(SHARED_FOR).await;
                let mut shared = slot.lock().await;
                if shared
                    .open
                    .as_ref()
                    .is_some_and(|o| o.generation == generation)
                {
                    shared.commit(&kept).await;
                }
            });
        }
        Ok(Durable::when(made))
    }
}

/// The longest pause between two tries of a `BEGIN` that found the write
/// lock taken. SQLite's own busy handler, which this replaces for `BEGIN`,
/// sleeps 1 ms growing to 100 ms; a shorter ceiling notices a short
/// transaction's end sooner.
const BEGIN_PAUSE_MAX: Duration = Duration::from_millis(20);

/// Begins on the raw handle, trying again after a pause on the runtime's
/// timer while another connection holds the write lock, for as long as
/// the busy timeout. SQLite's busy handler would wait inside the call,
/// holding a runtime thread, and waiting through sqlx instead would end
/// the hold, and with it the connection's prepared statements.
async fn begin_on(conn: &mut HeldConnection, begin: &str) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    while !ledger_sql::try_begin(conn.raw().await?, begin)? {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Database {
                message: format!(
                    "database is locked: another connection held the write lock for {} s",
                    BUSY_TIMEOUT.as_secs()
                ),
                transient: true,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(BEGIN_PAUSE_MAX);
    }
    Ok(())
}

impl Drop for SqliteTx {
    /// Not committed: rolls back. A period of the shared transaction rolls
    /// back its savepoint only, and the shared transaction goes on with
    /// the periods before it; if that fails (SQLite itself rolled the
    /// transaction back after an I/O error, say), the shared transaction
    /// is closed, rolled back whole, and its periods are told.
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let Some(shared) = &mut self.member else {
            conn.close_on_drop();
            return;
        };
        let rolled_back = conn.raw_if_held().is_some_and(|raw| {
            let back = format!("ROLLBACK TO {PERIOD_SAVEPOINT}");
            let release = format!("RELEASE {PERIOD_SAVEPOINT}");
            ledger_sql::execute(raw, &back, &[]).is_ok()
                && ledger_sql::execute(raw, &release, &[]).is_ok()
                && !raw.is_autocommit()
        });
        match shared.open.as_mut() {
            Some(open) if rolled_back && open.periods > 0 => open.conn = Some(conn),
            // It was the first period: nothing else is in the transaction,
            // which ends here rather than hold the write lock with no
            // timer to commit it.
            Some(_) if rolled_back => {
                shared.open = None;
                let ended = conn
                    .raw_if_held()
                    .is_some_and(|raw| ledger_sql::execute(raw, "ROLLBACK", &[]).is_ok());
                if ended {
                    keep_outside(conn, &self.kept);
                } else {
                    conn.close_on_drop();
                }
            }
            _ => {
                conn.close_on_drop();
                if let Some(mut open) = shared.open.take() {
                    open.tell(&Err(Error::Database {
                        message: "a period sharing this commit failed in a way that rolled \
                                  the shared transaction back; the periods before it in the \
                                  transaction run again"
                            .into(),
                        transient: true,
                    }));
                }
            }
        }
    }
}

impl LedgerTx for SqliteTx {
    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, Error> {
        ledger_sql::execute(self.raw().await?, sql, args)
    }

    async fn fetch_each(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        each: impl FnMut(Record) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        ledger_sql::fetch_each(self.raw().await?, sql, args, each)
    }

    async fn commit(self) -> Result<(), Error> {
        self.commit_now().await
    }

    async fn commit_shared(self) -> Result<Durable, Error> {
        if self.member.is_some() {
            self.commit_member(false).await
        } else {
            self.commit_now().await.map(|()| Durable::now())
        }
    }
}

/// Batches of at least this many rows are written with the runtime told
/// that the thread blocks (`block_in_place`), so the reader one batch ahead
/// and the heartbeat go on elsewhere. A smaller batch takes less time than
/// that hand-over of the worker thread costs.
const BLOCKING_ROWS: usize = 1_000;

impl Driver for SqliteStore {
    type Tx = SqliteTx;
    type Prepared = raw::Rendered;
    type Vanished = Vec<i64>;

    const DIALECT: Dialect = Dialect::Sqlite;

    async fn begin(&self) -> Result<SqliteTx, Error> {
        SqliteTx::begin_alone(self).await
    }

    async fn begin_shared(&self) -> Result<SqliteTx, Error> {
        SqliteTx::begin_member(self).await
    }

    async fn begin_read(&self) -> Result<SqliteTx, Error> {
        SqliteTx::begin(self, "BEGIN").await
    }

    /// Checks or creates the table on one connection, under the write lock,
    /// so two runs starting together cannot both create it.
    async fn ensure_table(&self, schema: &TableSchema) -> Result<(), Error> {
        let mut tx = self.begin().await?;
        table::ensure_table(tx.connection(), schema).await?;
        tx.commit_now().await
    }

    async fn stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &Lineage,
        run_id: Option<&str>,
        each: impl FnMut(StoredRow) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        let mut conn = self.kept.take(&self.pool).await?;
        let raw = conn.raw().await?;
        // A period never loaded (every first backfill) holds nothing: asked
        // on this thread, without the hand-over to a blocking thread that
        // a long read needs (thread wake-ups are most of a tiny period's
        // time, ADR 0022).
        if raw::holds_live_rows(raw, schema, lineage)? {
            raw::blocking(|| raw::stored_rows(raw, schema, lineage, run_id, each))?;
        }
        self.kept.keep(conn);
        Ok(())
    }

    /// Renders decimals, times, JSON and row hashes as the text SQLite
    /// stores, before the write lock is taken: formatting was 5% of a first
    /// backfill, and inside the lock every other period waits for it.
    fn prepare(
        &self,
        _schema: &TableSchema,
        _stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
    ) -> Result<raw::Rendered, Error> {
        Ok(raw::Rendered::new(&batch.rows))
    }

    async fn write_rows(
        &self,
        tx: &mut SqliteTx,
        schema: &TableSchema,
        stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
        rendered: &raw::Rendered,
    ) -> Result<BatchOutcome, Error> {
        let loaded_at = crate::timestamp_text(stamp.loaded_at);
        let stamp = table::Stamp {
            lineage: stamp.lineage,
            run_id: stamp.run_id,
            loaded_at: &loaded_at,
        };
        let conn = tx.raw().await?;
        let write = || raw::write_rows(conn, schema, &stamp, &batch.rows, rendered);
        let written = if batch.rows.len() >= BLOCKING_ROWS {
            raw::blocking(write)?
        } else {
            write()?
        };
        Ok(BatchOutcome {
            written,
            direct_copy_conflict: false,
        })
    }

    async fn vanished(
        &self,
        tx: &mut SqliteTx,
        schema: &TableSchema,
        lineage: &Lineage,
        existing: &StoredHashes,
    ) -> Result<(u64, Vec<i64>), Error> {
        let conn = tx.raw().await?;
        raw::blocking(|| raw::vanished_rows(conn, schema, lineage, existing))
    }

    async fn remove_vanished(
        &self,
        tx: &mut SqliteTx,
        schema: &TableSchema,
        _lineage: &Lineage,
        on_missing: OnMissing,
        rowids: &Vec<i64>,
    ) -> Result<u64, Error> {
        table::delete_rows(tx.connection(), schema, on_missing, rowids).await
    }
}
