//! What an operator runs and reads: usage and the quota, retention (`team prune`), webhooks, the dashboard's and the scrape's read models, where `serve` listens.

pub mod dashboard;
pub mod listeners;
pub mod retention;
pub mod scrape;
pub mod usage;
pub mod webhooks;
