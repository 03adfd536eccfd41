//! Rebuild when a migration is added: `sqlx::migrate!` embeds the files of
//! `migrations/` but cannot see a new one by itself (see its documentation).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
