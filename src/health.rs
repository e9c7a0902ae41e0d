//! What the relay knows about its connections, in one place: each fact is written where it is
//! learnt (the start-up checks and the stats task for the database, the listener for its
//! connection, the NATS client's connection events for the broker) and read by `/readyz`, the
//! `outbox_*_connected` gauges and [`crate::Relay::health`].

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;

use crate::metrics::Metrics;

/// The relay's view of its connections at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthReport {
    /// The last check of the database (schema at start, then the periodic status query) succeeded.
    pub database: bool,
    /// The LISTEN connection is up (always true with `NotifyMode::Poll`, which has none).
    pub listener: bool,
    /// Connected to NATS, with the stream checked at start.
    pub broker: bool,
}

impl HealthReport {
    /// Ready to relay: every part answers.
    pub fn is_ready(&self) -> bool {
        self.database && self.listener && self.broker
    }

    /// The parts that do not answer, by name (`database`, `listener`, `broker`).
    pub fn missing(&self) -> Vec<&'static str> {
        [
            ("database", self.database),
            ("listener", self.listener),
            ("broker", self.broker),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(part, _)| part)
        .collect()
    }
}

pub(crate) struct Health {
    metrics: Arc<Metrics>,
    database: AtomicBool,
    listener: AtomicBool,
    /// The stream was checked at start: from then on the client's connection state decides.
    broker_checked: AtomicBool,
    broker_link: AtomicBool,
}

impl Health {
    /// `polling_only`: no listener to be connected (its gauge stays 1, keeping its alert quiet).
    pub fn new(metrics: Arc<Metrics>, polling_only: bool) -> Health {
        let health = Health {
            metrics,
            database: AtomicBool::new(false),
            listener: AtomicBool::new(false),
            broker_checked: AtomicBool::new(false),
            broker_link: AtomicBool::new(false),
        };
        health.set_listener(polling_only);
        health
    }

    pub fn set_database(&self, up: bool) {
        self.database.store(up, AtomicOrdering::Release);
    }

    pub fn set_listener(&self, up: bool) {
        self.listener.store(up, AtomicOrdering::Release);
        self.metrics.listener_connected.set(i64::from(up));
    }

    /// `--source wal`: its own connections are up (streaming from the slot, or standing by with
    /// the control connection). Reported where the table source reports its LISTEN connection
    /// (`listener` in [`HealthReport`] and `/readyz`, `outbox_listener_connected`): one readiness
    /// contract for both sources.
    pub fn set_stream(&self, up: bool) {
        self.set_listener(up);
    }

    /// The start-up found the stream, on a client that is `connected` now.
    pub fn broker_checked(&self, connected: bool) {
        self.broker_checked.store(true, AtomicOrdering::Release);
        self.set_broker_link(connected);
    }

    /// The NATS client connected or lost its connection.
    pub fn set_broker_link(&self, up: bool) {
        self.broker_link.store(up, AtomicOrdering::Release);
        self.metrics.broker_connected.set(i64::from(
            up && self.broker_checked.load(AtomicOrdering::Acquire),
        ));
    }

    pub fn report(&self) -> HealthReport {
        HealthReport {
            database: self.database.load(AtomicOrdering::Acquire),
            listener: self.listener.load(AtomicOrdering::Acquire),
            broker: self.broker_checked.load(AtomicOrdering::Acquire)
                && self.broker_link.load(AtomicOrdering::Acquire),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_part_answers() {
        let metrics = Arc::new(Metrics::new());
        let h = Health::new(metrics.clone(), false);
        assert_eq!(h.report().missing(), ["database", "listener", "broker"]);
        h.set_database(true);
        h.set_listener(true);
        // Connected before the stream was checked: not yet.
        h.set_broker_link(true);
        assert_eq!(h.report().missing(), ["broker"]);
        assert_eq!(metrics.broker_connected.get(), 0);
        h.broker_checked(true);
        assert!(h.report().is_ready());
        assert_eq!(metrics.broker_connected.get(), 1);
        h.set_broker_link(false);
        assert_eq!(h.report().missing(), ["broker"]);
        assert_eq!(metrics.broker_connected.get(), 0);
    }

    #[test]
    fn polling_only_needs_no_listener() {
        let metrics = Arc::new(Metrics::new());
        let h = Health::new(metrics.clone(), true);
        assert!(h.report().listener);
        assert_eq!(metrics.listener_connected.get(), 1);
    }
}
