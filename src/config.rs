//! Relay configuration: a plain struct with defaults and [`RelayConfig::validate`]. The CLI maps its
//! flags onto it; applications embedding the relay fill it directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Whether the relay keeps the events of one aggregate in `seq` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// Per (aggregate_type, aggregate_id): events reach the stream in `seq` order, with any number
    /// of relays, retries and backoff.
    #[default]
    Aggregate,
    /// No ordering: raw throughput.
    None,
}

/// How writers wake the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NotifyMode {
    /// Writers notify only while a relay is idle and waiting ("armed"); a draining relay costs the
    /// writers nothing. See docs/ARCHITECTURE.md.
    #[default]
    Gated,
    /// Every writing transaction notifies (the relay stays armed): for comparison.
    Always,
    /// No LISTEN at all: the relay polls every `fallback_interval`.
    Poll,
}

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// libpq-style URL of the database holding `outbox_events`.
    pub database_url: String,
    /// A separate URL for the LISTEN connection (for example direct to PostgreSQL when
    /// `database_url` goes through PgBouncer in transaction mode). Defaults to `database_url`.
    pub listen_database_url: Option<String>,
    /// PostgreSQL schema holding the outbox objects (`None`: the connection's search_path,
    /// normally `public`).
    pub schema: Option<String>,
    pub nats_url: String,
    /// NATS credentials: a JWT + NKey `.creds` file, or an NKey seed file.
    pub nats_creds: Option<PathBuf>,
    pub nats_nkey: Option<PathBuf>,
    /// TLS towards NATS: extra root CA, and a client certificate and key.
    pub nats_tls_ca: Option<PathBuf>,
    pub nats_tls_cert: Option<PathBuf>,
    pub nats_tls_key: Option<PathBuf>,
    /// JetStream stream the events are published into; checked at start.
    pub stream: String,
    /// Create `stream` when it is missing.
    pub create_stream: bool,
    /// Events are published to `<subject_prefix>.<event_type>`.
    pub subject_prefix: String,
    /// Poll this often even without notifications (they can be lost during a reconnect).
    pub fallback_interval: Duration,
    /// Rows claimed per transaction.
    pub batch_size: usize,
    /// Payload bytes claimed per transaction (about: payload text plus headers). Bounds the relay's
    /// memory whatever the payloads; a single larger row is still claimed, alone.
    pub max_batch_bytes: usize,
    /// A row failing this many times is dead-lettered.
    pub max_attempts: u32,
    /// Bound on the wait for a batch's acks.
    pub publish_timeout: Duration,
    /// First retry delay of a failed row; doubles (with jitter) up to `retry_max`.
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub ordering: Ordering,
    pub notify_mode: NotifyMode,
    /// Delete processed rows older than this, periodically. `None`: keep them.
    pub retention: Option<Duration>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served. `None`: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// How often the pending/dead-letter gauges are refreshed.
    pub stats_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            database_url: String::new(),
            listen_database_url: None,
            schema: None,
            nats_url: "nats://127.0.0.1:4222".into(),
            nats_creds: None,
            nats_nkey: None,
            nats_tls_ca: None,
            nats_tls_cert: None,
            nats_tls_key: None,
            stream: "OUTBOX".into(),
            create_stream: false,
            subject_prefix: "outbox".into(),
            fallback_interval: Duration::from_secs(5),
            batch_size: 1000,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_attempts: 10,
            publish_timeout: Duration::from_secs(5),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            ordering: Ordering::Aggregate,
            notify_mode: NotifyMode::Gated,
            retention: None,
            metrics_addr: None,
            stats_interval: Duration::from_secs(5),
        }
    }
}

/// Largest batch accepted: bounds memory and the acks in flight.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// Default byte budget of a batch: 32 MiB.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;

impl RelayConfig {
    /// A config with defaults for everything but the database URL.
    pub fn new(database_url: impl Into<String>) -> Self {
        RelayConfig {
            database_url: database_url.into(),
            ..Default::default()
        }
    }

