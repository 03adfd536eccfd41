//! Landed migrations are immutable: a database that applied a migration must
//! never meet a different text under the same version (sqlx refuses to start
//! on a checksum mismatch, and the behaviour would silently differ between
//! databases migrated before and after the edit). `migrations.sha256`, beside
//! `migrations/`, lists every landed file with its digest (`sha256sum`
//! format, so `sha256sum -c migrations.sha256` checks it by hand too).
//!
//! Change behaviour with a new migration; add its line with
//! `sha256sum migrations/NNNN_name.sql >> migrations.sha256` when it lands.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `migrations/NNNN_name.sql` → hex digest, as listed.
fn listed() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("migrations.sha256"))
        .expect("migrations.sha256 sits beside migrations/");
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (digest, path) = line
                .split_once("  ")
                .unwrap_or_else(|| panic!("`{line}` is not `<sha256>  <path>`"));
            (path.to_owned(), digest.to_owned())
        })
        .collect()
}

fn on_disk() -> BTreeMap<String, String> {
    std::fs::read_dir(root().join("migrations"))
        .expect("read migrations/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .map(|path| {
            let name = format!("migrations/{}", path.file_name().unwrap().to_string_lossy());
            let digest = hex::encode(Sha256::digest(
                std::fs::read(&path).expect("read a migration"),
            ));
            (name, digest)
        })
        .collect()
}

#[test]
fn no_landed_migration_changes_or_disappears() {
    let disk = on_disk();
    for (path, digest) in listed() {
        match disk.get(&path) {
            None => panic!("{path} has landed and was removed; put it back as it was."),
            Some(now) => assert_eq!(
                now, &digest,
                "{path} has landed and its contents changed; restore it (git checkout) and put the \
                 change in a new migration."
            ),
        }
    }
}

#[test]
fn every_migration_is_listed() {
    let listed = listed();
    let unlisted: Vec<_> = on_disk()
        .into_keys()
        .filter(|path| !listed.contains_key(path))
        .collect();
    assert!(
        unlisted.is_empty(),
        "{unlisted:?} not in migrations.sha256: append each with `sha256sum <file> >> \
         migrations.sha256` in the commit that adds it."
    );
}
