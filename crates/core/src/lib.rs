//! tidemark's domain model: periods, run keys, pipeline specs, typed values,
//! templates and the error taxonomy. This crate does no I/O beyond reading a
//! pipeline file; every stage crate depends on it and on nothing else of
//! tidemark's.

#![warn(missing_docs)]

pub mod error;
pub mod fingerprint;
pub mod period;
pub mod rate;
pub mod record;
pub mod run_key;
pub mod spec;
pub mod template;
pub mod value;

pub use error::{Error, ErrorClass, Location, Result};
pub use fingerprint::FieldsFingerprint;
pub use period::{Granularity, Period};
pub use rate::RateGate;
pub use record::{Origin, RawData, RawHasher, RawRecord, RawValue, Selector};
pub use run_key::RunKey;
pub use spec::{Pipeline, PipelineSpec, RetryPolicy};
pub use value::{FieldType, Hash128, KeyMap, KeySet, Row, RowShape, Value};
