//! The durable spool of a window's inbox references, on the client's own
//! disk: what lets a local process (the stdio proxy) confirm delivery to the
//! bus without ever losing a reference it confirmed.
//!
//! The rule it exists for: a reference is appended here and fsynced
//! *before* `confirm_inbox_delivery` tells the bus it arrived. A crash after
//! the append and before the confirmation leaves it spooled and unconfirmed,
//! and the next start confirms it ([`Spool::unconfirmed`]); a crash before
//! the append leaves it unconfirmed on the bus, which hands it out again
//! after its hand-out time. Either way nothing confirmed is lost.
//!
//! The file is append-only JSON lines, one record per line: a reference
//! spooled, or a set of delivery ids confirmed. Its state is the replay of
//! its lines. Only the last line can be torn (each append is one write
//! followed by fsync), so a last line without its newline is cut off at
//! open; a broken line anywhere else is refused, not skipped, because
//! skipping it could drop a reference. Compaction rewrites the file
//! (temporary file, fsync, rename) without references confirmed more than
//! [`KEEP_CONFIRMED`] ago; an unconfirmed reference is never dropped.
//!
//! A reference holds ids, a seq, a sender and times, never a body: the
//! record type has no field that could carry one.
//!
//! What this module deliberately does not do: talk to the bus. The caller
//! fetches, appends, confirms, then records the confirmation.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::local_files;

/// How long a confirmed reference stays in the spool (for `session_status`
/// and the hooks to say what arrived lately) before compaction drops it.
pub const KEEP_CONFIRMED: Duration = Duration::hours(48);

/// One inbox reference as `fetch_conversation_inbox` hands it out (the
/// server's very shape).
pub use acs_wire::inbox::InboxReference as Reference;

/// A reference in the spool, and when it was confirmed to the bus.
#[derive(Clone, Debug, PartialEq)]
pub struct Spooled {
    pub reference: Reference,
    pub spooled_at: DateTime<Utc>,
    pub confirmed_at: Option<DateTime<Utc>>,
}

/// One line of the file.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Record {
    Spooled {
        reference: Reference,
        at: DateTime<Utc>,
    },
    Confirmed {
        delivery_ids: Vec<Uuid>,
        at: DateTime<Utc>,
    },
}

/// An open spool: the file, kept open for appends, and its replayed state.
pub struct Spool {
    path: PathBuf,
    file: File,
    /// By delivery id, in the order first spooled.
    entries: BTreeMap<Uuid, Spooled>,
    order: Vec<Uuid>,
}

