//! The sweep of the deferred aggregates: their pending events go out from the table in
//! seq order (as the table source publishes them), and an aggregate with no pending event left
//! goes back to the stream, in the same transaction.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use backoff::backoff::Backoff;

use super::pipeline::Pipeline;
use super::WalSource;
use crate::event::AggregateKey;
use crate::source::batch::run_claim_with;

/// deferred aggregates looked at per sweep.
const SWEEP_AGGREGATES: usize = 100;

/// The least time the stream has between two sweeps that found more to publish. Between them it
/// has at least as long as the last sweep took: the table's work never takes more than half the
/// relay's time, nor holds the stream up for more than one sweep (one batch) at a time.
const SWEEP_GAP_MIN: Duration = Duration::from_millis(5);

/// Where the rounds of kept transactions ([`WalSource::purge_kept`]) stand: the last transaction
/// looked at, `None` from the start. Memory only says where to look next; what is purged is found
/// in the database.
#[derive(Debug, Default)]
pub(super) struct KeptRounds {
    after: Option<String>,
}

impl WalSource<'_> {
    /// With `--wal-marking delete`: a round of the transactions whose published rows the outbox
    /// keeps for their count (`outbox_kept_transactions`, `outbox_transaction_runs`): those with
    /// no pending row left leave the outbox, whether or not a batch holds them again (a
    /// transaction whose last pending event was discarded, or finished by a batch that could not
    /// see another's marks yet). Errors are logged; the next round comes at the next occasion.
    /// `true`: the round was full, more are to look at.
    pub(super) async fn purge_kept(&mut self, rounds: &mut KeptRounds) -> bool {
        let after = rounds.after.take().unwrap_or_else(|| "0".to_string());
        match self.stores[0].purge_kept(&after).await {
            Ok((next, done)) => {
                if done > 0 {
                    tracing::debug!(
                        transactions = done,
                        "kept rows of transactions done left the outbox"
                    );
                }
                rounds.after = next;
                rounds.after.is_some()
            }
            Err(e) => {
                self.recover(&e);
                rounds.after = Some(after);
                tracing::warn!(error = %e, "deleting the kept rows of transactions done failed; trying again at the next round");
                false
            }
        }
    }

    /// Sweeps a round of the deferred aggregates, as `outbox_wal_deferred` records them
    /// (whoever recorded them): publishes what may go now and takes back those left with nothing
    /// pending. Errors are logged; the sweep comes again. Returns when the next sweep is due (at
    /// the latest a fallback interval on: a deferral recorded by another is found then).
    pub(super) async fn sweep(&mut self, pipeline: &mut Pipeline) -> Option<Instant> {
        let started = Instant::now();
        let mut undeferred = Vec::new();
        let mut deferred = Vec::new();
        let mut next_due = None;
        let mut served = 0;
        let (batch, retry) = (self.batch, self.retry);
        let (publisher, metrics) = (&self.publisher, self.metrics);
        let after = pipeline.cursor();
        let result = match self.stores[0]
            .sweep(
                &after,
                SWEEP_AGGREGATES,
                |chosen| pipeline.serve(chosen),
                batch,
            )
            .await
        {
            Ok((claim, mut record, info)) => {
                next_due = info.next_due;
                served = info.served.len();
                // Rows found moved to another aggregate are recorded with it: memory learns it.
                deferred.clone_from(&record.defer);
                let undeferred = &mut undeferred;
                run_claim_with(
                    retry,
                    publisher,
                    metrics,
                    claim,
                    started,
                    // The stream's order: a transaction's rows of aggregates the table does not
                    // hold wait for what the stream brought before them.
                    Some(&*pipeline),
                    |published, claim| {
                        // Undeferred: the aggregates whose every pending row was in this sweep and
                        // went out. Not those stopped at a row locked elsewhere or not eligible, nor
                        // those with a failure.
                        let mut not_out: HashSet<AggregateKey> =
                            published.unsettled.iter().cloned().collect();
                        not_out.extend(info.held.iter().cloned());
                        let out: HashSet<AggregateKey> = claim
                            .groups
                            .iter()
                            .filter_map(|g| g.first())
                            .map(|e| (e.aggregate_type.clone(), e.aggregate_id.clone()))
                            .filter(|k| !not_out.contains(k))
                            .collect();
                        record
                            .undefer
                            .extend(info.complete.into_iter().filter(|k| out.contains(k)));
                        undeferred.clone_from(&record.undefer);
                        record
                    },
                )
                .await
            }
            Err(e) => Err(e),
        };
        let now = Instant::now();
        match result {
            Ok(report) => {
                pipeline.defer(deferred);
                pipeline.undefer(&undeferred);
                if report.broker_failures == 0 {
                    self.trouble.reset();
                }
                if report.broker_failures > 0 {
                    Some(now + self.trouble_delay())
                } else if report.published > 0 || report.full || served == SWEEP_AGGREGATES {
                    // More may be waiting behind what went out: after the stream's turn.
                    Some(now + now.duration_since(started).max(SWEEP_GAP_MIN))
                } else {
                    let wait = [
                        next_due,
                        report.next_retry,
                        Some(self.source.fallback_interval),
                    ]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(self.source.fallback_interval);
                    Some(now + wait)
                }
            }
            Err(e) => {
                self.recover(&e);
                let delay = self.trouble_delay();
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "sweep of the deferred aggregates failed");
                Some(now + delay)
            }
        }
    }
}
