//! The SQLite backend: the embedded default.
//!
//! SQLite allows one writer at a time. Every write transaction of the
//! ledger starts with a write (the fencing `UPDATE` or the ledger `INSERT`),
//! so it takes the write lock first and waits on the busy timeout instead of
//! failing with a stale read snapshot.
//!
//! - `open`: the pool, start-up retries and the background WAL checkpointer;
//! - `driver`: the ledger's type mapping and the data plane behind
//!   [`crate::ledger::driver::Driver`];
//! - `table`, `raw`: destination tables and the row-by-row fast paths;
//! - `ledger_sql`: ledger statements on a transaction's held raw handle;
//! - `kept`: held connections kept between transactions, with their
//!   prepared statements;
//! - `scan`: a re-sync's read of the stored rows on a thread of its own;
//! - `ffi`: every raw call into SQLite (the one place `unsafe` is allowed).

pub(crate) mod driver;
mod ffi;
mod kept;
mod ledger_sql;
mod open;
mod raw;
mod scan;
mod table;

use std::ffi::c_int;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use tidemark_core::Error;

use crate::retry_while;
use ffi::WalSignal;
use kept::Kept;
use open::{checkpoint_in_background, open_pool, MIGRATE_DEADLINE, WAL_CHECKPOINT_FRAMES};

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// Connections kept between transactions: as many as periods write at
/// once by default on two cores, half the pool (`open::open_pool`).
const KEPT_CONNECTIONS: usize = 2;

/// A pool of connections to one SQLite file.
#[derive(Debug, Clone)]
pub(crate) struct SqliteStore {
    pool: SqlitePool,
    /// Connections between transactions (see [`Kept`]).
    kept: std::sync::Arc<Kept>,
    wal_signal: &'static WalSignal,
    /// Opened read-only (dry runs): closing must not checkpoint.
    read_only: bool,
    /// The space reserve beside the database file (see [`Reserve`]).
    reserve: Option<std::sync::Arc<Reserve>>,
    /// Connections of the stored-row scans that overlap a re-sync's
    /// reading (see [`scan`]); `None` for a database no other connection
    /// can open, and read-only.
    scans: Option<std::sync::Arc<scan::ScanConnections>>,
    /// The transaction one-batch periods share (see [`driver::Shared`]).
    shared: std::sync::Arc<tokio::sync::Mutex<driver::Shared>>,
}

/// Space kept beside the database file (`<file>-tidemark-reserve`, 256
/// KiB) for the ledger's last writes after the disk fills: a command whose
/// writes fail for lack of space deletes it, and its attempts' failure
/// records then fit, so no key is left `running`. Made again by the next
/// command that opens the file with space to spare.
#[derive(Debug)]
struct Reserve {
    path: std::path::PathBuf,
    /// Set when this process released the reserve; cleared once it is
    /// made again.
    released: std::sync::atomic::AtomicBool,
}

impl Reserve {
    const BYTES: usize = 256 * 1024;

    /// Makes the reserve unless it exists; without space, goes on without.
    fn keep(database: &std::path::Path) -> Reserve {
        let mut name = database.as_os_str().to_owned();
        name.push("-tidemark-reserve");
        let reserve = Reserve {
            path: name.into(),
            released: false.into(),
        };
        if !reserve.path.exists() {
            if let Err(e) = reserve.write() {
                tracing::debug!(error = %e, "no space reserve beside the database file");
            }
        }
        reserve
    }

    /// Writes the reserve file; a partial file is removed.
    fn write(&self) -> std::io::Result<()> {
        std::fs::write(&self.path, vec![0u8; Self::BYTES]).inspect_err(|_| {
            let _ = std::fs::remove_file(&self.path);
        })
    }

    /// Gives the reserve's space back to the file system.
    fn release(&self) {
        use std::sync::atomic::Ordering;
        if std::fs::remove_file(&self.path).is_ok() {
            self.released.store(true, Ordering::SeqCst);
            tracing::warn!(path = %self.path.display(), "released the space reserve beside the database file to record the failure; no new work is claimed until it can be made again");
        }
    }

