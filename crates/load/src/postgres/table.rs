//! Destination tables on PostgreSQL: native column types, `COPY`-based
//! batch writes and key-based reconciliation.
//!
//! The write path (see docs/adr/0002-postgres-load-path.md):
//! 1. rows whose hash matches the stored one were already dropped in memory;
//! 2. a batch of keys new to the run key is first `COPY`ed straight into the
//!    table inside a savepoint — the common first-backfill case, at `COPY`
//!    speed; a unique violation rolls the savepoint back and switches the
//!    run to step 3;
//! 3. otherwise the batch is `COPY`ed into a temporary staging table and
//!    merged with one `INSERT … SELECT … ON CONFLICT DO UPDATE … WHERE the
//!    hash or run key differs`, so identical rows are never rewritten.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, FieldType, Row, Value};

use super::copy_binary::{encode_rows, LineageValues};
use super::driver::PgTx;
use super::PgStore;
use crate::db_error::DbResultExt;
use crate::schema::{compare_columns, quote, TableSchema, DELETED_AT, LINEAGE_COLUMNS, RAW_HASH};
use crate::writer::{BatchOutcome, BatchWrite, Lineage, Stamp, WriteCounts};

/// The PostgreSQL type of a field type.
fn pg_type(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Text => "text",
        FieldType::Int => "bigint",
        FieldType::Float => "double precision",
        FieldType::Decimal => "numeric",
        FieldType::Bool => "boolean",
        FieldType::Date => "date",
        FieldType::Timestamp => "timestamp",
        FieldType::Timestamptz => "timestamptz",
        FieldType::Json => "jsonb",
    }
}

/// How `information_schema.columns.data_type` names [`pg_type`].
fn information_schema_type(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Timestamp => "timestamp without time zone",
        FieldType::Timestamptz => "timestamp with time zone",
        other => pg_type(other),
    }
}

fn lineage_type(column: &str) -> &'static str {
    match column {
        "_tm_period_start" | "_tm_loaded_at" => "timestamptz NOT NULL",
        _ => "text NOT NULL",
    }
}

pub(super) async fn ensure_table(store: &PgStore, schema: &TableSchema) -> Result<(), Error> {
    let mut tx = PgTx::begin(store).await?;
    // Concurrent CREATE TABLE IF NOT EXISTS can still collide in the
    // catalog; serialise DDL on this table across every worker.
    tx.query("SELECT pg_advisory_xact_lock(hashtext('tidemark.ddl.' || $1))")
        .bind(&schema.table)
        .execute(tx.connection())
        .await
        .db()?;
    let exists: bool = tx
        .query_scalar("SELECT to_regclass(quote_ident($1)) IS NOT NULL")
        .bind(&schema.table)
        .fetch_one(tx.connection())
        .await
        .db()?;
    if exists {
        check_table(&mut tx, schema).await?;
    } else {
        create_table(&mut tx, schema).await?;
    }
    tx.commit_now().await
}

/// The type of tidemark's nullable columns ([`RAW_HASH`], [`DELETED_AT`]).
fn extra_type(column: &str) -> &'static str {
    match column {
        DELETED_AT => "timestamptz",
        _ => "text",
    }
}

async fn create_table(tx: &mut PgTx, schema: &TableSchema) -> Result<(), Error> {
    let mut columns: Vec<String> = schema
        .columns
        .iter()
        .map(|(name, ty)| format!("{} {}", quote(name), pg_type(*ty)))
        .collect();
    columns.extend(
        LINEAGE_COLUMNS
            .iter()
            .map(|c| format!("{c} {}", lineage_type(c))),
    );
    columns.push(format!("{RAW_HASH} {}", extra_type(RAW_HASH)));
    if schema.soft_delete {
        columns.push(format!("{DELETED_AT} {}", extra_type(DELETED_AT)));
    }
    columns.push(format!("UNIQUE ({})", key_list(schema)));
    let table = quote(&schema.table);
    tx.query(&format!(
        "CREATE TABLE {table} (\n  {}\n)",
        columns.join(",\n  ")
    ))
    .execute(tx.connection())
    .await
    .db()?;
    tx.query(&format!(
        "CREATE INDEX {} ON {table} (_tm_source, _tm_export_type, _tm_period_start)",
        quote(&format!(
            "{}{}",
            schema.table,
            tidemark_core::spec::RUN_KEY_INDEX_SUFFIX
        ))
    ))
    .execute(tx.connection())
    .await
    .db()?;
    tracing::info!(table = %schema.table, "created destination table");
    Ok(())
}

