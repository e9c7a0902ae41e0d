//! Relay configuration in sections, each a plain struct with defaults that validates itself:
//! [`PostgresConfig`], [`NatsConfig`], [`PublishConfig`], [`BatchConfig`] (and the limits derived
//! from the batch size), [`RetryConfig`], [`SourceConfig`], [`WalConfig`], [`RetentionConfig`] and
//! [`MetricsConfig`], gathered in [`RelayConfig`]. The relay hands each component only its
//! section. Secrets are kept in types whose `Debug` never shows them ([`DatabaseUrl`],
//! [`NatsUrl`], [`Secret`]), so every struct here derives `Debug`.
//!
//! Every struct is `#[non_exhaustive]`: start from `RelayConfig::new(url)` (or a section's
//! `Default`) and set fields, so that a new setting is not a breaking change.
//!
//! One file per section (`retention` also holds `MetricsConfig`, `source` also `WalConfig`);
//! `modes`: the enums; `secret`: the hidden strings; `values` (feature `clap`): the enums as
//! `clap::ValueEnum`s.

mod batch;
mod modes;
mod nats;
mod postgres;
mod publish;
mod retention;
mod retry;
mod secret;
mod source;
#[cfg(feature = "clap")]
mod values;

use std::time::Duration;

use crate::error::{Error, Result};
use crate::schema::Schema;

pub use self::batch::{BatchConfig, DEFAULT_MAX_BATCH_BYTES, MAX_BATCH_SIZE};
pub use self::modes::{
    HeaderFormat, NotifyMode, Ordering, PublishBatches, Source, TransactionMode, WalMarking,
};
pub(crate) use self::nats::Credentials;
pub use self::nats::NatsConfig;
pub use self::postgres::PostgresConfig;
pub use self::publish::{PublishConfig, DEFAULT_CE_SOURCE};
pub use self::retention::{MetricsConfig, RetentionConfig, DEFAULT_METRICS_EVENT_TYPES_MAX};
pub use self::retry::RetryConfig;
pub use self::secret::{DatabaseUrl, NatsUrl, Secret};
pub use self::source::{SourceConfig, WalConfig};
pub use crate::schema::DEFAULT_SLOT;

/// The relay's configuration: one section per part. `Debug` never shows a secret.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RelayConfig {
    /// PostgreSQL.
    pub postgres: PostgresConfig,
    /// NATS and the stream.
    pub nats: NatsConfig,
    /// Subjects, headers, the ack timeout.
    pub publish: PublishConfig,
    /// Batch size, byte budget, ordering.
    pub batch: BatchConfig,
    /// Attempts and backoff.
    pub retry: RetryConfig,
    /// Table or wal source, and wake-ups.
    pub source: SourceConfig,
    /// The wal source's slot and marking.
    pub wal: WalConfig,
    /// Periodic deletes.
    pub retention: RetentionConfig,
    /// Metrics and the HTTP address.
    pub metrics: MetricsConfig,
}

/// A duration that must not be zero; the error names `field`.
fn positive(field: &'static str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::config(field, "must be greater than zero"));
    }
    Ok(())
}

impl RelayConfig {
    /// A config with defaults for everything but the database URL.
    pub fn new(database_url: impl Into<DatabaseUrl>) -> Self {
        RelayConfig {
            postgres: PostgresConfig::new(database_url),
            ..Default::default()
        }
    }

    /// Refuses values the relay cannot run with: each section's, then what crosses sections.
    /// The error names the field (as the flag is named).
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_relay::RelayConfig;
    ///
    /// let mut config = RelayConfig::new("postgres://relay@db:5432/app");
    /// config.nats.url = "nats://nats:4222".into();
    /// config.source.fallback_interval = Duration::from_secs(5);
    /// assert!(config.validate().is_ok());
    ///
    /// config.batch.size = 0;
    /// let err = config.validate().unwrap_err();
    /// assert!(err.is_usage());
    /// assert_eq!(err.config_field().map(|(field, _)| field), Some("batch_size"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        self.postgres.validate()?;
        self.nats.validate()?;
        self.publish.validate()?;
        if self.nats.create_stream && self.publish.subjects()?.stream_subject().is_none() {
            return Err(Error::config(
                "subject_template",
                "starts with a placeholder, so no stream subject can capture it: start it with a literal token, or create the stream yourself instead of create_stream",
            ));
        }
        self.batch.validate()?;
        self.retry.validate()?;
        self.source.validate()?;
        self.wal.validate()?;
        self.retention.validate()?;
        self.metrics.validate()
    }

    /// Validates once and resolves what the relay derives from the config (the user's value is
    /// left as it was given).
    pub(crate) fn resolve(self) -> Result<Settings> {
        self.validate()?;
        let schema = Schema::optional(self.postgres.schema.as_deref())?;
        Ok(Settings {
            listen_url: self.postgres.session_url(schema.as_ref())?,
            slot: self.wal.slot(schema.as_ref()),
            schema,
            config: self,
        })
    }

    /// The replication slot `Source::Wal` streams from (see [`WalConfig::slot`]). Fails as
    /// [`PostgresConfig::validate`] does when the schema is not a plain lowercase identifier.
    pub fn slot(&self) -> Result<String> {
        let schema = Schema::optional(self.postgres.schema.as_deref())?;
        Ok(self.wal.slot(schema.as_ref()))
    }

    /// Longest gap between two publishes of one row: JetStream deduplicates only inside the
    /// stream's duplicate window, so a window shorter than this can let a redelivery through.
    pub fn longest_redelivery_gap(&self) -> Duration {
        self.retry.max + self.publish.timeout
    }
}

/// A validated [`RelayConfig`] and what the relay derives from it.
pub(crate) struct Settings {
    pub config: RelayConfig,
    /// `config.postgres.schema`, validated.
    pub schema: Option<Schema>,
    /// The LISTEN connection's URL: `listen_url` or `url`, with the schema.
    pub listen_url: String,
    /// The wal source's slot.
    pub slot: String,
}

#[cfg(test)]
mod tests;
