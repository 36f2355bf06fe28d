//! The shared rate bucket on a real PostgreSQL: two stores (two pools, as
//! two processes would have) take from one bucket row, the refill follows
//! the database's clock, and a pause set through one holds the other.

mod support;

use std::time::{Duration, Instant};

use sqlx::Connection as _;
use tidemark_core::spec::RateLimit;
use tidemark_load::Store;

use support::TestDb;

const LIMIT: RateLimit = RateLimit {
    per_second: 4,
    burst: Some(1),
};

/// 40/s with a burst of 8 leases 5 tokens per round trip (bucket 5, hold
/// 100 ms). Twelve readers in two processes pull as fast as they can for
/// two seconds: no second sees more than 48 tokens, and the sustained rate
/// is reached.
#[tokio::test]
async fn leased_tokens_keep_every_second_within_the_limit() {
    let limit = RateLimit {
        per_second: 40,
        burst: Some(8),
    };
    let db = TestDb::new(true).await;
    let url = db.url.clone();
    let stores = [
        Store::connect(&url).await.unwrap(),
        Store::connect(&url).await.unwrap(),
    ];
    let start = Instant::now();
    let run_for = Duration::from_secs(2);
    let mut readers = Vec::new();
    for i in 0..12 {
        let gate = stores[i % 2].rate_gate("p", "s", limit).unwrap();
        readers.push(tokio::spawn(async move {
            let mut times = Vec::new();
            while start.elapsed() < run_for {
                gate.acquire().await.unwrap();
                times.push(start.elapsed());
            }
            times
        }));
    }
    let mut times = Vec::new();
    for reader in readers {
        times.extend(reader.await.unwrap());
    }
    times.sort();
    let busiest = times
        .iter()
        .map(|t| {
            times
                .iter()
                .filter(|o| **o >= *t && **o - *t < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    eprintln!(
        "{} tokens in {run_for:?}; busiest second {busiest}",
        times.len()
    );
    assert!(busiest <= 48, "{busiest} tokens within one second");
    assert!(times.len() >= 70, "the rate is reached: {}", times.len());
    for store in &stores {
        store.close().await;
    }
}

#[tokio::test]
async fn two_stores_share_one_bucket_and_one_pause() {
    let db = TestDb::new(true).await;
    let url = db.url.clone();
    let (a, b) = (
        Store::connect(&url).await.unwrap(),
        Store::connect(&url).await.unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("t.db").display());
    let sqlite = Store::connect(&sqlite).await.unwrap();
    assert!(
        sqlite.rate_gate("p", "s", LIMIT).is_none(),
        "SQLite keeps the in-process bucket"
    );
    sqlite.close().await;
    let gate_a = a.rate_gate("p", "s", LIMIT).unwrap();
    let gate_b = b.rate_gate("p", "s", LIMIT).unwrap();

    // The bucket starts full: 1 + burst tokens at once, from either store.
    let start = Instant::now();
    gate_a.acquire().await.unwrap();
    gate_b.acquire().await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
    // Then one every 1/4 s, whoever asks.
    for gate in [&gate_a, &gate_b, &gate_a, &gate_b] {
        gate.acquire().await.unwrap();
    }
    let paced = start.elapsed();
    assert!(
        paced >= Duration::from_millis(950) && paced < Duration::from_millis(1400),
        "4 more tokens at 4/s: {paced:?}"
    );

    // A pause set through one store holds the other, as long as it lasts.
    let paused = Instant::now();
    gate_a.pause_for(Duration::from_millis(800)).await.unwrap();
    gate_a.pause_for(Duration::from_millis(100)).await.unwrap();
    gate_b.acquire().await.unwrap();
    let waited = paused.elapsed();
    assert!(
        waited >= Duration::from_millis(780) && waited < Duration::from_millis(1200),
        "the pause held the other store: {waited:?}"
    );

    // A bucket the database cannot give is a database error naming the
    // source, never a request let through unlimited.
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("DROP TABLE _tm_rate_buckets")
        .execute(&mut conn)
        .await
        .unwrap();
    let _ = conn.close().await;
    let gate_c = b.rate_gate("p", "other", LIMIT).unwrap();
    let err = gate_c.acquire().await.unwrap_err();
    assert_eq!(err.class().as_str(), "database", "{err}");
    assert!(
        err.to_string().contains("rate limit of source other"),
        "{err}"
    );
    a.close().await;
    b.close().await;
}
