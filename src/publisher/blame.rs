//! Whose fault a failed publish is: JetStream's answers classified, and "no responders" judged by
//! asking JetStream which subjects a stream captures.

use std::collections::HashMap;

use async_nats::jetstream::{self, context::PublishErrorKind};
use futures::StreamExt;

use crate::event::OutboxEvent;
use crate::policy::{Failure, FailureKind, Outcome};

use super::trace::trace_failure;
use super::Publisher;

impl Publisher {
    /// Whether JetStream knows a stream capturing `subject` (asked of the JetStream API, which the
    /// meta leader answers from the streams' assignments, also while a stream has no leader).
    async fn coverage(&self, subject: String) -> (String, Coverage) {
        use jetstream::context::GetStreamByNameErrorKind as K;
        let lookup = self.js.stream_by_subject(subject.clone());
        let coverage = match tokio::time::timeout(self.timeout, lookup).await {
            Ok(Ok(_)) => Coverage::Covered,
            Ok(Err(e)) if matches!(e.kind(), K::NotFound) => Coverage::Uncovered,
            _ => Coverage::Unknown,
        };
        (subject, coverage)
    }

    /// The coverage of each subject that met "no responders", asked [`COVERAGE_LOOKUPS_AT_ONCE`]
    /// at a time so that a batch is judged in the batch: a template with `{aggregate_id}` can fail
    /// on hundreds of subjects at once, and one left out counts as the broker's (no attempt spent,
    /// but the relay backs off as for an outage before it is asked about again). Bounded all the
    /// same: at most [`MAX_COVERAGE_LOOKUPS`] per batch, and none after the first answer that
    /// blames the broker (JetStream not answering, or a stream between leaders): the broker is in
    /// trouble then, asking it about hundreds of subjects on every round of its backoff would
    /// add to it, and a subject not asked about only waits (it counts as the broker's, spending
    /// no attempt) until a round where the broker answers. Missing from the map: not asked.
    async fn coverage_of(&self, mut subjects: Vec<&str>) -> HashMap<String, Coverage> {
        subjects.truncate(MAX_COVERAGE_LOOKUPS);
        // The futures made up front (they start only when polled): a closure inside the stream
        // would make the future not `Send` (a higher-ranked lifetime rustc cannot prove).
        let pending: Vec<_> = subjects
            .into_iter()
            .map(|s| self.coverage(s.to_string()))
            .collect();
        let mut lookups = futures::stream::iter(pending).buffer_unordered(COVERAGE_LOOKUPS_AT_ONCE);
        let mut coverage = HashMap::new();
        while let Some((subject, answer)) = lookups.next().await {
            coverage.insert(subject, answer);
            if answer.blame().is_brokers() {
                break;
            }
        }
        coverage
    }

    /// Judges the outcomes that met "no responders" (see below).
    pub(super) async fn judge_no_responders(&self, outcomes: &mut [Vec<Outcome>]) {
        // "No responders" means no stream captures the subject, JetStream is not answering at
        // all, or the stream that captures it has no leader for a moment (a node died). Only the
        // first is the event's fault: a lookup per subject tells them apart.
        let mut failed_subjects: Vec<&str> = outcomes
            .iter()
            .flatten()
            .filter_map(|o| match o {
                Outcome::Failed(f) => f.no_responders.as_deref(),
                _ => None,
            })
            .collect();
        if failed_subjects.is_empty() {
            return;
        }
        failed_subjects.sort_unstable();
        failed_subjects.dedup();
        let coverage = self.coverage_of(failed_subjects).await;
        for outcome in outcomes.iter_mut().flatten() {
            if let Outcome::Failed(f) = outcome {
                if let Some(subject) = &f.no_responders {
                    f.kind = coverage
                        .get(subject)
                        .copied()
                        .unwrap_or(Coverage::Unknown)
                        .blame();
                    // The send span is still open (the failure holds it).
                    trace_failure(&f.span, f.kind, &f.message);
                }
            }
        }
    }

    /// The subject for a message about a failed publish (which had a valid subject).
    pub(super) fn subject_shown(&self, event: &OutboxEvent) -> String {
        self.subject(event).unwrap_or_else(|e| e.to_string())
    }

