//! Prometheus metrics of the relay (`/metrics`). Names are part of the interface: alert rules and
//! dashboards in `deploy/` use them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
/// The `event_type` label.
pub struct EventTypeLabel {
    /// The event's type.
    pub event_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
/// Labels of `outbox_events_failed`.
pub struct FailedLabels {
    /// The event's type.
    pub event_type: String,
    /// broker / rejected / timeout
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
/// The `reason` label of `outbox_wakeups`.
pub struct ReasonLabel {
    /// notify / fallback / backlog / reconnect / armed (the catch-up poll after arming) / poll
    /// (arming waits for a long writer transaction)
    pub reason: &'static str,
}

/// Every metric of the relay, registered in `registry`.
pub struct Metrics {
    /// The registry holding them all (serve it with [`Metrics::encode`]).
    pub registry: Registry,
    /// `outbox_events_published`
    pub published: Family<EventTypeLabel, Counter>,
    /// `outbox_events_failed`
    pub failed: Family<FailedLabels, Counter>,
    /// `outbox_events_dead_lettered`
    pub dead_lettered: Counter,
    /// `outbox_events_pending`
    pub pending: Gauge,
    /// `outbox_oldest_pending_age_seconds`
    pub oldest_pending_age_seconds: Gauge<f64, AtomicU64>,
    /// `outbox_dead_letters`
    pub dead_letters: Gauge,
    /// `outbox_batch_duration_seconds`
    pub batch_duration: Histogram,
    /// `outbox_publish_duration_seconds`
    pub publish_duration: Histogram,
    /// `outbox_commit_to_publish_seconds`
    pub commit_to_publish: Histogram,
    /// `outbox_wakeups`
    pub wakeups: Family<ReasonLabel, Counter>,
    /// `outbox_listener_connected`
    pub listener_connected: Gauge,
    /// `outbox_listener_reconnects`
    pub listener_reconnects: Counter,
    /// `outbox_broker_connected`
    pub broker_connected: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric, registered and at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            published: Family::default(),
            failed: Family::default(),
            dead_lettered: Counter::default(),
            pending: Gauge::default(),
            oldest_pending_age_seconds: Gauge::default(),
            dead_letters: Gauge::default(),
            // 100 us .. ~100 s
            batch_duration: Histogram::new(exponential_buckets(0.0001, 2.5, 16)),
            publish_duration: Histogram::new(exponential_buckets(0.0001, 2.5, 16)),
            commit_to_publish: Histogram::new(exponential_buckets(0.0001, 2.5, 18)),
            wakeups: Family::default(),
            listener_connected: Gauge::default(),
            listener_reconnects: Counter::default(),
            broker_connected: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "outbox_events_published",
            "Events acknowledged by JetStream",
            m.published.clone(),
        );
        registry.register(
            "outbox_events_failed",
            "Failed publishes, by reason (broker, rejected, timeout)",
            m.failed.clone(),
        );
        registry.register(
            "outbox_events_dead_lettered",
            "Events moved to outbox_dead_letters",
            m.dead_lettered.clone(),
        );
        registry.register(
            "outbox_events_pending",
            "Pending events (not published, not dead-lettered)",
            m.pending.clone(),
        );
        registry.register(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest pending event",
            m.oldest_pending_age_seconds.clone(),
        );
        registry.register(
            "outbox_dead_letters",
            "Dead letters waiting for an operator",
            m.dead_letters.clone(),
        );
        registry.register(
            "outbox_batch_duration_seconds",
            "Claim, publish, mark and commit of one batch",
            m.batch_duration.clone(),
        );
        registry.register(
            "outbox_publish_duration_seconds",
            "Publishing one batch until its last ack",
            m.publish_duration.clone(),
        );
        registry.register(
            "outbox_commit_to_publish_seconds",
            "From the event's created_at to its JetStream ack",
            m.commit_to_publish.clone(),
        );
        registry.register(
            "outbox_wakeups",
            "Wake-ups of the batch processor, by reason (notify, fallback, backlog, reconnect, armed, poll)",
            m.wakeups.clone(),
        );
        registry.register(
            "outbox_listener_connected",
            "1 while the LISTEN connection is up (always 1 with --notify-mode poll, which has none)",
            m.listener_connected.clone(),
        );
        registry.register(
            "outbox_listener_reconnects",
            "Reconnects of the LISTEN connection",
            m.listener_reconnects.clone(),
        );
        registry.register(
            "outbox_broker_connected",
            "1 while connected to NATS",
            m.broker_connected.clone(),
        );
        registry.register(
            "outbox_relay_build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics { registry, ..m }
    }

    /// Counts a wake-up of the batch processor.
    pub fn wakeup(&self, reason: &'static str) {
        self.wakeups.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
