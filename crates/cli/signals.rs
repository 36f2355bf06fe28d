//! Signals, turned into the engine's stop token ([`Shutdown`], the shape
//! of mini-redis's `shutdown.rs`), never into a global flag.
//!
//! The first SIGTERM or SIGINT asks for a graceful stop: nothing new is
//! claimed, each run lets the batch in flight finish reading and commit,
//! then ends its attempt `interrupted` and hands its key back (`pending`,
//! lease released) for any worker to resume; the process then exits 0. A
//! second signal, or the shutdown timeout passing first, aborts at once:
//! the process exits 130 (SIGINT) or 143 (SIGTERM) and the uncommitted
//! batch rolls back with its connection.

use std::time::Duration;

use tidemark_engine::Shutdown;

use crate::exit::Exit;

/// How long a graceful stop may take before it becomes an abort.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// Installs the signal handlers and returns the token they trigger. After
/// the first signal, a second one or `timeout` ends the process with the
/// first signal's 128 + number.
pub fn on_signals(timeout: Duration) -> Shutdown {
    let shutdown = Shutdown::default();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            tracing::warn!(
                "cannot listen for SIGINT/SIGTERM; signals will end the process at once"
            );
            return shutdown;
        };
        let token = shutdown.clone();
        tokio::spawn(async move {
            let first: u8 = tokio::select! {
                _ = interrupt.recv() => 2,
                _ = terminate.recv() => 15,
            };
            tracing::warn!(
                signal = first,
                timeout_s = timeout.as_secs_f64(),
                "stopping: no new work is claimed; runs hand their key back after the batch in flight \
                 (a second signal aborts at once)"
            );
            token.request();
            let signal: u8 = tokio::select! {
                _ = interrupt.recv() => 2,
                _ = terminate.recv() => 15,
                () = tokio::time::sleep(timeout) => {
                    tracing::error!("the graceful stop took longer than {timeout:?}; aborting");
                    first
                }
            };
            abort(signal);
        });
    }
    #[cfg(not(unix))]
    {
        let token = shutdown.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                token.request();
                if tokio::signal::ctrl_c().await.is_ok() {
                    abort(2);
                }
            }
        });
    }
    shutdown
}

/// Ends the process now: open transactions roll back with their
/// connections (PostgreSQL aborts them; SQLite ignores a WAL's uncommitted
/// frames), and another worker takes the run keys over.
fn abort(signal: u8) -> ! {
    let exit = Exit::Aborted { signal };
    tracing::error!(code = exit.code(), "aborted by a second signal");
    std::process::exit(i32::from(exit.code()))
}
