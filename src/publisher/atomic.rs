//! `--transactions atomic`: a plan's units published, each transaction as one atomic batch.

use async_nats::jetstream;
use futures::future::join_all;

use crate::event::OutboxEvent;
use crate::policy::{Failure, FailureKind, Outcome};
use crate::source::atomic::{At, Plan, Unit};

use super::blame::error_code;
use super::trace::trace_failure;
use super::Publisher;

impl Publisher {
    /// `--transactions atomic`: publishes `plan`'s units, its chains side by side, each chain's
    /// units one after the other, stopping a chain at its first unit not published (the rest of
    /// its aggregates waits behind it). Outcomes in the shape of `groups`; the events the plan
    /// holds are [`Outcome::NotAttempted`].
    pub async fn publish_atomic(
        &self,
        groups: &[Vec<OutboxEvent>],
        plan: &Plan,
    ) -> Vec<Vec<Outcome>> {
        let mut outcomes: Vec<Vec<Outcome>> = groups
            .iter()
            .map(|g| g.iter().map(|_| Outcome::NotAttempted).collect())
            .collect();
        let chains = join_all(plan.chains.iter().map(|chain| async move {
            let mut out = Vec::new();
            for &u in chain {
                let Some(unit) = plan.units.get(u) else {
                    continue;
                };
                let results = self.publish_unit(groups, unit).await;
                let failed = results
                    .iter()
                    .any(|(_, o)| !matches!(o, Outcome::Published { .. }));
                out.extend(results);
                if failed {
                    break;
                }
            }
            out
        }))
        .await;
        for ((g, i), outcome) in chains.into_iter().flatten() {
            if let Some(slot) = outcomes.get_mut(g).and_then(|g| g.get_mut(i)) {
                *slot = outcome;
            }
        }
        self.judge_no_responders(&mut outcomes).await;
        outcomes
    }

    /// One unit of a plan: a lone event as usual; a transaction's events as one atomic batch
    /// (`Nats-Batch-Id`, `Nats-Batch-Sequence`, `Nats-Batch-Commit` on the last), all published or
    /// none. Every event gets the batch's outcome.
    async fn publish_unit(&self, groups: &[Vec<OutboxEvent>], unit: &Unit) -> Vec<(At, Outcome)> {
        let events: Vec<(At, &OutboxEvent)> = unit
            .events
            .iter()
            .filter_map(|&(g, i)| groups.get(g).and_then(|g| g.get(i)).map(|e| ((g, i), e)))
            .collect();
        if let [(at, event)] = events.as_slice() {
            return vec![(*at, self.publish_one(event).await)];
        }
        let txid = unit.txid.unwrap_or(0);
        let now = self.clock.now();
        let mut spans = Vec::with_capacity(events.len());
        let mut messages = Vec::with_capacity(events.len());
        for (_, event) in &events {
            let (span, message) = self.message_in_span(event, now);
            match message {
                Ok(message) => messages.push(message),
                Err(f) => {
                    // The transaction goes out whole or not at all: its other events are held
                    // with this one, and share its fate (its dead letter names them).
                    trace_failure(&span, f.kind, &f.message);
                    let culprit = event.id;
                    return events
                        .iter()
                        .map(|(at, e)| {
                            let message = if e.id == culprit {
                                format!(
                                    "{} (transaction {txid}: its {} other events are held with it)",
                                    f.message,
                                    events.len() - 1
                                )
                            } else {
                                format!(
                                    "held with event {culprit} of its transaction {txid}: {}",
                                    f.message
                                )
                            };
                            (*at, Outcome::Failed(Failure::new(f.kind, message)))
                        })
                        .collect();
                }
            }
            spans.push(span);
        }
        let Ok(_permit) = self.batches.acquire().await else {
            return fail_all(
                &events,
                Failure::new(FailureKind::Broker, "publisher closed"),
            );
        };
        let batch_id = uuid::Uuid::new_v4().simple().to_string();
        let last = messages.len();
        let mut commit = None;
        for (k, ((subject, mut headers), (_, event))) in
            messages.into_iter().zip(&events).enumerate()
        {
            headers.insert("Nats-Batch-Id", batch_id.as_str());
            headers.insert("Nats-Batch-Sequence", (k + 1).to_string().as_str());
            if k + 1 == last {
                headers.insert("Nats-Batch-Commit", "1");
                commit = Some(
                    self.js
                        .publish_with_headers(subject, headers, event.payload.clone())
                        .await,
                );
            } else if let Err(e) = self
                .client
                .publish_with_headers(subject, headers, event.payload.clone())
                .await
            {
                // The server drops the open batch after its timeout.
                return fail_all(
                    &events,
                    Failure::new(
                        FailureKind::Broker,
                        format!("transaction {txid}: cannot send its atomic batch: {e}"),
                    ),
                );
            }
        }
        let result = match commit {
            Some(Ok(ack)) => ack.await,
            Some(Err(e)) => Err(e),
            None => return Vec::new(),
        };
        match result {
            Ok(_) => {
                let acked_at = self.clock.now();
                events
                    .iter()
                    .map(|(at, _)| {
                        (
                            *at,
                            Outcome::Published {
                                duplicate: false,
                                acked_at,
                            },
                        )
                    })
                    .collect()
            }
            Err(e)
                if matches!(
                    error_code(&e),
                    Some(
                        jetstream::ErrorCode::ATOMIC_PUBLISH_CONTAINS_DUPLICATE_MESSAGE
                            | jetstream::ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH
                    )
                ) =>
            {
                if error_code(&e) == Some(jetstream::ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH) {
                    // A server whose batch limit is below ours: never stuck, event by event.
                    tracing::warn!(
                        transaction_id = txid,
                        events = events.len(),
                        error = %e,
                        "the server refused the transaction's atomic batch as too large: publishing it event by event"
                    );
                } else {
                    // Already stored, as a whole (a crash between a batch's commit and the rows'
                    // marking), or in part (published event by event before): JetStream refuses
                    // the whole batch. Sent one by one, what is stored is confirmed as a
                    // duplicate and anything missing is stored alone.
                    tracing::info!(
                        transaction_id = txid,
                        events = events.len(),
                        "transaction already in the stream: confirming its events one by one"
                    );
                }
                let mut out = Vec::with_capacity(events.len());
                let mut failed = false;
                for (at, event) in &events {
                    let outcome = if failed {
                        Outcome::NotAttempted
                    } else {
                        self.publish_one(event).await
                    };
                    failed = !matches!(outcome, Outcome::Published { .. });
                    out.push((*at, outcome));
                }
                out
            }
            Err(e) => {
                let (_, last_event) = events[events.len() - 1];
                let mut f = self.blame(last_event, &e);
                f.message = format!(
                    "transaction {txid} ({} events, one atomic batch): {}",
                    events.len(),
                    f.message
                );
                for span in &spans {
                    trace_failure(span, f.kind, &f.message);
                }
                fail_all(&events, f)
            }
        }
    }
}

/// Every event of a unit with the same failure.
fn fail_all(events: &[(At, &OutboxEvent)], f: Failure) -> Vec<(At, Outcome)> {
    events
        .iter()
        .map(|(at, _)| (*at, Outcome::Failed(f.clone())))
        .collect()
}
