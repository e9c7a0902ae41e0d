//! The settings that choose one of a few ways: ordering, wake-ups, the source, the wal source's
//! marking, headers, transactions and publish batches (with the `clap` feature, `clap::ValueEnum`s:
//! see `values`).

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

/// Where the relay finds committed events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// Claim pending rows from the table (`FOR UPDATE SKIP LOCKED`), woken by the gated NOTIFY
    /// trigger and the fallback ticker. Any number of relays share the work.
    #[default]
    Notify,
    /// Stream committed inserts from a logical replication slot (pgoutput): events in commit
    /// order, no trigger or polling in the writers' path. One relay streams; the others stand by.
    /// Needs `wal_level = logical`, a role with REPLICATION, and `migrate --wal` (the publication).
    Wal,
}

/// How `Source::Wal` records that a row was published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WalMarking {
    /// The row is deleted in the batch's transaction once JetStream acknowledged it: the stream
    /// holds it from then on. The cheapest for PostgreSQL (measured in docs/PERFORMANCE.md).
    #[default]
    Delete,
    /// The row is kept and marked `processed_at` like the table source does (history in the
    /// table until `cleanup`/`--retention` deletes it).
    Update,
}

/// Which metadata headers the relay sets on each message (`Nats-Msg-Id` is always set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderFormat {
    /// `Outbox-Event-Id`, `Outbox-Aggregate-Type`, `Outbox-Aggregate-Id`, `Outbox-Event-Type`,
    /// `Outbox-Created-At` (see [`crate::wire`]).
    #[default]
    Outbox,
    /// The CloudEvents NATS binding (binary mode): `ce-specversion`, `ce-id`, `ce-type`,
    /// `ce-source`, `ce-time`, `ce-subject`, and `content-type` for the JSON payload.
    CloudEvents,
    /// Both sets, for consumers moving from one to the other.
    Both,
}

/// How a database transaction's events reach the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransactionMode {
    /// One message per event, each acked on its own (the transaction headers tell consumers the
    /// boundaries).
    #[default]
    Events,
    /// Every transaction's events as one JetStream atomic batch: a consumer sees all of them or
    /// none. Needs nats-server 2.12 or later and a stream with `allow_atomic`.
    Atomic,
}

/// How the relay publishes a batch's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PublishBatches {
    /// Each event on its own, its ack awaited (many acks in flight at once).
    #[default]
    Off,
    /// A batch's events as JetStream fast-ingest batches (nats-server 2.14+, a stream with
    /// `allow_batched`): stored as they arrive, acked every few hundred messages and at the end.
    /// An event counts as published once the server confirmed its storage, as with `Off`.
    FastIngest,
}