/// An existing table must have every field with its type, the lineage
/// columns, no other column, and a UNIQUE index on exactly the natural key.
/// A field it lacks that is neither required nor in the key is added as a
/// nullable column, in the caller's transaction under the DDL advisory
/// lock, so two workers cannot both add it.
async fn check_table(tx: &mut PgTx, schema: &TableSchema) -> Result<(), Error> {
    let actual: Vec<(String, String)> = tx
        .query_as(
            "SELECT column_name::text, data_type::text FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = $1",
        )
        .bind(&schema.table)
        .fetch_all(tx.connection())
        .await
        .db()?;
    let check = compare_columns(
        schema,
        &actual,
        |ty, declared| declared == information_schema_type(ty),
        pg_type,
    );
    let contract = |message: String| Error::Contract {
        table: schema.table.clone(),
        message,
    };
    if !check.problems.is_empty() {
        return Err(contract(check.problems.join("; ")));
    }
    let unique_sets: Vec<Vec<String>> = tx
        .query_scalar(
            "SELECT array_agg(a.attname::text) FROM pg_index i
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
         WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisunique
         GROUP BY i.indexrelid",
        )
        .bind(&schema.table)
        .fetch_all(tx.connection())
        .await
        .db()?;
    let key: HashSet<&str> = schema.key_columns().map(|(n, _)| n.as_str()).collect();
    let keyed = unique_sets
        .iter()
        .any(|cols| cols.len() == key.len() && cols.iter().all(|c| key.contains(c.as_str())));
    if !keyed {
        let names: Vec<&str> = schema.key_columns().map(|(n, _)| n.as_str()).collect();
        return Err(contract(format!(
            "no UNIQUE constraint on exactly the natural key ({})",
            names.join(", ")
        )));
    }
    if !check.to_add.is_empty() {
        let adds: Vec<String> = check
            .to_add
            .iter()
            .map(|&i| {
                let (name, ty) = &schema.columns[i];
                format!("ADD COLUMN {} {}", quote(name), pg_type(*ty))
            })
            .collect();
        tx.query(&format!(
            "ALTER TABLE {} {}",
            quote(&schema.table),
            adds.join(", ")
        ))
        .execute(tx.connection())
        .await
        .db()?;
        for &i in &check.to_add {
            tracing::info!(table = %schema.table, column = %schema.columns[i].0, "added column (new field)");
        }
    }
    for column in check.extra_to_add {
        tx.query(&format!(
            "ALTER TABLE {} ADD COLUMN {column} {}",
            quote(&schema.table),
            extra_type(column)
        ))
        .execute(tx.connection())
        .await
        .db()?;
        tracing::info!(table = %schema.table, column, "added column");
    }
    Ok(())
}

