//! One round trip per write: the shape every fenced SQL write function
//! answers, and how a call of one is made.
//!
//! A write tool that is one function call (`acquire_team_lock`,
//! `release_team_lock`, `store_heartbeat`, `store_note`: migration 0033)
//! takes the caller's credential as its first five arguments, runs the write
//! fence (`agent_write_refusal`, migration 0016: the one definition of "who
//! may write") before anything else, and answers one row: the fence's
//! refusal, or an outcome code with the data its answer needs as JSON. The
//! call is a single statement outside any explicit transaction, so BEGIN,
//! the fence, the lookups, the writes and COMMIT cost one round trip.
//!
//! Words live here and in each tool's module, never in SQL: the fence's
//! refusal is worded by [`sessions::Refusal`], an outcome's by its caller.
//!
//! Not here: writes that still need Rust between their statements (they
//! call [`sessions::guard`] in their own transaction).

use serde::de::DeserializeOwned;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::{Query, QueryAs};
use sqlx::{Encode, FromRow, Postgres, Row, Type};

use super::identity::sessions::Refusal;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};

/// A fenced write function's row.
pub(crate) struct FencedWrite {
    refusal: Refusal,
    outcome: Option<String>,
    detail: Option<serde_json::Value>,
}

impl<'r> FromRow<'r, PgRow> for FencedWrite {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(FencedWrite {
            refusal: Refusal::from_row(row)?,
            outcome: row.try_get("outcome")?,
            detail: row.try_get("detail")?,
        })
    }
}

/// A call of a fenced write function, with the credential bound as its
/// first five arguments (team, agent, token, session row, epoch held). `sql`
/// selects `refusal, session_epoch, refused_since, outcome, detail`; bind
/// the function's own arguments after, from `$6` on.
pub(crate) fn call<'q>(
    sql: &'static str,
    me: &Identity,
) -> QueryAs<'q, Postgres, FencedWrite, PgArguments> {
    with_credential(sql, me)
}

/// `sql` with the caller's credential bound as its first five arguments, in
/// the order every fence function takes them: team, agent, token, session
/// row, epoch held.
pub(crate) fn with_credential<'q, O>(
    sql: &'static str,
    me: &Identity,
) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind_credential(me)
}

/// Binding the caller into a query, in the order the SQL write functions
/// take it (`agent_write_refusal`, migration 0016, and every function that
/// calls it first).
pub(crate) trait BindCaller<'q>: Sized {
    /// [`Query::bind`] / [`QueryAs::bind`].
    fn bind_value<T: 'q + Encode<'q, Postgres> + Type<Postgres>>(self, value: T) -> Self;

    /// The credential the call rests on, as three arguments: the agent
    /// token, the session row and the epoch held (both `NULL` for a bare
    /// agent token).
    fn bind_credential(self, me: &Identity) -> Self {
        self.bind_value(me.token_id)
            .bind_value(me.session_credential.map(|w| w.session_id))
            .bind_value(me.session_credential.map(|w| w.epoch))
    }

    /// The calling window, as three arguments: team, agent, window label.
    fn bind_window(self, me: &'q Identity) -> Self {
        self.bind_value(me.team_id)
            .bind_value(me.agent_id)
            .bind_value(&me.window)
    }

    /// The calling window and its credential, as six arguments:
    /// [`bind_window`](Self::bind_window), then
    /// [`bind_credential`](Self::bind_credential).
    fn bind_caller(self, me: &'q Identity) -> Self {
        self.bind_window(me).bind_credential(me)
    }
}

impl<'q> BindCaller<'q> for Query<'q, Postgres, PgArguments> {
    fn bind_value<T: 'q + Encode<'q, Postgres> + Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, O> BindCaller<'q> for QueryAs<'q, Postgres, O, PgArguments> {
    fn bind_value<T: 'q + Encode<'q, Postgres> + Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl FencedWrite {
    /// The fence's refusal in its words, or the outcome and its data.
    pub(crate) fn outcome(self, me: &Identity) -> BusResult<(String, Option<serde_json::Value>)> {
        self.refusal.check(me)?;
        let outcome = self.outcome.ok_or_else(|| {
            unreadable("a fenced write answered neither a refusal nor an outcome")
        })?;
        Ok((outcome, self.detail))
    }
}

/// An outcome's data as `T`; an error (a bug, not a refusal) when it is
/// missing or does not fit.
pub(crate) fn detail<T: DeserializeOwned>(detail: Option<serde_json::Value>) -> BusResult<T> {
    let value =
        detail.ok_or_else(|| unreadable("a fenced write's outcome came without its data"))?;
    serde_json::from_value(value)
        .map_err(|err| unreadable(&format!("a fenced write's data did not fit: {err}")))
}

/// The server could not read the database's answer: a bug, logged, and told
/// as such (the write may have committed).
fn unreadable(what: &str) -> BusError {
    sqlx::Error::Decode(what.to_owned().into()).into()
}
