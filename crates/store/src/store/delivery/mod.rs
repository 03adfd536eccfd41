//! Where conversation bodies go and how they get there: the outbox, moves between backends, bodies the broker lost, broker conditions.

pub mod broker_conditions;
pub mod lost_bodies;
pub mod moves;
pub mod outbox;
