//! Background loops. Each one is a plain function that does one bounded pass
//! (callable from tests and operator commands) and a `spawn` that runs it
//! periodically until shutdown. Every replica runs every worker: passes are
//! written so that concurrent replicas skip each other's rows instead of
//! waiting on them.

pub mod departures;
pub mod inbox_publisher;
pub mod presence_sweeper;
pub mod publication;
pub mod storage_recount;
pub mod webhook_dispatcher;
