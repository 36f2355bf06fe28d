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
#[derive(Debug, Clone, Args)]
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

    /// How long a run's lease lasts without a heartbeat (renewed every third
    /// of it). A worker on another host takes over a key whose holder
    /// stopped renewing once it has run out.
    #[arg(long, global = true, default_value = "30s", value_parser = parse_lease_ttl)]
    pub lease_ttl: std::time::Duration,

    /// The PostgreSQL --database-url points at PgBouncer in transaction
    /// mode: statements are not kept prepared across transactions, the
    /// session settings travel with each transaction, `serve`'s workers poll
    /// (--poll-interval) instead of LISTENing, and the ledger is not
    /// migrated through it (run `tidemark migrate` with a URL of the server
    /// itself first). Set TIDEMARK_PGBOUNCER=1 to the same effect.
    #[arg(long, global = true, env = "TIDEMARK_PGBOUNCER")]
    pub pgbouncer: bool,
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
    /// The long-running service: queue the due periods of every pipeline in
    /// --pipelines DIR that has a [schedule], and work the queue with
    /// --workers slots, until stopped (SIGTERM/SIGINT). Any number of `serve`
    /// processes on any hosts may share one PostgreSQL: the ledger is the
    /// work queue, and no period runs twice at once. SIGHUP re-reads the
    /// pipeline files.
    Serve(ServeArgs),
    /// Take queued (pending) run keys of a pipeline out of the queue; running
    /// ones finish.
    Cancel(CancelArgs),
    /// Record periods as done without running them: loaded by another tool
    /// (--as done, adoption) or deliberately empty (--as skipped).
    ///
    /// Each run key of the range (every source, or one with --source) becomes
    /// `done` with a new attempt that names the operator (mark:$USER@host:pid)
    /// and carries the note; nothing is read or written in the destination
    /// table. `sync`, `backfill --only missing`, dry runs and freshness then
    /// count those periods as done, and `status` shows them with
    /// `marked done: NOTE` or `marked skipped: NOTE`. A key already done is
    /// left as it is unless --force; a running key is left to its holder
    /// (exit 75 when any was). `run --force` or `backfill --force` later
    /// loads a marked period for real and clears the mark.
    Mark(MarkArgs),
    /// Show the ledger: what happened to each period.
    Status(StatusArgs),
    /// Check pipeline files without touching any database.
    Validate(ValidateArgs),
    /// Delete attempt history, rejected records and delivered notices
    /// older than a duration.
    Prune(PruneArgs),
    /// Notices: `notify test PIPELINE` sends one sample notice to every
    /// `[[notify]]` target of the pipeline, to check the wiring.
    Notify(NotifyArgs),
    /// Apply the ledger migrations (also done on every start).
    Migrate,
    /// Print a shell completion script for tidemark on stdout.
    ///
    /// Install it where the shell looks for completions, for example:
    ///
    ///   bash: tidemark completions bash > ~/.local/share/bash-completion/completions/tidemark
    ///
    ///   zsh:  tidemark completions zsh > ~/.zfunc/_tidemark
    ///         (with `fpath+=~/.zfunc; autoload -Uz compinit; compinit` in ~/.zshrc)
    ///
    ///   fish: tidemark completions fish > ~/.config/fish/completions/tidemark.fish
    #[command(verbatim_doc_comment)]
    Completions(CompletionsArgs),
    /// Print the JSON Schema (draft 07) of the pipeline file on stdout.
    ///
    /// The same schema is shipped as schema/pipeline.schema.json. A TOML
    /// language server (taplo, Even Better TOML) uses it to validate and
    /// complete pipeline files: put `#:schema ./schema/pipeline.schema.json`
    /// (a path relative to the file) on a pipeline's first line, or map
    /// pipelines/*.toml to it in .taplo.toml. The schema checks each key and
    /// its type; `validate` also checks what depends on several values.
    Schema,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Shells `completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    /// Bash (with the bash-completion package).
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

impl Shell {
    /// clap_complete's generator for this shell.
    pub fn generator(self) -> clap_complete::Shell {
        match self {
            Shell::Bash => clap_complete::Shell::Bash,
            Shell::Zsh => clap_complete::Shell::Zsh,
            Shell::Fish => clap_complete::Shell::Fish,
        }
    }
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

    /// Run a failed period now, whatever its failure back-off
    /// (`not_before`). `run` never waits for a back-off, so this is what it
    /// does anyway: the flag says it outright (and matches `sync --now`).
    /// The back-off holds `sync` and `serve`'s schedule only; a run that
    /// succeeds clears it, one that fails again doubles it.
    #[arg(long)]
    pub now: bool,

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

    /// Periods to run at once [default: on SQLite the number of cores, 2 to
    /// 4 (one writer at a time: a second period reads while the first
    /// writes); on PostgreSQL twice the cores, 2 to 8 (small periods wait
    /// on round trips, which more periods at once overlap)].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: Option<u16>,

    /// Only put the periods into the work queue (as `pending`) and return at
    /// once, printing how many were queued; `serve` processes do the work.
    /// Keys already done are queued again only with --force.
    #[arg(long)]
    pub enqueue: bool,

    /// With --enqueue: the claim order. Each point is one minute of head
    /// start over keys queued at the same time (scheduled periods get 1440);
    /// a key that waits long enough is claimed whatever its priority.
    #[arg(long, requires = "enqueue", default_value_t = 0, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-100_000..=100_000))]
    pub priority: i64,

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
    /// The engine's selection of the same name.
    pub fn selection(self) -> tidemark_engine::plan::Only {
        use tidemark_engine::plan::Only as Selection;
        match self {
            Only::Failed => Selection::Failed,
            Only::Missing => Selection::Missing,
            Only::Stale => Selection::Stale,
            Only::All => Selection::All,
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        self.selection().name()
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

    /// Periods to run at once [default: as for backfill].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: Option<u16>,

    /// Lift the failure back-off: run failed periods now, also those whose
    /// `not_before` (1 min after the first failure, doubling, at most 24 h)
    /// has not passed, which sync otherwise leaves alone.
    #[arg(long)]
    pub now: bool,

    /// Print what would be done for each run key, and why, without reading
    /// any source or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Worker slots in this process: how many queued periods it runs at once
    /// (across all pipelines).
    #[arg(long, visible_alias = "concurrency", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,

    /// Work only: do not queue scheduled periods (another `serve` does, or
    /// `backfill --enqueue`).
    #[arg(long)]
    pub no_schedule: bool,

    /// Exit 0 once nothing is left for this process: no pending key of its
    /// pipelines, and no running key whose holder is dead or whose lease has
    /// expired (a key held by a live worker elsewhere is that worker's).
    #[arg(long)]
    pub drain: bool,

    /// How long the first SIGTERM/SIGINT waits for the batches in flight
    /// before aborting as a second signal does (exit 130/143).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: std::time::Duration,

    /// How often an idle worker looks at the queue. On PostgreSQL a queued
    /// key also wakes idle workers at once (LISTEN/NOTIFY).
    #[arg(long, default_value = "1s", value_parser = parse_poll_interval)]
    pub poll_interval: std::time::Duration,

    /// Serve /metrics (Prometheus), /healthz, /readyz and the pages for
    /// people (/: a grid of periods; /periods/...: one period's story) on
    /// this address, e.g. 127.0.0.1:9464. Off by default. Read-only.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,

    /// Where people reach this service's pages (e.g.
    /// https://tidemark.example): each notice links to its period's page
    /// under it.
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,

    /// Link each attempt on the period page to its logs: an http(s) URL
    /// template naming {run_id}, {attempt}, {pipeline} and {period} (the
    /// period's start as stored), e.g.
    /// 'https://logs.example/explore?q=run_id%3D{run_id}'.
    #[arg(long, value_name = "TEMPLATE", requires = "listen",
          value_parser = |t: &str| tidemark_engine::web::LogUrl::parse(t).map_err(|e| e.to_string()))]
    pub log_url: Option<tidemark_engine::web::LogUrl>,

    /// The longest /metrics reuses what it read from the ledger before
    /// reading it again (0s: at every scrape). While scrapes come it is
    /// refreshed in the background, so a scrape does not wait for it.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub metrics_max_age: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Pipeline name (pipelines/NAME.toml) or path to a .toml file.
    pub pipeline: String,

    /// First period (included); default: every queued period.
    #[arg(long, requires = "to")]
    pub from: Option<String>,

    /// Last period (included).
    #[arg(long, requires = "from")]
    pub to: Option<String>,

    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,
}

#[derive(Debug, Args)]
pub struct MarkArgs {
    /// Pipeline name (pipelines/NAME.toml) or path to a .toml file.
    pub pipeline: String,

    /// Only this period (instead of --from/--to): any date or time inside it.
    #[arg(long, conflicts_with_all = ["from", "to"], required_unless_present = "from")]
    pub period: Option<String>,

    /// First period (included).
    #[arg(long, requires = "to")]
    pub from: Option<String>,

    /// Last period (included).
    #[arg(long, requires = "from")]
    pub to: Option<String>,

    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,

    /// What the periods are: `done` (loaded by another tool) or `skipped`
    /// (deliberately empty).
    #[arg(long = "as", value_name = "done|skipped")]
    pub mark_as: MarkAsArg,

    /// Why: kept with the mark in the ledger and shown by `status`.
    #[arg(long)]
    pub note: String,

    /// Mark periods that are done already too (recorded again as marked).
    #[arg(long)]
    pub force: bool,
}

/// `mark --as`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MarkAsArg {
    /// Loaded by another tool (adoption).
    Done,
    /// Deliberately empty.
    Skipped,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Pipeline name (pipelines/NAME.toml) or path to a .toml file.
    pub pipeline: String,

    /// Only this period.
    #[arg(long, conflicts_with_all = ["from", "to"])]
    pub period: Option<String>,

    /// The first period of a range (with --to). Periods of the range that
    /// the ledger has no row for are shown as `missing`.
    #[arg(long, requires = "to")]
    pub from: Option<String>,

    /// The last period of the range (inclusive).
    #[arg(long, requires = "from")]
    pub to: Option<String>,

    /// Only run keys in this state. `missing` without a range means every
    /// period from period.start through the last due one.
    #[arg(long, value_enum)]
    pub only: Option<StatusOnly>,

    /// The pipeline's notices (of --period, if given) and their delivery
    /// state (`pending`, `sent`, `dead` with the last error) instead of
    /// the run keys; with --json one object per notice.
    #[arg(long)]
    pub notices: bool,

    /// One JSON object per run key instead of a table (and no calendar
    /// or summary line: every line is a run key, as documented).
    #[arg(long)]
    pub json: bool,

    /// A calendar of the range above the table (one cell per period and
    /// source, a row per week of days, per day of hours, per month of
    /// weeks, per year of months) with a legend. `auto`: when stdout is a
    /// terminal and --from/--to is given.
    #[arg(long, value_enum, default_value_t = When::Auto, value_name = "WHEN")]
    pub calendar: When,

    /// Colours in the calendar. `auto`: when stdout is a terminal and
    /// NO_COLOR is not set; otherwise each cell is a letter or symbol
    /// (the legend says which).
    #[arg(long, value_enum, default_value_t = When::Auto, value_name = "WHEN")]
    pub color: When,
}

/// `--calendar`, `--color`: on, off, or decided by where stdout goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum When {
    /// Decided by where stdout goes (see the option).
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// `status --only`: the ledger's states (docs/ledger.md), plus `missing`
/// (no row: never run), `stale` and `provisional` (done, with a note).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOnly {
    /// Queued, waiting for a worker (or interrupted, waiting to resume).
    Pending,
    /// An attempt holds the lease now.
    Running,
    /// Finished.
    Done,
    /// The last attempt failed.
    Failed,
    /// Taken out of the queue by `cancel`.
    Cancelled,
    /// No ledger row: the period was never run (or queued).
    Missing,
    /// Done under another handler version or other [fields].
    Stale,
    /// Done while its period was still open.
    Provisional,
}

impl StatusOnly {
    /// The engine's filter of the same name.
    pub fn filter(self) -> tidemark_engine::status::StatusFilter {
        use tidemark_engine::status::StatusFilter as F;
        match self {
            StatusOnly::Pending => F::Pending,
            StatusOnly::Running => F::Running,
            StatusOnly::Done => F::Done,
            StatusOnly::Failed => F::Failed,
            StatusOnly::Cancelled => F::Cancelled,
            StatusOnly::Missing => F::Missing,
            StatusOnly::Stale => F::Stale,
            StatusOnly::Provisional => F::Provisional,
        }
    }
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
pub struct NotifyArgs {
    #[command(subcommand)]
    pub action: NotifyAction,
}

/// What `notify` does.
#[derive(Debug, Subcommand)]
pub enum NotifyAction {
    /// Queue and send one `test` notice to every `[[notify]]` target of
    /// the pipeline; exit 1 unless every receiver took it.
    Test {
        /// Pipeline name (pipelines/NAME.toml) or path to a .toml file.
        pipeline: String,
    },
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Age beyond which history goes, e.g. 30d, 12h.
    #[arg(long, value_parser = parse_age)]
    pub older_than: std::time::Duration,
}

/// `--concurrency`, or the default for the database: periods at once that
/// the machine and the database can use. SQLite has one writer, so past
/// one period per core more periods only queue for it (measured on 2
/// cores: 2 periods 0.82x the time of 1, 3 no better than 2; ADR 0003);
/// PostgreSQL runs periods in parallel and small ones spend most of their
/// time waiting on round trips (ADR 0007).
pub fn concurrency(requested: Option<u16>, database_url: &str) -> usize {
    if let Some(n) = requested {
        return usize::from(n);
    }
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    if database_url.starts_with("sqlite:") {
        cores.clamp(2, 4)
    } else {
        (2 * cores).clamp(2, 8)
    }
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

/// `--lease-ttl`: long enough for a heartbeat to get through (1 s), short
/// enough that a dead worker's key does not wait for a day.
fn parse_lease_ttl(text: &str) -> Result<std::time::Duration, String> {
    bounded(
        text,
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(86_400),
    )
}

/// `--poll-interval`: from 10 ms to an hour.
fn parse_poll_interval(text: &str) -> Result<std::time::Duration, String> {
    bounded(
        text,
        std::time::Duration::from_millis(10),
        std::time::Duration::from_secs(3600),
    )
}

fn bounded(
    text: &str,
    min: std::time::Duration,
    max: std::time::Duration,
) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d < min || d > max {
        return Err(format!(
            "{text} cannot work: give from {} to {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_defaults_follow_the_database() {
        assert_eq!(concurrency(Some(7), "sqlite://x.db"), 7);
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        assert_eq!(concurrency(None, "sqlite://x.db"), cores.clamp(2, 4));
        assert_eq!(
            concurrency(None, "postgres://h/db"),
            (2 * cores).clamp(2, 8)
        );
    }
}
