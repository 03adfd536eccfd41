//! The one error type of the library.
//!
//! Every message is written for the reader most likely to see it: a language
//! model calling a tool. It says what was wrong, the limit that applied, and
//! what to do instead. Database errors never leak their text to a caller; they
//! are logged here and reported as a plain "try again".

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BusError {
    /// The object does not exist, or exists but the caller may not see it.
    /// Both read the same so a foreign team's object cannot be probed.
    #[error("{0}")]
    NotFound(String),
    /// The input was wrong; nothing was changed.
    #[error("{0}")]
    Invalid(String),
    /// The input was fine but the current state refuses it (held, taken, stale).
    #[error("{0}")]
    Conflict(String),
    /// No usable credential.
    #[error("{0}")]
    Unauthenticated(String),
    /// A credential that may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// A backend (the message broker) did not answer or refused; the request
    /// may succeed later. Nothing accepted was lost.
    #[error("{0}")]
    Unavailable(String),
    /// The database failed. The text stays in the server log; what the
    /// caller is told depends on whether a change could have gone through
    /// ([`db_message`]).
    #[error("{}", db_message(.0))]
    Db(#[source] sqlx::Error),
}

impl BusError {
    pub fn not_found(msg: impl Into<String>) -> Self {
        BusError::NotFound(msg.into())
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        BusError::Invalid(msg.into())
    }
    pub fn conflict(msg: impl Into<String>) -> Self {
        BusError::Conflict(msg.into())
    }
    pub fn unauthenticated(msg: impl Into<String>) -> Self {
        BusError::Unauthenticated(msg.into())
    }
    pub fn forbidden(msg: impl Into<String>) -> Self {
        BusError::Forbidden(msg.into())
    }
    pub fn unavailable(msg: impl Into<String>) -> Self {
        BusError::Unavailable(msg.into())
    }

    /// A call that waited for a pool connection until the acquire timeout:
    /// counted where the refusal is answered (`acs_metrics::record_pool_timeout`).
    pub fn is_pool_timeout(&self) -> bool {
        matches!(self, BusError::Db(sqlx::Error::PoolTimedOut))
    }

    /// A short machine-readable name of the kind, for JSON bodies and tool results.
    pub fn kind(&self) -> &'static str {
        match self {
            BusError::NotFound(_) => "not_found",
            BusError::Invalid(_) => "invalid",
            BusError::Conflict(_) => "conflict",
            BusError::Unauthenticated(_) => "unauthenticated",
            BusError::Forbidden(_) => "forbidden",
            BusError::Unavailable(_) | BusError::Db(_) => "unavailable",
        }
    }

    /// The HTTP status a route answers with for this kind.
    pub fn http_status(&self) -> u16 {
        match self {
            BusError::NotFound(_) => 404,
            BusError::Invalid(_) => 400,
            BusError::Conflict(_) => 409,
            BusError::Unauthenticated(_) => 401,
            BusError::Forbidden(_) => 403,
            BusError::Unavailable(_) | BusError::Db(_) => 503,
        }
    }
}

/// What a caller is told when the database failed. With no connection to be
/// had, or an error the server answered with (the statement, and its
/// transaction, rolled back), nothing was changed. Once a statement was on
/// its way and the connection broke, the commit may have happened before the
/// answer was lost (a PostgreSQL restart does this): saying "nothing was
/// changed" then would be a lie the caller acts on, so it is told the outcome
/// is unknown and how to find out.
fn db_message(err: &sqlx::Error) -> &'static str {
    match err {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Database(_) => {
            "the database could not complete this request; nothing was changed, try again"
        }
        // The database answered, and the server could not read the answer:
        // a bug in the server, not a broken connection.
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => {
            "the server could not read the database's answer to this request (a server bug; \
             its log has the details): if it was a change, it may or may not have been made. \
             Read the state back before repeating it"
        }
        _ => {
            "the database connection broke during this request: if it was a change, it may \
             or may not have been made. Retry it with the same request_id (a call that \
             carried one is done once); for a call without one, read the state back before \
             repeating it"
        }
    }
}

impl From<sqlx::Error> for BusError {
    fn from(err: sqlx::Error) -> Self {
        tracing::error!(error = %err, "database error");
        BusError::Db(err)
    }
}

pub type BusResult<T> = Result<T, BusError>;

#[cfg(test)]
mod tests {
    use super::*;

    // The chaos run (seed 20261203, before this fix) saw sends refused with
    // "nothing was changed" during a PostgreSQL restart that were stored:
    // the connection broke after the commit. Only errors that prove nothing
    // ran may say so.
    #[test]
    fn a_broken_connection_says_the_change_may_have_been_made() {
        let broken = BusError::Db(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert!(broken.to_string().contains("may or may not have been made"));
        assert!(!broken.to_string().contains("nothing was changed"));
        assert_eq!(broken.kind(), "unavailable");

        // A session registration racing a takeover once lost its row this
        // way and was told the connection broke.
        let unreadable = BusError::Db(sqlx::Error::RowNotFound);
        assert!(unreadable.to_string().contains("server bug"));
        assert!(!unreadable.to_string().contains("connection broke"));

        let no_connection = BusError::Db(sqlx::Error::PoolTimedOut);
        assert!(no_connection.to_string().contains("nothing was changed"));
    }
}
