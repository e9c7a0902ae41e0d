//! `--transactions atomic`: a plan's units published, each transaction as one atomic batch.

use std::collections::HashMap;

use async_nats::jetstream;
use futures::future::join_all;
use futures::StreamExt;

use crate::event::OutboxEvent;
use crate::policy::{Failure, FailureKind, Outcome};
use crate::source::atomic::{At, Plan, Unit};
use crate::wire::header_block_len;

use super::blame::{answer, error_code, Answer, COVERAGE_LOOKUPS_AT_ONCE, MAX_COVERAGE_LOOKUPS};
use super::stream::subject_matches;
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
        let routes = self.routes(groups, plan).await;
        let routes = &routes;
        let chains = join_all(plan.chains.iter().map(|chain| async move {
            let mut out = Vec::new();
            for &u in chain {
                let Some(unit) = plan.units.get(u) else {
                    continue;
                };
                let results = self.publish_unit(groups, unit, routes).await;
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

    /// The stream of each subject of the plan's atomic batches that the relay's stream does not
    /// capture, asked of JetStream [`COVERAGE_LOOKUPS_AT_ONCE`] at a time, at most
    /// [`MAX_COVERAGE_LOOKUPS`] per batch (a subject not asked about counts as not known).
    async fn routes(&self, groups: &[Vec<OutboxEvent>], plan: &Plan) -> HashMap<String, Route> {
        let captured = self
            .stream_subjects
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let mut subjects: Vec<String> = plan
            .units
            .iter()
            .filter(|u| u.events.len() > 1)
            .flat_map(|u| &u.events)
            .filter_map(|&(g, i)| groups.get(g).and_then(|g| g.get(i)))
            .filter_map(|e| self.subject(e).ok())
            .filter(|s| !captured.iter().any(|f| subject_matches(f, s)))
            .collect();
        if subjects.is_empty() {
            return HashMap::new();
        }
        subjects.sort_unstable();
        subjects.dedup();
        subjects.truncate(MAX_COVERAGE_LOOKUPS);
        let pending: Vec<_> = subjects.into_iter().map(|s| self.stream_of(s)).collect();
        futures::stream::iter(pending)
            .buffer_unordered(COVERAGE_LOOKUPS_AT_ONCE)
            .collect()
            .await
    }

    /// Which stream captures `subject`, as JetStream answers.
    async fn stream_of(&self, subject: String) -> (String, Route) {
        use jetstream::context::GetStreamByNameErrorKind as K;
        let lookup = self.js.stream_by_subject(subject.clone());
        let route = match tokio::time::timeout(self.timeout, lookup).await {
            Ok(Ok(stream)) => Route::Stream(stream),
            Ok(Err(e)) if matches!(e.kind(), K::NotFound) => Route::Uncaptured,
            _ => Route::Unknown,
        };
        (subject, route)
    }

    /// One unit of a plan: a lone event as usual; a transaction's events as one atomic batch
    /// (`Nats-Batch-Id`, `Nats-Batch-Sequence`, `Nats-Batch-Commit` on the last), all published or
    /// none. Every event gets the batch's outcome.
    /// What can never be part of a batch (see [`check_batch`]) is not sent: a poison fails its
    /// transaction, its siblings held with it.
    async fn publish_unit(
        &self,
        groups: &[Vec<OutboxEvent>],
        unit: &Unit,
        routes: &HashMap<String, Route>,
    ) -> Vec<(At, Outcome)> {
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
                    return hold(&events, event.id, txid, f.kind, &f.message);
                }
            }
            spans.push(span);
        }
        let batch_id = uuid::Uuid::new_v4().simple().to_string();
        let last = messages.len();
        for (k, (_, headers)) in messages.iter_mut().enumerate() {
            headers.insert("Nats-Batch-Id", batch_id.as_str());
            headers.insert("Nats-Batch-Sequence", (k + 1).to_string().as_str());
            if k + 1 == last {
                headers.insert("Nats-Batch-Commit", "1");
            }
        }
        let ours = Route::Stream(self.stream.clone());
        let facts: Vec<Facts> = messages
            .iter()
            .zip(&events)
            .map(|((subject, headers), (_, event))| Facts {
                subject,
                size: header_block_len(headers) + event.payload.len(),
                payload: event.payload.len(),
                route: routes.get(subject).unwrap_or(&ours),
            })
            .collect();
        let limits = Limits {
            max_payload: self.client.max_payload(),
            stream: &self.stream,
            stream_max_msg: self.stream_max_msg_size(),
        };
        match check_batch(&facts, &limits) {
            Check::Send => {}
            Check::Poison {
                index,
                kind,
                reason,
            } => {
                for span in &spans {
                    trace_failure(span, kind, &reason);
                }
                let culprit = events[index].1.id;
                return hold(&events, culprit, txid, kind, &reason);
            }
            Check::Unknown { subject } => {
                return fail_all(
                    &events,
                    Failure::new(
                        FailureKind::Broker,
                        format!(
                            "transaction {txid}: cannot tell which stream captures subject {subject} (JetStream did not answer)"
                        ),
                    ),
                )
            }
            Check::Spans(streams) => {
                let counts: Vec<String> = streams
                    .iter()
                    .map(|(stream, n)| format!("{stream}: {n}"))
                    .collect();
                let message = format!(
                    "transaction {txid}: its {} events route to more than one stream ({}), and an atomic batch cannot span streams: route a transaction's events into one stream, or run with --transactions events",
                    events.len(),
                    counts.join(", ")
                );
                for span in &spans {
                    trace_failure(span, FailureKind::Invalid, &message);
                }
                return fail_all(&events, Failure::new(FailureKind::Invalid, message));
            }
        }
        let Ok(_permit) = self.batches.acquire().await else {
            return fail_all(
                &events,
                Failure::new(FailureKind::Broker, "publisher closed"),
            );
        };
        let mut commit = None;
        for (k, ((subject, headers), (_, event))) in messages.into_iter().zip(&events).enumerate() {
            if k + 1 == last {
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
                let kind = match e.kind() {
                    async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                        FailureKind::TooLarge
                    }
                    async_nats::client::PublishErrorKind::InvalidSubject => FailureKind::Invalid,
                    _ => FailureKind::Broker,
                };
                if kind != FailureKind::Broker {
                    return hold(&events, event.id, txid, kind, &e.to_string());
                }
                return fail_all(
                    &events,
                    Failure::new(
                        kind,
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
                    answer(error_code(&e)),
                    Answer::BatchDuplicate | Answer::BatchTooLarge
                ) =>
            {
                if answer(error_code(&e)) == Answer::BatchTooLarge {
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

/// A unit failed by one of its events, `culprit`, for `reason`: the transaction goes out whole or
/// not at all, so its other events are held with it and share its fate, each failure naming the
/// transaction and the culprit.
fn hold(
    events: &[(At, &OutboxEvent)],
    culprit: uuid::Uuid,
    txid: u64,
    kind: FailureKind,
    reason: &str,
) -> Vec<(At, Outcome)> {
    events
        .iter()
        .map(|(at, e)| {
            let message = if e.id == culprit {
                format!(
                    "{reason} (transaction {txid}: its {} other events are held with it)",
                    events.len() - 1
                )
            } else {
                format!("held with event {culprit} of its transaction {txid}: {reason}")
            };
            (*at, Outcome::Failed(Failure::new(kind, message)))
        })
        .collect()
}

/// Which stream captures a subject, as JetStream answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Route {
    Stream(String),
    /// JetStream answered: no stream captures it.
    Uncaptured,
    /// JetStream did not answer (or was not asked).
    Unknown,
}

/// What the relay knows of one message of an atomic batch before sending it.
#[derive(Debug)]
struct Facts<'a> {
    subject: &'a str,
    /// The message's size as the server counts it: its header block (the batch's headers in) and
    /// its payload.
    size: usize,
    payload: usize,
    route: &'a Route,
}

/// The limits a batch's messages must fit.
#[derive(Debug)]
struct Limits<'a> {
    /// The server's `max_payload`.
    max_payload: usize,
    /// The relay's stream, and its `max_msg_size` (`None`: no limit, or not known).
    stream: &'a str,
    stream_max_msg: Option<usize>,
}

/// Whether an atomic batch can be sent.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    Send,
    /// Message `index` can never be stored (too large, routed where no stream listens): the
    /// batch would be dropped whole, answered only "incomplete". Its event's failure.
    Poison {
        index: usize,
        kind: FailureKind,
        reason: String,
    },
    /// JetStream could not say which stream captures `subject`: the broker's trouble.
    Unknown {
        subject: String,
    },
    /// The messages route to more than one stream (each with its count, in the batch's order):
    /// one atomic batch is stored by one stream, so it can never be stored whole.
    Spans(Vec<(String, usize)>),
}

/// Judges an atomic batch before it is sent (`facts`: its messages in order). What the server
/// would refuse in one message of a batch it answers only with the batch's commit, as
/// "incomplete", without saying which message or why: found here, the event is named.
fn check_batch(facts: &[Facts], limits: &Limits) -> Check {
    for (index, f) in facts.iter().enumerate() {
        let poison = |kind, reason| Check::Poison {
            index,
            kind,
            reason,
        };
        if f.size > limits.max_payload {
            return poison(
                FailureKind::TooLarge,
                format!(
                    "message too large for the server's max_payload of {} bytes ({} bytes with its headers, payload {} bytes)",
                    limits.max_payload, f.size, f.payload
                ),
            );
        }
        match f.route {
            Route::Uncaptured => {
                return poison(
                    FailureKind::Rejected,
                    format!("no JetStream stream listens on subject {}", f.subject),
                )
            }
            Route::Stream(stream) if stream == limits.stream => {
                if let Some(max) = limits.stream_max_msg.filter(|max| f.size > *max) {
                    return poison(
                        FailureKind::TooLarge,
                        format!(
                            "message too large for the stream {stream}'s max_msg_size of {max} bytes ({} bytes with its headers, payload {} bytes)",
                            f.size, f.payload
                        ),
                    );
                }
            }
            Route::Stream(_) | Route::Unknown => {}
        }
    }
    if let Some(f) = facts.iter().find(|f| *f.route == Route::Unknown) {
        return Check::Unknown {
            subject: f.subject.to_string(),
        };
    }
    let mut streams: Vec<(String, usize)> = Vec::new();
    for f in facts {
        if let Route::Stream(stream) = f.route {
            match streams.iter_mut().find(|(s, _)| s == stream) {
                Some((_, n)) => *n += 1,
                None => streams.push((stream.clone(), 1)),
            }
        }
    }
    if streams.len() > 1 {
        return Check::Spans(streams);
    }
    Check::Send
}

/// Every event of a unit with the same failure.
fn fail_all(events: &[(At, &OutboxEvent)], f: Failure) -> Vec<(At, Outcome)> {
    events
        .iter()
        .map(|(at, _)| (*at, Outcome::Failed(f.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_payload: 1000,
        stream: "OUTBOX",
        stream_max_msg: Some(500),
    };

    fn ours() -> Route {
        Route::Stream("OUTBOX".into())
    }

    /// A message's subject, size and route.
    type Message<'a> = (&'a str, usize, &'a Route);

    fn facts<'a>(messages: &'a [Message<'a>]) -> Vec<Facts<'a>> {
        messages
            .iter()
            .map(|&(subject, size, route)| Facts {
                subject,
                size,
                payload: size.saturating_sub(100),
                route,
            })
            .collect()
    }

    #[test]
    fn a_batch_that_fits_one_stream_is_sent() {
        let (o, audit) = (ours(), Route::Stream("AUDIT".into()));
        let batch = [("outbox.a", 500, &o), ("outbox.b", 10, &o)];
        assert_eq!(check_batch(&facts(&batch), &LIMITS), Check::Send);
        // Another stream alone: its own limits are its server's to judge.
        let batch = [("audit.a", 900, &audit), ("audit.b", 10, &audit)];
        assert_eq!(check_batch(&facts(&batch), &LIMITS), Check::Send);
        let unlimited = Limits {
            stream_max_msg: None,
            ..LIMITS
        };
        let batch = [("outbox.a", 1000, &o)];
        assert_eq!(check_batch(&facts(&batch), &unlimited), Check::Send);
    }

    #[test]
    fn the_first_poison_is_named_with_its_reason() {
        let (o, none) = (ours(), Route::Uncaptured);
        let cases: [(&[Message], usize, FailureKind, &str); 4] = [
            (
                &[
                    ("outbox.a", 10, &o),
                    ("outbox.b", 1001, &o),
                    ("outbox.c", 10, &o),
                ],
                1,
                FailureKind::TooLarge,
                "max_payload of 1000 bytes (1001 bytes",
            ),
            (
                &[("outbox.a", 501, &o), ("outbox.b", 10, &o)],
                0,
                FailureKind::TooLarge,
                "the stream OUTBOX's max_msg_size of 500 bytes",
            ),
            (
                &[
                    ("outbox.a", 10, &o),
                    ("pay.x", 10, &none),
                    ("outbox.c", 2000, &o),
                ],
                1,
                FailureKind::Rejected,
                "no JetStream stream listens on subject pay.x",
            ),
            (
                &[
                    ("outbox.a", 10, &o),
                    ("outbox.b", 10, &o),
                    ("outbox.c", 2000, &o),
                ],
                2,
                FailureKind::TooLarge,
                "max_payload",
            ),
        ];
        for (batch, at, expected, text) in cases {
            match check_batch(&facts(batch), &LIMITS) {
                Check::Poison {
                    index,
                    kind,
                    reason,
                } => {
                    assert_eq!((index, kind), (at, expected), "{reason}");
                    assert!(reason.contains(text), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_batch_across_streams_is_refused_with_its_streams() {
        let (o, audit) = (ours(), Route::Stream("AUDIT".into()));
        let batch = [
            ("outbox.a", 10, &o),
            ("audit.a", 10, &audit),
            ("outbox.b", 10, &o),
        ];
        assert_eq!(
            check_batch(&facts(&batch), &LIMITS),
            Check::Spans(vec![("OUTBOX".into(), 2), ("AUDIT".into(), 1)])
        );
    }

    #[test]
    fn a_route_not_known_is_the_brokers_after_any_poison() {
        let (o, unknown) = (ours(), Route::Unknown);
        let batch = [("outbox.a", 10, &o), ("x.a", 10, &unknown)];
        assert_eq!(
            check_batch(&facts(&batch), &LIMITS),
            Check::Unknown {
                subject: "x.a".into()
            }
        );
        let batch = [("x.a", 10, &unknown), ("outbox.a", 600, &o)];
        assert!(matches!(
            check_batch(&facts(&batch), &LIMITS),
            Check::Poison { index: 1, .. }
        ));
    }
}
