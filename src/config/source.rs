//! [`SourceConfig`] (table or wal, and wake-ups) and [`WalConfig`] (the wal source's slot and
//! marking).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::schema::{Schema, DEFAULT_SLOT};

use super::{positive, NotifyMode, Source, WalMarking};

/// Where the relay finds committed events and how it is woken.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SourceConfig {
    /// The table ([`Source::Notify`]) or the WAL ([`Source::Wal`]).
    pub source: Source,
    /// How writers wake the table source.
    pub notify_mode: NotifyMode,
    /// Poll this often even without notifications (they can be lost during a reconnect); with
    /// the wal source, how often the aggregates handed to the table are swept at most.
    pub fallback_interval: Duration,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            source: Source::Notify,
            notify_mode: NotifyMode::Gated,
            fallback_interval: Duration::from_secs(5),
        }
    }
}

impl SourceConfig {
    /// Refuses a fallback interval of zero.
    pub fn validate(&self) -> Result<()> {
        positive("fallback_interval", self.fallback_interval)
    }
}

/// The wal source (`Source::Wal`): its slot and how it records published rows. Its stream's
/// buffer is derived from the batch ([`BatchConfig`](super::BatchConfig)).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WalConfig {
    /// The logical replication slot (`None`: `outbox_relay`, or `outbox_relay_<schema>` with a
    /// schema). One per outbox: relays of one outbox share it.
    pub slot_name: Option<String>,
    /// How published rows are recorded.
    pub marking: WalMarking,
}

impl WalConfig {
    /// Refuses a slot name PostgreSQL would not take.
    pub fn validate(&self) -> Result<()> {
        match &self.slot_name {
            Some(slot) => validate_slot_name(slot),
            None => Ok(()),
        }
    }

    /// The slot to stream from: `slot_name`, else one named after the outbox's `schema`
    /// ([`Schema::slot_name`]; [`DEFAULT_SLOT`] without one).
    pub fn slot(&self, schema: Option<&Schema>) -> String {
        match (&self.slot_name, schema) {
            (Some(slot), _) => slot.clone(),
            (None, Some(schema)) => schema.slot_name(),
            (None, None) => DEFAULT_SLOT.to_string(),
        }
    }
}

/// A replication slot name as PostgreSQL takes it: 1 to 63 lowercase letters, digits and
/// underscores.
fn validate_slot_name(slot: &str) -> Result<()> {
    if slot.is_empty()
        || slot.len() > 63
        || !slot
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(Error::config(
            "slot_name",
            format!("{slot:?} is not a replication slot name (1 to 63 lowercase letters, digits and underscores)"),
        ));
    }
    Ok(())
}
