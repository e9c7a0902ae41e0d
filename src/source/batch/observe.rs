//! What a batch tells of itself: metrics and logs of each settled event, and of an atomic plan.

use super::settle::Settled;
use crate::event::OutboxEvent;
use crate::metrics::Metrics;
use crate::publisher::ATOMIC_BATCH_MAX;
use crate::source::atomic;

/// Counts and logs what an atomic plan postpones or splits.
pub(super) fn note_plan(metrics: &Metrics, groups: &[Vec<OutboxEvent>], plan: &atomic::Plan) {
    if plan.postponed > 0 {
        metrics.transactions_postponed.inc_by(plan.postponed as u64);
        tracing::debug!(
            held = plan.postponed,
            "events postponed: their transactions cannot go out whole in this batch"
        );
    }
    for txid in &plan.split {
        metrics.transactions_split.inc();
        let events = groups
            .iter()
            .flatten()
            .find_map(|e| e.transaction.filter(|t| t.id == *txid))
            .and_then(|t| t.events);
        tracing::warn!(
            transaction_id = txid,
            events,
            max = ATOMIC_BATCH_MAX,
            "transaction larger than one atomic batch may be (1,000 events, or the batch's byte budget): published in parts, each atomic"
        );
    }
}

/// Event types tallied per batch before counting the rest one by one (bounds the search).
const MAX_TALLY: usize = 32;

/// A log line about one event, with its identifying fields.
macro_rules! log_event {
    ($level:expr, $event:expr, $($rest:tt)+) => {
        tracing::event!(
            $level,
            event_id = %$event.id,
            event_type = %$event.event_type,
            aggregate_type = %$event.aggregate_type,
            aggregate_id = %$event.aggregate_id,
            $($rest)+
        )
    };
}

/// Metrics and logs of one settled event; a published one is added to `tally` (by event type).
pub(super) fn observe<'a>(
    metrics: &Metrics,
    tally: &mut Vec<(&'a str, u64)>,
    settled: Settled<'a>,
) {
    match settled {
        Settled::Published {
            event,
            duplicate,
            acked_at,
        } => {
            // Batches hold few event types, mostly in runs: the last one first.
            let event_type = event.event_type.as_str();
            if let Some((_, n)) = tally.iter_mut().rev().find(|(t, _)| *t == event_type) {
                *n += 1;
            } else if tally.len() < MAX_TALLY {
                tally.push((event_type, 1));
            } else {
                metrics.count_published(event_type);
            }
            if let Some(lag) = event
                .created_at
                .system_time()
                .and_then(|t| acked_at.duration_since(t).ok())
            {
                metrics.commit_to_publish.observe(lag.as_secs_f64());
            }
            if duplicate {
                tracing::debug!(event_id = %event.id, event_type = %event.event_type, "already in the stream (deduplicated)");
            }
        }
        Settled::Failed {
            event,
            kind,
            message,
            verdict,
            span,
        } => {
            let _inside = span.enter();
            metrics.count_failed(&event.event_type, kind.label());
            if verdict.dead_letter {
                metrics.dead_lettered.inc();
                log_event!(
                    tracing::Level::ERROR,
                    event,
                    attempt = verdict.attempt,
                    error = %message,
                    "event dead-lettered"
                );
            } else {
                log_event!(
                    tracing::Level::WARN,
                    event,
                    attempt = verdict.attempt,
                    retry_in_ms = verdict.retry_in.as_millis() as u64,
                    error = %message,
                    "publish failed; will retry"
                );
            }
        }
    }
}
