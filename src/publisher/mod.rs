//! The NATS side: connecting, checking the stream, and publishing claimed events to JetStream.
//! The relay loop sees [`Outcome`]s, never async-nats types.
//!
//! One concept a file: `connect` (the client), `stream` (the stream's checks and creation),
//! `groups` (an aggregate's events one at a time), `atomic` (`--transactions atomic`), `ingest`
//! (`--publish-batches fast-ingest`, over the protocol of `fast`), `blame` (whose fault a failed
//! publish is) and `trace` (the send spans).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::future::join_all;

use crate::clock::DbClock;
use crate::config::{BatchConfig, HeaderFormat, NatsConfig, PublishConfig};
use crate::error::Result;
use crate::event::OutboxEvent;
use crate::policy::Outcome;
use crate::subject::SubjectTemplate;

mod atomic;
mod blame;
mod connect;
mod fast;
mod groups;
mod ingest;
mod stream;
mod trace;

pub(crate) use connect::connect;

#[derive(Clone)]
pub(crate) struct Publisher {
    client: async_nats::Client,
    js: jetstream::Context,
    subjects: SubjectTemplate,
    header_format: HeaderFormat,
    ce_source: String,
    stream: String,
    create_stream: bool,
    redelivery_gap: Duration,
    timeout: Duration,
    /// The database's clock, which acks and spans are timed on.
    clock: Arc<DbClock>,
    /// `--transactions atomic`: each transaction as one atomic batch.
    atomic: bool,
    /// `--max-batch-bytes`: what the rest of a transaction a claim takes must fit in.
    batch_bytes: usize,
    /// Atomic batches open at once (JetStream takes 50 per stream).
    batches: Arc<tokio::sync::Semaphore>,
    /// `--publish-batches fast-ingest`: a batch's events as fast-ingest batches.
    fast: bool,
    /// The stream's subjects, as `ensure_stream` found them: fast-ingest batches go to one stream,
    /// so an aggregate with an event the stream does not capture is published event by event.
    stream_subjects: Arc<std::sync::Mutex<Vec<String>>>,
    /// The stream's `max_msg_size`, as `ensure_stream` found it (-1: no limit): a message of an
    /// atomic batch over it is refused before the batch is sent.
    stream_max_msg_size: Arc<std::sync::atomic::AtomicI64>,
}

/// The most events one atomic batch holds (nats-server's default limit).
pub const ATOMIC_BATCH_MAX: usize = 1000;

/// Atomic batches this relay keeps open at once, below the 50 a stream takes in all.
const ATOMIC_BATCHES_AT_ONCE: usize = 32;

impl Publisher {
    /// A publisher into `nats.stream` with `publish`'s subjects and headers, awaiting as many acks
    /// at once as `batch` allows. `redelivery_gap`: the longest gap between two publishes of one
    /// row, which the stream's duplicate window must cover.
    pub fn new(
        client: async_nats::Client,
        nats: &NatsConfig,
        publish: &PublishConfig,
        batch: &BatchConfig,
        redelivery_gap: Duration,
        clock: Arc<DbClock>,
    ) -> Result<Self> {
        let js = jetstream::ContextBuilder::new()
            .timeout(publish.timeout)
            .ack_timeout(publish.timeout)
            .max_ack_inflight(batch.acks_in_flight())
            .backpressure_on_inflight(true)
            .build(client.clone());
        Ok(Publisher {
            client,
            js,
            subjects: publish.subjects()?,
            header_format: publish.header_format,
            ce_source: publish.ce_source.clone(),
            stream: nats.stream.clone(),
            create_stream: nats.create_stream,
            redelivery_gap,
            timeout: publish.timeout,
            clock,
            atomic: publish.transactions == crate::config::TransactionMode::Atomic,
            batch_bytes: batch.max_bytes,
            batches: Arc::new(tokio::sync::Semaphore::new(ATOMIC_BATCHES_AT_ONCE)),
            fast: publish.batches == crate::config::PublishBatches::FastIngest,
            stream_subjects: Arc::default(),
            stream_max_msg_size: Arc::new(std::sync::atomic::AtomicI64::new(-1)),
        })
    }

    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The event's subject under the template; an error (the row's) when its values make none.
    pub fn subject(&self, event: &OutboxEvent) -> Result<String> {
        self.subjects.render(event)
    }

    /// Publishes every group concurrently (pipelined on one connection); within a group, one event
    /// at a time in order, stopping at the first failure so an aggregate's order survives retries.
    /// With `--publish-batches fast-ingest`, the groups go out as fast-ingest batches instead
    /// ([`Publisher::publish_fast`]), with the same outcomes.
    pub async fn publish(&self, groups: &[Vec<OutboxEvent>]) -> Vec<Vec<Outcome>> {
        let mut outcomes = if self.fast {
            self.publish_fast(groups).await
        } else {
            join_all(groups.iter().map(|group| self.publish_group(group))).await
        };
        self.judge_no_responders(&mut outcomes).await;
        outcomes
    }

    /// Whether each transaction goes out as one atomic batch (`--transactions atomic`).
    pub fn atomic(&self) -> bool {
        self.atomic
    }

    /// The stream's `max_msg_size` (`None`: no limit, or not known yet).
    fn stream_max_msg_size(&self) -> Option<usize> {
        usize::try_from(
            self.stream_max_msg_size
                .load(std::sync::atomic::Ordering::Relaxed),
        )
        .ok()
    }

    /// A batch's byte budget (`--max-batch-bytes`).
    pub fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }
}
