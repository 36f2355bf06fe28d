//! The test's working directory and the real `tidemark` binary run in it:
//! to completion ([`Out`]), in the background ([`Running`]), fed through a
//! named pipe ([`FifoWriter`]).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use tempfile::TempDir;

use super::db::{Backend, TestDb};
use super::files::{copy_dir, set_toml_key};
use super::repo_root;

/// The tidemark binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

/// What one tidemark invocation did.
#[derive(Debug, Clone)]
pub struct Out {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Out {
    /// Panics with the full output unless the exit code is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32, what: &str) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "{what}: expected exit code {code}\n{self}"
        );
        self
    }

    /// stdout lines that are JSON objects.
    pub fn json_lines(&self) -> Vec<Json> {
        self.stdout
            .lines()
            .filter(|l| l.trim_start().starts_with('{'))
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
            })
            .collect()
    }

    /// The single JSON object printed on stdout (the result of `run`).
    #[track_caller]
    pub fn json(&self) -> Json {
        let mut lines = self.json_lines();
        assert_eq!(lines.len(), 1, "expected one JSON line on stdout\n{self}");
        lines.remove(0)
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--- exit code: {:?} after {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// A test's working directory and destination database.
pub struct Env {
    pub dir: TempDir,
    pub db: TestDb,
    spawned: AtomicUsize,
    /// Environment variables every run of this test gets.
    vars: Vec<(String, String)>,
}

impl Env {
    /// An empty working directory (with an empty `pipelines/`) and a fresh database.
    pub async fn new(backend: Backend) -> Env {
        let dir = work_dir();
        let db = TestDb::new(backend, dir.path()).await;
        Env::with(dir, db)
    }

    /// [`Env::new`] on SQLite, for tests that are not async (a SQLite
    /// database needs no set-up).
    pub fn sqlite() -> Env {
        let dir = work_dir();
        let db = TestDb::sqlite(dir.path());
        Env::with(dir, db)
    }

    fn with(dir: TempDir, db: TestDb) -> Env {
        Env {
            dir,
            db,
            spawned: AtomicUsize::new(0),
            vars: Vec::new(),
        }
    }

    /// Sets an environment variable for every later run of this test.
    pub fn set_var(&mut self, name: &str, value: &str) {
        self.vars.push((name.into(), value.into()));
    }

    /// A working directory holding a copy of the shipped `orders` example
    /// (`pipelines/orders.toml` and `pipelines/data/orders/`).
    pub async fn orders(backend: Backend) -> Env {
        let env = Env::new(backend).await;
        env.copy_example("orders");
        env
    }

    pub fn backend(&self) -> Backend {
        self.db.backend()
    }

    /// Copies `pipelines/NAME.toml` and `pipelines/data/NAME/` of the repository.
    pub fn copy_example(&self, name: &str) {
        let from = repo_root().join("pipelines");
        let to = self.path("pipelines");
        fs::copy(
            from.join(format!("{name}.toml")),
            to.join(format!("{name}.toml")),
        )
        .unwrap_or_else(|e| panic!("cannot copy pipelines/{name}.toml: {e}"));
        let data = from.join("data").join(name);
        if data.exists() {
            copy_dir(&data, &to.join("data").join(name));
        }
    }

    /// A path inside the working directory.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn pipeline_file(&self, name: &str) -> PathBuf {
        self.path(format!("pipelines/{name}.toml"))
    }

    /// Rewrites a pipeline file.
    pub fn edit_pipeline(&self, name: &str, edit: impl FnOnce(String) -> String) {
        let path = self.pipeline_file(name);
        let text = fs::read_to_string(&path).expect("read pipeline");
        fs::write(&path, edit(text)).expect("write pipeline");
    }

    /// Sets `key = value` (value as TOML) in `[section]` of a pipeline
    /// file, replacing the key's line or adding it under the header.
    pub fn set_option(&self, name: &str, section: &str, key: &str, value: &str) {
        self.edit_pipeline(name, |text| set_toml_key(&text, section, key, value));
    }

    /// Writes a file (creating folders) in the working directory.
    pub fn write(&self, rel: impl AsRef<Path>, contents: &str) {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create folders");
        }
        fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    fn command(&self, args: &[&str]) -> Command {
        self.command_at(&self.db.url(), args)
    }

    /// `tidemark --database-url URL ARGS...`, for a URL other than the test
    /// database's own (connection options, a server that is not there).
    fn command_at(&self, url: &str, args: &[&str]) -> Command {
        self.command_on(None, url, args)
    }

    /// The command, run on its own host name when `host` is given: in a new
    /// UTS namespace (`unshare --uts`, as root), so that its worker id names
    /// another host and the lease path is exercised, not the same-host
    /// dead-holder shortcut.
    fn command_on(&self, host: Option<&str>, url: &str, args: &[&str]) -> Command {
        let mut cmd = match host {
            None => Command::new(BIN),
            Some(host) => {
                let mut cmd = Command::new("unshare");
                cmd.args([
                    "--uts",
                    "sh",
                    "-c",
                    "hostname \"$0\" && exec \"$@\"",
                    host,
                    BIN,
                ]);
                cmd
            }
        };
        cmd.current_dir(self.dir.path())
            .arg("--database-url")
            .arg(url)
            .args(args)
            .env_remove("TIDEMARK_LOG")
            .env_remove("TIDEMARK_DATABASE_URL")
            .env_remove("RUST_LOG")
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `tidemark --database-url URL ARGS...` to completion.
    pub fn tidemark(&self, args: &[&str]) -> Out {
        self.tidemark_at(&self.db.url(), args)
    }

    /// Runs tidemark against `url` instead of the test database's own URL.
    pub fn tidemark_at(&self, url: &str, args: &[&str]) -> Out {
        let started = Instant::now();
        let output = self
            .command_at(url, args)
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// Starts tidemark against `url` in the background.
    pub fn spawn_at(&self, url: &str, args: &[&str]) -> Running {
        self.spawn_on(None, url, args)
    }

    /// Starts tidemark in the background as if on another host (see
    /// [`Env::command_on`]).
    pub fn spawn_on_host(&self, host: &str, args: &[&str]) -> Running {
        self.spawn_on(Some(host), &self.db.url(), args)
    }

    /// Starts tidemark in the background without the test's variables
    /// `unset` (a process that lacks a secret the others have).
    pub fn spawn_without(&self, unset: &[&str], args: &[&str]) -> Running {
        let mut command = self.command(args);
        for name in unset {
            command.env_remove(name);
        }
        self.spawn_command(command, args)
    }

    fn spawn_on(&self, host: Option<&str>, url: &str, args: &[&str]) -> Running {
        self.spawn_command(self.command_on(host, url, args), args)
    }

    fn spawn_command(&self, mut command: Command, args: &[&str]) -> Running {
        let n = self.spawned.fetch_add(1, Ordering::SeqCst);
        let stdout = self.path(format!("proc-{n}.stdout"));
        let stderr = self.path(format!("proc-{n}.stderr"));
        let child = command
            .stdout(fs::File::create(&stdout).expect("stdout file"))
            .stderr(fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Running {
            child,
            stdout,
            stderr,
            started: Instant::now(),
            args: args.join(" "),
        }
    }

    /// Runs tidemark with extra environment variables (`TIDEMARK_LOG`, say).
    pub fn tidemark_env(&self, vars: &[(&str, &str)], args: &[&str]) -> Out {
        let started = Instant::now();
        let mut command = self.command(args);
        command.envs(vars.iter().copied());
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// Runs tidemark with the environment variables `unset` removed (other
    /// tests of this process may have set them).
    pub fn tidemark_without(&self, unset: &[&str], args: &[&str]) -> Out {
        let started = Instant::now();
        let mut command = self.command(args);
        for name in unset {
            command.env_remove(name);
        }
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// `tidemark backfill orders` over January 2024's days `from..=to`.
    pub fn backfill_orders(&self, from: u32, to: u32) -> Out {
        let (from, to) = (format!("2024-01-{from:02}"), format!("2024-01-{to:02}"));
        self.tidemark(&["backfill", "orders", "--from", &from, "--to", &to])
    }

    /// Runs tidemark with neither `--database-url` nor any environment
    /// override: for commands that must not need a database.
    pub fn tidemark_bare(&self, args: &[&str]) -> Out {
        let started = Instant::now();
        let output = Command::new(BIN)
            .current_dir(self.dir.path())
            .args(args)
            .env_remove("TIDEMARK_LOG")
            .env_remove("TIDEMARK_DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Out {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }

    /// Starts tidemark in the background; its output goes to files.
    pub fn spawn(&self, args: &[&str]) -> Running {
        self.spawn_at(&self.db.url(), args)
    }

    /// `status PIPELINE --json`: one object per run key.
    #[track_caller]
    pub fn status(&self, pipeline: &str) -> Vec<Json> {
        let out = self.tidemark(&["status", pipeline, "--json"]);
        out.expect_code(0, "status --json");
        out.json_lines()
    }

    /// The ledger entry of one period (`2024-01-05`), if the ledger has one.
    #[track_caller]
    pub fn status_of(&self, pipeline: &str, period: &str) -> Option<Json> {
        let out = self.tidemark(&["status", pipeline, "--period", period, "--json"]);
        out.expect_code(0, "status --period --json");
        // A period the ledger has no row for is a `missing` (or, not due
        // yet, a `not_due`) line.
        let mut lines: Vec<Json> = out
            .json_lines()
            .into_iter()
            .filter(|line| line["status"] != "missing" && line["status"] != "not_due")
            .collect();
        assert!(lines.len() <= 1, "one run key per period expected\n{out}");
        lines.pop()
    }

    /// Polls `status_of` until `pred` holds or `timeout` passes.
    pub fn wait_for_status(
        &self,
        pipeline: &str,
        period: &str,
        timeout: Duration,
        pred: impl Fn(&Json) -> bool,
    ) -> Json {
        let deadline = Instant::now() + timeout;
        loop {
            let entry = self.status_of(pipeline, period);
            if let Some(entry) = &entry {
                if pred(entry) {
                    return entry.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "status of {pipeline} {period} did not reach the expected state within {timeout:?}; last: {entry:?}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A fresh temporary working directory with an empty `pipelines/`.
fn work_dir() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("tidemark-test-")
        .tempdir()
        .expect("temp dir");
    fs::create_dir_all(dir.path().join("pipelines")).expect("pipelines dir");
    dir
}

/// A tidemark process running in the background.
pub struct Running {
    pub child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    started: Instant,
    args: String,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the exit (killing it after `timeout`) and returns its output.
    pub fn finish(mut self, timeout: Duration) -> Out {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "`tidemark {}` did not finish within {timeout:?}\n{}",
                    self.args,
                    self.output(None)
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.output(status.code())
    }

    /// Sends a signal by name (`TERM`, `INT`, `HUP`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {}", self.child.id());
    }

    /// The output so far, while it runs.
    pub fn output_so_far(&self) -> Out {
        self.output(None)
    }

    /// Waits until its stderr contains `text`, or panics after `timeout`.
    pub fn wait_for_stderr(&self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !fs::read_to_string(&self.stderr)
            .unwrap_or_default()
            .contains(text)
        {
            assert!(
                Instant::now() < deadline,
                "`tidemark {}` did not log {text:?} within {timeout:?}\n{}",
                self.args,
                self.output(None)
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9`, reaped (a zombie would still look alive in /proc).
    pub fn kill9(mut self) -> Out {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("wait");
        self.output(status.code())
    }

    fn output(&self, code: Option<i32>) -> Out {
        Out {
            code,
            stdout: fs::read_to_string(&self.stdout).unwrap_or_default(),
            stderr: fs::read_to_string(&self.stderr).unwrap_or_default(),
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Writes into a named pipe from a thread, so the test controls when a
/// reader gets its records and when it sees the end of the input.
pub struct FifoWriter {
    sender: Option<mpsc::Sender<Vec<u8>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FifoWriter {
    /// Creates the FIFO at `path` (replacing any file there).
    pub fn create(path: &Path) -> FifoWriter {
        let _ = fs::remove_file(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("fifo folder");
        }
        let status = Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("run mkfifo");
        assert!(status.success(), "mkfifo {} failed", path.display());
        let (sender, receiver) = mpsc::channel::<Vec<u8>>();
        let path = path.to_path_buf();
        let thread = thread::spawn(move || {
            // Blocks until a reader opens the FIFO.
            let Ok(mut fifo) = fs::OpenOptions::new().write(true).open(&path) else {
                return;
            };
            for chunk in receiver {
                if fifo.write_all(&chunk).and_then(|()| fifo.flush()).is_err() {
                    return;
                }
            }
        });
        FifoWriter {
            sender: Some(sender),
            thread: Some(thread),
        }
    }

    /// Queues bytes for the reader.
    pub fn write(&self, text: &str) {
        if let Some(sender) = &self.sender {
            let _ = sender.send(text.as_bytes().to_vec());
        }
    }

    /// Closes the writing end (the reader then sees end of file) once a
    /// reader has opened the FIFO and got everything written.
    pub fn close(mut self, timeout: Duration) {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + timeout;
            while !thread.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "no reader opened the FIFO within {timeout:?}"
                );
                thread::sleep(Duration::from_millis(20));
            }
            let _ = thread.join();
        }
    }
}

impl Drop for FifoWriter {
    fn drop(&mut self) {
        // Closing the channel lets the thread end once a reader opened the
        // FIFO; a thread still blocked in open() is left behind.
        self.sender.take();
    }
}