impl Spool {
    /// Open (creating) the spool at `path`: its directory 0700, the file
    /// 0600. A torn last line is cut off; any other broken line is an error.
    pub fn open(path: &Path) -> anyhow::Result<Spool> {
        let dir = path
            .parent()
            .context("the spool path has no parent directory")?;
        local_files::private_dir(dir)?;
        // Never through a symlink: the spool is appended to and later
        // replaced, and a link would point both elsewhere.
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("opening the spool {}", path.display()))?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)?;
        let whole = match text.iter().rposition(|&b| b == b'\n') {
            Some(last_newline) => last_newline + 1,
            None => 0,
        };
        if whole < text.len() {
            // A write cut short by a crash: it was never fsynced, so nothing
            // was confirmed on its strength.
            file.set_len(whole as u64)?;
            file.sync_all()?;
            tracing::warn!(
                spool = %path.display(),
                bytes = text.len() - whole,
                "cut off a torn last line of the spool"
            );
        }
        file.seek(SeekFrom::End(0))?;
        let mut spool = Spool {
            path: path.to_path_buf(),
            file,
            entries: BTreeMap::new(),
            order: Vec::new(),
        };
        for (number, line) in text[..whole].split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let record: Record = serde_json::from_slice(line).with_context(|| {
                format!(
                    "line {} of the spool {} is not a spool record; it is kept as it is (a \
                     reference may be in it): move the file aside to start a new spool, and \
                     the bus hands out again whatever was not confirmed",
                    number + 1,
                    path.display()
                )
            })?;
            spool.replay(record);
        }
        Ok(spool)
    }

    fn replay(&mut self, record: Record) {
        match record {
            Record::Spooled { reference, at } => {
                let id = reference.delivery_id;
                if !self.entries.contains_key(&id) {
                    self.order.push(id);
                    self.entries.insert(
                        id,
                        Spooled {
                            reference,
                            spooled_at: at,
                            confirmed_at: None,
                        },
                    );
                }
            }
            Record::Confirmed { delivery_ids, at } => {
                for id in delivery_ids {
                    if let Some(entry) = self.entries.get_mut(&id) {
                        entry.confirmed_at.get_or_insert(at);
                    }
                }
            }
        }
    }

    /// Append `records` as one write and fsync it.
    fn write(&mut self, records: &[Record]) -> anyhow::Result<()> {
        let mut bytes = Vec::new();
        for record in records {
            serde_json::to_writer(&mut bytes, record)?;
            bytes.push(b'\n');
        }
        self.file
            .write_all(&bytes)
            .and_then(|()| self.file.sync_data())
            .with_context(|| format!("appending to the spool {}", self.path.display()))
    }

    /// Spool `references` durably; returns the delivery ids to confirm now:
    /// those given that are not confirmed yet (a reference handed out again
    /// is spooled once and confirmed once more, which the bus takes as a
    /// repeat).
    pub fn append(&mut self, references: &[Reference]) -> anyhow::Result<Vec<Uuid>> {
        let now = Utc::now();
        let fresh: Vec<Record> = references
            .iter()
            .filter(|r| !self.entries.contains_key(&r.delivery_id))
            .map(|r| Record::Spooled {
                reference: r.clone(),
                at: now,
            })
            .collect();
        if !fresh.is_empty() {
            self.write(&fresh)?;
            for record in fresh {
                self.replay(record);
            }
        }
        let mut seen = std::collections::HashSet::new();
        Ok(references
            .iter()
            .map(|r| r.delivery_id)
            .filter(|id| self.entries[id].confirmed_at.is_none() && seen.insert(*id))
            .collect())
    }

    /// Record that the bus confirmed `delivery_ids` (after
    /// `confirm_inbox_delivery` answered).
    pub fn mark_confirmed(&mut self, delivery_ids: &[Uuid]) -> anyhow::Result<()> {
        let known: Vec<Uuid> = delivery_ids
            .iter()
            .copied()
            .filter(|id| {
                self.entries
                    .get(id)
                    .is_some_and(|e| e.confirmed_at.is_none())
            })
            .collect();
        if known.is_empty() {
            return Ok(());
        }
        let record = Record::Confirmed {
            delivery_ids: known,
            at: Utc::now(),
        };
        self.write(std::slice::from_ref(&record))?;
        self.replay(record);
        Ok(())
    }

    /// Spooled and not yet confirmed: what a start confirms first.
    pub fn unconfirmed(&self) -> Vec<Uuid> {
        self.order
            .iter()
            .filter(|id| self.entries[*id].confirmed_at.is_none())
            .copied()
            .collect()
    }

    /// Every reference in the spool, in the order spooled.
    pub fn entries(&self) -> impl Iterator<Item = &Spooled> {
        self.order.iter().map(|id| &self.entries[id])
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rewrite the file without references confirmed before `now -
    /// KEEP_CONFIRMED`; returns how many were dropped. Unconfirmed ones are
    /// always kept.
    pub fn compact(&mut self, now: DateTime<Utc>) -> anyhow::Result<usize> {
        let cutoff = now - KEEP_CONFIRMED;
        let dropped: Vec<Uuid> = self
            .order
            .iter()
            .filter(|id| self.entries[*id].confirmed_at.is_some_and(|at| at < cutoff))
            .copied()
            .collect();
        if dropped.is_empty() {
            return Ok(0);
        }
        for id in &dropped {
            self.entries.remove(id);
        }
        self.order.retain(|id| self.entries.contains_key(id));
        let mut bytes = Vec::new();
        for id in &self.order {
            let entry = &self.entries[id];
            let spooled = Record::Spooled {
                reference: entry.reference.clone(),
                at: entry.spooled_at,
            };
            serde_json::to_writer(&mut bytes, &spooled)?;
            bytes.push(b'\n');
            if let Some(at) = entry.confirmed_at {
                let confirmed = Record::Confirmed {
                    delivery_ids: vec![*id],
                    at,
                };
                serde_json::to_writer(&mut bytes, &confirmed)?;
                bytes.push(b'\n');
            }
        }
        let tmp = local_files::temporary_beside(&self.path, "compacting")?;
        let mut out = local_files::create_new_private(&tmp)?;
        out.write_all(&bytes)?;
        out.sync_all()?;
        drop(out);
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("replacing {}", self.path.display()))?;
        if let Some(dir) = self.path.parent()
            && let Ok(dir) = File::open(dir)
        {
            let _ = dir.sync_all();
        }
        self.file = OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .with_context(|| format!("reopening {}", self.path.display()))?;
        Ok(dropped.len())
    }
}

