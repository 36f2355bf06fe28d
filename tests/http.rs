//! HTTP sources against a local fake API (issue 4): the real `tidemark`
//! binary, a temporary SQLite database, and an in-process HTTP server on
//! 127.0.0.1 with injectable faults and a log of every request.

pub(crate) mod api;
mod case;

mod errors;
mod example;
mod faults;
mod pagination;
mod rate_limit;
mod secrets;
mod throughput;
