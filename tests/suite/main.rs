//! The integration suite: one test binary (builds are slow here), one module per area.
//! Every test talks to a real PostgreSQL, and to the server over real HTTP.

mod support;

mod admin;
mod attachments;
mod auth;
mod binary;
mod bounded_reads;
mod cli;
mod client;
mod completions_man;
mod connections;
mod conversation_messages;
mod conversations;
mod deploy_unit;
mod doctor;
mod embedded;
mod events;
mod http_surface;
mod inbox;
mod input_bounds;
mod jetstream;
mod jetstream_bus;
mod limits;
mod locks;
mod message_positions;
mod messaging;
mod migrations_landed;
mod moves;
mod notes;
mod outbox;
mod overview;
mod presence;
mod projects;
mod refusals;
mod run_script;
mod sessions;
mod shutdown;
mod support_servers;
mod task_cancel;
mod tasks;
mod tenancy;
mod text_rules;
mod upgrades;
mod waiting;
mod write_fence;
