//! The process's exit status, decided here and nowhere else (as ripgrep's
//! `main` does): every command returns an [`Exit`], several runs combine
//! with [`Exit::worst`], and only `main` turns it into a number.

use std::process::ExitCode;

use tidemark_core::Error;

use tidemark_engine::Outcome;

/// What the contract's exit codes mean, ordered from best to worst, so
/// that the worst of several outcomes is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    /// 0: everything asked for is done (also: it was done already).
    Success,
    /// 75: a run key is held by another live run (or this attempt lost its
    /// lease to another one); nothing failed.
    Held,
    /// 1: a run failed (permanent error, or retries exhausted), including a
    /// configuration error found only once a run had started.
    Failed,
    /// 2: usage or configuration error; nothing was touched.
    Usage,
    /// 130 / 143: a second SIGINT / SIGTERM aborted the work.
    Aborted {
        /// The signal's number (2 or 15).
        signal: u8,
    },
}

impl Exit {
    /// The worst of several: `Failed` beats `Held` beats `Success`.
    pub fn worst(outcomes: impl IntoIterator<Item = Exit>) -> Exit {
        outcomes.into_iter().max().unwrap_or(Exit::Success)
    }

    /// The exit of one run key's outcome. A configuration error met during
    /// a run failed that run: 1, never 2 (the run was started, the ledger
    /// records it) and never 0.
    pub fn of_outcome(outcome: &Outcome) -> Exit {
        match outcome {
            Outcome::Done(_)
            | Outcome::AlreadyDone(_)
            | Outcome::Interrupted
            | Outcome::Stopped => Exit::Success,
            Outcome::Held { .. } | Outcome::Failed(Error::LeaseLost(_)) => Exit::Held,
            Outcome::Failed(_) | Outcome::NotRun { .. } => Exit::Failed,
        }
    }

    /// The exit of an error that stopped a command before any run started.
    pub fn of_error(error: &Error) -> Exit {
        match error {
            Error::Config { .. } => Exit::Usage,
            Error::LeaseLost(_) => Exit::Held,
            _ => Exit::Failed,
        }
    }

    /// The number the process exits with.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Held => 75,
            Exit::Aborted { signal } => 128 + signal,
        }
    }
}

/// A configuration error the engine names by what was passed (its key is
/// `passed`: "source", "pipelines folder"), named by the command-line flag
/// that passed it instead: the library does not know its caller's flags.
/// Any other error is returned as it is.
pub fn flag(error: Error, passed: &str, flag: &str) -> Error {
    match error {
        Error::Config { file, key, message } if key == passed => Error::Config {
            file,
            key: flag.to_string(),
            message,
        },
        other => other,
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_outcome_wins() {
        use Exit::*;
        assert_eq!(Exit::worst([Success, Success]), Success);
        assert_eq!(Exit::worst([Success, Held, Success]), Held);
        assert_eq!(Exit::worst([Held, Failed, Success]), Failed);
        assert_eq!(Exit::worst([]), Success);
        assert_eq!(Exit::worst([Failed, Aborted { signal: 15 }]).code(), 143);
        assert_eq!(Aborted { signal: 2 }.code(), 130);
    }

    #[test]
    fn a_failed_run_never_exits_0() {
        let config = Error::config("p.toml", "fields.n.default", "not an int");
        assert_eq!(
            Exit::of_outcome(&Outcome::Failed(config.clone())),
            Exit::Failed
        );
        assert_eq!(Exit::of_error(&config), Exit::Usage);
        let lost = Error::LeaseLost("taken over".into());
        assert_eq!(Exit::of_outcome(&Outcome::Failed(lost)).code(), 75);
    }
}
