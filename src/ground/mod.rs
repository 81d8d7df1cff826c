//! The ground floor: the vocabulary every layer of the engine shares (where a stage runs, the
//! two phases of a forward pass, byte sizes as people write them). It imports nothing of the
//! engine, so any module may import it without closing a circle.

mod placement;
mod size;

pub use placement::{Device, Phase, PhasePlacement, Placement};
pub use size::{format_size, parse_count, parse_size, SizeError};