    /// Whose fault a failed publish is (see [`FailureKind`]).
    pub(super) fn blame(
        &self,
        event: &OutboxEvent,
        e: &jetstream::context::PublishError,
    ) -> Failure {
        match e.kind() {
            PublishErrorKind::MaxPayloadExceeded => Failure::new(
                FailureKind::TooLarge,
                format!(
                    "message too large for the server's max_payload of {} bytes (payload {} bytes plus headers): {e}",
                    self.client.max_payload(),
                    event.payload.len()
                ),
            ),
            PublishErrorKind::StreamNotFound => {
                let subject = self.subject_shown(event);
                Failure {
                    message: format!("no JetStream stream listens on subject {subject}"),
                    no_responders: Some(subject),
                    ..Failure::new(FailureKind::Broker, "")
                }
            }
            // Expected-* headers are refused before publishing, so these are the event's own.
            PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
                Failure::new(FailureKind::Rejected, e.to_string())
            }
            PublishErrorKind::TimedOut => Failure::new(FailureKind::Timeout, e.to_string()),
            PublishErrorKind::Other => self.blame_code(event, error_code(e), e.to_string()),
            _ => Failure::new(FailureKind::Broker, e.to_string()),
        }
    }

    /// Whose fault JetStream's answer `code` (None: no answer) about `event` is (see
    /// [`answer`]).
    pub(super) fn blame_code(
        &self,
        event: &OutboxEvent,
        code: Option<jetstream::ErrorCode>,
        e: String,
    ) -> Failure {
        match answer(code) {
            Answer::TooLarge => Failure::new(
                FailureKind::TooLarge,
                format!(
                    "message too large for the stream (payload {} bytes): {e}",
                    event.payload.len()
                ),
            ),
            Answer::NoStream => Failure::new(
                FailureKind::Rejected,
                format!(
                    "no JetStream stream listens on subject {}",
                    self.subject_shown(event)
                ),
            ),
            other => Failure::new(other.kind(), e),
        }
    }
}

/// What an answer of JetStream's says about the message or atomic batch it answers, from its
/// error code (`None`: JetStream did not answer). Only the broker's trouble spends no attempt;
/// an answer not known here is the event's, so that a message JetStream keeps refusing is
/// dead-lettered after `--max-attempts` (with the server's text) instead of holding its aggregate
/// for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Larger than the stream takes (its max_msg_size, its header limit): dead-letter at once.
    TooLarge,
    /// No stream captures the subject.
    NoStream,
    /// The broker cannot take messages now: resources or storage exceeded, the store refusing a
    /// write (a full stream with discard new), the cluster incomplete, without peers, inactive or
    /// without a leader, batches switched off on the stream or too many open at once, a
    /// fast-ingest batch the server forgot, or no JetStream answer at all.
    Outage,
    /// An atomic batch the server holds incomplete (err_code 10176): a message of it refused or
    /// lost (too large, routed where no stream or another stream listens), or the batch dropped
    /// (the server's batch timeout, a restart). The relay checks what it can before sending; what
    /// is left spends an attempt, so that a batch that can never complete is dead-lettered.
    IncompleteBatch,
    /// An atomic batch of more events than the server's limit (err_code 10199).
    BatchTooLarge,
    /// An atomic batch holding a message already stored (err_code 10201).
    BatchDuplicate,
    /// Any other refusal: the event's, spending an attempt.
    Refused,
}

impl Answer {
    /// Whose fault it is, for the retry policy.
    pub(crate) fn kind(self) -> FailureKind {
        match self {
            Answer::TooLarge => FailureKind::TooLarge,
            Answer::Outage => FailureKind::Broker,
            Answer::NoStream
            | Answer::IncompleteBatch
            | Answer::BatchTooLarge
            | Answer::BatchDuplicate
            | Answer::Refused => FailureKind::Rejected,
        }
    }
}

/// Classifies JetStream's answer `code` (see [`Answer`]).
pub(crate) fn answer(code: Option<jetstream::ErrorCode>) -> Answer {
    use jetstream::ErrorCode as C;
    match code {
        Some(C::STREAM_MESSAGE_EXCEEDS_MAXIMUM | C::STREAM_HEADER_EXCEEDS_MAXIMUM) => {
            Answer::TooLarge
        }
        Some(C::STREAM_NOT_FOUND) => Answer::NoStream,
        Some(C::ATOMIC_PUBLISH_INCOMPLETE_BATCH) => Answer::IncompleteBatch,
        Some(C::ATOMIC_PUBLISH_TOO_LARGE_BATCH) => Answer::BatchTooLarge,
        Some(C::ATOMIC_PUBLISH_CONTAINS_DUPLICATE_MESSAGE) => Answer::BatchDuplicate,
        Some(
            C::ACCOUNT_RESOURCES_EXCEEDED
            | C::INSUFFICIENT_RESOURCES
            | C::MEMORY_RESOURCES_EXCEEDED
            | C::STORAGE_RESOURCES_EXCEEDED
            | C::STREAM_STORE_FAILED
            | C::CLUSTER_INCOMPLETE
            | C::CLUSTER_NO_PEERS
            | C::CLUSTER_NOT_ACTIVE
            | C::CLUSTER_NOT_ASSIGNED
            | C::CLUSTER_NOT_AVAILABLE
            | C::CLUSTER_NOT_LEADER
            | C::CLUSTER_REQUIRED
            // Atomic batches: too many open at once, or the stream's allow_atomic switched off.
            | C::ATOMIC_PUBLISH_TOO_MANY_INFLIGHT
            | C::ATOMIC_PUBLISH_DISABLED
            // Fast-ingest batches the server does not take (allow_batched switched off, too
            // many at once) or forgot.
            | C::BATCH_PUBLISH_DISABLED
            | C::BATCH_PUBLISH_INVALID_PATTERN
            | C::BATCH_PUBLISH_INVALID_BATCH_ID
            | C::BATCH_PUBLISH_UNKNOWN_BATCH_ID
            | C::BATCH_PUBLISH_TOO_MANY_INFLIGHT,
        )
        | None => Answer::Outage,
        Some(_) => Answer::Refused,
    }
}

