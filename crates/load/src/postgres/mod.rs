//! The PostgreSQL backend: production, and the coordinator many workers on
//! many hosts share.
//!
//! Claims lock the run key's ledger row (`INSERT … ON CONFLICT DO NOTHING`,
//! then `SELECT … FOR UPDATE SKIP LOCKED`), so two workers can never both
//! take it, and a claim never waits on a locked row (it answers "held").
//! Every batch transaction starts with the fencing `SELECT … FOR KEY SHARE`
//! of that row, held until commit: it conflicts with a claim's `FOR UPDATE`
//! but not with the heartbeat's `UPDATE` of the lease, so a batch that
//! waits (on its destination table, say) keeps its lease and keeps claims
//! out; a takeover that committed first makes the old attempt's next fence
//! find `attempt` changed. Lease times use the database's clock, so hosts
//! with skewed clocks agree.
//!
//! - `driver`: the ledger's type mapping and the data plane behind
//!   [`crate::ledger::driver::Driver`];
//! - `table`, `copy_binary`, `stored_copy`: destination tables, binary
//!   `COPY` of batches, and reading a run key's stored hashes;
//! - `rate`: the sources' rate limits, one bucket row per source shared by
//!   every process.

mod copy_binary;
pub(crate) mod driver;
mod rate;
mod stored_copy;
mod table;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection as _;
use tidemark_core::spec::RateLimit;
use tidemark_core::{Error, RateGate};

use crate::db_error::db_error;

/// How long the first connection may keep failing with a transient error
/// (a server that is restarting) before the command gives up with the
/// real cause.
const FIRST_CONNECT_DEADLINE: Duration = Duration::from_secs(5);

/// How long the first connection waits for a free slot on a server whose
/// `max_connections` is exhausted (another client's end frees one): a
/// process that cannot start yet harms no one by waiting.
const SLOT_PATIENCE: Duration = Duration::from_secs(300);

/// How long one connection attempt may take (a host that drops packets
/// would otherwise hold it for minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a statement waits for a connection of the pool (including a
/// new one the server has no slot for yet) before failing, transiently.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(crate::ACQUIRE_TIMEOUT_SECS);

/// The pool's size when the caller names none (a program using the
/// library with [`crate::StoreOptions::default`]).
pub(crate) const DEFAULT_MAX_CONNECTIONS: u32 = 16;

/// A connection unused this long is closed, so a process that was busy
/// gives its slots back to the server's `max_connections` soon.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled connection idle for at least this long is pinged before it is
/// handed out; one used more recently is handed out as it is. sqlx pings
/// every connection it hands out by default, a round trip (and a wake-up
/// of the server's backend) before every transaction: two per small
/// period (its stored-row probe and its write transaction), about a fifth
/// of the round trips a tiny period makes (ADR 0022). A connection the
/// server dropped within this second fails its first statement instead,
/// as one dropped mid-statement does, and that failure is transient
/// (retried, `tests/coordination.rs`).
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// For this long after this process saw a connection that was gone, every
/// pooled connection is pinged before it is handed out, however recently
/// it was used: a server restart (or a pooler's) leaves every idle
/// connection dead, and each would otherwise cost an operation one of its
/// retries.
const PING_ALL_AFTER_LOSS: Duration = Duration::from_secs(10);

/// When this process last saw a PostgreSQL connection that was gone, in
/// milliseconds since the Unix epoch (0: never). One clock for every pool
/// of the process: a lost connection is evidence about the server, and
/// pinging for a while costs nothing else.
static LOST_AT_MS: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Records that a connection was found gone (`db_error`, where every
/// sqlx error becomes tidemark's, tells).
pub(crate) fn connection_lost() {
    LOST_AT_MS.store(now_ms(), Ordering::Relaxed);
}

/// Whether a connection idle for `idle_for` is pinged before it is handed
/// out (see [`PING_AFTER_IDLE`], [`PING_ALL_AFTER_LOSS`]).
fn ping_first(idle_for: Duration) -> bool {
    let lost_at = LOST_AT_MS.load(Ordering::Relaxed);
    let since_loss = Duration::from_millis(now_ms().saturating_sub(lost_at));
    idle_for >= PING_AFTER_IDLE || (lost_at != 0 && since_loss < PING_ALL_AFTER_LOSS)
}

/// A pool of connections to one PostgreSQL database.
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pool: PgPool,
    gates: Gates,
    session: Session,
}

/// How this store's connections meet the server: directly, or through a
/// pooler in transaction mode, where consecutive transactions of one
/// client connection may run on different server sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Session {
    /// Behind PgBouncer in transaction mode: statements are unnamed (no
    /// server-side prepared statement outlives its transaction), the
    /// session settings travel with each `BEGIN` (`SET LOCAL`), nothing
    /// runs outside a transaction, no `LISTEN` (workers poll), and the
    /// ledger is not migrated through it.
    pub(crate) pooled: bool,
    /// Every transaction is read-only (`status`, dry runs).
    pub(crate) read_only: bool,
}

