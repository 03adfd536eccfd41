//! A window's own reservations: `release_paths` and `renew_reservations`.
//!
//! Both touch only rows this window holds (every project: a window that
//! changed project still holds what it reserved before), found by the
//! holder index, under the write fence alone: giving up or extending one's
//! own rows cannot make two windows' reservations collide, so neither takes
//! the project's lock.

use serde::Serialize;

use acs_wire::globs::PathGlob;

use super::{Reservation, Row, check_ttl, columns, joined, of_window, parse_patterns};
use crate::auth::Identity;
use crate::error::BusResult;
use crate::events::{BusEvent, EventKind};
use crate::store::fenced::BindCaller as _;
use crate::store::identity::sessions;
use crate::store::requests::Writer;

/// `release_paths`' answer.
#[derive(Clone, Debug, Serialize)]
pub struct Released {
    /// The live patterns released (of every project this window reserved in).
    pub released: Vec<String>,
    /// Patterns asked for that this window does not hold (never reserved,
    /// released already, or expired).
    pub not_held: Vec<String>,
}

/// `renew_reservations`' answer.
#[derive(Clone, Debug, Serialize)]
pub struct Renewed {
    pub count: usize,
    /// This window's live reservations, each now expiring `ttl_seconds` from now.
    pub reservations: Vec<Reservation>,
}

/// `release_paths`: this window's reservations, all of them when `paths` is
/// omitted, otherwise the patterns named. A pattern is found as the answers
/// show it (the stored form: `Cargo.toml` is the root's own) or as it was
/// written when reserved (`Cargo.toml` there meant `**/Cargo.toml`), the
/// stored form first. Its expired rows go too (nobody sees them), but only
/// live ones are answered as released.
pub async fn release(
    w: &mut Writer,
    me: &Identity,
    paths: Option<&[String]>,
) -> BusResult<Released> {
    let asked: Option<Vec<(Option<String>, String)>> = paths
        .map(|paths| {
            let written = parse_patterns(
                paths,
                "Omit `paths` to release every reservation of this window, or name the \
                 patterns as you reserved them.",
            )?;
            Ok::<_, crate::error::BusError>(
                paths
                    .iter()
                    .zip(written)
                    .map(|(raw, glob)| {
                        let stored = PathGlob::from_stored(raw)
                            .ok()
                            .map(|g| g.as_str().to_string());
                        (stored, glob.as_str().to_string())
                    })
                    .collect(),
            )
        })
        .transpose()?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let (chosen, mut not_held) = match &asked {
        None => (None, Vec::new()),
        Some(asked) => {
            let held: Vec<String> = sqlx::query_scalar(concat!(
                "SELECT pattern FROM path_reservations",
                of_window!(),
                " AND expires_at > now()"
            ))
            .bind(me.team_id)
            .bind(me.agent_id)
            .bind(&me.window)
            .fetch_all(&mut *tx)
            .await?;
            let mut chosen = Vec::new();
            let mut not_held = Vec::new();
            for (stored, written) in asked {
                match stored.iter().chain([written]).find(|p| held.contains(p)) {
                    Some(pattern) => chosen.push(pattern.clone()),
                    None => not_held.push(written.clone()),
                }
            }
            (Some(chosen), not_held)
        }
    };
    let gone: Vec<(String, bool)> = sqlx::query_as(concat!(
        "DELETE FROM path_reservations",
        of_window!(),
        " AND ($4::text[] IS NULL OR pattern = ANY($4))
         RETURNING pattern, expires_at > now()"
    ))
    .bind_window(me)
    .bind(&chosen)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut released: Vec<String> = gone
        .into_iter()
        .filter(|(_, live)| *live)
        .map(|(pattern, _)| pattern)
        .collect();
    released.sort();
    released.dedup();
    not_held.dedup();
    if let Some(first) = released.first() {
        let id = match released.len() {
            1 => first.clone(),
            n => format!("{first} (+{} more)", n - 1),
        };
        w.emit(BusEvent::new(me.team_id, EventKind::Reservation, id).by(me));
    }
    Ok(Released { released, not_held })
}

/// `renew_reservations`: every live reservation of this window now expires
/// `ttl_seconds` from now. Expired ones are not revived: another window may
/// have reserved their paths since; reserve them again.
pub async fn renew(w: &mut Writer, me: &Identity, ttl_seconds: Option<i64>) -> BusResult<Renewed> {
    let ttl = check_ttl(ttl_seconds)?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let rows: Vec<Row> = sqlx::query_as(concat!(
        "WITH renewed AS (
             UPDATE path_reservations SET expires_at = now() + $4",
        of_window!(),
        " AND expires_at > now()
             RETURNING *)
         SELECT ",
        columns!(),
        joined!("renewed"),
        " ORDER BY r.project, r.pattern"
    ))
    .bind_window(me)
    .bind(ttl)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let reservations: Vec<Reservation> = rows.into_iter().map(Row::into_reservation).collect();
    Ok(Renewed {
        count: reservations.len(),
        reservations,
    })
}
