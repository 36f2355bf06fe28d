//! Issue 24 item 5, connections that fit a real PostgreSQL (ADR 0019): two
//! `serve` processes drain a queue through a real PgBouncer in transaction
//! mode with no key run twice, and twelve processes share a server started
//! with `max_connections = 20` without a run failing for want of a slot.
//! Real processes, a real pooler, a real second server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::db::TestDb;
use crate::support::pg::admin_url;
use crate::support::{Backend, Env, Out};

/// Rows of each hour's file.
const ROWS: i64 = 2;

/// Pipeline `p`: hourly UTC periods from 2024-01-01, one CSV file per hour
/// (`data/2024-01-01T05.csv`), retried patiently.
fn hourly_pipeline(env: &Env, hours: i64) {
    env.write(
        "pipelines/p.toml",
        r#"name = "p"
export_type = "hourly"
version = "1"

[period]
granularity = "hour"
start = "2024-01-01"

[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "../data/{period.start:%Y-%m-%dT%H}.csv"

[fields]
id = { type = "text", required = true }
v = { type = "int" }

[load]
table = "p"
key = ["id"]

[retry]
max_attempts = 8
base_delay = "200ms"
max_delay = "5s"
"#,
    );
    let start = chrono::NaiveDate::from_ymd_opt(2024, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("start");
    for h in 0..hours {
        let at = start + chrono::Duration::hours(h);
        let mut text = String::from("id,v\n");
        for n in 0..ROWS {
            text.push_str(&format!("h{h}-{n},{n}\n"));
        }
        env.write(format!("data/{}.csv", at.format("%Y-%m-%dT%H")), &text);
    }
}

/// The `--from`/`--to` of hours `first..=last` of 2024.
fn hour(h: i64) -> String {
    let start = chrono::NaiveDate::from_ymd_opt(2024, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("start");
    (start + chrono::Duration::hours(h))
        .format("%Y-%m-%dT%H")
        .to_string()
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// Waits until something accepts connections on `port`.
fn wait_for_port(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on {port} within 30 s; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `program args` as the `postgres` OS user when the test runs as
/// root (neither PgBouncer nor PostgreSQL runs as root), else as is.
fn as_postgres(program: &Path, args: &[&str]) -> Command {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program).args(args);
        cmd
    } else {
        let mut cmd = Command::new(program);
        cmd.args(args);
        cmd
    }
}

/// A folder the `postgres` OS user may write (the servers' files).
fn postgres_dir(env: &Env, name: &str) -> PathBuf {
    let dir = env.path(name);
    std::fs::create_dir_all(&dir).expect("create folder");
    // The test's temporary folder is root's, mode 0700.
    let _ = Command::new("chmod")
        .arg("755")
        .arg(env.dir.path())
        .status();
    let _ = Command::new("chown")
        .args(["-R", "postgres"])
        .arg(&dir)
        .status();
    dir
}

/// The host and port of the test server's URL.
fn server_address() -> (String, u16) {
    let url = admin_url();
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("127.0.0.1:5432");
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    match host_port.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), port.parse().unwrap_or(5432)),
        None => (host_port.to_string(), 5432),
    }
}

/// The name of the test's database on the test server.
fn database_name(env: &Env) -> String {
    match &env.db {
        TestDb::Postgres(pg) => pg.name.clone(),
        TestDb::Sqlite { .. } => panic!("a PostgreSQL test"),
    }
}

/// Debian's pgbouncer (in /usr/sbin, which may not be on PATH).
fn pgbouncer_binary() -> PathBuf {
    let packaged = PathBuf::from("/usr/sbin/pgbouncer");
    if packaged.exists() {
        return packaged;
    }
    PathBuf::from("pgbouncer")
}

