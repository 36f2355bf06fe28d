//! OpenLineage run events of a pipeline's attempts (ADR 0024).
//!
//! One event per change of an attempt (START, COMPLETE, FAIL, ABORT),
//! built from a notice of the outbox. The run id is a UUID v5 of the run
//! key and the attempt, so every event of one attempt names the same run
//! whichever process sends it, and a resent event is the same event. The
//! nominal time is the period; the job is the pipeline and source; the
//! output dataset is the destination table with the ledger's counts.

use tidemark_core::spec::SourceSpec;
use tidemark_core::Pipeline;
use tidemark_load::OutboxNotice;

/// The OpenLineage spec version the events follow.
const SCHEMA_URL: &str = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent";
const NOMINAL_TIME: &str =
    "https://openlineage.io/spec/facets/1-0-1/NominalTimeRunFacet.json#/$defs/NominalTimeRunFacet";
const OUTPUT_STATISTICS: &str = "https://openlineage.io/spec/facets/1-0-2/OutputStatisticsOutputDatasetFacet.json#/$defs/OutputStatisticsOutputDatasetFacet";

/// The `producer` of every event and facet.
pub const PRODUCER: &str = concat!(
    "https://github.com/tidemark/tidemark/tree/v",
    env!("CARGO_PKG_VERSION")
);

/// The namespace of run ids (a UUID v5 of the text below in the URL
/// namespace): fixed forever, so run ids never change between versions.
fn run_namespace() -> uuid::Uuid {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_URL,
        b"https://tidemark/openlineage/run",
    )
}

/// The run id of attempt `attempt` of a run key.
pub fn run_id(
    pipeline: &str,
    source: &str,
    export_type: &str,
    period_start: &str,
    attempt: i64,
) -> uuid::Uuid {
    let name =
        serde_json::json!([pipeline, source, export_type, period_start, attempt]).to_string();
    uuid::Uuid::new_v5(&run_namespace(), name.as_bytes())
}

/// The OpenLineage `RunEvent` of a lineage notice.
pub fn event(pipeline: &Pipeline, namespace: &str, notice: &OutboxNotice) -> serde_json::Value {
    let p = &notice.payload;
    let count = |k: &str| {
        p.get("counts")
            .and_then(|c| c.get(k))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let written = count("rows_inserted") + count("rows_updated") + count("rows_unchanged");
    let period_end = p
        .get("period_end")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let run = run_id(
        &notice.pipeline,
        &notice.source,
        &notice.export_type,
        &notice.period_start,
        notice.attempt,
    );
    let mut output = serde_json::json!({
        "namespace": namespace,
        "name": pipeline.spec.load.table,
    });
    if notice.kind == "COMPLETE" {
        output["outputFacets"] = serde_json::json!({
            "outputStatistics": {
                "_producer": PRODUCER,
                "_schemaURL": OUTPUT_STATISTICS,
                "rowCount": written,
            }
        });
    }
    serde_json::json!({
        "eventType": notice.kind,
        "eventTime": notice.created_at,
        "producer": PRODUCER,
        "schemaURL": SCHEMA_URL,
        "run": {
            "runId": run.to_string(),
            "facets": {
                "nominalTime": {
                    "_producer": PRODUCER,
                    "_schemaURL": NOMINAL_TIME,
                    "nominalStartTime": notice.period_start,
                    "nominalEndTime": period_end,
                }
            }
        },
        "job": {
            "namespace": namespace,
            "name": format!("{}.{}", notice.pipeline, notice.source),
        },
        "inputs": [{
            "namespace": namespace,
            "name": input_name(pipeline, &notice.source),
        }],
        "outputs": [output],
    })
}

/// The input dataset's name: the source without secrets (an HTTP URL with
/// its `${…}` shown as names and a password as `***`, a file path
/// template, a custom source's id).
fn input_name(pipeline: &Pipeline, source: &str) -> String {
    match pipeline.source(source) {
        Some(SourceSpec::Http(h)) => {
            tidemark_load::redact_url(&tidemark_core::spec::redacted_url(&h.url))
        }
        Some(SourceSpec::File(f)) => f.path.clone(),
        _ => source.to_string(),
    }
}
