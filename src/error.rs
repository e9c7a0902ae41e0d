//! The one error type of the library.

use std::time::Duration;

/// Everything that can go wrong in the library, with predicates that drive retry decisions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is unusable; `field` names the setting (the CLI maps it to its flag).
    #[error("invalid configuration: {field}: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    /// An event was refused before it reached the database.
    #[error("invalid event: {0}")]
    InvalidEvent(String),
    /// The database has no outbox schema, or an older one.
    #[error("the outbox schema is missing or out of date (found version {found:?}, need {need}): run `outbox-relay migrate`")]
    SchemaMissing { found: Option<i32>, need: i32 },
    /// PostgreSQL failed or could not be reached.
    #[error("database error: {}", describe_db_error(.0))]
    Database(#[from] tokio_postgres::Error),
    /// PostgreSQL failed or could not be reached through sqlx (the `sqlx` feature's writer). The
    /// variant exists without the feature too, so that enabling it never changes this enum.
    #[error("database error: {message}")]
    Sqlx { message: String, retryable: bool },
    /// NATS could not be reached.
    #[error("NATS connection failed: {0}")]
    NatsConnect(String),
    /// A server refused the relay's credentials or its TLS handshake: retrying the same settings
    /// cannot succeed.
    #[error("refused: {0}")]
    Refused(String),
    /// The JetStream stream is missing, or a JetStream API call failed.
    #[error("JetStream: {0}")]
    Stream(String),
    /// The broker as a whole is unavailable: nothing was published and no attempt was spent.
    #[error("broker unavailable: {0}")]
    BrokerUnavailable(String),
    /// A bounded wait ran out.
    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
    /// An operator command named ids that do not exist or are not in the expected state.
    #[error("{0}")]
    NotFound(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    pub(crate) fn config(field: &'static str, message: impl Into<String>) -> Self {
        Error::Config {
            field,
            message: message.into(),
        }
    }

    /// Worth trying again later without changing anything (connections, broker outages, timeouts).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Database(e) => is_transient_db_error(e),
            Error::NatsConnect(_) | Error::BrokerUnavailable(_) | Error::Timeout(..) => true,
            Error::Io(_) => true,
            Error::Sqlx { retryable, .. } => *retryable,
            Error::Config { .. }
            | Error::InvalidEvent(_)
            | Error::SchemaMissing { .. }
            | Error::Stream(_)
            | Error::Refused(_)
            | Error::NotFound(_) => false,
        }
    }

    /// A named prepared statement was missing or taken on the server connection: a transaction
    /// pooler (PgBouncer before 1.21) handed the session's statements to another client.
    pub fn is_prepared_statement_lost(&self) -> bool {
        use tokio_postgres::error::SqlState;
        matches!(self, Error::Database(e) if e.code().is_some_and(|c| {
            *c == SqlState::INVALID_SQL_STATEMENT_NAME || *c == SqlState::DUPLICATE_PSTATEMENT
        }))
    }

    /// The error is the caller's fault (bad input); a CLI reports it as a usage error.
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::Config { .. } | Error::InvalidEvent(_))
    }
}

/// At start: is this something the relay should wait out (a server not up yet, a database not
/// created yet) rather than exit on? Credentials refused, TLS verification failed, a missing
/// schema or stream and invalid settings are not: waiting cannot heal them.
pub(crate) fn heals_by_waiting(e: &Error) -> bool {
    match e {
        Error::Database(e) => {
            if is_tls_failure(e) {
                return false;
            }
            match e.code() {
                // The database may not be created yet; everything else of the server's own
                // (authentication, permissions) is for the operator.
                // Class 53 (too many connections, out of memory or disk) passes too.
                Some(code) => {
                    *code == tokio_postgres::error::SqlState::INVALID_CATALOG_NAME
                        || code.code().starts_with("53")
                        || is_transient_db_error(e)
                }
                None => true,
            }
        }
        Error::NatsConnect(_) | Error::BrokerUnavailable(_) | Error::Timeout(..) | Error::Io(_) => {
            true
        }
        _ => false,
    }
}

/// The TLS handshake failed or the server does not offer TLS that the settings require.
fn is_tls_failure(e: &tokio_postgres::Error) -> bool {
    if e.to_string().contains("TLS") {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return true;
            }
        }
        source = s.source();
    }
    false
}

/// tokio-postgres displays server errors as just "db error"; show the server's message.
fn describe_db_error(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut out = format!("{}: {}", db.severity(), db.message());
        if let Some(detail) = db.detail() {
            out.push_str(&format!(" ({detail})"));
        }
        return out;
    }
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

/// Connection loss, shutdown, serialization failures: the statement may succeed on a new try.
fn is_transient_db_error(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    if e.is_closed() {
        return true;
    }
    match e.code() {
        None => true, // I/O or protocol level: the connection is gone
        Some(code) => {
            *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::LOCK_NOT_AVAILABLE
                || *code == SqlState::QUERY_CANCELED
                || code.code().starts_with("08")
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
