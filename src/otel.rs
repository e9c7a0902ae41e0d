//! OpenTelemetry trace context for enqueued events (the `otel` feature).
//!
//! [`crate::enqueue`] and [`crate::enqueue_many`] (and their sqlx twins) give every event that has
//! no `traceparent` header the trace context of the writer's current `tracing` span, so a consumer
//! continues the trace of the request that wrote the event.

use opentelemetry::trace::{SpanContext, TraceContextExt};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// `traceparent` (and `tracestate` when not empty) of the current span, as W3C Trace Context
/// headers; empty when there is no valid span context.
///
/// The current `tracing` span is asked first (it needs a `tracing_opentelemetry` layer in the
/// subscriber); an application that uses the OpenTelemetry API directly is served by the
/// OpenTelemetry context that is current on this thread.
pub(crate) fn current_trace_headers() -> Vec<(String, String)> {
    let from_tracing = trace_headers(tracing::Span::current().context().span().span_context());
    if !from_tracing.is_empty() {
        return from_tracing;
    }
    trace_headers(opentelemetry::Context::current().span().span_context())
}

/// `00-{trace id}-{span id}-{flags}` as in the W3C Trace Context spec, plus the trace state.
fn trace_headers(context: &SpanContext) -> Vec<(String, String)> {
    if !context.is_valid() {
        return Vec::new();
    }
    let mut headers = vec![(
        "traceparent".to_owned(),
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        ),
    )];
    let state = context.trace_state().header();
    if !state.is_empty() {
        headers.push(("tracestate".to_owned(), state));
    }
    headers
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
}
