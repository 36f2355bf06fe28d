//! HTTP sources against a local fake API.
