//! `completions` and `schema`: what editors and shells need to know about
//! tidemark. Neither reads a pipeline, the clock or a database, so `main`
//! runs them before anything else starts.

use std::io::Write as _;

use clap::CommandFactory;

use crate::cli::{Cli, Command, Shell};
use crate::exit::Exit;

/// Runs `command` when it is one of these; `None` for every other.
pub fn run(command: &Command) -> Option<Exit> {
    match command {
        Command::Completions(args) => Some(completions(args.shell)),
        Command::Schema => Some(schema()),
        _ => None,
    }
}

/// `tidemark completions SHELL`: the script on stdout.
pub fn completions(shell: Shell) -> Exit {
    let mut script = Vec::new();
    clap_complete::generate(
        shell.generator(),
        &mut Cli::command(),
        "tidemark",
        &mut script,
    );
    print(&script)
}

/// `tidemark schema`: the pipeline file's JSON Schema on stdout, exactly
/// as shipped in `schema/pipeline.schema.json` (a test compares them).
pub fn schema() -> Exit {
    let schema = tidemark_core::spec::json_schema();
    match serde_json::to_string_pretty(&schema) {
        Ok(mut text) => {
            text.push('\n');
            print(text.as_bytes())
        }
        Err(e) => {
            tell!("error: cannot write the schema: {e}");
            Exit::Failed
        }
    }
}

/// Writes `bytes` to stdout; a closed stdout (`| head`) is no error.
fn print(bytes: &[u8]) -> Exit {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes).and_then(|()| out.flush());
    Exit::Success
}
