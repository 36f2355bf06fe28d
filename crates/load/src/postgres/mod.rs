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
use std::sync::{Arc, Mutex, PoisonError};

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection as _;
use tidemark_core::spec::RateLimit;
use tidemark_core::{Error, RateGate};

use crate::db_error::db_error;
use crate::retry_while;

/// How long the first connection may keep failing with a transient error
/// (a server that is restarting) before the command gives up with the
/// real cause.
const FIRST_CONNECT_DEADLINE: Duration = Duration::from_secs(5);

/// How long one connection attempt may take (a host that drops packets
/// would otherwise hold it for minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A pool of connections to one PostgreSQL database.
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pool: PgPool,
    gates: Gates,
}

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
    pub(crate) async fn connect(url: &str) -> Result<Self, Error> {
        let store = Self::open(url, |options| options).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Connects for a dry run: every transaction is read-only (the server
    /// refuses any write), and nothing is migrated. `None` when the
    /// database holds no ledger yet; an error when its ledger is older than
    /// this build (a dry run must not migrate it).
    pub(crate) async fn connect_read_only(url: &str) -> Result<Option<Self>, Error> {
        let store = Self::open(url, |options| {
            options.options([("default_transaction_read_only", "on")])
        })
        .await?;
        let found: Option<String> =
            sqlx::query_scalar("SELECT CAST(to_regclass('_tm_runs') AS text)")
                .fetch_one(&store.pool)
                .await
                .map_err(db_error)?;
        if found.is_none() {
            store.close().await;
            return Ok(None);
        }
        let applied = || async {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&store.pool)
                .await
                .map_err(db_error)
        };
        if let Err(error) = crate::check_migrated(&Self::migrator(), applied).await {
            store.close().await;
            return Err(error);
        }
        Ok(Some(store))
    }

    async fn open(
        url: &str,
        adjust: impl FnOnce(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<Self, Error> {
        let shown = crate::redact_url(url);
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| Error::config("command line", "database URL", format!("{shown}: {e}")))?;
        let options = adjust(session_settings(options));
        let first = retry_while(
            "connecting to PostgreSQL",
            FIRST_CONNECT_DEADLINE,
            Error::is_transient,
            || connect_once(&options),
        )
        .await
        .map_err(|e| Error::Database {
            message: format!("cannot connect to {shown}: {}", cause(&e)),
            transient: false,
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(60))
            .connect_lazy_with(options);
        let _ = first.close().await;
        Ok(PgStore {
            pool,
            gates: Gates::default(),
        })
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
            Arc::new(rate::PgRateGate::new(
                self.pool.clone(),
                pipeline,
                source,
                plan,
            ))
        });
        Some(Arc::clone(gate) as Arc<dyn RateGate>)
    }

    /// A connection that LISTENs for queued keys (and reconnects by itself).
    pub(crate) async fn listen(&self) -> Result<sqlx::postgres::PgListener, Error> {
        let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool)
            .await
            .map_err(db_error)?;
        listener
            .listen(crate::ledger::sql::QUEUE_CHANNEL)
            .await
            .map_err(db_error)?;
        Ok(listener)
    }

    /// The versions of the ledger migrations applied (`/readyz`).
    pub(crate) async fn applied_migrations(&self) -> Result<Vec<i64>, Error> {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) fn migrator() -> sqlx::migrate::Migrator {
        sqlx::migrate!("../../migrations/postgres")
    }

    pub(crate) async fn migrate(&self) -> Result<(), Error> {
        Self::migrator()
            .run(&self.pool)
            .await
            .map_err(|e| Error::Database {
                message: format!("ledger migration failed: {e}"),
                transient: false,
            })
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

/// One connection attempt, bounded by [`CONNECT_TIMEOUT`].
async fn connect_once(options: &PgConnectOptions) -> Result<PgConnection, Error> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(options)).await {
        Ok(connected) => connected.map_err(db_error),
        Err(_) => Err(Error::Database {
            message: format!("no answer within {CONNECT_TIMEOUT:?}"),
            transient: true,
        }),
    }
}

/// The driver's message without the "database: " prefix of our own type.
fn cause(error: &Error) -> String {
    match error {
        Error::Database { message, .. } => message.clone(),
        other => other.to_string(),
    }
}
