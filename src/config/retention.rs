//! [`RetentionConfig`] (periodic deletes) and [`MetricsConfig`] (metrics and the HTTP address).

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::{Error, Result};

use super::positive;

/// Retention: what the relay deletes periodically.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RetentionConfig {
    /// Delete processed rows older than this. `None`: keep them.
    pub processed: Option<Duration>,
    /// Delete `processed_events` rows (consumers' idempotency records) older than this, in the
    /// same task. `None`: keep them. Must be longer than any redelivery of an event can come, or
    /// a consumer handles that delivery as a first one.
    pub processed_events: Option<Duration>,
}

impl RetentionConfig {
    /// Refuses ages of zero.
    pub fn validate(&self) -> Result<()> {
        if matches!(self.processed, Some(d) if d.is_zero()) {
            return Err(Error::config("retention", "must be greater than zero"));
        }
        if matches!(self.processed_events, Some(d) if d.is_zero()) {
            return Err(Error::config(
                "processed_events_retention",
                "must be greater than zero",
            ));
        }
        Ok(())
    }

    /// Whether anything is deleted periodically.
    pub fn is_on(&self) -> bool {
        self.processed.is_some() || self.processed_events.is_some()
    }
}

/// Metrics and the HTTP address.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` are served. `None`: not served. Needs the
    /// `http` feature (without it `validate` refuses an address).
    pub addr: Option<SocketAddr>,
    /// Distinct `event_type` label values per metric family; further event types are counted
    /// under `event_type="other"`, so that the series stay bounded whatever the rows hold.
    pub event_types_max: usize,
    /// How often the pending/dead-letter gauges are refreshed.
    pub stats_interval: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            addr: None,
            event_types_max: DEFAULT_METRICS_EVENT_TYPES_MAX,
            stats_interval: Duration::from_secs(5),
        }
    }
}

impl MetricsConfig {
    /// Refuses a stats interval of zero, and an address without the `http` feature.
    pub fn validate(&self) -> Result<()> {
        if cfg!(not(feature = "http")) && self.addr.is_some() {
            return Err(Error::config(
                "metrics_addr",
                "needs the library's `http` feature (or serve Relay::metrics() yourself)",
            ));
        }
        positive("stats_interval", self.stats_interval)
    }
}

/// Default of [`MetricsConfig::event_types_max`]: more than the event types of most applications,
/// and at most about 400 series for them (one published and up to three failed reasons each),
/// which any Prometheus holds with ease.
pub const DEFAULT_METRICS_EVENT_TYPES_MAX: usize = 100;
