//! The command line, declared with clap's derive API. Every command and
//! flag has a doc comment: that text is what `--help` shows.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// tidemark: idempotent, period-scoped ETL syncs. One period run = one
/// effect, however often it runs.
#[derive(Debug, Parser)]
#[command(name = "tidemark", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// Destination database, which also holds the ledger:
    /// sqlite://PATH (created when missing) or postgres://USER@HOST/DB.
    #[arg(
        long,
        global = true,
        env = "TIDEMARK_DATABASE_URL",
        default_value = "sqlite://tidemark.db"
    )]
    pub database_url: String,

    /// Folder where pipeline names are looked up as NAME.toml.
    #[arg(long, global = true, default_value = "pipelines")]
    pub pipelines: PathBuf,

    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one period of a pipeline (every source, or one with --source).
    ///
    /// A period that is already done is not run again: its stored result is
    /// printed and the exit code is 0. Use --force to re-sync it.
    Run(RunArgs),
    /// Run every period from --from to --to (both included).
    Backfill(BackfillArgs),
    /// Run the due periods of pipelines: every period from period.start whose
    /// end + lag has passed and that is not done yet, plus the last `lookback`
    /// done ones again (late data).
    Sync(SyncArgs),
    /// Run `sync` for every pipeline in --pipelines DIR on its [schedule],
    /// until interrupted. Any number of `serve` processes may share one
    /// PostgreSQL: the ledger makes sure no period runs twice at once.
    Serve(ServeArgs),
    /// Show the ledger: what happened to each period.
    Status(StatusArgs),
    /// Check pipeline files without touching any database.
    Validate(ValidateArgs),
    /// Delete attempt history and rejected records older than a duration.
    Prune(PruneArgs),
    /// Apply the ledger migrations (also done on every start).
    Migrate,
}

/// Options shared by `run` and `backfill`.
#[derive(Debug, Args)]
pub struct RunOptions {
    /// Only this source (default: every source of the pipeline).
    #[arg(long)]
    pub source: Option<String>,

    /// Re-run periods that are already done; the destination then holds
    /// exactly the source's current rows for each run key.
    #[arg(long)]
    pub force: bool,

    /// Allow a reconciliation that deletes more than load.max_delete_fraction
    /// of a period's rows, or empties a period whose source returned nothing.
    #[arg(long)]
    pub force_deletes: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline name (pipelines/NAME.toml) or path to a .toml file.
    pub pipeline: String,

    /// The period: any date or time inside it (2024-03-07, 2024-03, 2024-03-07T13:00),
    /// as wall-clock time in the pipeline's timezone.
    #[arg(long)]
    pub period: String,

    #[command(flatten)]
    pub options: RunOptions,

    /// When another live run holds the period, wait for it and report the
    /// result instead of exiting with 75.
    #[arg(long)]
    pub wait: bool,

    /// Run the period although it is still open (its end plus period.lag
    /// has not passed); it is recorded as provisional and `sync` re-runs it
    /// once it is due.
    #[arg(long)]
    pub allow_open: bool,

    /// Print what would be done for each run key, and why, without reading
    /// any source or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct BackfillArgs {
    /// Pipeline name (pipelines/NAME.toml) or path to a .toml file.
    pub pipeline: String,

    /// First period (included).
    #[arg(long)]
    pub from: String,

    /// Last period (included).
    #[arg(long)]
    pub to: String,

    #[command(flatten)]
    pub options: RunOptions,

    /// Periods to run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,

    /// Only run keys in this state (default: every period not done).
    #[arg(long, value_enum, conflicts_with = "force")]
    pub only: Option<Only>,

    /// Run periods that are still open (their end plus period.lag has not
    /// passed); they are recorded as provisional and `sync` re-runs them
    /// once they are due.
    #[arg(long)]
    pub allow_open: bool,

    /// Print what would be done for each run key, and why, without reading
    /// any source or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// `backfill --only`: run keys by their state in the ledger
/// (docs/ledger.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Only {
    /// Failed keys: run again from the start.
    Failed,
    /// Periods with no ledger row: never run.
    Missing,
    /// Done under another handler version or other [fields]: re-run
    /// (forced); unchanged rows are not written again.
    Stale,
    /// Every period, done ones re-run (like --force).
    All,
}

impl Only {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Only::Failed => "failed",
            Only::Missing => "missing",
            Only::Stale => "stale",
            Only::All => "all",
        }
    }
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Pipeline names or paths.
    #[arg(
        value_name = "PIPELINE",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub names: Vec<String>,

    /// Every pipeline in --pipelines DIR.
    #[arg(long)]
    pub all: bool,

    #[command(flatten)]
    pub options: RunOptions,

    /// Periods to run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,

    /// Print what would be done for each run key, and why, without reading
    /// any source or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Periods to run at once in this process.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Pipeline name (pipelines/NAME.toml) or path to a .toml file.
    pub pipeline: String,

    /// Only this period.
    #[arg(long)]
    pub period: Option<String>,

    /// One JSON object per run key instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Pipeline names or paths.
    #[arg(required = true, value_name = "PIPELINE")]
    pub names: Vec<String>,

    /// Also read each source's first page (HTTP) or first batch (files) for
    /// --period and show how the first record maps to the fields. Writes
    /// nothing and opens no database.
    #[arg(long)]
    pub check_source: bool,

    /// The period to check with --check-source (default: the current period).
    #[arg(long, requires = "check_source")]
    pub period: Option<String>,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Age beyond which history goes, e.g. 30d, 12h.
    #[arg(long, value_parser = parse_age)]
    pub older_than: std::time::Duration,
}

/// `prune --older-than`: a duration whose cut-off (now minus it) is a
/// time both databases store, in the year 1 or later. A longer one once
/// overflowed: `300000000y` became a cut-off of now and pruned all history,
/// `99999999999d` panicked. Refused, it is a usage error that touches
/// nothing.
fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    let age = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    let now = chrono::Utc::now();
    let year_one = chrono::NaiveDate::from_ymd_opt(1, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
        .ok_or("no year 1")?;
    let cutoff = chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age));
    match cutoff {
        Some(cutoff) if cutoff >= year_one => Ok(age),
        _ => Err(format!(
            "{text} reaches back before the year 1, so no cut-off can be computed from it; give at most {}d (such as 90d)",
            (now - year_one).num_days()
        )),
    }
}
