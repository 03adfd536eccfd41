//! What an operator runs and reads: usage and the quota, retention (`team prune`), webhooks, the dashboard's and the scrape's read models.

pub mod dashboard;
pub mod retention;
pub mod scrape;
pub mod usage;
pub mod webhooks;
