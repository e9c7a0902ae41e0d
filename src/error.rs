//! The one error type of the library: opaque, asked through its predicates (which drive the
//! relay's backoff, its connection resets and the CLI's exit codes) or its [`ErrorKind`].

use std::time::Duration;

/// Everything that can go wrong in the library. Ask it with [`Error::kind`] and the predicates
/// ([`Error::is_retryable`], [`Error::is_usage`], [`Error::is_not_found`], ...); its message
/// ([`std::fmt::Display`]) is for people.
///
/// ```
/// use outbox_relay::{Error, ErrorKind, RelayConfig};
///
/// /// What a writer does with a failed transaction.
/// fn next_step(err: &Error) -> &'static str {
///     if err.is_retryable() {
///         "run the transaction again" // connection lost, serialization failure, ...
///     } else if err.is_usage() {
///         "fix the input" // an invalid event or setting
///     } else {
///         "give up and report"
///     }
/// }
///
/// let err = RelayConfig::new("").validate().unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Config);
/// assert_eq!(err.config_field().map(|(field, _)| field), Some("database_url"));
/// assert_eq!(next_step(&err), "fix the input");
/// ```
///
/// An error made from a lower-level failure (an I/O error, an async-nats or tokio-postgres error)
/// keeps it: [`std::error::Error::source`] walks down to it, and the message ends with its text.
#[derive(Debug)]
pub struct Error(Box<Inner>);

/// A lower-level failure behind an [`Error`].
type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug)]
struct Inner {
    repr: Repr,
    /// What failed underneath, for the variants that do not hold it themselves.
    cause: Option<Cause>,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0.repr, f)?;
        match &self.0.cause {
            // Redacted here too: the message is what logs and terminals show.
            Some(cause) => write!(f, ": {}", crate::redact::redact(&cause.to_string())),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0.cause {
            Some(cause) => Some(cause.as_ref()),
            None => std::error::Error::source(&self.0.repr),
        }
    }
}

/// What kind of failure an [`Error`] is. New kinds may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A configuration value is unusable; [`Error::config_field`] names the setting.
    Config,
    /// An event was refused before it reached the database.
    InvalidEvent,
    /// The database has no outbox schema, or an older one.
    SchemaMissing,
    /// PostgreSQL failed or could not be reached (through tokio-postgres or sqlx).
    Database,
    /// NATS could not be reached.
    BrokerConnect,
    /// A server refused the credentials or the TLS handshake: retrying the same settings cannot
    /// succeed.
    Refused,
    /// The JetStream stream is missing, or a JetStream API call failed.
    Stream,
    /// The broker as a whole is unavailable: nothing was published and no attempt was spent.
    BrokerUnavailable,
    /// A bounded wait ran out.
    Timeout,
    /// An operator command named ids that do not exist or are not in the expected state.
    NotFound,
    /// An I/O error (a listening socket, a file).
    Io,
}

