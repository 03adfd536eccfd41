//! The integration suite: one test binary (builds are slow here), one module per area.
//! Every test talks to a real PostgreSQL, and to the server over real HTTP.

mod support;

/// How many tests run at once when neither `RUST_TEST_THREADS` nor
/// `--test-threads` says: libtest's default is one per core, but this
/// suite's tests mostly wait (long polls, child processes, brokers'
/// timeouts, elections), so on a small machine three per core, at most six,
/// finish it in about half the time. Six keeps a run's database connections
/// (up to eight per server under test) under PostgreSQL's default 100;
/// machines with six cores or more keep libtest's default. Set from
/// `.init_array`, before main, where libtest reads the variable from.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static DEFAULT_TEST_THREADS: extern "C" fn() = default_test_threads;

#[cfg(target_os = "linux")]
extern "C" fn default_test_threads() {
    if std::env::var_os("RUST_TEST_THREADS").is_some() {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.max((3 * cores).min(6));
    // SAFETY: this runs before main, while the process has one thread.
    unsafe { std::env::set_var("RUST_TEST_THREADS", threads.to_string()) };
}

/// A failing test's panic message, said again below its backtrace: CI keeps
/// the end of a long log, where the backtrace alone would stand and the
/// message (what went wrong) would be cut. Set from `.init_array` too, so it
/// is in place before libtest starts the first test.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static REPEAT_PANIC_MESSAGE: extern "C" fn() = repeat_panic_message;

#[cfg(target_os = "linux")]
extern "C" fn repeat_panic_message() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        eprintln!("(the panic above, again below its backtrace) {info}");
    }));
}

mod admin;
mod architecture;
mod attachments;
mod auth;
mod binary;
mod bounded_reads;
mod cli;
mod client;
mod completions_man;
mod connections;
mod context;
mod conversation_messages;
mod conversations;
mod dashboard;
mod default_channel;
mod deploy_unit;
mod docs;
mod doctor;
mod embedded;
mod events;
mod fenced_writes;
mod guard;
mod hooks;
mod http_surface;
mod inbox;
mod inbox_publisher;
mod input_bounds;
mod jetstream;
mod jetstream_bus;
mod jetstream_cluster;
mod limits;
mod locks;
mod message_positions;
mod messaging;
mod metrics;
mod migrations_landed;
mod moves;
mod never_empty;
mod newcomer;
mod notes;
mod outbox;
mod overview;
mod owed_acks;
mod own_posts;
mod parallel_posts;
mod pending;
mod plugin;
mod pre_tool_use;
mod presence;
mod projects;
mod proxy;
mod proxy_lifecycle;
mod proxy_thread;
mod read_once;
mod refusals;
mod request_ids;
mod reservation_views;
mod reservations;
mod run_script;
mod sessions;
mod shutdown;
mod stated_limits;
mod storage;
mod support_servers;
mod task_cancel;
mod task_priority;
mod task_writes;
mod tasks;
mod tenancy;
mod text_rules;
mod upgrades;
mod waiting;
mod webhooks;
mod window_end;
mod write_fence;
