//! [`PublishConfig`]: subjects, headers, the ack timeout, transactions and publish batches.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::subject::SubjectTemplate;

use super::{positive, HeaderFormat, PublishBatches, TransactionMode};

/// Default CloudEvents `source`: names the relay; set `ce_source` to name the producing service.
pub const DEFAULT_CE_SOURCE: &str = "/outbox-relay";

/// Publishing: where each event goes, with which headers, and how long an ack may take.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PublishConfig {
    /// Events are published to `<subject_prefix>.<event_type>` (unless `subject_template` is set).
    pub subject_prefix: String,
    /// Where each event goes, with placeholders `{event_type}`, `{aggregate_type}` and
    /// `{aggregate_id}`, for example `orders.{aggregate_type}.{event_type}`. `None`:
    /// `<subject_prefix>.{event_type}`. A row whose values make an invalid subject is dead-lettered.
    pub subject_template: Option<String>,
    /// Metadata headers: the `Outbox-*` ones, CloudEvents', or both.
    pub header_format: HeaderFormat,
    /// CloudEvents `source` attribute (a URI-reference naming the producer, for example
    /// `/orders-service`), sent as `ce-source` with [`HeaderFormat::CloudEvents`] or `Both`.
    pub ce_source: String,
    /// Bound on the wait for a batch's acks.
    pub timeout: Duration,
    /// One message per event (the default) or each transaction as one atomic batch.
    pub transactions: TransactionMode,
    /// Per-message acks (the default) or fast-ingest batches. Not with
    /// [`TransactionMode::Atomic`].
    pub batches: PublishBatches,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            subject_prefix: "outbox".into(),
            subject_template: None,
            header_format: HeaderFormat::Outbox,
            ce_source: DEFAULT_CE_SOURCE.into(),
            timeout: Duration::from_secs(5),
            transactions: TransactionMode::Events,
            batches: PublishBatches::Off,
        }
    }
}

impl PublishConfig {
    /// Refuses subjects, sources and timeouts the relay cannot publish with.
    pub fn validate(&self) -> Result<()> {
        crate::event::validate_subject_prefix(&self.subject_prefix)?;
        self.subjects()?;
        // A URI-reference (RFC 3986): never empty, no whitespace or control characters, which a
        // header value could not carry anyway.
        if self.header_format != HeaderFormat::Outbox
            && (self.ce_source.is_empty() || !self.ce_source.chars().all(|c| c.is_ascii_graphic()))
        {
            return Err(Error::config(
                "ce_source",
                format!(
                    "{:?} is not a URI-reference (for example /orders-service or urn:example:orders)",
                    self.ce_source
                ),
            ));
        }
        if self.batches == PublishBatches::FastIngest
            && self.transactions == TransactionMode::Atomic
        {
            return Err(Error::config(
                "publish_batches",
                "--publish-batches fast-ingest does not combine with --transactions atomic (fast-ingest batches store each event as it arrives, an atomic batch all or none): pick one",
            ));
        }
        positive("publish_timeout", self.timeout)
    }

    /// The parsed subject template (the default one when `subject_template` is not set).
    pub(crate) fn subjects(&self) -> Result<SubjectTemplate> {
        match &self.subject_template {
            Some(template) => SubjectTemplate::parse(template),
            None => Ok(SubjectTemplate::with_prefix(&self.subject_prefix)),
        }
    }
}
