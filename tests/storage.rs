//! The database's storage fails: a full disk. The run rolls back at once,
//! fails naming the cause, the command stops claiming more work, the
//! database stays intact, and the next run after freeing space completes.
//!
//! The small disks are tmpfs mounts made by the test (tests run as root, as
//! in CI).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sqlx::Connection as _;

use crate::support::pg::PgTablespace;
use crate::support::{Backend, Env, DEFAULT_PG_URL};

/// A tmpfs of a given size, unmounted when dropped.
pub(crate) struct SmallDisk {
    pub(crate) path: PathBuf,
}

impl SmallDisk {
    pub(crate) fn mount(path: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(path).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {size} tmpfs at {} failed: these tests need root (as in CI)",
            path.display()
        );
        SmallDisk {
            path: path.to_path_buf(),
        }
    }

    /// KiB in use, as `df` counts them.
    pub(crate) fn used_kib(&self) -> u64 {
        let out = Command::new("df")
            .args(["-k", "--output=used"])
            .arg(&self.path)
            .output()
            .expect("run df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df prints the KiB used")
    }

    pub(crate) fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount {}", self.path.display());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

pub(crate) fn january(env: &Env, url: &str) -> crate::support::Out {
    env.tidemark_at(
        url,
        &[
            "backfill",
            "orders",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-31",
            "--concurrency",
            "2",
        ],
    )
}

/// Asserts the failed backfill: quick, the cause named, work stopped.
fn assert_stopped_on_full_disk(out: &crate::support::Out) {
    out.expect_code(1, "backfill onto a full disk");
    assert!(
        out.elapsed < Duration::from_secs(20),
        "fails at once instead of waiting on locks\n{out}"
    );
    let cause = out.stderr.contains("disk is full")
        || out.stderr.contains("No space left on device")
        || out.stderr.contains("could not extend");
    assert!(cause, "the real cause is named\n{out}");
    assert!(out.stderr.contains("stopped claiming work"), "{out}");
    assert!(
        out.stdout.contains("not run"),
        "later periods are not run\n{out}"
    );
}

/// A small disk of `size` in the test's folder, the SQLite file on it,
/// and that file's URL.
pub(crate) fn sqlite_on_small_disk(env: &Env, size: &str) -> (SmallDisk, PathBuf, String) {
    let disk = SmallDisk::mount(&env.path("small-disk"), size);
    let file = disk.path.join("t.db");
    let url = format!("sqlite://{}", file.display());
    (disk, file, url)
}

/// After more space: every period done exactly once.
async fn assert_recovers(env: &Env, url: &str) {
    january(env, url).expect_code(0, "backfill after freeing space");
    let entries = env.status("orders");
    assert_eq!(entries.len(), 31);
    assert!(entries.iter().all(|e| e["status"] == "done"), "{entries:?}");
    assert_eq!(env.db.count("FROM orders").await, 620, "each row once");
}

#[tokio::test]
async fn full_disk_fails_fast_stops_claiming_and_recovers_sqlite() {
    let mut env = Env::orders(Backend::Sqlite).await;
    // The ledger's migrations go in first, on a roomy disk, which then
    // shrinks to what they use plus a little: the disk fills during the
    // backfill, whatever the migrations weigh.
    let (disk, file, url) = sqlite_on_small_disk(&env, "64M");
    env.tidemark_at(&url, &["migrate"])
        .expect_code(0, "migrate on the roomy disk");
    disk.resize(&format!("{}k", disk.used_kib() + 96));
    let out = january(&env, &url);
    assert_stopped_on_full_disk(&out);
    disk.resize("64M");
    let integrity = Command::new("sqlite3")
        .arg(&file)
        .arg("PRAGMA integrity_check")
        .output();
    if let Ok(integrity) = integrity {
        assert_eq!(String::from_utf8_lossy(&integrity.stdout).trim(), "ok");
    }
    env.db = crate::support::TestDb::Sqlite { path: file };
    assert_recovers(&env, &url).await;
}

/// A disk too small for the ledger's migrations: the command fails at
/// once naming the cause (no retries as if another process raced it, no
/// 60 s wait on a connection left inside the failed migration), and runs
/// once there is space.
#[tokio::test]
async fn full_disk_during_migration_fails_fast_and_recovers_sqlite() {
    let mut env = Env::orders(Backend::Sqlite).await;
    let (disk, file, url) = sqlite_on_small_disk(&env, "96k");
    let out = january(&env, &url);
    out.expect_code(1, "backfill onto a disk too small for the ledger");
    assert!(
        out.elapsed < Duration::from_secs(20),
        "fails at once\n{out}"
    );
    assert!(out.stderr.contains("ledger migration failed"), "{out}");
    assert!(
        out.stderr.contains("disk is full"),
        "the cause is named\n{out}"
    );
    disk.resize("64M");
    env.db = crate::support::TestDb::Sqlite { path: file };
    assert_recovers(&env, &url).await;
}

/// PostgreSQL: the test database's default tablespace lives on a small
/// tmpfs, so the ledger and the destination table fill it.
#[tokio::test]
async fn full_disk_fails_fast_stops_claiming_and_recovers_postgres() {
    let space = format!("tm_small_{}", std::process::id());
    // Dropped after the test database that uses it, also on a panic.
    let _tablespace = PgTablespace {
        name: space.clone(),
    };
    let env = Env::orders(Backend::Postgres).await;
    let disk = SmallDisk::mount(&env.path("small-disk"), "1M");
    let status = Command::new("chown")
        .args(["postgres:postgres"])
        .arg(&disk.path)
        .status()
        .expect("chown");
    assert!(status.success());
    let admin_url =
        std::env::var("TIDEMARK_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string());
    let mut admin = sqlx::PgConnection::connect(&admin_url)
        .await
        .expect("admin");
    sqlx::query(&format!(
        "CREATE TABLESPACE {space} LOCATION '{}'",
        disk.path.display()
    ))
    .execute(&mut admin)
    .await
    .expect("tablespace");
    let name = env
        .db
        .url()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    sqlx::query(&format!(
        "ALTER DATABASE \"{name}\" SET default_tablespace = {space}"
    ))
    .execute(&mut admin)
    .await
    .expect("default tablespace");
    env.tidemark(&["migrate"]).expect_code(0, "the ledger fits");
    // Fill most of the disk so the first days do not fit.
    env.db
        .execute(
            "CREATE TABLE ballast AS SELECT repeat('x', 1000) AS pad FROM generate_series(1, 600)",
        )
        .await;
    let url = env.db.url();
    let out = january(&env, &url);
    assert_stopped_on_full_disk(&out);
    disk.resize("64M");
    assert_recovers(&env, &url).await;
    drop(env);
    let _ = sqlx::query(&format!("DROP TABLESPACE IF EXISTS {space}"))
        .execute(&mut admin)
        .await;
}