/// A PgBouncer in transaction mode in front of the test server, on a port
/// of its own; stopped when dropped (also when the test panics).
struct PgBouncer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl PgBouncer {
    /// Starts it with `server_pool` server connections per database and user:
    /// fewer than its clients, so their transactions share server sessions.
    fn start(env: &Env, server_pool: u32) -> PgBouncer {
        let dir = postgres_dir(env, "pgbouncer");
        let port = free_port();
        let (host, server_port) = server_address();
        let log = dir.join("pgbouncer.log");
        let config = format!(
            "[databases]\n* = host={host} port={server_port}\n\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
             default_pool_size = {server_pool}\nmax_client_conn = 200\n\
             logfile = {log}\n",
            users = dir.join("users.txt").display(),
            log = log.display(),
        );
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("users");
        std::fs::write(dir.join("pgbouncer.ini"), config).expect("config");
        let _ = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .status();
        let ini = dir.join("pgbouncer.ini");
        let child = as_postgres(&pgbouncer_binary(), &[&ini.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer (scripts/test-setup.sh installs it)");
        wait_for_port(port, "pgbouncer", &log);
        PgBouncer { child, port, log }
    }

    /// The URL of database `name` through this PgBouncer.
    fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // runuser passes the signal on to pgbouncer.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a background tidemark, which must exit 0 within `timeout`.
fn finished(run: crate::support::Running, timeout: Duration, what: &str) -> Out {
    let out = run.finish(timeout);
    out.expect_code(0, what);
    out
}

/// Two `serve --no-schedule --drain` processes work a queue of 200 hourly
/// keys through PgBouncer in transaction mode, whose few server sessions
/// their transactions share: every key is done by exactly one attempt, each
/// row loaded once, and both processes took keys.
#[tokio::test]
async fn two_serves_drain_a_queue_through_pgbouncer_in_transaction_mode_postgres() {
    const HOURS: i64 = 200;
    let env = Env::new(Backend::Postgres).await;
    hourly_pipeline(&env, HOURS);
    let bouncer = PgBouncer::start(&env, 3);
    let pooled = bouncer.url(&database_name(&env));
    let (first, last) = (hour(0), hour(HOURS - 1));

    // Through PgBouncer the ledger is not created: a configuration error
    // that says to migrate against the server directly.
    let refused = env.tidemark_at(
        &pooled,
        &[
            "--pgbouncer",
            "backfill",
            "p",
            "--from",
            &first,
            "--to",
            &last,
            "--enqueue",
        ],
    );
    refused.expect_code(2, "no ledger through PgBouncer");
    assert!(
        refused.stderr.contains("tidemark migrate") && refused.stderr.contains("directly"),
        "{refused}"
    );
    env.tidemark(&["migrate"])
        .expect_code(0, "migrate directly");

    env.tidemark_at(
        &pooled,
        &[
            "--pgbouncer",
            "backfill",
            "p",
            "--from",
            &first,
            "--to",
            &last,
            "--enqueue",
        ],
    )
    .expect_code(0, "enqueue through PgBouncer");
    let serve = [
        "--pgbouncer",
        "serve",
        "--no-schedule",
        "--drain",
        "--workers",
        "2",
        "--poll-interval",
        "200ms",
    ];
    let a = env.spawn_at(&pooled, &serve);
    let b = env.spawn_at(&pooled, &serve);
    let a = finished(a, Duration::from_secs(240), "serve A through PgBouncer");
    let b = finished(b, Duration::from_secs(240), "serve B through PgBouncer");
    for out in [&a, &b] {
        assert!(
            !out.stderr.contains("prepared statement"),
            "no prepared statement crossed server sessions\n{out}"
        );
    }

    let runs = env
        .db
        .rows(
            "SELECT CAST(COUNT(*) AS TEXT),
                    CAST(COUNT(*) FILTER (WHERE status = 'done') AS TEXT),
                    CAST(COUNT(*) FILTER (WHERE attempt = 1) AS TEXT),
                    CAST(SUM(rows_inserted) AS TEXT), CAST(SUM(rows_updated) AS TEXT)
             FROM _tm_runs",
        )
        .await;
    let expect = |n: i64| Some(n.to_string());
    assert_eq!(
        runs[0],
        vec![
            expect(HOURS),
            expect(HOURS),
            expect(HOURS),
            expect(HOURS * ROWS),
            expect(0)
        ],
        "every key done once, by its first attempt, its rows inserted once\n{a}\n{b}"
    );
    let attempts = env
        .db
        .rows(
            "SELECT CAST(COUNT(*) AS TEXT), CAST(COUNT(DISTINCT run_ref) AS TEXT),
                    CAST(COUNT(*) FILTER (WHERE status = 'done') AS TEXT),
                    CAST(COUNT(DISTINCT worker) AS TEXT)
             FROM _tm_attempts",
        )
        .await;
    assert_eq!(
        attempts[0][..3],
        [expect(HOURS), expect(HOURS), expect(HOURS)],
        "one attempt per key, done: no key ran twice"
    );
    assert_eq!(
        attempts[0][3],
        expect(2),
        "both processes took keys through PgBouncer"
    );
    assert_eq!(
        env.db.count("FROM p").await,
        HOURS * ROWS,
        "each row loaded once"
    );
    let log = std::fs::read_to_string(&bouncer.log).unwrap_or_default();
    assert!(
        log.contains(&format!("{}", bouncer.port)),
        "the processes went through PgBouncer:\n{log}"
    );
}

/// The newest PostgreSQL server binaries of the machine (Debian's layout).
fn postgres_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL installed in /usr/lib/postgresql (scripts/test-setup.sh)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("pg_ctl").exists())
        .collect();
    versions.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop().expect("a PostgreSQL with pg_ctl")
}

/// A PostgreSQL server of the test's own, with few connection slots;
/// stopped when dropped.
struct SmallServer {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
}

impl SmallServer {
    fn start(env: &Env, max_connections: u32) -> SmallServer {
        let bin = postgres_bin();
        let root = postgres_dir(env, "small-server");
        let data = root.join("data");
        let log = root.join("server.log");
        let init = as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                &data.display().to_string(),
                "--auth=trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        )
        .stdout(Stdio::null())
        .output()
        .expect("initdb");
        assert!(
            init.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let port = free_port();
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c max_connections={max_connections} -c fsync=off -c shared_buffers=16MB",
            root.display()
        );
        let started = as_postgres(
            &bin.join("pg_ctl"),
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &log.display().to_string(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        )
        .stdout(Stdio::null())
        .output()
        .expect("pg_ctl start");
        assert!(
            started.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&started.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        wait_for_port(port, "the small PostgreSQL", &log);
        SmallServer { bin, data, port }
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for SmallServer {
    fn drop(&mut self) {
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "stop",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    }
}

/// Twelve `backfill --concurrency 4` processes on distinct ranges share a
/// server with `max_connections = 20`, far fewer than their pools could
/// open together: connections the server refuses ("sorry, too many
/// clients already") are waited for and retried, no run fails, and every
/// key is done.
#[tokio::test]
async fn twelve_processes_fit_a_server_with_twenty_connection_slots_postgres() {
    const PROCESSES: i64 = 12;
    const HOURS_EACH: i64 = 10;
    let env = Env::new(Backend::Postgres).await;
    hourly_pipeline(&env, PROCESSES * HOURS_EACH);
    let server = SmallServer::start(&env, 20);
    let url = server.url("postgres");
    env.tidemark_at(&url, &["migrate"])
        .expect_code(0, "migrate the small server");

    let started = Instant::now();
    let runs: Vec<_> = (0..PROCESSES)
        .map(|i| {
            let (from, to) = (hour(i * HOURS_EACH), hour((i + 1) * HOURS_EACH - 1));
            env.spawn_at(
                &url,
                &[
                    "backfill",
                    "p",
                    "--from",
                    &from,
                    "--to",
                    &to,
                    "--concurrency",
                    "4",
                ],
            )
        })
        .collect();
    let outs: Vec<Out> = runs
        .into_iter()
        .enumerate()
        .map(|(i, run)| finished(run, Duration::from_secs(300), &format!("backfill {i}")))
        .collect();
    let waited = outs
        .iter()
        .filter(|o| o.stderr.contains("no free connection slot"))
        .count();
    eprintln!(
        "{PROCESSES} processes done in {:?}; {waited} waited for a connection slot at some point",
        started.elapsed()
    );
    for out in &outs {
        assert!(!out.stderr.contains("run failed"), "no run failed\n{out}");
    }

    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("connect to the small server");
    let (done, rows): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM _tm_runs WHERE status = 'done'), (SELECT COUNT(*) FROM p)",
    )
    .fetch_one(&mut conn)
    .await
    .expect("count");
    let _ = sqlx::Connection::close(conn).await;
    assert_eq!(
        (done, rows),
        (PROCESSES * HOURS_EACH, PROCESSES * HOURS_EACH * ROWS),
        "every key done, every row loaded"
    );
}