/// The settings a pooled session sets in each transaction: the server ends
/// a holder that stopped inside a transaction (see [`SESSION_SETTINGS`]),
/// here only for the transaction, since the next one may run in another
/// server session.
const POOLED_BEGIN: &str = "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '20s'";

/// [`POOLED_BEGIN`] for a read-only store.
const POOLED_BEGIN_READ_ONLY: &str =
    "BEGIN READ ONLY; SET LOCAL idle_in_transaction_session_timeout = '20s'";

/// The rate gates of this process, one per pipeline, source and quota, so
/// every reader of a source in the process shares one lease.
#[derive(Clone, Default)]
struct Gates(Arc<Mutex<HashMap<GateKey, Arc<rate::PgRateGate>>>>);

/// Pipeline name, source id, requests per second, burst.
type GateKey = (String, String, u32, u32);

impl std::fmt::Debug for Gates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gates")
    }
}

impl PgStore {
    /// Connects and migrates. The URL's `sslmode` (`prefer` by default:
    /// TLS whenever the server offers it; `require`, `verify-ca`,
    /// `verify-full`) and `sslrootcert` apply, with the system's CA roots.
    ///
    /// One connection is made directly first: a pool retries until its
    /// acquire timeout and then reports only "pool timed out", where the
    /// operator needs "connection refused", a TLS or an authentication
    /// error, within seconds.
    ///
    /// Behind PgBouncer (`options.pgbouncer`) the ledger is not migrated
    /// (its migrations take a session lock, which transaction pooling does
    /// not keep): it must be current, or the error says to run `tidemark
    /// migrate` against the server directly.
    pub(crate) async fn connect(url: &str, options: &crate::StoreOptions) -> Result<Self, Error> {
        let session = Session {
            pooled: options.pgbouncer,
            read_only: false,
        };
        let (store, mut first) = Self::open(url, session, options.max_connections).await?;
        let ready = if session.pooled {
            store.check_current().await
        } else {
            // On the connection already made: on a server with no slot to
            // spare, the pool's first one may have to wait for another
            // client's end.
            Self::migrate_on(&mut first).await
        };
        let _ = first.close().await;
        if let Err(error) = ready {
            store.close().await;
            return Err(error);
        }
        Ok(store)
    }

    /// Connects for a dry run: every transaction is read-only (the server
    /// refuses any write), and nothing is migrated. `None` when the
    /// database holds no ledger yet; an error when its ledger is older than
    /// this build (a dry run must not migrate it).
    pub(crate) async fn connect_read_only(
        url: &str,
        options: &crate::StoreOptions,
    ) -> Result<Option<Self>, Error> {
        let session = Session {
            pooled: options.pgbouncer,
            read_only: true,
        };
        let (store, first) = Self::open(url, session, options.max_connections).await?;
        let _ = first.close().await;
        if !store.has_ledger().await? {
            store.close().await;
            return Ok(None);
        }
        if let Err(error) = store.check_current().await {
            store.close().await;
            return Err(error);
        }
        Ok(Some(store))
    }

    /// Whether the database holds a ledger (migrated at least once).
    async fn has_ledger(&self) -> Result<bool, Error> {
        let mut tx = self.begin_tx().await.map_err(db_error)?;
        let found: Option<String> = sqlx::query_scalar(
            "SELECT CAST(to_regclass('_tm_runs') AS text) WHERE to_regclass('_sqlx_migrations') IS NOT NULL",
        )
        .persistent(self.persistent())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?
        .flatten();
        tx.commit().await.map_err(db_error)?;
        Ok(found.is_some())
    }

    /// Checks that the ledger holds every migration of this build
    /// ([`crate::check_migrated`]).
    async fn check_current(&self) -> Result<(), Error> {
        if !self.has_ledger().await? {
            return Err(Error::config(
                "database",
                "ledger",
                "this database has no tidemark ledger yet, and through PgBouncer (--pgbouncer) \
                 tidemark does not create it: run `tidemark migrate` with a --database-url that \
                 reaches the PostgreSQL server directly, without --pgbouncer",
            ));
        }
        let applied = || self.applied_migrations();
        crate::check_migrated(&Self::migrator(), applied)
            .await
            .map_err(|error| match error {
                Error::Config { file, key, message } if self.session.pooled && !self.session.read_only => {
                    Error::Config {
                        file,
                        key,
                        message: format!(
                            "{message}. Through PgBouncer (--pgbouncer) tidemark does not migrate: \
                             run `tidemark migrate` with a --database-url that reaches the server directly"
                        ),
                    }
                }
                other => other,
            })
    }