#[derive(Debug, thiserror::Error)]
enum Repr {
    #[error("invalid configuration: {field}: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    #[error("invalid event: {0}")]
    InvalidEvent(String),
    #[error("the outbox schema is missing or out of date (found version {found:?}, need {need}): run `outbox-relay migrate`")]
    SchemaMissing { found: Option<i32>, need: i32 },
    #[error("database error: {}", describe_db_error(.0))]
    Database(#[from] tokio_postgres::Error),
    /// Through sqlx (the `sqlx` feature's writer), classified when it was made.
    #[error("database error: {message}")]
    Sqlx { message: String, retryable: bool },
    #[error("NATS connection failed: {0}")]
    BrokerConnect(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("JetStream: {0}")]
    Stream(String),
    #[error("broker unavailable: {0}")]
    BrokerUnavailable(String),
    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
    #[error("{0}")]
    NotFound(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{message}")]
    Replication { message: String, retryable: bool },
    /// The database connection or an answer of the database is not what the work needs (the
    /// connection holding a claim closed): a new connection may heal it.
    #[error("database error: {0}")]
    DatabaseState(String),
}

impl From<Repr> for Error {
    fn from(repr: Repr) -> Self {
        Error(Box::new(Inner { repr, cause: None }))
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Repr::Database(e).into()
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Repr::Io(e).into()
    }
}

impl Error {
    /// A configuration error naming `field` (for applications that check their own settings
    /// alongside a [`crate::RelayConfig`]).
    pub fn config(field: &'static str, message: impl Into<String>) -> Self {
        Repr::Config {
            field,
            message: message.into(),
        }
        .into()
    }
}

/// Constructors, for the library's own modules.
impl Error {
    pub(crate) fn invalid_event(message: impl Into<String>) -> Self {
        Repr::InvalidEvent(message.into()).into()
    }

    pub(crate) fn schema_missing(found: Option<i32>, need: i32) -> Self {
        Repr::SchemaMissing { found, need }.into()
    }

    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn sqlx(message: String, retryable: bool) -> Self {
        Repr::Sqlx { message, retryable }.into()
    }

    pub(crate) fn broker_connect(message: impl Into<String>) -> Self {
        Repr::BrokerConnect(message.into()).into()
    }

    pub(crate) fn refused(message: impl Into<String>) -> Self {
        Repr::Refused(message.into()).into()
    }

    pub(crate) fn stream(message: impl Into<String>) -> Self {
        Repr::Stream(message.into()).into()
    }

    pub(crate) fn broker_unavailable(message: impl Into<String>) -> Self {
        Repr::BrokerUnavailable(message.into()).into()
    }

    pub(crate) fn timeout(after: Duration, what: impl Into<String>) -> Self {
        Repr::Timeout(after, what.into()).into()
    }

    /// The replication connection of `--source wal` failed; `retryable`: reconnecting may heal it.
    pub(crate) fn replication(message: impl Into<String>, retryable: bool) -> Self {
        Repr::Replication {
            message: message.into(),
            retryable,
        }
        .into()
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Repr::NotFound(message.into()).into()
    }

    /// The database connection or an answer is not what the work needs; retrying on a new
    /// connection may heal it.
    pub(crate) fn database_state(message: impl Into<String>) -> Self {
        Repr::DatabaseState(message.into()).into()
    }

    /// The same error, keeping `cause` (what failed underneath) as its source; the message says
    /// what failed, the cause's text follows it. Kind and predicates stay those of `self`.
    pub(crate) fn caused_by(mut self, cause: impl Into<Cause>) -> Self {
        self.0.cause = Some(cause.into());
        self
    }
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match &self.0.repr {
            Repr::Config { .. } => ErrorKind::Config,
            Repr::InvalidEvent(_) => ErrorKind::InvalidEvent,
            Repr::SchemaMissing { .. } => ErrorKind::SchemaMissing,
            Repr::Database(_)
            | Repr::Sqlx { .. }
            | Repr::Replication { .. }
            | Repr::DatabaseState(_) => ErrorKind::Database,
            Repr::BrokerConnect(_) => ErrorKind::BrokerConnect,
            Repr::Refused(_) => ErrorKind::Refused,
            Repr::Stream(_) => ErrorKind::Stream,
            Repr::BrokerUnavailable(_) => ErrorKind::BrokerUnavailable,
            Repr::Timeout(..) => ErrorKind::Timeout,
            Repr::NotFound(_) => ErrorKind::NotFound,
            Repr::Io(_) => ErrorKind::Io,
        }
    }

    /// For a configuration error: the setting (the library's field name; the CLI shows it as its
    /// flag) and what is wrong with it.
    pub fn config_field(&self) -> Option<(&'static str, &str)> {
        match &self.0.repr {
            Repr::Config { field, message } => Some((field, message)),
            _ => None,
        }
    }

    /// The message of an invalid event, without the "invalid event" prefix.
    pub(crate) fn invalid_event_message(&self) -> Option<&str> {
        match &self.0.repr {
            Repr::InvalidEvent(message) => Some(message),
            _ => None,
        }
    }

    /// The PostgreSQL error behind a database failure, with its SQLSTATE.
    pub fn as_db_error(&self) -> Option<&tokio_postgres::Error> {
        match &self.0.repr {
            Repr::Database(e) => Some(e),
            _ => None,
        }
    }

    /// Worth trying again later without changing anything (connections, broker outages, timeouts,
    /// serialization failures).
    pub fn is_retryable(&self) -> bool {
        match &self.0.repr {
            Repr::Database(e) => is_transient_db_error(e),
            Repr::Sqlx { retryable, .. } | Repr::Replication { retryable, .. } => *retryable,
            Repr::BrokerConnect(_)
            | Repr::BrokerUnavailable(_)
            | Repr::Timeout(..)
            | Repr::Io(_)
            | Repr::DatabaseState(_) => true,
            Repr::Config { .. }
            | Repr::InvalidEvent(_)
            | Repr::SchemaMissing { .. }
            | Repr::Stream(_)
            | Repr::Refused(_)
            | Repr::NotFound(_) => false,
        }
    }

    /// The error is the caller's fault (bad input); a CLI reports it as a usage error.
    pub fn is_usage(&self) -> bool {
        matches!(self.kind(), ErrorKind::Config | ErrorKind::InvalidEvent)
    }

    /// An operator command named something that is not there (the CLI exits 2).
    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }

