//! The send spans: the `otel` feature's, or none without it.

#[cfg(feature = "otel")]
pub(super) use crate::otel::{
    outgoing_headers as outgoing_trace_headers, record_failure as trace_failure, send_span,
};

/// Without the `otel` feature: no span, the row's headers go out as they are.
#[cfg(not(feature = "otel"))]
pub(super) fn send_span(
    _: &crate::event::OutboxEvent,
    _: &str,
    _: std::time::SystemTime,
) -> tracing::Span {
    tracing::Span::none()
}

#[cfg(not(feature = "otel"))]
pub(super) fn outgoing_trace_headers(_: &tracing::Span) -> Vec<(String, String)> {
    Vec::new()
}

#[cfg(not(feature = "otel"))]
pub(super) fn trace_failure(_: &tracing::Span, _: crate::policy::FailureKind, _: &str) {}