    /// Refuses values the relay cannot run with. The error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.database_url.trim().is_empty() {
            return Err(Error::config("database_url", "is required"));
        }
        crate::db::parse_config(&self.database_url, "database_url")?;
        if let Some(url) = &self.listen_database_url {
            crate::db::parse_config(url, "listen_database_url")?;
        }
        if let Some(schema) = &self.schema {
            crate::db::validate_schema(schema)?;
        }
        if self.nats_url.trim().is_empty() {
            return Err(Error::config("nats_url", "is required"));
        }
        if self.stream.is_empty()
            || self
                .stream
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
        {
            return Err(Error::config(
                "stream",
                format!("{:?} is not a valid JetStream stream name", self.stream),
            ));
        }
        if self.nats_tls_cert.is_some() != self.nats_tls_key.is_some() {
            return Err(Error::config(
                "nats_tls_cert",
                "a client certificate needs its key (and the other way round)",
            ));
        }
        crate::event::validate_subject_prefix(&self.subject_prefix)?;
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(Error::config(
                "batch_size",
                format!("must be between 1 and {MAX_BATCH_SIZE}"),
            ));
        }
        if self.max_batch_bytes == 0 {
            return Err(Error::config("max_batch_bytes", "must be at least 1 byte"));
        }
        if self.max_attempts == 0 {
            return Err(Error::config("max_attempts", "must be at least 1"));
        }
        let positive = [
            ("fallback_interval", self.fallback_interval),
            ("publish_timeout", self.publish_timeout),
            ("retry_initial", self.retry_initial),
            ("stats_interval", self.stats_interval),
        ];
        for (field, d) in positive {
            if d.is_zero() {
                return Err(Error::config(field, "must be greater than zero"));
            }
        }
        if self.retry_max < self.retry_initial {
            return Err(Error::config(
                "retry_max",
                "must not be shorter than retry_initial",
            ));
        }
        if matches!(self.retention, Some(d) if d.is_zero()) {
            return Err(Error::config("retention", "must be greater than zero"));
        }
        Ok(())
    }

    /// The effective configuration for logs: URLs with passwords and tokens replaced.
    pub fn redacted(&self) -> String {
        let redact = crate::db::redact;
        format!(
            "database_url={} listen_database_url={} schema={} nats_url={} stream={} create_stream={} subject_prefix={} \
             fallback_interval={} batch_size={} max_batch_bytes={} max_attempts={} publish_timeout={} retry_initial={} \
             retry_max={} ordering={:?} notify_mode={:?} retention={} metrics_addr={} nats_creds={} nats_nkey={}",
            redact(&self.database_url),
            self.listen_database_url.as_deref().map(redact).unwrap_or_else(|| "-".into()),
            self.schema.as_deref().unwrap_or("-"),
            redact(&self.nats_url),
            self.stream,
            self.create_stream,
            self.subject_prefix,
            humantime::format_duration(self.fallback_interval),
            self.batch_size,
            self.max_batch_bytes,
            self.max_attempts,
            humantime::format_duration(self.publish_timeout),
            humantime::format_duration(self.retry_initial),
            humantime::format_duration(self.retry_max),
            self.ordering,
            self.notify_mode,
            self.retention.map(|d| humantime::format_duration(d).to_string()).unwrap_or_else(|| "off".into()),
            self.metrics_addr.map(|a| a.to_string()).unwrap_or_else(|| "off".into()),
            self.nats_creds.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into()),
            self.nats_nkey.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into()),
        )
    }

    /// Database URLs with the schema applied (see [`crate::db::with_schema`]).
    pub(crate) fn resolved_urls(&self) -> Result<(String, String)> {
        let listen = self
            .listen_database_url
            .clone()
            .unwrap_or_else(|| self.database_url.clone());
        match &self.schema {
            Some(schema) => Ok((
                crate::db::with_schema(&self.database_url, schema)?,
                crate::db::with_schema(&listen, schema)?,
            )),
            None => Ok((self.database_url.clone(), listen)),
        }
    }

    /// Longest gap between two publishes of one row: JetStream deduplicates only inside the
    /// stream's duplicate window, so a window shorter than this can let a redelivery through.
    pub fn longest_redelivery_gap(&self) -> Duration {
        self.retry_max + self.publish_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_once_a_url_is_set() {
        assert!(RelayConfig::default().validate().is_err());
        RelayConfig::new("postgres://localhost/db")
            .validate()
            .expect("defaults are valid");
    }

    #[test]
    fn errors_name_the_field() {
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.batch_size = 0;
        assert!(matches!(
            c.validate(),
            Err(Error::Config {
                field: "batch_size",
                ..
            })
        ));
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.subject_prefix = "a.*".into();
        assert!(matches!(
            c.validate(),
            Err(Error::Config {
                field: "subject_prefix",
                ..
            })
        ));
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.stream = "has.dot".into();
        assert!(matches!(
            c.validate(),
            Err(Error::Config {
                field: "stream",
                ..
            })
        ));
    }
}
