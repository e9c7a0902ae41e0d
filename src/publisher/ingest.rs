//! `--publish-batches fast-ingest`: the groups' events as fast-ingest batches (the protocol is
//! `fast`'s), a refused event failing alone and the rest going out again.

use futures::future::join_all;

use crate::event::OutboxEvent;
use crate::policy::{Failure, FailureKind, Outcome};
use crate::source::atomic::At;

use super::fast;
use super::stream::subject_matches;
use super::trace::trace_failure;
use super::Publisher;

impl Publisher {
    /// `--publish-batches fast-ingest`: the groups' events as fast-ingest batches (see
    /// [`fast`]), each group's events in order. An event is [`Outcome::Published`] only once the
    /// server confirmed its storage (the final ack's count, or a flow ack covering it). A message
    /// the stream refuses ends the batch there (nothing after it is stored): that event fails with
    /// the stream's answer, the rest of its group is held, and the others go out in a new batch.
    /// When the batch itself fails (the broker's trouble, a timeout), each group's first event not
    /// confirmed fails with it and the rest of the group is held. A group with an event the
    /// stream does not capture (routed elsewhere) goes out event by event, as without the flag.
    pub(super) async fn publish_fast(&self, groups: &[Vec<OutboxEvent>]) -> Vec<Vec<Outcome>> {
        let mut outcomes: Vec<Vec<Outcome>> = groups
            .iter()
            .map(|g| g.iter().map(|_| Outcome::NotAttempted).collect())
            .collect();
        let captured = self
            .stream_subjects
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let in_stream = |event: &OutboxEvent| match self.subject(event) {
            Ok(subject) => captured.iter().any(|f| subject_matches(f, &subject)),
            // Failed below, as the event's own.
            Err(_) => true,
        };
        let now = self.clock.now();
        let mut elsewhere = Vec::new();
        let mut queue: Vec<Pending> = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            if !group.iter().all(in_stream) {
                elsewhere.push(g);
                continue;
            }
            for (i, event) in group.iter().enumerate() {
                let (span, message) = self.message_in_span(event, now);
                match message {
                    Ok((subject, headers)) => queue.push(Pending {
                        at: (g, i),
                        message: fast::Message {
                            subject,
                            headers,
                            payload: event.payload.clone(),
                        },
                        span,
                    }),
                    Err(mut f) => {
                        trace_failure(&span, f.kind, &f.message);
                        f.span = span;
                        outcomes[g][i] = Outcome::Failed(f);
                        break;
                    }
                }
            }
        }
        let per_event = join_all(elsewhere.iter().map(|&g| self.publish_group(&groups[g])));
        let batches = self.fast_batches(groups, queue, &mut outcomes);
        let (per_event, ()) = futures::join!(per_event, batches);
        for (g, group_outcomes) in elsewhere.into_iter().zip(per_event) {
            outcomes[g] = group_outcomes;
        }
        outcomes
    }

    /// Publishes `queue` as fast-ingest batches until every event is confirmed or failed (see
    /// [`Publisher::publish_fast`]), writing into `outcomes`.
    async fn fast_batches(
        &self,
        groups: &[Vec<OutboxEvent>],
        mut queue: Vec<Pending>,
        outcomes: &mut [Vec<Outcome>],
    ) {
        let flow = fast::Flow {
            timeout: self.timeout,
            ..fast::DEFAULT_FLOW
        };
        while !queue.is_empty() {
            let (meta, messages): (Vec<_>, Vec<_>) = queue
                .into_iter()
                .map(|p| ((p.at, p.span), p.message))
                .unzip();
            let report = fast::publish(&self.client, messages, flow).await;
            let acked_at = self.clock.now();
            for ((g, i), _) in &meta[..report.stored.min(meta.len())] {
                outcomes[*g][*i] = Outcome::Published {
                    duplicate: false,
                    acked_at,
                };
            }
            let Some(stop) = report.stop else {
                return;
            };
            let first = report.stored;
            let event = |(g, i): At| &groups[g][i];
            // The event the stream refused: its own failure; the rest goes out again.
            if let fast::Stop::Refused { index, error } = &stop {
                if let Some(((g, i), _)) = meta.get(*index).filter(|_| *index >= first) {
                    let (g, i) = (*g, *i);
                    let mut f = self.blame_code(
                        event((g, i)),
                        Some(error.error_code()),
                        format!("fast-ingest batch: {error}"),
                    );
                    if let Some((_, span)) = meta.get(*index) {
                        trace_failure(span, f.kind, &f.message);
                        f.span = span.clone();
                    }
                    outcomes[g][i] = Outcome::Failed(f);
                    // Everything not confirmed goes out again (a message stored without its
                    // confirmation is deduplicated by its Nats-Msg-Id), but the failed event's
                    // group stops at it. The messages are built again (rarely: a refused event).
                    queue = Vec::new();
                    let mut held = std::collections::HashSet::new();
                    for (at, span) in meta.into_iter().skip(first) {
                        if (at.0 == g && at.1 >= i) || held.contains(&at.0) {
                            continue;
                        }
                        let e = event(at);
                        match self.message(e, self.subject(e), &span) {
                            Ok((subject, headers)) => queue.push(Pending {
                                at,
                                message: fast::Message {
                                    subject,
                                    headers,
                                    payload: e.payload.clone(),
                                },
                                span,
                            }),
                            Err(f) => {
                                held.insert(at.0);
                                outcomes[at.0][at.1] = Outcome::Failed(f);
                            }
                        }
                    }
                    continue;
                }
            }
            // The batch failed: each group's first event not confirmed fails with it.
            let failure = |at: At, span: &tracing::Span| -> Failure {
                let mut f = match &stop {
                    fast::Stop::NoResponders { index }
                        if meta.get(*index).is_some_and(|(a, _)| *a == at) =>
                    {
                        let subject = self.subject_shown(event(at));
                        Failure {
                            message: format!("no JetStream stream listens on subject {subject}"),
                            no_responders: Some(subject),
                            ..Failure::new(FailureKind::Broker, "")
                        }
                    }
                    fast::Stop::TimedOut(m) => Failure::new(
                        FailureKind::Timeout,
                        format!(
                            "fast-ingest batch: {m}; {first} of its {} events confirmed",
                            meta.len()
                        ),
                    ),
                    other => Failure::new(
                        FailureKind::Broker,
                        format!(
                            "fast-ingest batch stopped ({}); {first} of its {} events confirmed",
                            describe(other),
                            meta.len()
                        ),
                    ),
                };
                if f.no_responders.is_none() {
                    trace_failure(span, f.kind, &f.message);
                }
                f.span = span.clone();
                f
            };
            let mut failed_groups = std::collections::HashSet::new();
            for (at, span) in meta.iter().skip(first) {
                if failed_groups.insert(at.0) {
                    outcomes[at.0][at.1] = Outcome::Failed(failure(*at, span));
                }
            }
            return;
        }
    }
}

/// An event waiting in a fast-ingest batch: where it is in the groups, its message and send span.
struct Pending {
    at: At,
    message: fast::Message,
    span: tracing::Span,
}

/// A batch's stop, for a failure's message.
fn describe(stop: &fast::Stop) -> String {
    match stop {
        fast::Stop::Refused { index, error } => format!("message {} refused: {error}", index + 1),
        fast::Stop::NoResponders { index } => format!("no responders for message {}", index + 1),
        fast::Stop::Broker(m) | fast::Stop::TimedOut(m) => m.clone(),
    }
}
