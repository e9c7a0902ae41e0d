//! The `otel` feature: `enqueue` fills `traceparent` from the current tracing span's OpenTelemetry
//! context, and a `traceparent` the writer gave explicitly wins.

use std::time::Duration;

use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use outbox_relay::{enqueue, NewEvent};
use testkit::outbox::{Env, Stored};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const EXPLICIT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A subscriber with an OpenTelemetry layer over an SDK tracer (no exporter: spans are only
/// recorded in memory), installed for this thread until the guard drops.
fn install_tracing() -> (SdkTracerProvider, tracing::subscriber::DefaultGuard) {
    let provider = SdkTracerProvider::builder().build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-relay-test"));
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    (provider, guard)
}

fn event(aggregate_id: &str) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate_id,
        "order.created",
        &serde_json::json!({}),
    )
    .expect("event")
}

fn span_context(span: &tracing::Span) -> SpanContext {
    span.context().span().span_context().clone()
}

fn by_aggregate<'a>(stored: &'a [Stored], aggregate_id: &str) -> &'a Stored {
    stored
        .iter()
        .find(|m| m.headers["Outbox-Aggregate-Id"] == aggregate_id)
        .unwrap_or_else(|| panic!("no message for {aggregate_id}"))
}

#[tokio::test]
async fn traceparent_comes_from_the_current_span_unless_given() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let mut client = env.client().await;
    let (_provider, _guard) = install_tracing();

    let span = tracing::info_span!("handle_request");
    let expected = span_context(&span);
    assert!(
        expected.is_valid(),
        "the SDK tracer gives the span a context"
    );
    let (from_span, explicit) = async {
        let tx = client.transaction().await.expect("tx");
        let from_span = enqueue(&tx, &event("from-span")).await.expect("enqueue");
        let explicit = enqueue(&tx, &event("explicit").with_traceparent(EXPLICIT))
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        (from_span, explicit)
    }
    .instrument(span)
    .await;

    // Outside any span: nothing to fill in.
    let outside = enqueue(&client, &event("outside")).await.expect("enqueue");

    env.wait_stream_len(3, Duration::from_secs(10)).await;
    let stored = env.stored().await;

    let m = by_aggregate(&stored, "from-span");
    assert_eq!(m.event_id(), from_span);
    let traceparent = &m.headers["traceparent"];
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    assert_eq!(
        parts[1],
        expected.trace_id().to_string(),
        "trace id of the span"
    );
    assert_eq!(
        parts[2],
        expected.span_id().to_string(),
        "the span is the parent"
    );
    assert_eq!(parts[3], "01", "sampled");
    assert!(
        !m.headers.contains_key("tracestate"),
        "an empty trace state is not sent"
    );

    let m = by_aggregate(&stored, "explicit");
    assert_eq!(m.event_id(), explicit);
    assert_eq!(m.headers["traceparent"], EXPLICIT, "the writer's own wins");

    let m = by_aggregate(&stored, "outside");
    assert_eq!(m.event_id(), outside);
    assert!(!m.headers.contains_key("traceparent"), "{:?}", m.headers);
    relay.stop().await;
}

#[tokio::test]
async fn enqueue_many_fills_each_event_and_keeps_given_headers() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let client = env.client().await;
    let (_provider, _guard) = install_tracing();

    let span = tracing::info_span!("batch");
    let expected = span_context(&span);
    let ids = async {
        outbox_relay::enqueue_many(
            &client,
            &[
                event("a").with_header("tracestate", "mine=1"),
                // Header names are case-insensitive: this one counts as a traceparent.
                event("b").with_header("Traceparent", EXPLICIT),
                event("c"),
            ],
        )
        .await
        .expect("enqueue_many")
    }
    .instrument(span)
    .await;

    env.wait_stream_len(3, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    let a = by_aggregate(&stored, "a");
    assert_eq!(a.event_id(), ids[0]);
    assert!(a.headers["traceparent"].contains(&expected.trace_id().to_string()));
    assert_eq!(
        a.headers["tracestate"], "mine=1",
        "the writer's own is kept"
    );
    let b = by_aggregate(&stored, "b");
    assert_eq!(b.headers["Traceparent"], EXPLICIT);
    assert!(!b.headers.contains_key("traceparent"), "{:?}", b.headers);
    let c = by_aggregate(&stored, "c");
    assert!(c.headers["traceparent"].contains(&expected.trace_id().to_string()));
    relay.stop().await;
}

#[cfg(feature = "sqlx")]
#[tokio::test]
async fn the_sqlx_writer_fills_it_in_too() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let pool = sqlx::PgPool::connect(&env.db).await.expect("pool");
    let (_provider, _guard) = install_tracing();

    let span = tracing::info_span!("sqlx_request");
    let expected = span_context(&span);
    let id = async {
        let mut tx = pool.begin().await.expect("begin");
        let id = outbox_relay::sqlx::enqueue(&mut *tx, &event("sqlx"))
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        id
    }
    .instrument(span)
    .await;

    env.wait_stream_len(1, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    assert_eq!(stored[0].event_id(), id);
    assert_eq!(
        stored[0].headers["traceparent"],
        format!("00-{}-{}-01", expected.trace_id(), expected.span_id())
    );
    relay.stop().await;
}
