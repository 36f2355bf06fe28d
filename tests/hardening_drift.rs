//! Issue 19, items 7 and 12: a field added to `[fields]` never turns a
//! `done` period into a failed one (schema evolution is not source drift),
//! and a response body that arrived whole but cannot be decoded is a
//! `parse` error after one request, whatever layer fails to decode it,
//! while a body the transport cut is retried. Every scenario runs the real
//! binary on SQLite and PostgreSQL.

mod added_fields;
mod bodies;
