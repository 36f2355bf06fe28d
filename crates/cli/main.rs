//! The `tidemark` binary: parses the command line, loads pipelines, opens
//! the database and maps outcomes to the contract's exit codes (decided in
//! [`exit`]: 0 ok, 1 a run failed, 2 usage/configuration, 75 held
//! elsewhere, 130/143 aborted by a second signal).

// The doc comments of `cli.rs` are the `--help` text clap prints, written
// for a terminal: `[schedule]` names a TOML table and URLs are examples, so
// rustdoc's link lints do not apply to them.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::bare_urls)]

/// `println!` that ignores a closed stdout (`tidemark status | head`):
/// output is best-effort, the run's effect and exit code are not.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that ignores a closed stderr.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// jemalloc instead of the system allocator, as Vector does: the hot path
/// builds and drops a few small values per source row, and glibc's
/// malloc/free were a quarter of the client's CPU samples on an unchanged
/// re-sync. Measured against glibc and mimalloc (ADR 0002): as fast as
/// mimalloc, with the lowest peak RSS of the three.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, which it reads from this symbol once at start-up
/// (`_RJEM_MALLOC_CONF` in the environment still overrides them). Its
/// default keeps freed pages for 10 s before giving them back, so a period
/// that ends while the next starts held both in its peak RSS: returning
/// dirty pages after 1 s and muzzy ones at once lowered the peak RSS of a
/// 1,000,000-row SQL-source load into PostgreSQL by 15 MiB (149–157 ->
/// 134–141 MiB) and of a 4,000,000-row SQLite re-sync by 11 MiB, at the same
/// speed (ADR 0007, "jemalloc's decay").
#[allow(unsafe_code, non_upper_case_globals)] // an exported symbol; no code runs
#[export_name = "_rjem_malloc_conf"]
static malloc_conf: MallocConf = MallocConf(c"dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

/// A C string pointer, as jemalloc declares `malloc_conf` (`const char *`).
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a 'static string literal that nothing writes.
#[allow(unsafe_code)]
unsafe impl Sync for MallocConf {}

mod calendar;
mod cli;
mod clock;
mod commands;
mod exit;
mod output;
mod preview;
mod serve;
mod setup;
mod signals;
mod status;
mod story;
mod tools;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, LogFormat};
use crate::exit::Exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Success
            }
            .into();
        }
    };
    // Editor and shell helpers: no clock, logging, runtime or database.
    if let Some(exit) = tools::run(&cli.command) {
        return exit.into();
    }
    init_logging(cli.global.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tell!("error: cannot start the async runtime: {e}");
            return Exit::Failed.into();
        }
    };
    let outcome = runtime.block_on(commands::dispatch(cli));
    // Every run has finished or failed; do not wait for a reader that may
    // still be blocked on a source (a pipe, a slow file system).
    runtime.shutdown_background();
    match outcome {
        Ok(exit) => exit.into(),
        Err(e) => {
            tell!("error: {e}");
            Exit::of_error(&e).into()
        }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    // sqlx logs PostgreSQL NOTICEs ("relation ... already exists, skipping")
    // at info: noise for an operator.
    let filter = EnvFilter::try_from_env("TIDEMARK_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}
