//! One event at a time: its message (subject, headers, size checked), its send in its span, and an
//! aggregate's group in order, stopping at the first failure.

use tracing::Instrument;

use crate::error::Result;
use crate::event::OutboxEvent;
use crate::policy::{Failure, FailureKind, Outcome};
use crate::wire::{header_block_len, headers_with};

use super::trace::{outgoing_trace_headers, send_span, trace_failure};
use super::Publisher;

impl Publisher {
    pub(super) async fn publish_group(&self, group: &[OutboxEvent]) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(group.len());
        let mut failed = false;
        for event in group {
            let outcome = if failed {
                Outcome::NotAttempted
            } else {
                self.publish_one(event).await
            };
            failed = !matches!(outcome, Outcome::Published { .. });
            outcomes.push(outcome);
        }
        outcomes
    }

    /// One publish inside the event's send span (see `otel`; a disabled span without the feature
    /// or a subscriber that wants it).
    pub(super) async fn publish_one(&self, event: &OutboxEvent) -> Outcome {
        let subject = self.subject(event);
        // A row whose values make no subject still gets its (failed) span, under the template.
        let shown = match &subject {
            Ok(subject) => subject.as_str(),
            Err(_) => "(invalid subject)",
        };
        let span = send_span(event, shown, self.clock.now());
        // Entering a disabled span on every poll costs without telling anyone anything.
        let outcome = if span.is_disabled() {
            self.send(event, subject, &span).await
        } else {
            self.send(event, subject, &span)
                .instrument(span.clone())
                .await
        };
        match outcome {
            Outcome::Failed(mut f) => {
                // "No responders" is judged in `publish`, which records it then: an attribute
                // recorded twice would be exported twice.
                if f.no_responders.is_none() {
                    trace_failure(&span, f.kind, &f.message);
                }
                f.span = span;
                Outcome::Failed(f)
            }
            outcome => outcome,
        }
    }

    /// The event's send span (opened at `now`, under its subject or the template's failure) and
    /// its message, for a publish that sends several events before awaiting any ack.
    pub(super) fn message_in_span(
        &self,
        event: &OutboxEvent,
        now: std::time::SystemTime,
    ) -> (
        tracing::Span,
        std::result::Result<(String, async_nats::HeaderMap), Failure>,
    ) {
        let subject = self.subject(event);
        let shown = subject
            .as_deref()
            .unwrap_or("(invalid subject)")
            .to_string();
        let span = send_span(event, &shown, now);
        let message = self.message(event, subject, &span);
        (span, message)
    }

    /// The message of `event`: its subject and headers, or why the event cannot be sent.
    pub(super) fn message(
        &self,
        event: &OutboxEvent,
        subject: Result<String>,
        span: &tracing::Span,
    ) -> std::result::Result<(String, async_nats::HeaderMap), Failure> {
        let subject = match event.validate().and(subject) {
            Ok(subject) => subject,
            Err(e) => return Err(Failure::new(FailureKind::Invalid, e.to_string())),
        };
        let trace = outgoing_trace_headers(span);
        let headers = headers_with(event, self.header_format, &self.ce_source, &trace);
        // Writers check the block with the Outbox-* headers; the CloudEvents ones are longer.
        let block = header_block_len(&headers);
        if block > crate::event::MAX_HEADER_BLOCK_BYTES {
            return Err(Failure::new(
                FailureKind::Invalid,
                format!(
                    "headers take {block} bytes with the relay's own ({:?} format), more than the {} JetStream stores",
                    self.header_format,
                    crate::event::MAX_HEADER_BLOCK_BYTES
                ),
            ));
        }
        Ok((subject, headers))
    }

    async fn send(
        &self,
        event: &OutboxEvent,
        subject: Result<String>,
        span: &tracing::Span,
    ) -> Outcome {
        let (subject, headers) = match self.message(event, subject, span) {
            Ok(message) => message,
            Err(f) => return Outcome::Failed(f),
        };
        let sent = self
            .js
            .publish_with_headers(subject, headers, event.payload.clone())
            .await;
        let result = match sent {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match result {
            Ok(ack) => Outcome::Published {
                duplicate: ack.duplicate,
                acked_at: self.clock.now(),
            },
            Err(e) => Outcome::Failed(self.blame(event, &e)),
        }
    }
}
