//! The contract the server and the agent side share, with no I/O: the
//! character rules of text fields, the window label and address rule, and
//! the body limit. Both sides
//! depend on this crate; it depends on nothing of the bus.

pub mod label;
pub mod limits;
pub mod text;
