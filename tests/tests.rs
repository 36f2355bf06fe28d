//! End-to-end tests of the `tidemark` binary against real databases.
//! One test binary (faster to link); each area is a module.

mod support;

mod commands;
mod connections;
mod coordination;
mod drift;
mod foundation;
mod guards;
mod hardening_config;
mod hardening_drift;
mod hardening_extract;
mod hardening_periods;
mod hardening_planning;
mod hardening_queue;
mod hardening_storage;
mod http;
mod library;
mod mark;
mod memory_budget;
mod notices;
mod observability;
mod ownership;
mod page;
mod piggy_back;
mod pooling;
mod rate_limits;
mod raw_hash;
mod scheduler;
mod service;
mod sql_source;
mod status;
mod storage;
mod views;
