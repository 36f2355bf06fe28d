//! Issue 10, the extract stage (items 1, 3, 7, 9, 10, 13, 16, 18), and
//! issue 11 defect 1: the ways a file or an API could make a period lose
//! rows silently, leak a secret, hang or mislead. Every scenario runs the
//! real binary on SQLite and PostgreSQL against files it writes or a local
//! HTTP server ([`crate::support::http`]) that counts its requests.

mod files;
mod http;
mod memory;
mod secrets;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::support::{Env, Out, BIN};

/// `[retry]` with quick backoff, so a wrongly retried error shows as extra
/// requests within the test's time.
const QUICK_RETRY: &str = "max_attempts = 6\nbase_delay = \"10ms\"\nmax_delay = \"200ms\"";

/// Writes `pipelines/NAME.toml`: one day-period source `src` (its settings
/// after `id`), `fields`, table NAME keyed on `id`, and `load` settings.
pub fn write_pipeline(env: &Env, name: &str, source: &str, fields: &str, load: &str) {
    let text = format!(
        "name = \"{name}\"\nexport_type = \"t\"\n\n[period]\ngranularity = \"day\"\n\n\
         [[sources]]\nid = \"src\"\n{source}\n\n[fields]\n{fields}\n\n\
         [load]\ntable = \"{name}\"\nkey = [\"id\"]\n{load}\n\n[retry]\n{QUICK_RETRY}\n"
    );
    env.write(format!("pipelines/{name}.toml"), &text);
}

/// Runs `tidemark ARGS` with extra environment variables, killed after
/// `timeout` (a run that loops forever fails the test instead of hanging it).
pub fn tidemark(env: &Env, vars: &[(&str, &str)], args: &[&str], timeout: Duration) -> Out {
    let started = Instant::now();
    let mut command = Command::new(BIN);
    command
        .current_dir(env.dir.path())
        .arg("--database-url")
        .arg(env.db.url())
        .args(args)
        .env_remove("TIDEMARK_LOG")
        .env_remove("TIDEMARK_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in vars {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("start tidemark");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait for tidemark") {
            break status.code();
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`tidemark {}` did not finish within {timeout:?}\n--- stderr:\n{}",
                args.join(" "),
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        code,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
        elapsed: started.elapsed(),
    }
}

/// `run NAME --period DAY` with no extra environment, within 60 s.
pub fn run(env: &Env, name: &str, day: &str, extra: &[&str]) -> Out {
    let mut args = vec!["run", name, "--period", day];
    args.extend_from_slice(extra);
    tidemark(env, &[], &args, Duration::from_secs(60))
}

/// The ledger entry of `day` (`status --period --json`).
#[track_caller]
pub fn ledger(env: &Env, name: &str, day: &str) -> Json {
    env.status_of(name, day)
        .unwrap_or_else(|| panic!("no ledger entry for {name} {day}"))
}

/// The ids of table `name` as text, sorted as text (the same on both
/// databases, whatever the column's type).
pub async fn ids(env: &Env, name: &str) -> Vec<String> {
    let mut ids: Vec<String> = env
        .db
        .select(&["id"], &format!("FROM {name}"))
        .await
        .into_iter()
        .map(|r| r[0].clone().unwrap_or_default())
        .collect();
    ids.sort();
    ids
}

/// Every byte of a SQLite database's files (main, WAL, journal).
pub fn sqlite_bytes(db: &Path) -> Vec<u8> {
    ["", "-wal", "-shm", "-journal"]
        .iter()
        .filter_map(|suffix| std::fs::read(format!("{}{suffix}", db.display())).ok())
        .flatten()
        .collect()
}
