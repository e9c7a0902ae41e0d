//! Prometheus metrics of the relay (`/metrics`). Names are part of the interface: alert rules and
//! dashboards in `deploy/` use them.
//!
//! `event_type` comes from the rows, so its values are unbounded: each family with that label
//! keeps the first [`Metrics::event_types_max`] distinct event types it sees, and counts the others
//! under [`OTHER_EVENT_TYPE`] (see [`EventTypeCap`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};

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

/// The `event_type` label value of the event types beyond the cap, and of an event type that is
/// literally named `other`: it shares the series and takes no place under the cap, so that no two
/// series carry the same label and the sum over all event types stays exact.
pub const OTHER_EVENT_TYPE: &str = "other";

/// The distinct `event_type` values one metric family keeps: the first `max` seen, for the life of
/// the process. Lookups of a known (or overflowing) event type take a shared read lock only, which
/// readers never wait on each other for; the write lock is taken at most `max` times, to admit.
#[derive(Debug)]
pub struct EventTypeCap {
    max: AtomicUsize,
    admitted: RwLock<HashSet<String>>,
    /// The first overflow is logged, once.
    warned: AtomicBool,
    /// Which family, for that log line.
    family: &'static str,
}

impl EventTypeCap {
    /// A cap of `max` distinct event types for the family named `family`.
    pub fn new(family: &'static str, max: usize) -> Self {
        EventTypeCap {
            max: AtomicUsize::new(max),
            admitted: RwLock::new(HashSet::new()),
            warned: AtomicBool::new(false),
            family,
        }
    }

    /// The label value to count `event_type` under: itself while it is admitted or there is room,
    /// [`OTHER_EVENT_TYPE`] otherwise.
    pub fn label(&self, event_type: &str) -> String {
        if event_type == OTHER_EVENT_TYPE {
            return OTHER_EVENT_TYPE.to_string();
        }
        let max = self.max.load(Ordering::Relaxed);
        {
            // A poisoned lock still holds a valid set (inserting cannot half-fail).
            let admitted = self.admitted.read().unwrap_or_else(PoisonError::into_inner);
            if admitted.contains(event_type) {
                return event_type.to_string();
            }
            if admitted.len() >= max {
                return self.other();
            }
        }
        let mut admitted = self
            .admitted
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Another thread may have admitted it, or filled the last place, in between.
        if admitted.contains(event_type) {
            return event_type.to_string();
        }
        if admitted.len() >= max {
            return self.other();
        }
        admitted.insert(event_type.to_string());
        event_type.to_string()
    }

    fn other(&self) -> String {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                metric = self.family,
                max = self.max.load(Ordering::Relaxed),
                "more distinct event types than --metrics-event-types-max: the others are counted as event_type=\"other\""
            );
        }
        OTHER_EVENT_TYPE.to_string()
    }

    /// Changes the cap. Event types admitted already keep their series.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
