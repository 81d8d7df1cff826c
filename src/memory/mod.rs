//! One memory budget for the whole engine: what the process may hold ([`limit`]), which
//! weights stay resident within it ([`residency`]), and the reader that streams the rest from
//! storage ([`reader`]).
//!
//! This module is ground floor: it imports nothing of the engine but the error type, so every
//! layer above (the plan, the backends, the executor) can use it.

pub mod experts;
pub mod limit;
pub mod reader;
pub mod residency;

pub use limit::{budget_of, detect_limit, measured_peak, LimitSource, MemoryLimit, Peak};
pub use reader::{BlockSpan, IoMode, LayerReader, ReaderStats, SharedReader, Slot};
pub use residency::{plan, Costs, Residency};
