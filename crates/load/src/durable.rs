//! When a committed period is on disk: at once, or when the commit it
//! shares with other periods is made (SQLite's shared commit, ADR 0022).

use tidemark_core::Error;
use tokio::sync::oneshot;

/// The answer to "is what this transaction wrote durable?", handed back by
/// a transaction that may share its commit with the periods after it.
///
/// A period whose commit is shared is not done until the shared commit
/// is made: whoever reports it (a command's summary line, its progress
/// bar, its exit code) waits for [`Durable::wait`] first, so a crash
/// between the period's end and the shared commit leaves the period
/// unreported as well as unwritten, and it simply runs again.
#[derive(Debug, Default)]
#[must_use = "a shared commit is reported only once it is made"]
pub struct Durable(Option<oneshot::Receiver<Result<(), Error>>>);

impl Durable {
    /// Committed on its own: durable already.
    pub fn now() -> Durable {
        Durable(None)
    }

    /// Durable when `made` answers (the shared commit's outcome).
    pub(crate) fn when(made: oneshot::Receiver<Result<(), Error>>) -> Durable {
        Durable(Some(made))
    }

    /// Whether the commit is still to be made.
    pub fn is_pending(&self) -> bool {
        self.0.is_some()
    }

    /// Waits for the shared commit. An error means nothing the transaction
    /// wrote was kept: the shared commit failed, or the store closed (or
    /// the process began to end) before it was made.
    pub async fn wait(self) -> Result<(), Error> {
        let Some(made) = self.0 else {
            return Ok(());
        };
        made.await.unwrap_or_else(|_| {
            Err(Error::Database {
                message: "the commit this period shared with the next ones was never made \
                          (the store closed first); nothing of the period was kept"
                    .into(),
                transient: true,
            })
        })
    }
}

/// How the finishing transaction of a one-batch period commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// At once (a period run on its own, `serve`'s queue workers).
    Alone,
    /// Possibly later, together with the next periods of the command's
    /// workers (SQLite; PostgreSQL commits at once): for a worker whose
    /// reporter waits for [`Durable::wait`].
    Shared,
}
