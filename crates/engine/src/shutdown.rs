//! Stopping, passed down as a token (the shape of mini-redis's
//! `shutdown.rs`), never as a global flag. Whoever embeds the engine
//! decides what asks for a stop: the `tidemark` binary's first SIGTERM or
//! SIGINT, a test, a program's own shutdown.
//!
//! A stop asks for a graceful end: nothing new is claimed, each run lets
//! the batch in flight finish reading and commit, then ends its attempt
//! `interrupted` and hands its key back (`pending`, lease released) for any
//! worker to resume. Aborting at once (the uncommitted batch rolls back
//! with its connection) is the embedding program's business: it drops the
//! runtime or exits.

use tokio_util::sync::CancellationToken;

/// A request to stop, shared by every loop that should.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    /// A token no one has triggered yet.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once a stop is asked for.
    pub async fn wait(&self) {
        self.token.cancelled().await;
    }

    /// Asks for a graceful stop.
    pub fn request(&self) {
        self.token.cancel();
    }
}