/// Where a window's spool lives: `spool/<window key>.jsonl` under `dir`
/// (the client's config directory).
pub fn path_for(dir: &Path, window_key: &str) -> anyhow::Result<PathBuf> {
    let fits = !window_key.is_empty()
        && window_key.len() <= 128
        && window_key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if !fits {
        bail!("a spool is named by a window key of letters, digits, '-', '_' or '.'");
    }
    Ok(dir.join("spool").join(format!("{window_key}.jsonl")))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn reference(seq: i64) -> Reference {
        Reference {
            delivery_id: Uuid::now_v7(),
            kind: acs_wire::inbox::InboxKind::Message,
            conversation_id: Uuid::nil(),
            message_id: Uuid::now_v7(),
            seq,
            from: "bob/main".into(),
            receipt: None,
            queued_at: Utc::now(),
        }
    }

    fn spool_in(dir: &tempfile::TempDir) -> PathBuf {
        path_for(dir.path(), "alice-main").unwrap()
    }

    #[test]
    fn a_reference_spooled_and_not_confirmed_is_unconfirmed_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = spool_in(&dir);
        let (a, b) = (reference(1), reference(2));
        {
            let mut spool = Spool::open(&path).unwrap();
            let to_confirm = spool.append(&[a.clone(), b.clone()]).unwrap();
            assert_eq!(to_confirm, vec![a.delivery_id, b.delivery_id]);
            spool.mark_confirmed(&[a.delivery_id]).unwrap();
            // Dropped here without confirming b: a crash after the fsync.
        }
        let spool = Spool::open(&path).unwrap();
        assert_eq!(spool.unconfirmed(), vec![b.delivery_id]);
        assert_eq!(spool.entries().count(), 2);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }

    #[test]
    fn a_reference_handed_out_again_is_spooled_once_and_not_confirmed_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(&spool_in(&dir)).unwrap();
        let a = reference(1);
        assert_eq!(
            spool.append(std::slice::from_ref(&a)).unwrap(),
            vec![a.delivery_id]
        );
        assert_eq!(
            spool.append(std::slice::from_ref(&a)).unwrap(),
            vec![a.delivery_id]
        );
        spool.mark_confirmed(&[a.delivery_id]).unwrap();
        assert!(spool.append(std::slice::from_ref(&a)).unwrap().is_empty());
        assert_eq!(spool.entries().count(), 1);
        let text = std::fs::read_to_string(spool.path()).unwrap();
        assert_eq!(
            text.lines().count(),
            2,
            "one spooled, one confirmed: {text}"
        );
    }

    #[test]
    fn a_torn_last_line_is_cut_off_and_a_broken_middle_line_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = spool_in(&dir);
        let a = reference(1);
        {
            let mut spool = Spool::open(&path).unwrap();
            spool.append(std::slice::from_ref(&a)).unwrap();
        }
        let whole = std::fs::read(&path).unwrap();
        let mut torn = OpenOptions::new().append(true).open(&path).unwrap();
        torn.write_all(br#"{"spooled":{"reference":{"deliv"#)
            .unwrap();
        drop(torn);
        let mut spool = Spool::open(&path).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            whole,
            "the torn tail is gone"
        );
        assert_eq!(spool.unconfirmed(), vec![a.delivery_id]);
        let b = reference(2);
        spool.append(std::slice::from_ref(&b)).unwrap();
        drop(spool);
        assert_eq!(Spool::open(&path).unwrap().entries().count(), 2);

        let mut text = std::fs::read_to_string(&path).unwrap();
        text.insert_str(0, "not json\n");
        std::fs::write(&path, text).unwrap();
        let refused = Spool::open(&path).err().expect("a broken middle line");
        assert!(format!("{refused:#}").contains("line 1"), "{refused:#}");
    }

    #[test]
    fn compaction_drops_old_confirmed_references_and_never_an_unconfirmed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = spool_in(&dir);
        let (first, open, second) = (reference(1), reference(2), reference(3));
        let mut spool = Spool::open(&path).unwrap();
        spool
            .append(&[first.clone(), open.clone(), second.clone()])
            .unwrap();
        spool.mark_confirmed(&[first.delivery_id]).unwrap();
        spool.mark_confirmed(&[second.delivery_id]).unwrap();
        assert_eq!(
            spool.compact(Utc::now()).unwrap(),
            0,
            "confirmed just now: kept"
        );
        let later = Utc::now() + KEEP_CONFIRMED + Duration::minutes(1);
        let dropped = spool.compact(later).unwrap();
        assert_eq!(dropped, 2, "both confirmed ones are past 48 hours then");
        assert_eq!(spool.unconfirmed(), vec![open.delivery_id]);
        let later_still = later + Duration::days(30);
        assert_eq!(spool.compact(later_still).unwrap(), 0);
        drop(spool);
        let reopened = Spool::open(&path).unwrap();
        assert_eq!(reopened.unconfirmed(), vec![open.delivery_id]);
        assert_eq!(reopened.entries().count(), 1);
    }

    // Issue 33 item 10: the spool is never opened through a symlink (it
    // would append to, then replace, whatever the link names), and a spool
    // directory others may write in is refused, named with the fix.
    #[test]
    fn a_spool_behind_a_symlink_or_in_a_directory_others_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = spool_in(&dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let target = dir.path().join("elsewhere");
        // Empty: a spool would open it happily, were the link followed.
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(Spool::open(&path).is_err(), "opened through a symlink");
        std::fs::remove_file(&path).unwrap();

        let spool_dir = path.parent().unwrap();
        std::fs::set_permissions(spool_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = Spool::open(&path).err().expect("refused").to_string();
        assert!(
            err.contains(&spool_dir.display().to_string())
                && err.contains(&format!("chmod 700 {}", spool_dir.display())),
            "{err}"
        );
        assert!(!path.exists(), "nothing created");
    }

    #[test]
    fn a_spool_record_cannot_hold_a_body() {
        let line = r#"{"spooled":{"reference":{"delivery_id":"00000000-0000-0000-0000-000000000001","kind":"message","conversation_id":"00000000-0000-0000-0000-000000000000","message_id":"00000000-0000-0000-0000-000000000002","seq":1,"from":"bob","queued_at":"2026-12-01T00:00:00Z","body":"secret"},"at":"2026-12-01T00:00:00Z"}}"#;
        // Unknown fields of a reference are dropped on read, never written back.
        let record: Record = serde_json::from_str(line).unwrap();
        let written = serde_json::to_string(&record).unwrap();
        assert!(!written.contains("secret"), "{written}");
    }
}