/// At most this many subjects that met "no responders" are looked up per batch.
pub(super) const MAX_COVERAGE_LOOKUPS: usize = 1024;

/// Lookups of subjects' coverage in flight at once.
pub(super) const COVERAGE_LOOKUPS_AT_ONCE: usize = 16;

/// What JetStream said about a subject that met "no responders".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coverage {
    /// A stream captures it: that stream is between leaders (the broker's trouble).
    Covered,
    /// JetStream answered and no stream captures it: the event is routed where nothing listens.
    Uncovered,
    /// JetStream did not answer: an outage.
    Unknown,
}

impl Coverage {
    fn blame(self) -> FailureKind {
        match self {
            Coverage::Uncovered => FailureKind::Rejected,
            Coverage::Covered | Coverage::Unknown => FailureKind::Broker,
        }
    }
}

/// JetStream's error code in a failed publish's answer, if it answered.
pub(super) fn error_code(e: &jetstream::context::PublishError) -> Option<jetstream::ErrorCode> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_responders_blame_the_event_only_where_no_stream_listens() {
        assert_eq!(Coverage::Uncovered.blame(), FailureKind::Rejected);
        assert_eq!(Coverage::Covered.blame(), FailureKind::Broker);
        assert_eq!(Coverage::Unknown.blame(), FailureKind::Broker);
    }

    #[test]
    fn every_answer_but_an_outage_spends_an_attempt() {
        use jetstream::ErrorCode as C;
        for (code, expected, kind) in [
            (
                Some(C::STREAM_MESSAGE_EXCEEDS_MAXIMUM),
                Answer::TooLarge,
                FailureKind::TooLarge,
            ),
            (
                Some(C::STREAM_HEADER_EXCEEDS_MAXIMUM),
                Answer::TooLarge,
                FailureKind::TooLarge,
            ),
            (
                Some(C::STREAM_NOT_FOUND),
                Answer::NoStream,
                FailureKind::Rejected,
            ),
            (
                Some(C::ATOMIC_PUBLISH_INCOMPLETE_BATCH),
                Answer::IncompleteBatch,
                FailureKind::Rejected,
            ),
            (
                Some(C::ATOMIC_PUBLISH_TOO_LARGE_BATCH),
                Answer::BatchTooLarge,
                FailureKind::Rejected,
            ),
            (
                Some(C::ATOMIC_PUBLISH_CONTAINS_DUPLICATE_MESSAGE),
                Answer::BatchDuplicate,
                FailureKind::Rejected,
            ),
            (
                Some(C::ATOMIC_PUBLISH_TOO_MANY_INFLIGHT),
                Answer::Outage,
                FailureKind::Broker,
            ),
            (
                Some(C::ATOMIC_PUBLISH_DISABLED),
                Answer::Outage,
                FailureKind::Broker,
            ),
            (
                Some(C::BATCH_PUBLISH_UNKNOWN_BATCH_ID),
                Answer::Outage,
                FailureKind::Broker,
            ),
            (
                Some(C::STORAGE_RESOURCES_EXCEEDED),
                Answer::Outage,
                FailureKind::Broker,
            ),
            (
                Some(C::CLUSTER_NOT_LEADER),
                Answer::Outage,
                FailureKind::Broker,
            ),
            (None, Answer::Outage, FailureKind::Broker),
            // Not known here: the event's, with the server's text.
            (Some(C(10999)), Answer::Refused, FailureKind::Rejected),
            (
                Some(C::STREAM_WRONG_LAST_SEQUENCE),
                Answer::Refused,
                FailureKind::Rejected,
            ),
        ] {
            assert_eq!(answer(code), expected, "{code:?}");
            assert_eq!(expected.kind(), kind, "{code:?}");
        }
    }
}