    /// After a release: makes the reserve again, when the disk has room.
    /// Whether the reserve is in place (or was never released here).
    fn restore(&self) -> bool {
        use std::sync::atomic::Ordering;
        if !self.released.load(Ordering::SeqCst) {
            return true;
        }
        match self.write() {
            Ok(()) => {
                self.released.store(false, Ordering::SeqCst);
                tracing::info!(path = %self.path.display(), "made the space reserve again; claiming work again");
                true
            }
            Err(_) => false,
        }
    }
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
            .map_err(|e| Error::config("command line", "database URL", e.to_string()))?
            .create_if_missing(true)
            .page_size(8192)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .pragma("cache_size", "-16384");
        // One signal per store, alive for the rest of the program: the
        // hook of every connection points to it, and a connection may be
        // closed after the store is gone.
        let wal_signal: &'static WalSignal = Box::leak(Box::new(WalSignal {
            threshold: checkpoint_frames,
            notify: tokio::sync::Notify::new(),
        }));
        // An in-memory database has no disk to fill.
        let file = options.get_filename();
        let reserve = (!file.as_os_str().is_empty() && file != std::path::Path::new(":memory:"))
            .then(|| std::sync::Arc::new(Reserve::keep(file)));
        let scans = scan::ScanConnections::for_file(file);
        let pool = open_pool(options, wal_signal).await?;
        tokio::spawn(checkpoint_in_background(pool.clone(), wal_signal));
        let store = SqliteStore {
            pool,
            kept: std::sync::Arc::new(Kept::new(KEPT_CONNECTIONS)),
            wal_signal,
            read_only: false,
            reserve,
            scans,
            shared: std::sync::Arc::default(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Opens an existing database read-only, for a dry run: SQLite refuses
    /// every write on these connections, a missing file is not created
    /// (`None`: nothing is recorded yet), and nothing is migrated. `None`
    /// too for a file without a ledger; an error for a ledger older than
    /// this build.
    pub(crate) async fn connect_read_only(url: &str) -> Result<Option<Self>, Error> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::config("command line", "database URL", e.to_string()))?
            .create_if_missing(false)
            .read_only(true)
            .busy_timeout(BUSY_TIMEOUT);
        if !options.get_filename().exists() {
            return Ok(None);
        }
        let shown = options.get_filename().display().to_string();
        // SQLite reads the file at the first statement: its errors (not a
        // database, unreadable) name the file as an open's would.
        let named = |e: sqlx::Error| {
            let mut error = crate::db_error::db_error(e);
            if let Error::Database { message, .. } | Error::Storage { message } = &mut error {
                *message = format!("cannot read the SQLite database {shown}: {message}");
            }
            error
        };
        let pool = open::open_read_only(options).await?;
        let store = SqliteStore {
            pool,
            // The read-only pool has one connection, which sqlx's own
            // queries need too.
            kept: std::sync::Arc::new(Kept::new(0)),
            wal_signal: Box::leak(Box::new(WalSignal {
                threshold: c_int::MAX,
                notify: tokio::sync::Notify::new(),
            })),
            read_only: true,
            shared: std::sync::Arc::default(),
            reserve: None,
            scans: None,
        };
        let found: Option<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_tm_runs'",
        )
        .fetch_optional(&store.pool)
        .await
        .map_err(named)?;
        if found.is_none() {
            store.close().await;
            return Ok(None);
        }
        let applied = || async {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&store.pool)
                .await
                .map_err(named)
        };
        if let Err(error) = crate::check_migrated(&Self::migrator(), applied).await {
            store.close().await;
            return Err(error);
        }
        Ok(Some(store))
    }

    /// Frees space for the ledger's last writes after a storage failure:
    /// releases the [`Reserve`]. Until the reserve can be made again, no
    /// new work is claimed ([`SqliteStore::room_to_claim`]): a claim would
    /// take the freed space from the failure records it is for.
    pub(crate) fn make_room(&self) {
        if let Some(reserve) = &self.reserve {
            reserve.release();
        }
    }

    /// Whether new work may be claimed: not after the reserve was released
    /// for a storage failure, until the disk has room to make it again.
    pub(crate) fn room_to_claim(&self) -> Result<(), Error> {
        match &self.reserve {
            Some(reserve) if !reserve.restore() => Err(Error::Storage {
                message: format!(
                    "database or disk is full: no new work is claimed until {} can be made again ({} KiB kept for recording failures)",
                    reserve.path.display(),
                    Reserve::BYTES / 1024
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Checkpoints the WAL into the database file and empties it, then
    /// closes the pool. SQLite does this on its own only when the last
    /// connection closes, and the pool closes its connections at once, so
    /// none of them may be "last". Waits at most 1 s for another process's
    /// transaction; its own last close checkpoints then.
    /// The versions of the ledger migrations applied (`/readyz`).
    pub(crate) async fn applied_migrations(&self) -> Result<Vec<i64>, Error> {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&self.pool)
            .await
            .map_err(crate::db_error::db_error)
    }

    /// Commits the transaction tiny periods share, if one is open (see
    /// [`driver::Shared`]).
    pub(crate) async fn commit_shared_now(&self) {
        self.shared.lock().await.commit(&self.kept).await;
    }

    pub(crate) async fn close(&self) {
        self.commit_shared_now().await;
        self.kept.release_all();
        if let Some(scans) = &self.scans {
            scans.close();
        }
        if self.read_only {
            self.pool.close().await;
            return;
        }
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
    pub(crate) fn migrator() -> sqlx::migrate::Migrator {
        sqlx::migrate!("../../migrations/sqlite")
    }

    /// A storage failure (a full disk) is no race: it ends the command at
    /// once, naming the cause.
    pub(crate) async fn migrate(&self) -> Result<(), Error> {
        let migrator = Self::migrator();
        retry_while(
            "ledger migration raced another process",
            MIGRATE_DEADLINE,
            |e| !migration_storage_failure(e),
            || self.migrate_once(&migrator),
        )
        .await
        .map_err(|e| Error::Database {
            message: format!("ledger migration failed: {e}"),
            transient: false,
        })
    }

    /// One try, on a connection that is closed rather than handed back to
    /// the pool when the try fails: a migration that failed halfway (a full
    /// disk) can leave its connection inside a transaction that holds the
    /// write lock, and every other writer then waited 60 s for it, then
    /// met "cannot start a transaction within a transaction" on it.
    async fn migrate_once(
        &self,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<(), sqlx::migrate::MigrateError> {
        let mut conn = self.pool.acquire().await?;
        let result = migrator.run_direct(&mut *conn).await;
        if result.is_err() {
            conn.close_on_drop();
        }
        result
    }
}

/// Whether a migration failed because the database cannot store more.
fn migration_storage_failure(e: &sqlx::migrate::MigrateError) -> bool {
    use sqlx::migrate::MigrateError;
    match e {
        MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => {
            crate::db_error::is_storage_failure(e)
        }
        _ => false,
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

    /// A `BEGIN IMMEDIATE` that finds another connection's write lock
    /// taken waits for it (on the runtime's timer) and then begins, instead
    /// of failing at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_begin_waits_for_another_connections_write_lock() {
        use crate::ledger::driver::{Driver, LedgerTx};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("COMMIT").unwrap();
        });
        let started = std::time::Instant::now();
        let mut tx = store.begin().await.expect("waits, then begins");
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "began after {:?}, while the lock was held",
            started.elapsed()
        );
        tx.execute("SELECT 1", &[]).await.unwrap();
        tx.commit().await.unwrap();
        release.join().unwrap();
        store.close().await;
    }

    /// Closing waits for the pool's connections to come back: one kept
    /// between transactions comes back at once, and so does one whose
    /// transaction commits while the store closes (instead of being kept
    /// for a transaction that never comes, with `close` waiting forever).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn close_gets_back_kept_connections_and_those_of_open_transactions() {
        use crate::ledger::driver::{Driver, LedgerTx};
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = SqliteStore::connect(&url).await.unwrap();
        for _ in 0..3 {
            let mut tx = store.begin().await.unwrap();
            tx.execute("SELECT 1", &[]).await.unwrap();
            tx.commit().await.unwrap();
        }
        assert_eq!(
            store.kept.lock_len(),
            1,
            "the committed transactions' connection is kept"
        );
        let mut open = store.begin().await.unwrap();
        open.execute("SELECT 1", &[]).await.unwrap();
        let closing = tokio::spawn({
            let store = store.clone();
            async move { store.close().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        open.commit().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), closing)
            .await
            .expect("close waited for a kept connection")
            .unwrap();
        assert_eq!(store.kept.lock_len(), 0);
    }
    /// The rows a connection of its own sees in `t` (committed ones).
    fn committed(path: &std::path::Path) -> Vec<i64> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut stmt = conn.prepare("SELECT v FROM t ORDER BY v").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// The shared transaction of tiny periods (ADR 0022): a period's
    /// commit is not made until another write begins (which makes it,
    /// before it takes the write lock itself); a period dropped without
    /// committing rolls back its own writes only; and `commit()` of a
    /// period commits the shared transaction at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_periods_commit_together_and_roll_back_alone() {
        use crate::ledger::driver::{Arg, Driver, LedgerTx};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        let mut tx = store.begin().await.unwrap();
        tx.execute("CREATE TABLE t (v INTEGER)", &[]).await.unwrap();
        tx.commit().await.unwrap();
        let insert = |v| {
            let store = store.clone();
            async move {
                let mut tx = store.begin_shared().await.unwrap();
                tx.execute("INSERT INTO t VALUES ($1)", &[Arg::Int(v)])
                    .await
                    .unwrap();
                tx
            }
        };

        let first = insert(1).await.commit_shared().await.unwrap();
        assert!(first.is_pending(), "the first period's commit is shared");
        // A period that fails: dropped after its write.
        drop(insert(2).await);
        let third = insert(3).await.commit_shared().await.unwrap();
        assert!(committed(&path).is_empty(), "nothing is committed yet");

        // Another write commits the shared transaction before it begins.
        let mut alone = store.begin().await.unwrap();
        assert_eq!(
            committed(&path),
            [1, 3],
            "the dropped period rolled back alone"
        );
        first.wait().await.expect("the first period is on disk");
        third.wait().await.expect("the third period is on disk");
        alone
            .execute("INSERT INTO t VALUES ($1)", &[Arg::Int(4)])
            .await
            .unwrap();
        alone.commit().await.unwrap();

        // A period committed with `commit()` is on disk when it returns.
        insert(5).await.commit().await.unwrap();
        assert_eq!(committed(&path), [1, 3, 4, 5]);

        // The timer commits a shared transaction nobody else ends.
        let sixth = insert(6).await.commit_shared().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), sixth.wait())
            .await
            .expect("the timer commits within its 20 ms")
            .unwrap();
        assert_eq!(committed(&path), [1, 3, 4, 5, 6]);
        store.close().await;
    }
}
