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
    /// The database failed. The text stays in the server log.
    #[error("the database could not complete this request; nothing was changed, try again")]
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

impl From<sqlx::Error> for BusError {
    fn from(err: sqlx::Error) -> Self {
        tracing::error!(error = %err, "database error");
        crate::metrics::record_db_error(&err);
        BusError::Db(err)
    }
}

pub type BusResult<T> = Result<T, BusError>;