    /// The store and the first connection, made directly (see
    /// [`PgStore::connect`]).
    async fn open(
        url: &str,
        session: Session,
        max_connections: Option<u32>,
    ) -> Result<(Self, PgConnection), Error> {
        let shown = crate::redact_url(url);
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| Error::config("command line", "database URL", format!("{shown}: {e}")))?;
        let options = if session.pooled {
            // PgBouncer 1.18 refuses startup parameters it does not track
            // (`options`, `extra_float_digits`), and keeps no named
            // prepared statement across transactions.
            options.statement_cache_capacity(0).extra_float_digits(None)
        } else {
            let options = session_settings(options);
            if session.read_only {
                options.options([("default_transaction_read_only", "on")])
            } else {
                options
            }
        };
        let first = first_connection(&options)
            .await
            .map_err(|(e, limit)| Error::Database {
                message: format!("cannot connect to {shown}: {}", cause(&e)),
                transient: limit,
            })?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS).max(1))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(IDLE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if ping_first(meta.idle_for) {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(options);
        let store = PgStore {
            pool,
            gates: Gates::default(),
            session,
        };
        Ok((store, first))
    }

    /// Whether statements are named and kept per connection (direct), or
    /// unnamed and parsed again in each transaction (behind PgBouncer).
    pub(crate) fn persistent(&self) -> bool {
        !self.session.pooled
    }

    /// A connection for one statement on its own: a pooled connection,
    /// or behind PgBouncer a transaction of its own (an unnamed statement
    /// is parsed and executed in two round trips, which transaction
    /// pooling may send to two server sessions unless a transaction holds
    /// one). [`Single::finish`] after the statement.
    pub(crate) async fn single(&self) -> Result<Single, sqlx::Error> {
        Ok(if self.session.pooled {
            Single::Pooled(self.begin_tx().await?)
        } else {
            Single::Direct(self.pool.acquire().await?)
        })
    }

    /// The statement that begins a transaction as this store's session
    /// needs it (see [`PgStore::begin_tx`]).
    pub(crate) fn begin_statement(&self) -> &'static str {
        match (self.session.pooled, self.session.read_only) {
            (false, _) => "BEGIN",
            (true, false) => POOLED_BEGIN,
            (true, true) => POOLED_BEGIN_READ_ONLY,
        }
    }

    /// A connection of the pool, for a transaction tidemark begins and
    /// ends itself ([`driver::PgTx`]).
    pub(crate) async fn acquire(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, sqlx::Error> {
        self.pool.acquire().await
    }

    /// A transaction as this store's session needs it: behind PgBouncer
    /// its `BEGIN` carries the session settings (`SET LOCAL`) and, read
    /// only, `READ ONLY`.
    pub(crate) async fn begin_tx(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        self.pool.begin_with(self.begin_statement()).await
    }

    /// The shared bucket of `source` of `pipeline` (see [`rate`]); `None`
    /// for a zero rate (refused by the config check).
    pub(crate) fn rate_gate(
        &self,
        pipeline: &str,
        source: &str,
        limit: RateLimit,
    ) -> Option<Arc<dyn RateGate>> {
        let plan = crate::rate::LeasePlan::new(limit)?;
        let key = (
            pipeline.to_string(),
            source.to_string(),
            plan.per_second,
            plan.burst,
        );
        let mut gates = self.gates.0.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = gates.entry(key).or_insert_with(|| {
            Arc::new(rate::PgRateGate::new(self.clone(), pipeline, source, plan))
        });
        Some(Arc::clone(gate) as Arc<dyn RateGate>)
    }

    /// A connection that LISTENs for queued keys (and reconnects by itself);
    /// `None` behind PgBouncer in transaction mode, where a `LISTEN` is
    /// lost with its transaction's server session: workers poll.
    pub(crate) async fn listen(&self) -> Result<Option<sqlx::postgres::PgListener>, Error> {
        if self.session.pooled {
            return Ok(None);
        }
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool)
            .await
            .map_err(db_error)?;
        listener
            .listen(crate::ledger::sql::QUEUE_CHANNEL)
            .await
            .map_err(db_error)?;
        Ok(Some(listener))
    }

    /// The versions of the ledger migrations applied (`/readyz`).
    pub(crate) async fn applied_migrations(&self) -> Result<Vec<i64>, Error> {
        let mut tx = self.begin_tx().await.map_err(db_error)?;
        let applied = sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .persistent(self.persistent())
            .fetch_all(&mut *tx)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(applied)
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) fn migrator() -> sqlx::migrate::Migrator {
        sqlx::migrate!("../../migrations/postgres")
    }

    /// Applies the pending migrations. Not through PgBouncer in
    /// transaction mode: sqlx's migrator holds a session-level advisory
    /// lock across its transactions.
    pub(crate) async fn migrate(&self) -> Result<(), Error> {
        if self.session.pooled {
            return self.check_current().await.map_err(|_| {
                Error::config(
                    "command line",
                    "--pgbouncer",
                    "the ledger is not migrated through PgBouncer in transaction mode (the migration \
                     lock is a session lock): run `tidemark migrate` with a --database-url that \
                     reaches the PostgreSQL server directly, without --pgbouncer",
                )
            });
        }
        let mut conn = self.pool.acquire().await.map_err(db_error)?;
        Self::migrate_on(&mut conn).await
    }

    /// Applies the pending migrations on `conn`. A migration that failed
    /// for want of a connection or on a lost one is transient.
    async fn migrate_on(conn: &mut PgConnection) -> Result<(), Error> {
        Self::migrator().run_direct(conn).await.map_err(|e| {
            let transient = match e {
                sqlx::migrate::MigrateError::Execute(ref inner) => {
                    crate::db_error::is_transient(inner)
                }
                _ => false,
            };
            Error::Database {
                message: format!("ledger migration failed: {e}"),
                transient,
            }
        })
    }
}

