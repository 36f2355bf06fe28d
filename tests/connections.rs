//! How tidemark connects: TLS to PostgreSQL, and errors that name the real
//! cause (a refused connection, a file that is not a database) in seconds.

use std::time::Duration;

use crate::support::{Backend, Csv, Env, FifoWriter};

/// The test server's URL with `query` appended.
fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

/// How many connections of `application_name` are open, and whether all
/// of them are encrypted (PostgreSQL's own view of the sessions).
async fn sessions(env: &Env, application: &str) -> (i64, bool) {
    let rows = env
        .db
        .rows(&format!(
            "SELECT CAST(COUNT(*) AS TEXT), CAST(COALESCE(bool_and(s.ssl), false) AS TEXT)
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.application_name = '{application}'"
        ))
        .await;
    let count = rows[0][0].as_deref().unwrap_or("0").parse().unwrap_or(0);
    (count, rows[0][1].as_deref() == Some("true"))
}

/// Runs January `day` with its export behind a FIFO, so the process stays
/// connected while the test looks at its sessions; returns whether every
/// session was encrypted, and checks the day loaded.
async fn day_over(env: &Env, day: u32, url: &str, application: &str) -> bool {
    let path = env.path(format!("pipelines/data/orders/2024/01/{day:02}/orders.csv"));
    let export = std::fs::read_to_string(&path).expect("read export");
    let fifo = FifoWriter::create(&path);
    let period = format!("2024-01-{day:02}");
    let run = env.spawn_at(url, &["run", "orders", "--period", &period]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut count, mut encrypted) = (0, false);
    while count == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no session of {application} appeared"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        (count, encrypted) = sessions(env, application).await;
    }
    fifo.write(&export);
    fifo.close(Duration::from_secs(30));
    run.finish(Duration::from_secs(60))
        .expect_code(0, &format!("day {day} over {url}"));
    let rows = Csv::parse(&export).rows.len();
    let loaded = env
        .db
        .count(&format!(
            "FROM orders WHERE order_id LIKE 'O-202401{day:02}-%'"
        ))
        .await;
    assert_eq!(
        loaded,
        i64::try_from(rows).unwrap(),
        "day {day} loaded over {url}"
    );
    encrypted
}

/// `sslmode=require` and `verify-full` (against the server's own
/// certificate) work, and the default `prefer` now encrypts when the
/// server offers TLS instead of silently sending rows in plaintext.
/// Debian's PostgreSQL runs with `ssl = on` and a snakeoil certificate for
/// `localhost`.
#[tokio::test]
async fn postgres_connections_use_tls_postgres() {
    let env = Env::orders(Backend::Postgres).await;
    let url = env.db.url();
    let require = with_query(&url, "sslmode=require&application_name=tm_tls_require");
    assert!(
        day_over(&env, 5, &require, "tm_tls_require").await,
        "sslmode=require encrypts"
    );
    let prefer = with_query(&url, "application_name=tm_tls_prefer");
    assert!(
        day_over(&env, 6, &prefer, "tm_tls_prefer").await,
        "the default (prefer) encrypts when the server offers TLS"
    );
    let cert = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    let full = with_query(
        &url.replace("127.0.0.1", "localhost"),
        &format!("sslmode=verify-full&sslrootcert={cert}&application_name=tm_tls_full"),
    );
    let out = env.tidemark_at(&full, &["status", "orders", "--json"]);
    out.expect_code(0, "verify-full against the server's certificate");
    // The certificate names localhost, not 127.0.0.1: verify-full refuses.
    let wrong_name = with_query(&url, &format!("sslmode=verify-full&sslrootcert={cert}"));
    let out = env.tidemark_at(&wrong_name, &["status", "orders"]);
    out.expect_code(1, "verify-full with a name the certificate does not hold");
    assert!(out.stderr.contains("certificate"), "{out}");
}

/// A PostgreSQL server that refuses connections is reported as such
/// within seconds (was: 60 s, then "pool timed out"), with exit 1.
#[tokio::test]
async fn refused_connection_names_the_cause_within_seconds_postgres() {
    let env = Env::orders(Backend::Postgres).await;
    // A port nothing listens on.
    let url = "postgres://postgres@127.0.0.1:1/postgres";
    for args in [
        &["run", "orders", "--period", "2024-01-05"][..],
        &["status", "orders"][..],
    ] {
        let out = env.tidemark_at(url, args);
        out.expect_code(1, "refused connection");
        assert!(out.stderr.contains("Connection refused"), "{out}");
        assert!(
            out.stderr.contains("127.0.0.1:1"),
            "names the server\n{out}"
        );
        assert!(out.elapsed < Duration::from_secs(15), "{out}");
    }
}

/// SQLite open errors name the file.
#[tokio::test]
async fn sqlite_open_errors_name_the_file_sqlite() {
    let env = Env::orders(Backend::Sqlite).await;
    std::fs::write(
        env.path("garbage.db"),
        "this is not a database at all, not even close\n".repeat(100),
    )
    .expect("write");
    let out = env.tidemark_at("sqlite://garbage.db", &["status", "orders"]);
    out.expect_code(1, "not a database");
    assert!(
        out.stderr.contains("garbage.db") && out.stderr.contains("not a database"),
        "{out}"
    );
    let missing = env.path("no/such/folder/t.db");
    let url = format!("sqlite://{}", missing.display());
    let out = env.tidemark_at(&url, &["run", "orders", "--period", "2024-01-05"]);
    out.expect_code(1, "unopenable path");
    assert!(out.stderr.contains(&missing.display().to_string()), "{out}");
    assert!(out.stderr.contains("unable to open"), "{out}");
    // `status` only reads: a file that is not there holds no ledger, and it
    // says which file it looked at instead of creating one (issue 19).
    let out = env.tidemark_at(&url, &["status", "orders"]);
    out.expect_code(0, "status of a file that is not there");
    assert!(out.stderr.contains(&missing.display().to_string()), "{out}");
    assert!(!missing.exists(), "status created no file");
}