fn key_list(schema: &TableSchema) -> String {
    schema
        .key_columns()
        .map(|(n, _)| quote(n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The batch in binary `COPY` encoding: values, then lineage columns.
pub(super) fn copy_data(
    schema: &TableSchema,
    rows: &[(&Row, crate::writer::Write)],
    stamp: &Stamp<'_>,
) -> Result<Vec<u8>, Error> {
    let period_start = &stamp.lineage.period_start;
    let period_start = DateTime::parse_from_rfc3339(period_start)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| Error::Invariant(format!("period start {period_start:?}: {e}")))?;
    let lineage = LineageValues {
        source: &stamp.lineage.source,
        export_type: &stamp.lineage.export_type,
        period_start,
        run_id: stamp.run_id,
        loaded_at: stamp.loaded_at,
    };
    encode_rows(rows, schema, &lineage)
}

fn column_list(schema: &TableSchema) -> String {
    let mut names: Vec<String> = schema.columns.iter().map(|(n, _)| quote(n)).collect();
    names.extend(LINEAGE_COLUMNS.iter().map(ToString::to_string));
    names.push(RAW_HASH.to_string());
    names.join(", ")
}

/// A binary `COPY … FROM STDIN`. Until it has ended (finished, aborted or
/// failed), a dropped transaction closes its connection: sqlx's `COPY` in,
/// dropped, sends `CopyFail` without counting the answer it is owed.
async fn copy_into(
    tx: &mut PgTx,
    table: &str,
    columns: &str,
    data: &[u8],
) -> Result<u64, sqlx::Error> {
    tx.copy_open(true);
    let copied = async {
        let mut copy = tx
            .connection()
            .copy_in_raw(&format!(
                "COPY {table} ({columns}) FROM STDIN (FORMAT binary)"
            ))
            .await?;
        if let Err(e) = copy.send(data).await {
            let _ = copy.abort(e.to_string()).await;
            return Err(e);
        }
        copy.finish().await
    }
    .await;
    tx.copy_open(false);
    copied
}

pub(super) async fn write_rows(
    tx: &mut PgTx,
    schema: &TableSchema,
    batch: &BatchWrite<'_>,
    data: &[u8],
) -> Result<BatchOutcome, Error> {
    let mut outcome = BatchOutcome::default();
    if batch.rows.is_empty() {
        return Ok(outcome);
    }
    let columns = column_list(schema);
    // No savepoint around the optimistic COPY: two round trips for every
    // batch of a fresh period (most of a tiny period's) to spare the rare
    // conflict a whole transaction. On a conflict the transaction is
    // aborted, and the caller runs it again through the staging table.
    if batch.try_direct_copy {
        match copy_into(tx, &quote(&schema.table), &columns, data).await {
            Ok(n) => {
                outcome.written.inserted = n;
                return Ok(outcome);
            }
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23505") => {
                tracing::debug!("direct COPY met existing keys; merging through a staging table");
                outcome.direct_copy_conflict = true;
                return Ok(outcome);
            }
            Err(e) => return Err(crate::db_error::db_error(e)),
        }
    }
    outcome.written = merge_through_stage(tx, schema, &columns, data, batch.rows.len()).await?;
    Ok(outcome)
}

async fn merge_through_stage(
    tx: &mut PgTx,
    schema: &TableSchema,
    columns: &str,
    data: &[u8],
    staged: usize,
) -> Result<WriteCounts, Error> {
    let table = quote(&schema.table);
    let stage = quote(&stage_name(schema, columns));
    tx.query(&format!(
        "CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
    ))
    .execute(tx.connection())
    .await
    .db()?;
    copy_into(tx, &stage, columns, data).await.db()?;
    let mut sets: Vec<String> = schema
        .columns
        .iter()
        .map(|(n, _)| format!("{0} = EXCLUDED.{0}", quote(n)))
        .collect();
    sets.extend(
        LINEAGE_COLUMNS
            .iter()
            .map(|c| format!("{c} = EXCLUDED.{c}")),
    );
    // Written with the row, never compared: a row whose raw record changed
    // but whose typed values did not stays as it is (its stored raw hash
    // then no longer matches, so its record is typed next time).
    sets.push(format!("{RAW_HASH} = EXCLUDED.{RAW_HASH}"));
    let mut differs = String::from(
        "t._tm_row_hash IS DISTINCT FROM EXCLUDED._tm_row_hash
         OR t._tm_source IS DISTINCT FROM EXCLUDED._tm_source
         OR t._tm_export_type IS DISTINCT FROM EXCLUDED._tm_export_type
         OR t._tm_period_start IS DISTINCT FROM EXCLUDED._tm_period_start",
    );
    // The ownership rule (ADR 0006): a row belongs to the latest period that
    // holds it, so another run key's row is taken over only from an earlier
    // period (or when soft-deleted); an equal period start keeps it where it is.
    let mut may_take = String::from(
        "(t._tm_source = EXCLUDED._tm_source AND t._tm_export_type = EXCLUDED._tm_export_type
          AND t._tm_period_start = EXCLUDED._tm_period_start)
         OR EXCLUDED._tm_period_start > t._tm_period_start",
    );
    if schema.soft_delete {
        sets.push(format!("{DELETED_AT} = NULL"));
        differs.push_str(&format!(" OR t.{DELETED_AT} IS NOT NULL"));
        may_take.push_str(&format!(" OR t.{DELETED_AT} IS NOT NULL"));
    }
    let sql = format!(
        "INSERT INTO {table} AS t ({columns}) SELECT {columns} FROM {stage}
         ON CONFLICT ({}) DO UPDATE SET {} WHERE ({differs}) AND ({may_take})
         RETURNING (xmax = 0) AS inserted",
        key_list(schema),
        sets.join(", ")
    );
    let returned: Vec<bool> = sqlx::query_scalar(&sql)
        .fetch_all(tx.connection())
        .await
        .db()?;
    let inserted = returned.iter().filter(|i| **i).count() as u64;
    let written = returned.len() as u64;
    let superseded = if written < staged as u64 {
        held_elsewhere(tx, schema, &stage).await?
    } else {
        0
    };
    Ok(WriteCounts {
        inserted,
        updated: written - inserted,
        unchanged: (staged as u64).saturating_sub(written + superseded),
        superseded,
    })
}