/// A connection for one statement ([`PgStore::single`]).
pub(crate) enum Single {
    Direct(sqlx::pool::PoolConnection<sqlx::Postgres>),
    Pooled(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl Single {
    pub(crate) fn connection(&mut self) -> &mut PgConnection {
        match self {
            Single::Direct(conn) => conn,
            Single::Pooled(tx) => tx,
        }
    }

    /// Commits the statement's own transaction (behind PgBouncer).
    pub(crate) async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Single::Direct(_) => Ok(()),
            Single::Pooled(tx) => tx.commit().await,
        }
    }
}

/// Server settings of every session, so a holder that stopped (SIGSTOP,
/// a paused VM) or lost its network frees the run row its open batch
/// holds within about 20 s, below the default 30 s lease: the server ends
/// a session idle inside a transaction, and probes a silent peer's TCP
/// connection (10 s idle, then 3 probes 5 s apart). Statements waiting on
/// a lock are not idle; the ledger's own waits are bounded where they are
/// taken (claims skip locked rows, the heartbeat sets `lock_timeout`). A
/// setting the database URL's `options` names is left as given.
const SESSION_SETTINGS: [(&str, &str); 4] = [
    ("idle_in_transaction_session_timeout", "20s"),
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
];

fn session_settings(options: PgConnectOptions) -> PgConnectOptions {
    let given = options.get_options().unwrap_or_default().to_string();
    options.options(
        SESSION_SETTINGS
            .into_iter()
            .filter(|(name, _)| !given.contains(name)),
    )
}

/// The first connection: transient failures are tried again for
/// [`FIRST_CONNECT_DEADLINE`], a server out of connection slots for
/// [`SLOT_PATIENCE`] (another client's end frees one). The error, and
/// whether it was the connection limit (then still transient).
async fn first_connection(options: &PgConnectOptions) -> Result<PgConnection, (Error, bool)> {
    let backoff = tidemark_core::spec::RetryPolicy {
        max_attempts: u32::MAX,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(500),
    };
    let started = tokio::time::Instant::now();
    let (mut attempt, mut told) = (0, false);
    loop {
        attempt += 1;
        let (error, limit) = match connect_once(options).await {
            Ok(connection) => return Ok(connection),
            Err(failed) => failed,
        };
        let patience = if limit {
            SLOT_PATIENCE
        } else {
            FIRST_CONNECT_DEADLINE
        };
        if !error.is_transient() || started.elapsed() >= patience {
            return Err((error, limit));
        }
        if limit && !told {
            tracing::warn!(error = %error, "waiting for a free connection slot");
            told = true;
        }
        tracing::debug!(error = %error, attempt, "connecting to PostgreSQL: trying again");
        tokio::time::sleep(backoff.delay(attempt, None, rand::random::<f64>())).await;
    }
}

/// One connection attempt, bounded by [`CONNECT_TIMEOUT`]; whether a
/// failure was the server's connection limit.
async fn connect_once(options: &PgConnectOptions) -> Result<PgConnection, (Error, bool)> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(options)).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => {
            let limit = crate::db_error::is_connection_limit(&e);
            Err((db_error(e), limit))
        }
        Err(_) => Err((
            Error::Database {
                message: format!("no answer within {CONNECT_TIMEOUT:?}"),
                transient: true,
            },
            false,
        )),
    }
}

/// The driver's message without the "database: " prefix of our own type.
fn cause(error: &Error) -> String {
    match error {
        Error::Database { message, .. } => message.clone(),
        other => other.to_string(),
    }
}