    /// The broker took nothing (no attempt was spent): pause, the connections are fine.
    pub fn is_broker_unavailable(&self) -> bool {
        self.kind() == ErrorKind::BrokerUnavailable
    }

    /// A named prepared statement was missing or taken on the server connection: a transaction
    /// pooler (PgBouncer before 1.21) handed the session's statements to another client.
    pub fn is_prepared_statement_lost(&self) -> bool {
        sqlstate(self).is_some_and(|c| {
            c == SqlState::INVALID_SQL_STATEMENT_NAME.code()
                || c == SqlState::DUPLICATE_PSTATEMENT.code()
        })
    }

    /// The message with any password of a connection string in it replaced (for logs and
    /// terminals), the causes' text included. The causes behind [`std::error::Error::source`] are
    /// the libraries' own errors: the relay hands them no credentials inside URLs (NATS
    /// credentials travel in the connect options), so walking the chain does not bring back what
    /// this removes.
    pub fn redacted(&self) -> String {
        crate::redact::redact(&self.to_string())
    }

    /// At start: is this something the relay should wait out (a server not up yet, a database not
    /// created yet) rather than exit on? Credentials refused, TLS verification failed, a missing
    /// schema or stream and invalid settings are not: waiting cannot heal them.
    pub(crate) fn heals_by_waiting(&self) -> bool {
        match &self.0.repr {
            Repr::Database(e) => {
                if is_tls_failure(e) {
                    return false;
                }
                match e.code() {
                    // The database may not be created yet; everything else of the server's own
                    // (authentication, permissions) is for the operator. Class 53 (too many
                    // connections, out of memory or disk) passes too.
                    Some(code) => {
                        *code == SqlState::INVALID_CATALOG_NAME
                            || code.code().starts_with("53")
                            || is_transient_db_error(e)
                    }
                    None => true,
                }
            }
            Repr::BrokerConnect(_)
            | Repr::BrokerUnavailable(_)
            | Repr::Timeout(..)
            | Repr::Io(_)
            | Repr::DatabaseState(_) => true,
            Repr::Replication { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

use tokio_postgres::error::SqlState;

fn sqlstate(e: &Error) -> Option<&str> {
    e.as_db_error().and_then(|e| e.code()).map(SqlState::code)
}

/// The one SQLSTATE classifier of both writer APIs (tokio-postgres and sqlx): connection loss,
/// shutdown, serialization failures, lock and statement timeouts — the statement may succeed on
/// a new try.
pub(crate) fn is_transient_sqlstate(code: &str) -> bool {
    const TRANSIENT: [&str; 7] = [
        "40001", // serialization_failure
        "40P01", // deadlock_detected
        "57P01", // admin_shutdown
        "57P02", // crash_shutdown
        "57P03", // cannot_connect_now
        "55P03", // lock_not_available
        "57014", // query_canceled
    ];
    TRANSIENT.contains(&code) || code.starts_with("08") // connection exceptions
}

/// Connection loss, or a transient SQLSTATE.
fn is_transient_db_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        None => true, // I/O or protocol level: the connection is gone
        Some(code) => is_transient_sqlstate(code.code()),
    }
}

/// The TLS handshake failed or the server does not offer TLS that the settings require.
fn is_tls_failure(e: &tokio_postgres::Error) -> bool {
    e.to_string().contains("TLS") || caused_by_rustls(e)
}

/// Is a rustls error (a certificate that does not verify, a handshake refused) somewhere in the
/// chain of causes of `e`, directly or inside an I/O error as TLS streams report it?
pub(crate) fn caused_by_rustls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
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

/// `Result` with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// For tests: the setting a failed result names, if it is a configuration error.
#[cfg(test)]
pub(crate) fn field_of<T>(r: Result<T>) -> Option<&'static str> {
    r.err()
        .and_then(|e| e.config_field().map(|(field, _)| field))
}

#[cfg(test)]
mod tests;
