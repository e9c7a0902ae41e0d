//! OpenTelemetry through the outbox (the `otel` feature).
//!
//! Writer side: [`crate::enqueue`] and [`crate::enqueue_many`] (and their sqlx twins) give every
//! event that has no `traceparent` header the trace context of the writer's current `tracing`
//! span, injected by the application's global propagator, so the trace continues through the
//! outbox.
//!
//! Relay side: [`send_span`] opens one PRODUCER span per published event (OpenTelemetry messaging
//! conventions), parented on the context stored in the row, and [`outgoing_headers`] gives the
//! message that span's context. The spans are `tracing` spans (target [`SEND_TARGET`]) that a
//! `tracing_opentelemetry` layer turns into OpenTelemetry spans; without a subscriber interested in
//! them they are disabled, and cost one cached callsite check per event.

use std::collections::BTreeMap;
use std::time::SystemTime;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
#[cfg(test)]
use opentelemetry::trace::SpanContext;
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::event::OutboxEvent;
use crate::policy::FailureKind;

/// The `tracing` target of the relay's send spans: a subscriber can enable or drop them by it.
pub const SEND_TARGET: &str = "outbox_relay::otel";

/// The trace context headers of the current span; empty when there is no valid span context.
///
/// The current `tracing` span is asked first (it needs a `tracing_opentelemetry` layer in the
/// subscriber); an application that uses the OpenTelemetry API directly is served by the
/// OpenTelemetry context that is current on this thread.
pub(crate) fn current_trace_headers() -> Vec<(String, String)> {
    let from_tracing = tracing::Span::current().context();
    if from_tracing.span().span_context().is_valid() {
        return inject(&from_tracing);
    }
    inject(&Context::current())
}

/// The headers of `context` as the global propagator writes them. A global propagator that writes
/// nothing for a valid span context (the default no-op one: the application installed none) is
/// replaced by W3C Trace Context, so that events keep getting a `traceparent` without any setup.
/// Empty values (an empty `tracestate`) are left out.
fn inject(context: &Context) -> Vec<(String, String)> {
    let mut headers = Headers::default();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(context, &mut headers));
    if headers.0.is_empty() && context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(context, &mut headers);
    }
    headers.0
}

/// [`inject`] for a bare span context (the unit tests' entry).
#[cfg(test)]
fn trace_headers(context: &SpanContext) -> Vec<(String, String)> {
    inject(&Context::new().with_remote_span_context(context.clone()))
}

/// The context stored in a row's headers, read by the global propagator, or by W3C Trace Context
/// when the global one finds none (the same rule as the writer's). `None` without a valid one.
fn extract(headers: &BTreeMap<String, String>) -> Option<Context> {
    let stored = Stored(headers);
    let valid = |cx: &Context| cx.span().span_context().is_valid();
    let cx = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract_with_context(&Context::new(), &stored)
    });
    if valid(&cx) {
        return Some(cx);
    }
    let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), &stored);
    valid(&cx).then_some(cx)
}

