//! The contract the server and the agent side share, with no I/O: the
//! character rules of text fields, the window label and address rule, the
//! body limit, and the inbox reference a window is handed. Both sides
//! depend on this crate; it depends on nothing of the bus.

pub mod globs;
pub mod inbox;
pub mod label;
pub mod limits;
pub mod text;
pub mod text_enum;

/// serde, for [`text_enum!`]'s expansion in crates that name it otherwise.
#[doc(hidden)]
pub use serde as __serde;
