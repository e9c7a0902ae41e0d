//! [`BatchConfig`]: what one transaction claims, and the limits derived from it.

use crate::error::{Error, Result};

use super::Ordering;

/// Largest batch accepted: bounds memory and the acks in flight.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// Default byte budget of a batch: 32 MiB.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;

/// Batching: how much one transaction claims, and in which order. The limits derived from the
/// batch size are named and computed here, nowhere else.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BatchConfig {
    /// Rows claimed per transaction.
    pub size: usize,
    /// Payload bytes claimed per transaction (about: payload text plus headers). Bounds the relay's
    /// memory whatever the payloads; a single larger row is still claimed, alone.
    pub max_bytes: usize,
    /// Per-aggregate order or raw throughput.
    pub ordering: Ordering,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            size: 1000,
            max_bytes: DEFAULT_MAX_BATCH_BYTES,
            ordering: Ordering::Aggregate,
        }
    }
}

impl BatchConfig {
    /// Refuses sizes the relay cannot run with.
    pub fn validate(&self) -> Result<()> {
        if self.size == 0 || self.size > MAX_BATCH_SIZE {
            return Err(Error::config(
                "batch_size",
                format!("must be between 1 and {MAX_BATCH_SIZE}"),
            ));
        }
        if self.max_bytes == 0 {
            return Err(Error::config("max_batch_bytes", "must be at least 1 byte"));
        }
        Ok(())
    }

    /// JetStream acks awaited at once: two batches' worth (at least 512), so that a batch's
    /// publishes never wait for room while the one before is acked.
    pub(crate) fn acks_in_flight(&self) -> usize {
        self.size.max(256) * 2
    }

    /// Decoded changes the wal source's stream holds for the relay: two batches' worth.
    pub(crate) fn stream_buffer(&self) -> usize {
        self.size.saturating_mul(2)
    }

    /// Rows and bytes one sweep of the aggregates the wal source handed to the table claims: a
    /// quarter of a batch, so that the stream never waits long behind the table's work (sweeps
    /// and the stream take turns; the table's share of the time is the same whatever the slice).
    pub(crate) fn sweep_slice(&self) -> (usize, usize) {
        ((self.size / 4).max(1), (self.max_bytes / 4).max(1))
    }

    /// Rows of each aggregate one sweep claims when `aggregates` of them may go: an even share of
    /// [`BatchConfig::sweep_slice`] (at least one).
    pub(crate) fn per_aggregate(&self, aggregates: usize) -> usize {
        (self.sweep_slice().0 / aggregates.max(1)).max(1)
    }

    /// Whether `rows` rows of `bytes` bytes fill a batch (the stream stops reading ahead then).
    pub(crate) fn is_full(&self, rows: usize, bytes: usize) -> bool {
        rows >= self.size || bytes >= self.max_bytes
    }
}