/// The PRODUCER span of one publish of `event` to `subject`, following OpenTelemetry's messaging
/// conventions (`publish <subject>`: `{messaging.operation.name} {destination}`, `messaging.*`), plus the outbox's own attributes; among them
/// `outbox.wait_ms`, the time from the row's `created_at` (its commit, give or take the writer's
/// transaction) to this publish (`now`, on the database's clock: see `crate::clock`), in
/// milliseconds. Its parent is the context stored in the row, so
/// the span lands in the writer's trace; a row without one starts a trace of its own.
pub(crate) fn send_span(event: &OutboxEvent, subject: &str, now: SystemTime) -> tracing::Span {
    let span = tracing::info_span!(
        target: SEND_TARGET,
        parent: None,
        "send",
        otel.name = %format_args!("publish {subject}"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        error.type = tracing::field::Empty,
        messaging.system = "nats",
        messaging.destination.name = subject,
        messaging.operation.type = "send",
        messaging.operation.name = "publish",
        messaging.message.id = %event.id,
        messaging.message.body.size = event.payload.len() as i64,
        outbox.aggregate_type = event.aggregate_type.as_str(),
        outbox.aggregate_id = event.aggregate_id.as_str(),
        outbox.event_type = event.event_type.as_str(),
        outbox.attempt = i64::from(event.attempts) + 1,
        outbox.wait_ms = wait_ms(event, now),
    );
    if !span.is_disabled() {
        if let Some(parent) = extract(&event.headers) {
            // Fails only once the span has started, and it has not: nothing to handle.
            let _ = span.set_parent(parent);
        }
    }
    span
}

/// Milliseconds from `created_at` to `now` (both on the database's clock); none for a `created_at`
/// that is no time (or dated after `now`).
fn wait_ms(event: &OutboxEvent, now: SystemTime) -> Option<f64> {
    let created = event.created_at.system_time()?;
    let waited = now.duration_since(created).ok()?;
    Some(waited.as_secs_f64() * 1000.0)
}

/// The trace headers the published message carries: the send span's context (so a consumer's span
/// becomes a child of the send), written by the global propagator with the writer's W3C fallback.
/// Empty when the span is disabled: the row's own headers then go out unchanged.
pub(crate) fn outgoing_headers(span: &tracing::Span) -> Vec<(String, String)> {
    if span.is_disabled() {
        return Vec::new();
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    inject(&cx)
}

/// Marks the send span as failed, with why and `error.type` (the verdict on the failure:
/// `invalid`, `too_large`, `rejected`, `timeout` or `broker`). Call it once per span: a field
/// recorded again is exported twice.
pub(crate) fn record_failure(span: &tracing::Span, kind: FailureKind, message: &str) {
    if span.is_disabled() {
        return;
    }
    let error_type = match kind {
        FailureKind::Invalid => "invalid",
        FailureKind::TooLarge => "too_large",
        FailureKind::Rejected => "rejected",
        FailureKind::Timeout => "timeout",
        FailureKind::Broker => "broker",
    };
    span.record("error.type", error_type);
    span.record("otel.status_code", "error");
    span.record("otel.status_description", message);
}

/// Collects what a propagator injects, without empty values.
#[derive(Default)]
struct Headers(Vec<(String, String)>);

impl Injector for Headers {
    fn set(&mut self, key: &str, value: String) {
        if value.is_empty() {
            return;
        }
        match self.0.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case(key)) {
            Some(entry) => entry.1 = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }
}

/// A row's headers for a propagator; names match whatever their case, as the writer's do.
struct Stored<'a>(&'a BTreeMap<String, String>);

impl Extractor for Stored<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .or_else(|| {
                self.0
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, v)| v)
            })
            .map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    use super::*;

    fn context(trace_id: u128, span_id: u64, flags: TraceFlags, state: TraceState) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(trace_id.to_be_bytes()),
            SpanId::from_bytes(span_id.to_be_bytes()),
            flags,
            true,
            state,
        )
    }

    #[test]
    fn formats_a_w3c_traceparent_with_leading_zeros() {
        let headers = trace_headers(&context(
            0x0af7651916cd43dd8448eb211c80319c,
            0x00f067aa0ba902b7,
            TraceFlags::SAMPLED,
            TraceState::NONE,
        ));
        assert_eq!(
            headers,
            [(
                "traceparent".to_owned(),
                "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01".to_owned()
            )]
        );
        let event = crate::NewEvent::new("a", "1", "a", &())
            .expect("event")
            .with_traceparent(&headers[0].1);
        assert!(event.validate().is_ok(), "the relay accepts what we write");
    }

    #[test]
    fn adds_tracestate_only_when_present() {
        let state = TraceState::from_key_value([("vendor", "abc"), ("other", "x")]).expect("state");
        let headers = trace_headers(&context(1, 2, TraceFlags::NOT_SAMPLED, state));
        assert_eq!(
            headers[0].1,
            "00-00000000000000000000000000000001-0000000000000002-00"
        );
        assert_eq!(
            headers[1],
            ("tracestate".to_owned(), "vendor=abc,other=x".to_owned())
        );
    }

    #[test]
    fn nothing_without_a_valid_context() {
        assert!(trace_headers(&SpanContext::empty_context()).is_empty());
        assert!(
            current_trace_headers().is_empty(),
            "no subscriber, no context"
        );
    }

    #[test]
    fn reads_the_stored_context_whatever_the_header_case() {
        let mut headers = BTreeMap::new();
        headers.insert(
            "Traceparent".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01".to_owned(),
        );
        let cx = extract(&headers).expect("a context");
        let sc = cx.span().span_context().clone();
        assert!(sc.is_remote());
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");

        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            headers.insert("Traceparent".to_owned(), bad.to_owned());
            assert!(extract(&headers).is_none(), "{bad:?}");
        }
        assert!(extract(&BTreeMap::new()).is_none());
    }

    #[test]
    fn a_disabled_send_span_changes_no_header() {
        let event = crate::OutboxEvent::sample("1");
        let span = send_span(&event, "outbox.created", SystemTime::now());
        assert!(span.is_disabled(), "no subscriber");
        assert!(outgoing_headers(&span).is_empty());
        record_failure(&span, FailureKind::Invalid, "nothing to record on");
    }
}
