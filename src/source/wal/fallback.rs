//! The stream's fallback, as the table source has its fallback ticker for missed notifications:
//! every `--fallback-interval`, pending rows the slot has already passed without the stream
//! carrying them (a publication changed for a moment, a row changed by hand, a defect) are found
//! and their aggregates deferred, which publishes them in seq order.
//!
//! A look notes the server's WAL position `L` after seeing, per aggregate, its oldest pending row
//! that may go now (of aggregates not deferred). Every such row committed before `L`.
//! Once the pipeline has confirmed `L` or past it, the stream has carried and resolved everything
//! committed before it: a noted row that is still pending, not in the pipeline, and whose
//! aggregate not deferred was in no stream. Its aggregate is recorded as deferred
//! (committed first), with a warning and `outbox_wal_stranded_events`. The looks go round the
//! pending aggregates, at most [`SCAN_AGGREGATES`] each, so a stranded row is found within two
//! intervals of the slot passing it while fewer aggregates than that have pending rows, at a
//! bounded cost per interval whatever the backlog.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::control::{Control, Scan};
use super::pipeline::Pipeline;
use super::WalSource;
use crate::error::Result;
use crate::event::AggregateKey;

/// Aggregates looked at per interval (one probe of the pending aggregate index each).
const SCAN_AGGREGATES: usize = 5_000;

/// Where the fallback stands between two looks.
pub(super) struct Fallback {
    interval: Duration,
    /// When the next look is due.
    pub due: Instant,
    /// The last look, waiting for the slot to pass its position.
    scan: Option<Scan>,
    /// Where the next look starts (the looks go round the aggregates).
    next: Option<AggregateKey>,
}

impl Fallback {
    pub fn new(interval: Duration) -> Fallback {
        Fallback {
            interval,
            due: Instant::now() + interval,
            scan: None,
            next: None,
        }
    }
}

/// The rows of `scan` the slot has passed that the pipeline neither holds nor left to the table:
/// to check in the table (still pending: in no stream). Pure.
pub(super) fn suspects(scan: &Scan, pipeline: &Pipeline) -> Vec<Uuid> {
    let tracked = pipeline.tracked();
    scan.rows
        .iter()
        .filter(|(id, key)| !tracked.contains(id) && !pipeline.deferred().contains(key))
        .map(|(id, _)| *id)
        .collect()
}

impl WalSource<'_> {
    /// A look of the fallback (see the module doc). `true`: aggregates were deferred
    /// (sweep now).
    pub(super) async fn look_for_stranded(
        &mut self,
        control: &Control,
        pipeline: &mut Pipeline,
        fallback: &mut Fallback,
    ) -> Result<bool> {
        fallback.due = Instant::now() + fallback.interval;
        let mut deferred = false;
        if let Some(scan) = fallback.scan.take() {
            if pipeline.confirmed() < scan.lsn {
                // Not passed yet: the same rows are looked at once it is.
                fallback.scan = Some(scan);
                return Ok(false);
            }
            let ids = suspects(&scan, pipeline);
            if !ids.is_empty() {
                let stranded = control.stranded_check(&ids).await?;
                if let Some((first, _)) = stranded.first() {
                    let keys: BTreeSet<AggregateKey> =
                        stranded.iter().map(|(_, k)| k.clone()).collect();
                    let keys: Vec<AggregateKey> = keys.into_iter().collect();
                    control.defer(&keys).await?;
                    pipeline.defer(keys.iter().cloned());
                    self.metrics.wal_stranded.inc_by(stranded.len() as u64);
                    tracing::warn!(
                        events = stranded.len(),
                        aggregates = keys.len(),
                        event_id = %first,
                        "pending events that the replication slot had passed were in no stream (a publication changed for a moment, or rows changed by hand): their aggregates go to the table, which publishes them in seq order"
                    );
                    deferred = true;
                }
            }
        }
        let scan = control
            .stranded_scan(SCAN_AGGREGATES, fallback.next.as_ref())
            .await?;
        fallback.next = scan.next.clone();
        fallback.scan = (!scan.rows.is_empty()).then_some(scan);
        Ok(deferred)
    }
}