/// The staging table of `schema`'s table with these columns. A temporary
/// table lives as long as its connection, and a pooled connection outlives
/// a change of the table (a column added by a newer pipeline in a
/// long-running `serve`): a stage made `LIKE` the table before would lack
/// the column. So the name holds a digest of the table and its columns,
/// and a changed table gets a new stage.
fn stage_name(schema: &TableSchema, columns: &str) -> String {
    let shape = format!("{}({columns}){}", schema.table, schema.soft_delete);
    format!(
        "_tm_stage_{:016x}",
        xxhash_rust::xxh3::xxh3_64(shape.as_bytes())
    )
}

/// How many staged rows another run key still holds after the merge: left
/// to a later period by the ownership rule. Asked only when the merge wrote
/// fewer rows than it was given; logs each key at debug level.
async fn held_elsewhere(tx: &mut PgTx, schema: &TableSchema, stage: &str) -> Result<u64, Error> {
    let keys: Vec<String> = schema
        .key_columns()
        .map(|(n, _)| format!("s.{}::text", quote(n)))
        .collect();
    let join: Vec<String> = schema
        .key_columns()
        .map(|(n, _)| format!("t.{0} = s.{0}", quote(n)))
        .collect();
    let sql = format!(
        "SELECT concat_ws(', ', {}), t._tm_period_start::text FROM {stage} s JOIN {} t ON {}
         WHERE NOT (t._tm_source = s._tm_source AND t._tm_export_type = s._tm_export_type
                    AND t._tm_period_start = s._tm_period_start)",
        keys.join(", "),
        quote(&schema.table),
        join.join(" AND ")
    );
    let held: Vec<(String, String)> = sqlx::query_as(&sql).fetch_all(tx.connection()).await.db()?;
    for (key, period) in &held {
        tracing::debug!(%key, held_by = %period, "row left as it is: a later period holds its key");
    }
    Ok(held.len() as u64)
}

/// Deletes (or soft-deletes) rows of the run key by natural key, joining
/// against `unnest` of one text array per key column.
pub(super) async fn delete_keys(
    tx: &mut PgTx,
    schema: &TableSchema,
    lineage: &Lineage,
    on_missing: OnMissing,
    keys: &[Vec<Value>],
) -> Result<u64, Error> {
    if keys.is_empty() {
        return Ok(0);
    }
    let key_columns: Vec<&(String, FieldType)> = schema.key_columns().collect();
    let arrays: Vec<String> = (0..key_columns.len())
        .map(|i| format!("${}::text[]", i + 4))
        .collect();
    let names: Vec<String> = (0..key_columns.len()).map(|i| format!("k{i}")).collect();
    let join: Vec<String> = key_columns
        .iter()
        .enumerate()
        .map(|(i, (n, ty))| format!("t.{} = v.k{i}::{}", quote(n), pg_type(*ty)))
        .collect();
    let table = quote(&schema.table);
    let from = format!("unnest({}) AS v({})", arrays.join(", "), names.join(", "));
    let run_key =
        "t._tm_source = $1 AND t._tm_export_type = $2 AND t._tm_period_start = $3::timestamptz";
    let sql = match on_missing {
        OnMissing::SoftDelete => format!(
            "UPDATE {table} AS t SET {DELETED_AT} = now() FROM {from} WHERE {} AND {run_key}",
            join.join(" AND ")
        ),
        _ => format!(
            "DELETE FROM {table} AS t USING {from} WHERE {} AND {run_key}",
            join.join(" AND ")
        ),
    };
    let mut query = tx
        .query(&sql)
        .bind(&lineage.source)
        .bind(&lineage.export_type)
        .bind(&lineage.period_start);
    for i in 0..key_columns.len() {
        let column: Vec<Option<String>> = keys.iter().map(|k| k[i].canonical_text()).collect();
        query = query.bind(column);
    }
    Ok(query.execute(tx.connection()).await.db()?.rows_affected())
}