/// The `table` label of `outbox_retention_deleted_rows`.
pub struct TableLabel {
    /// `outbox_events` or `processed_events`
    pub table: &'static str,
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
    /// `outbox_events_published` ([`Metrics::count_published`] applies the event type cap)
    pub published: Family<EventTypeLabel, Counter>,
    /// `outbox_events_failed` ([`Metrics::count_failed`] applies the event type cap)
    pub failed: Family<FailedLabels, Counter>,
    /// `outbox_events_dead_lettered`
    pub dead_lettered: Counter,
    /// `outbox_transactions_split` (`--transactions atomic`)
    pub transactions_split: Counter,
    /// `outbox_transactions_held` (`--transactions atomic`)
    pub transactions_postponed: Counter,
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
    /// `outbox_retention_deleted_rows`, by table (`outbox_events`, `processed_events`)
    pub retention_deleted: Family<TableLabel, Counter>,
    /// `outbox_replication_lag_bytes`: WAL the slot of `--source wal` retains
    pub replication_lag_bytes: Gauge<f64, AtomicU64>,
    /// `outbox_wal_streaming`: 1 while this relay streams from the slot, 0 while it stands by
    pub wal_streaming: Gauge,
    /// `outbox_wal_stranded_events`: pending rows the slot had passed without the stream
    /// carrying them (found by the stream's fallback and handed to the table)
    pub wal_stranded: Counter,
    /// Every event published, whatever its type (what the relay reports in `outbox_relays`).
    published_all: AtomicU64,
    /// When the last event was published: milliseconds since `started` (0: none yet).
    last_publish_millis: AtomicU64,
    started: std::time::Instant,
    /// The event types `published` counts on their own ([`Metrics::count_published`]).
    published_event_types: EventTypeCap,
    /// The event types `failed` counts on their own ([`Metrics::count_failed`]).
    failed_event_types: EventTypeCap,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric, registered and at zero; at most
    /// [`crate::config::DEFAULT_METRICS_EVENT_TYPES_MAX`] event types per family (the relay sets
    /// its configured cap with [`Metrics::set_event_types_max`]).
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            published: Family::default(),
            failed: Family::default(),
            dead_lettered: Counter::default(),
            transactions_split: Counter::default(),
            transactions_postponed: Counter::default(),
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
            retention_deleted: Family::default(),
            replication_lag_bytes: Gauge::default(),
            wal_streaming: Gauge::default(),
            wal_stranded: Counter::default(),
            published_all: AtomicU64::new(0),
            last_publish_millis: AtomicU64::new(0),
            started: std::time::Instant::now(),
            published_event_types: EventTypeCap::new(
                "outbox_events_published",
                crate::config::DEFAULT_METRICS_EVENT_TYPES_MAX,
            ),
            failed_event_types: EventTypeCap::new(
                "outbox_events_failed",
                crate::config::DEFAULT_METRICS_EVENT_TYPES_MAX,
            ),
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
            "outbox_transactions_split",
            "Transactions larger than one atomic batch, published in parts (--transactions atomic; counted per batch that published a part)",
            m.transactions_split.clone(),
        );
        registry.register(
            "outbox_transactions_held",
            "Events a batch postponed because their transaction could not go out whole with them (--transactions atomic)",
            m.transactions_postponed.clone(),
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
            "outbox_retention_deleted_rows",
            "Rows deleted by the relay's retention (--retention, --processed-events-retention), by table",
            m.retention_deleted.clone(),
        );
        registry.register(
            "outbox_replication_lag_bytes",
            "WAL retained by the replication slot of --source wal (from its restart_lsn), bytes; PostgreSQL keeps it until the relay confirms",
            m.replication_lag_bytes.clone(),
        );
        registry.register(
            "outbox_wal_streaming",
            "1 while this relay streams from the replication slot (--source wal), 0 while it stands by",
            m.wal_streaming.clone(),
        );
        registry.register(
            "outbox_wal_stranded_events",
            "Pending events the replication slot had passed that no stream carried (--source wal: a publication changed for a moment, a row changed by hand), found by the stream's fallback and handed to the table; each is a defect or a hand-made change to look into",
            m.wal_stranded.clone(),
        );
        registry.register(
            "outbox_relay_build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics { registry, ..m }
    }

    /// Counts an event acknowledged by JetStream, under its event type or `other` (see
    /// [`EventTypeCap`]).
    pub fn count_published(&self, event_type: &str) {
        self.count_published_n(event_type, 1);
    }

    /// Counts `n` published events of one type (see [`Metrics::count_published`]).
    pub fn count_published_n(&self, event_type: &str, n: u64) {
        self.published
            .get_or_create(&EventTypeLabel {
                event_type: self.published_event_types.label(event_type),
            })
            .inc_by(n);
        self.published_all.fetch_add(n, Ordering::Relaxed);
        let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_publish_millis
            .store(millis.max(1), Ordering::Relaxed);
    }

    /// Events published since start, every type, and how long ago the last one was (`None`: none
    /// yet).
    pub(crate) fn published_so_far(&self) -> (u64, Option<std::time::Duration>) {
        let total = self.published_all.load(Ordering::Relaxed);
        let last = match self.last_publish_millis.load(Ordering::Relaxed) {
            0 => None,
            at => Some(
                self.started
                    .elapsed()
                    .saturating_sub(std::time::Duration::from_millis(at)),
            ),
        };
        (total, last)
    }

    /// Counts a failed publish, under its event type or `other` (see [`EventTypeCap`]).
    pub fn count_failed(&self, event_type: &str, reason: &str) {
        self.failed
            .get_or_create(&FailedLabels {
                event_type: self.failed_event_types.label(event_type),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Caps the distinct `event_type` values of each family at `max` (0: every event is counted
    /// as `other`). Event types admitted already keep their series.
    pub fn set_event_types_max(&self, max: usize) {
        self.published_event_types.set_max(max);
        self.failed_event_types.set_max(max);
    }

    /// The cap on distinct `event_type` values per family.
    pub fn event_types_max(&self) -> usize {
        self.published_event_types.max()
    }

    /// Counts the rows a retention cleanup deleted from `table`.
    pub fn count_retention_deleted(&self, table: &'static str, rows: u64) {
        self.retention_deleted
            .get_or_create(&TableLabel { table })
            .inc_by(rows);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn published(m: &Metrics, event_type: &str) -> u64 {
        m.published
            .get_or_create(&EventTypeLabel {
                event_type: event_type.into(),
            })
            .get()
    }

    #[test]
    fn the_first_event_types_keep_their_label_the_rest_are_other() {
        let cap = EventTypeCap::new("t", 2);
        assert_eq!(cap.label("a"), "a");
        assert_eq!(cap.label("b"), "b");
        assert_eq!(cap.label("c"), OTHER_EVENT_TYPE);
        assert_eq!(cap.label("a"), "a", "admitted once, kept");
        assert_eq!(cap.label("d"), OTHER_EVENT_TYPE);
        cap.set_max(3);
        assert_eq!(cap.label("d"), "d", "room again after raising the cap");
        assert_eq!(cap.label("c"), OTHER_EVENT_TYPE);
        let none = EventTypeCap::new("t", 0);
        assert_eq!(none.label("a"), OTHER_EVENT_TYPE);
    }

    #[test]
    fn an_event_type_named_other_shares_the_series_and_takes_no_place() {
        let cap = EventTypeCap::new("t", 1);
        assert_eq!(cap.label("other"), OTHER_EVENT_TYPE);
        assert_eq!(cap.label("a"), "a", "`other` took no place");
        assert_eq!(cap.label("b"), OTHER_EVENT_TYPE);
        assert_eq!(
            cap.label("Other"),
            OTHER_EVENT_TYPE,
            "a distinct type, over the cap"
        );
    }

    #[test]
    fn each_family_has_its_own_cap_and_counts_add_up() {
        let m = Metrics::new();
        m.set_event_types_max(2);
        assert_eq!(m.event_types_max(), 2);
        for (event_type, n) in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("other", 5)] {
            for _ in 0..n {
                m.count_published(event_type);
            }
        }
        assert_eq!(published(&m, "a"), 1);
        assert_eq!(published(&m, "b"), 2);
        assert_eq!(published(&m, "c"), 0);
        assert_eq!(published(&m, OTHER_EVENT_TYPE), 3 + 4 + 5);
        // `failed` admits its own first two: c and d.
        for event_type in ["c", "d", "a"] {
            m.count_failed(event_type, "broker");
        }
        let failed = |event_type: &str| {
            m.failed
                .get_or_create(&FailedLabels {
                    event_type: event_type.into(),
                    reason: "broker".into(),
                })
                .get()
        };
        assert_eq!((failed("c"), failed("d"), failed("a")), (1, 1, 0));
        assert_eq!(failed(OTHER_EVENT_TYPE), 1);
        let text = m.encode();
        let series = text
            .lines()
            .filter(|l| l.starts_with("outbox_events_published_total{"))
            .count();
        assert_eq!(series, 4, "a, b, other and the c read above: {text}");
    }

    #[test]
    fn concurrent_lookups_admit_exactly_max() {
        let cap = std::sync::Arc::new(EventTypeCap::new("t", 10));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let cap = cap.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .map(|i| cap.label(&format!("type-{}", (i * 7 + t) % 50)))
                        .filter(|l| l != OTHER_EVENT_TYPE)
                        .collect::<HashSet<_>>()
                })
            })
            .collect();
        let mut named = HashSet::new();
        for t in threads {
            named.extend(t.join().expect("thread"));
        }
        assert_eq!(named.len(), 10, "{named:?}");
    }

    #[test]
    fn retention_deletions_are_counted_by_table() {
        let m = Metrics::new();
        m.count_retention_deleted("processed_events", 7);
        m.count_retention_deleted("processed_events", 3);
        let text = m.encode();
        assert!(
            text.contains("outbox_retention_deleted_rows_total{table=\"processed_events\"} 10"),
            "{text}"
        );
    }
}
