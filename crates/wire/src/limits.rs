//! Limits of the contract that more than one layer sizes itself from.

/// The largest message body the bus accepts, in a conversation or a channel.
/// The outbox's slot and the broker's body stream are sized from it (O1).
pub const BODY_MAX_BYTES: usize = 1024 * 1024;
