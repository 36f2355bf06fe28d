//! Run one period of a pipeline from your own `#[tokio::main]`, reading a
//! source tidemark does not ship: an in-memory generator whose checkpoint
//! is a counter.
//!
//! ```sh
//! cargo run --example custom_source -- sqlite://custom.db 2024-01-02
//! cargo run --example custom_source -- postgres://postgres@127.0.0.1/postgres 2024-01-02
//! ```
//!
//! The pipeline declares the source with `transport = "custom"`; the
//! program registers an [`OpenSource`] for its id. tidemark commits each
//! batch with the checkpoint the source returned, so a run killed part way
//! (try `kill -9` while `CUSTOM_SOURCE_BATCH_DELAY_MS=500` slows it down)
//! resumes after the last committed batch when started again, and the
//! table ends as after one uninterrupted run.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tidemark_core::{Origin, RawData, RawRecord};
use tidemark_engine::{
    Batch, BatchSource, Checkpoint, Engine, Error, OpenRequest, OpenSource, Outcome, Pipeline,
    Store,
};

/// The pipeline, built from TOML here (a file works the same way, with
/// `Pipeline::load`).
const PIPELINE: &str = r#"
name = "generated"
export_type = "readings"
version = "1"

[period]
granularity = "day"
timezone = "UTC"

[[sources]]
id = "generator"
transport = "custom"

[fields]
id      = { type = "text", required = true }
sensor  = { type = "text", required = true }
reading = { type = "int" }

[load]
table = "readings"
key = ["id"]
batch_size = 1000
"#;

/// Records the generator makes for each period.
const RECORDS: u64 = 5_000;

/// Opens the generator for a period.
struct Generator {
    /// A pause before each batch, so a test (or you) can kill the run
    /// between batches.
    delay: Duration,
}

/// One period's records, read from `next` on.
struct Reading {
    day: String,
    next: u64,
    batch_size: u64,
    delay: Duration,
}

#[async_trait::async_trait]
impl OpenSource for Generator {
    async fn open(&self, request: OpenRequest<'_>) -> Result<Box<dyn BatchSource>, Error> {
        // The checkpoint is ours: `{"v": 1, "next": N}`, the next record.
        let next = match request.resume {
            None => 0,
            Some(checkpoint) => match checkpoint.get("next").and_then(|n| n.as_u64()) {
                Some(next) if checkpoint["v"] == 1 && next <= RECORDS => next,
                _ => return Err(Error::StaleCheckpoint(format!("not ours: {checkpoint}"))),
            },
        };
        let batch_size = u64::try_from(request.batch_size())
            .unwrap_or(u64::MAX)
            .max(1);
        // The line the end-to-end test reads to tell where a run started.
        println!(
            "opened {} at record {next} (batch {})",
            request.period.label(),
            next / batch_size + 1
        );
        Ok(Box::new(Reading {
            day: request.period.label(),
            next,
            batch_size,
            delay: self.delay,
        }))
    }
}

#[async_trait::async_trait]
impl BatchSource for Reading {
    async fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        if self.next >= RECORDS {
            return Ok(None);
        }
        tokio::time::sleep(self.delay).await;
        let end = (self.next + self.batch_size).min(RECORDS);
        let resource: Arc<str> = Arc::from(format!("generator/{}", self.day));
        let records = (self.next..end)
            .map(|n| RawRecord {
                data: RawData::Json(serde_json::json!({
                    "id": format!("{}-{n}", self.day),
                    "sensor": format!("s{}", n % 7),
                    "reading": (n * 37) % 1000,
                })),
                origin: Origin {
                    resource: Arc::clone(&resource),
                    page: None,
                    record: n + 1,
                    line: None,
                },
            })
            .collect();
        self.next = end;
        let checkpoint: Checkpoint = serde_json::json!({ "v": 1, "next": end });
        Ok(Some(Batch {
            records,
            checkpoint,
        }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "sqlite://custom.db".into());
    let day = args.next().unwrap_or_else(|| "2024-01-02".into());
    let delay = std::env::var("CUSTOM_SOURCE_BATCH_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);

    let pipeline = Arc::new(Pipeline::parse(PIPELINE, Path::new("generated.toml"))?);
    let store = Store::connect(&url).await?;
    let engine = Engine::builder(store)
        .source("generator", Arc::new(Generator { delay }))
        .build();
    let period = pipeline.period(&day)?;
    let outcomes = engine.run_period(&pipeline, period).await;
    engine.close().await;
    for ran in outcomes? {
        match ran.outcome {
            Outcome::Done(result) | Outcome::AlreadyDone(result) => {
                println!("{}: done {result}", ran.key);
            }
            Outcome::Failed(error) => return Err(error),
            other => println!("{}: {other:?}", ran.key),
        }
    }
    Ok(())
}
