//! `--source wal`: committed inserts of the outbox from a logical replication slot, in commit
//! order.
//!
//! - `leader`: lead or stand by (an advisory lock on the control connection), check the setup and
//!   the slot (creating it, and catching up from the table behind a new one), start the stream.
//! - `driver`: the pipelined batches (one recorded while the next publishes and the one after is
//!   claimed), performing what `pipeline` decides.
//! - `pipeline`: the pure state machine of streamed rows, batches in flight, the deferred
//!   aggregates and the position the slot may confirm.
//! - `publication`: whether this outbox's publication publishes every insert of its table, and
//!   how `migrate --wal` makes it so.
//! - `store`: the worker connections' claims by id, sweeps and records; `control`: the control
//!   connection (leadership, the slot, the deferred aggregates).
//! - `stream` (with `pgoutput`): the replication connection, decoded as it arrives into the few
//!   facts the pipeline needs.
//! - `sweep`: publishes the events of deferred aggregates, in seq order, and takes them
//!   back once none is pending.
//! - `fallback`: every `--fallback-interval`, finds pending rows the slot passed that no stream
//!   carried, and defers their aggregates.

mod assemble;
pub(crate) mod control;
mod driver;
mod fallback;
mod leader;
pub(crate) mod pgoutput;
pub(crate) mod pipeline;
pub(crate) mod publication;
pub(crate) mod store;
pub(crate) mod stream;
pub(crate) mod streamed;
mod sweep;

use std::time::Duration;

use backoff::exponential::ExponentialBackoff;
use backoff::SystemClock;

use crate::config::{BatchConfig, RetryConfig, SourceConfig};
use crate::error::Error;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::publisher::Publisher;
use store::WalStore;

/// Appended to the claim's `BEGIN` on the worker connections: the batches' records commit
/// durably whatever `synchronous_commit` says (`begin_durable.sql`).
pub(crate) const BEGIN_DURABLE: &str = include_str!("../../../sql/queries/wal/begin_durable.sql");

/// Why leading stopped (shutdown returns `Ok`).
enum Stop {
    /// Setup that waiting cannot heal (wal_level, the publication, the slot's plugin): exit.
    Fatal(Error),
    /// Connections, the slot in use, a lost stream: reconnect after a pause.
    Retry(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        if e.is_retryable() || e.heals_by_waiting() {
            Stop::Retry(e)
        } else {
            Stop::Fatal(e)
        }
    }
}

/// The wal source of one relay.
pub(crate) struct WalSource<'a> {
    pub batch: &'a BatchConfig,
    pub retry: &'a RetryConfig,
    /// `fallback_interval`: the longest wait for a sweep of the deferred aggregates.
    pub source: &'a SourceConfig,
    /// The control and replication connections' URL (direct, never pooled; the schema in the
    /// session).
    pub url: &'a str,
    pub publisher: Publisher,
    pub metrics: &'a Metrics,
    pub health: &'a Health,
    /// Three worker connections: one records a batch while the next publishes and the one after
    /// is claimed.
    pub stores: [WalStore; 3],
    pub slot: String,
    pub trouble: ExponentialBackoff<SystemClock>,
    /// The outbox table as the last stream knew it (see [`stream::OutboxTable`]).
    pub table: stream::OutboxTable,
}

impl WalSource<'_> {
    /// At shutdown, after work that did not finish within the grace: says what it waited for,
    /// and cancels and drops the worker connections (their transactions roll back; nothing
    /// stays locked).
    async fn abandon(&mut self, waiting_for: &str) {
        tracing::warn!(
            waiting_for,
            grace_ms = crate::stop::GRACE.as_millis() as u64,
            "stopping without the work in hand: it was still waiting for {waiting_for} after the shutdown's grace; it goes again to the next leader"
        );
        futures::future::join_all(self.stores.iter_mut().map(|s| s.table().cancel_and_reset()))
            .await;
    }

    /// The next pause after trouble (exponential, capped).
    fn trouble_delay(&mut self) -> Duration {
        crate::source::recovery::next_delay(&mut self.trouble)
    }

    /// After a failed batch or sweep: connections that may be broken are dropped, statements
    /// lost to a pooler are sent unnamed from now on.
    fn recover(&mut self, e: &Error) {
        crate::source::recovery::recover(self.stores.iter_mut().map(WalStore::table), e);
    }
}
