//! The `otel` feature: `enqueue` fills `traceparent` from the current tracing span's OpenTelemetry
//! context (through the global propagator, W3C when none is set), and a `traceparent` the writer gave
//! explicitly wins; the relay binary exports a PRODUCER span per published event over OTLP/HTTP, in
//! the writer's trace, and its log lines inside a span carry the trace id.
//!
//! The writer's subscriber is set only around the writer's own futures (`with_subscriber`): the
//! in-process relays of these tests run untraced, so they publish the rows' headers unchanged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::global;
use opentelemetry::propagation::text_map_propagator::FieldIter;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::noop::NoopTextMapPropagator;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use prost::Message as _;
use testkit::{wait_until, RelayProcess};

use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::InMemorySpanExporter;
use opentelemetry_sdk::trace::SdkTracerProvider;
use outbox_relay::{enqueue, NewEvent};
use testkit::outbox::{Env, Stored};
use tracing::instrument::WithSubscriber;
use tracing::{Dispatch, Instrument};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const EXPLICIT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A subscriber with an OpenTelemetry layer over an SDK tracer whose spans go to an in-memory
/// exporter, for the writer's code only.
fn writer_tracing() -> (InMemorySpanExporter, SdkTracerProvider, Dispatch) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-relay-test"));
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer));
    (exporter, provider, dispatch)
}

/// An info span made by `dispatch`'s subscriber.
fn writer_span(dispatch: &Dispatch, name: &'static str) -> tracing::Span {
    tracing::dispatcher::with_default(dispatch, || tracing::info_span!("writer", otel.name = name))
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
    let (_exporter, _provider, dispatch) = writer_tracing();

    let span = writer_span(&dispatch, "handle_request");
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
    .with_subscriber(dispatch)
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
    let (_exporter, _provider, dispatch) = writer_tracing();

    let span = writer_span(&dispatch, "batch");
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
    .with_subscriber(dispatch)
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
    let (_exporter, _provider, dispatch) = writer_tracing();

    let span = writer_span(&dispatch, "sqlx_request");
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
    .with_subscriber(dispatch)
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

/// Serialises the tests that set the global propagator (process-wide state).
static GLOBAL_PROPAGATOR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// W3C Trace Context plus a marker header, to see that `enqueue` goes through the global
/// propagator. Other tests running meanwhile still get their `traceparent`.
#[derive(Debug)]
struct Marked(TraceContextPropagator);

impl TextMapPropagator for Marked {
    fn inject_context(&self, cx: &opentelemetry::Context, injector: &mut dyn Injector) {
        if cx.span().span_context().is_valid() {
            self.0.inject_context(cx, injector);
            injector.set("x-propagated-by", "marked".to_owned());
        }
    }

    fn extract_with_context(
        &self,
        cx: &opentelemetry::Context,
        extractor: &dyn Extractor,
    ) -> opentelemetry::Context {
        self.0.extract_with_context(cx, extractor)
    }

    fn fields(&self) -> FieldIter<'_> {
        self.0.fields()
    }
}

/// The `headers` column of the row `id`.
async fn row_headers(client: &tokio_postgres::Client, id: uuid::Uuid) -> serde_json::Value {
    client
        .query_one("SELECT headers FROM outbox_events WHERE id = $1", &[&id])
        .await
        .expect("row")
        .get::<_, Option<serde_json::Value>>(0)
        .unwrap_or(serde_json::Value::Null)
}

#[tokio::test]
async fn enqueue_uses_the_global_propagator_and_falls_back_to_w3c() {
    let _global = GLOBAL_PROPAGATOR.lock().await;
    let env = Env::new().await;
    let client = env.client().await;
    let (_exporter, _provider, dispatch) = writer_tracing();
    let span = writer_span(&dispatch, "propagators");
    let expected = span_context(&span);
    let enqueue_in_span = |name: &'static str| {
        let (client, span, dispatch) = (&client, span.clone(), dispatch.clone());
        async move { enqueue(client, &event(name)).await }
            .instrument(span)
            .with_subscriber(dispatch)
    };

    // The default global propagator is a no-op: the W3C fallback writes the traceparent.
    global::set_text_map_propagator(NoopTextMapPropagator::new());
    let id = enqueue_in_span("noop").await.expect("enqueue");
    let headers = row_headers(&client, id).await;
    assert_eq!(
        headers,
        serde_json::json!({
            "traceparent": format!("00-{}-{}-01", expected.trace_id(), expected.span_id())
        })
    );

    // An application's propagator is used as it is.
    global::set_text_map_propagator(Marked(TraceContextPropagator::new()));
    let id = enqueue_in_span("custom").await;
    global::set_text_map_propagator(NoopTextMapPropagator::new());
    let headers = row_headers(&client, id.expect("enqueue")).await;
    assert_eq!(headers["x-propagated-by"], "marked", "{headers}");
    assert_eq!(
        headers["traceparent"],
        format!("00-{}-{}-01", expected.trace_id(), expected.span_id())
    );

    // Outside a span, neither writes anything.
    let id = enqueue(&client, &event("outside")).await.expect("enqueue");
    assert_eq!(row_headers(&client, id).await, serde_json::Value::Null);
}

/// What the relay exported: each span with its resource's `service.name`.
type Exported = Arc<Mutex<Vec<(String, Span)>>>;

/// An OTLP/HTTP receiver (protobuf) on a free port: `POST /v1/traces`.
async fn otlp_receiver(tls: Option<tokio_rustls::TlsAcceptor>) -> (std::net::SocketAddr, Exported) {
    let exported: Exported = Arc::default();
    let sink = exported.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                let mut sink = sink.lock().expect("lock");
                for resource_spans in request.resource_spans {
                    let service = resource_spans
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .map(|a| text(a.value.as_ref()))
                        .unwrap_or_default();
                    for scope in resource_spans.scope_spans {
                        sink.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    match tls {
        None => drop(tokio::spawn(
            async move { axum::serve(listener, app).await },
        )),
        Some(acceptor) => drop(tokio::spawn(async move {
            axum::serve(TlsListener { listener, acceptor }, app).await
        })),
    }
    (addr, exported)
}

/// An HTTPS listener for the receiver: TLS accepted on each connection; a failed handshake drops
/// the connection (counted, for tests that expect refusals).
struct TlsListener {
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.listener.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// A TLS acceptor with the test PKI's server certificate that requires a client certificate
/// signed by its CA.
fn mutual_tls(pki: &crate::tls::Pki) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&pki.ca).expect("ca") {
        roots.add(ca.expect("ca pem")).expect("add ca");
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .expect("client verifier");
    let chain = CertificateDer::pem_file_iter(&pki.cert)
        .expect("cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("cert pem");
    let key = PrivateKeyDer::from_pem_file(&pki.key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The exported send span of the event `id`.
fn send_span_of(exported: &[(String, Span)], id: uuid::Uuid) -> (String, Span) {
    exported
        .iter()
        .find(|(_, s)| text(attribute(s, "messaging.message.id")) == id.to_string())
        .cloned()
        .unwrap_or_else(|| panic!("no span for {id} in {exported:#?}"))
}

/// The relay binary exporting spans to `receiver` quickly (100 ms batches), logging at warn in
/// `format` to `log_path`.
fn relay_exporting_to(
    env: &Env,
    receiver: std::net::SocketAddr,
    format: &str,
    log_path: &std::path::Path,
) -> RelayProcess {
    relay_exporting_with(env, &format!("http://{receiver}"), &[], format, log_path)
}

/// [`relay_exporting_to`] an `endpoint` URL with more variables.
fn relay_exporting_with(
    env: &Env,
    endpoint: &str,
    vars: &[(&str, &std::path::Path)],
    format: &str,
    log_path: &std::path::Path,
) -> RelayProcess {
    let log = std::fs::File::create(log_path).expect("log file");
    let mut cmd = testkit::relay_command();
    cmd.envs(vars.iter().copied());
    for var in [
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    ] {
        if !vars.iter().any(|(k, _)| *k == var) {
            cmd.env_remove(var);
        }
    }
    cmd.args(["run", "--metrics-addr", "off", "--fallback-interval", "60s"])
        .args(["--log-format", format])
        .env("DATABASE_URL", &env.db)
        .env("NATS_URL", env.nats.url())
        .env("RUST_LOG", "warn")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    RelayProcess::spawn("otel-relay", cmd, Some(log_path.to_owned())).expect("relay")
}

/// Inserts a row whose `created_at` is no time (dead-lettered at once) with `traceparent`.
async fn insert_poison(client: &tokio_postgres::Client, traceparent: &str) -> uuid::Uuid {
    client
        .query_one(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at, headers)
             VALUES ('order', 'poison', 'order.created', '{}', 'infinity', jsonb_build_object('traceparent', $1::text))
             RETURNING id",
            &[&traceparent],
        )
        .await
        .expect("poison row")
        .get(0)
}

#[tokio::test]
async fn the_relay_binary_exports_producer_spans_in_the_writers_trace() {
    let env = Env::new().await;
    let client = env.client().await;
    let (receiver, exported) = otlp_receiver(None).await;

    // The writer enqueues one event inside a traced request and one outside any span.
    let (_exporter, _provider, dispatch) = writer_tracing();
    let span = writer_span(&dispatch, "handle_request");
    let writer = span_context(&span);
    let traced = enqueue(&client, &event("traced"))
        .instrument(span)
        .with_subscriber(dispatch)
        .await
        .expect("enqueue");
    let untraced = enqueue(&client, &event("untraced")).await.expect("enqueue");
    // A poison row with a stored context: a `created_at` that is no time is dead-lettered at once.
    const POISON_PARENT: &str = "00-11111111111111111111111111111111-2222222222222222-01";
    let poison = insert_poison(&client, POISON_PARENT).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("relay.log");
    let relay = relay_exporting_to(&env, receiver, "json", &log_path);

    env.wait_stream_len(2, Duration::from_secs(20)).await;
    env.wait_dead_letters(1, Duration::from_secs(20)).await;
    // SIGTERM: the relay flushes its spans before it exits.
    assert_eq!(relay.stop().await, None, "the relay exits cleanly");
    let exported = exported.lock().expect("lock").clone();

    // The traced event: a PRODUCER span in the writer's trace, child of the writer's span.
    let (service, send) = send_span_of(&exported, traced);
    assert_eq!(service, "outbox-relay", "default service name");
    assert_eq!(send.name, "publish outbox.order.created");
    assert_eq!(send.kind, SpanKind::Producer as i32);
    assert_eq!(hex(&send.trace_id), writer.trace_id().to_string());
    assert_eq!(hex(&send.parent_span_id), writer.span_id().to_string());
    for (key, value) in [
        ("messaging.system", "nats"),
        ("messaging.destination.name", "outbox.order.created"),
        ("messaging.operation.type", "send"),
        ("messaging.operation.name", "publish"),
        ("outbox.aggregate_type", "order"),
        ("outbox.aggregate_id", "traced"),
        ("outbox.event_type", "order.created"),
        ("outbox.attempt", "1"),
    ] {
        assert_eq!(text(attribute(&send, key)), value, "{key}");
    }
    let wait_ms = match attribute(&send, "outbox.wait_ms").and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::DoubleValue(ms)) => *ms,
        other => panic!("outbox.wait_ms: {other:?}"),
    };
    assert!(
        (0.0..20_000.0).contains(&wait_ms),
        "outbox.wait_ms {wait_ms}"
    );
    assert_ne!(
        send.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );

    // The message carries the send span's context: a consumer's span is its child.
    let stored = env.stored().await;
    let m = by_aggregate(&stored, "traced");
    assert_eq!(
        m.headers["traceparent"],
        format!("00-{}-{}-01", writer.trace_id(), hex(&send.span_id))
    );

    // The untraced event: a root span of a trace of its own, and its message carries it.
    let (_, root) = send_span_of(&exported, untraced);
    assert!(root.parent_span_id.is_empty(), "{root:?}");
    assert_ne!(hex(&root.trace_id), writer.trace_id().to_string());
    assert_eq!(root.kind, SpanKind::Producer as i32);
    let m = by_aggregate(&stored, "untraced");
    assert_eq!(
        m.headers["traceparent"],
        format!("00-{}-{}-01", hex(&root.trace_id), hex(&root.span_id))
    );

    // The poison row: its span, in the stored trace, is an error, and the dead-letter line logged
    // inside it carries its ids.
    let (_, failed) = send_span_of(&exported, poison);
    assert_eq!(hex(&failed.trace_id), "11111111111111111111111111111111");
    assert_eq!(hex(&failed.parent_span_id), "2222222222222222");
    let status = failed.status.as_ref().expect("status");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(status.message.contains("created_at"), "{status:?}");
    assert_eq!(text(attribute(&failed, "error.type")), "invalid");
    assert!(
        attribute(&failed, "outbox.wait_ms").is_none(),
        "no wait for a created_at that is no time"
    );
    let logs = std::fs::read_to_string(&log_path).expect("log");
    let line: serde_json::Value = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["message"] == "event dead-lettered")
        .unwrap_or_else(|| panic!("no dead-letter line in {logs}"));
    assert_eq!(line["event_id"], poison.to_string(), "{line}");
    assert_eq!(line["trace_id"], hex(&failed.trace_id), "{line}");
    assert_eq!(line["span_id"], hex(&failed.span_id), "{line}");
    assert!(
        failed
            .events
            .iter()
            .any(|e| e.name == "event dead-lettered"),
        "the dead letter is an event of the span: {:?}",
        failed.events
    );
}

#[tokio::test]
async fn text_log_lines_inside_a_send_span_end_with_its_ids() {
    let env = Env::new().await;
    let client = env.client().await;
    let (receiver, exported) = otlp_receiver(None).await;
    let poison = insert_poison(
        &client,
        "00-33333333333333333333333333333333-4444444444444444-01",
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("relay.log");
    let relay = relay_exporting_to(&env, receiver, "text", &log_path);
    env.wait_dead_letters(1, Duration::from_secs(20)).await;
    assert_eq!(relay.stop().await, None, "the relay exits cleanly");
    let (_, failed) = send_span_of(&exported.lock().expect("lock"), poison);
    assert_eq!(hex(&failed.trace_id), "33333333333333333333333333333333");
    let logs = std::fs::read_to_string(&log_path).expect("log");
    let line = logs
        .lines()
        .find(|l| l.contains("event dead-lettered"))
        .unwrap_or_else(|| panic!("no dead-letter line in {logs}"));
    assert!(
        line.ends_with(&format!(
            " trace_id={} span_id={}",
            hex(&failed.trace_id),
            hex(&failed.span_id)
        )),
        "{line}"
    );
    assert!(line.contains(&poison.to_string()), "{line}");
}

#[test]
fn an_unsupported_otlp_protocol_is_a_usage_error() {
    let out = testkit::relay_command()
        .args(["run", "--metrics-addr", "off"])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .output()
        .expect("run outbox-relay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{stderr}");
}

#[tokio::test]
async fn an_embedded_relay_traces_through_the_applications_subscriber() {
    let env = Env::new().await;
    let client = env.client().await;
    // The writer's own context under a header name in another case: replaced under that name.
    let id = enqueue(
        &client,
        &event("embedded").with_header("Traceparent", EXPLICIT),
    )
    .await
    .expect("enqueue");

    let spans = run_traced(env.config(), async {
        env.wait_stream_len(1, Duration::from_secs(10)).await;
    })
    .await;
    let send = finished_send_span(&spans, id);
    assert_eq!(send.span_kind, opentelemetry::trace::SpanKind::Producer);
    assert_eq!(send.name, "publish outbox.order.created");
    assert_eq!(
        send.span_context.trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(send.parent_span_id.to_string(), "00f067aa0ba902b7");

    let stored = env.stored().await;
    let m = by_aggregate(&stored, "embedded");
    assert_eq!(
        m.headers["Traceparent"],
        format!(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
            send.span_context.span_id()
        )
    );
    assert!(!m.headers.contains_key("traceparent"), "{:?}", m.headers);
}

/// Runs an embedded relay with `config` under an application's OpenTelemetry subscriber until
/// `done`; returns the spans it finished.
async fn run_traced(
    config: outbox_relay::RelayConfig,
    done: impl std::future::Future<Output = ()>,
) -> Vec<opentelemetry_sdk::trace::SpanData> {
    let (exporter, provider, dispatch) = writer_tracing();
    // tracing caches each callsite's interest. While at most one dispatcher is alive, it asks only
    // the dispatcher of the thread that hits a callsite first: an untraced relay of another test
    // would then disable the send span for good. A second live dispatcher makes it ask all.
    let _second = Dispatch::new(tracing_subscriber::registry());
    let relay = outbox_relay::Relay::new(config).await.expect("relay");
    let token = tokio_util::sync::CancellationToken::new();
    let handle = tokio::spawn(relay.run(token.clone()).with_subscriber(dispatch));
    done.await;
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .expect("relay stops")
        .expect("relay task")
        .expect("relay exits cleanly");
    provider.force_flush().expect("flush");
    exporter.get_finished_spans().expect("spans")
}

fn finished_send_span(
    spans: &[opentelemetry_sdk::trace::SpanData],
    id: uuid::Uuid,
) -> &opentelemetry_sdk::trace::SpanData {
    spans
        .iter()
        .find(|s| {
            s.attributes.iter().any(|kv| {
                kv.key.as_str() == "messaging.message.id" && kv.value.as_str() == id.to_string()
            })
        })
        .unwrap_or_else(|| panic!("no send span in {spans:#?}"))
}

/// "No responders" is first taken for the broker's trouble and judged after a lookup of the
/// stream: the send span of an event routed where no stream listens ends as the event's failure
/// (`error.type` "rejected"), as the row's verdict does.
#[tokio::test]
async fn a_send_span_records_the_verdict_on_no_responders() {
    let env = Env::new().await; // the stream covers outbox.>
    let id = enqueue(
        &env.client().await,
        &NewEvent::new("audit", "a-1", "created", &serde_json::json!({})).expect("event"),
    )
    .await
    .expect("enqueue");
    let config = {
        let mut config = env.config();
        config.publish.subject_template = Some("{aggregate_type}.{event_type}".into());
        config.retry.max_attempts = 1;
        config
    };
    let spans = run_traced(config, async {
        env.wait_dead_letters(1, Duration::from_secs(20)).await;
    })
    .await;
    let send = finished_send_span(&spans, id);
    assert_eq!(send.name, "publish audit.created");
    let error_types: Vec<String> = send
        .attributes
        .iter()
        .filter(|kv| kv.key.as_str() == "error.type")
        .map(|kv| kv.value.as_str().into_owned())
        .collect();
    assert_eq!(error_types, ["rejected"], "one verdict: {send:#?}");
    assert!(
        matches!(send.status, opentelemetry::trace::Status::Error { .. }),
        "{:?}",
        send.status
    );
}

/// An https:// collector that requires a client certificate: the relay trusts its CA from
/// `OTEL_EXPORTER_OTLP_CERTIFICATE` and presents `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and
/// `..._CLIENT_KEY` (the variables of the OpenTelemetry SDKs), and the span arrives.
#[tokio::test]
async fn spans_are_exported_over_https_with_client_certificates() {
    let pki = crate::tls::pki();
    let env = Env::new().await;
    let id = enqueue(&env.client().await, &event("over-tls"))
        .await
        .expect("enqueue");
    let (receiver, exported) = otlp_receiver(Some(mutual_tls(&pki))).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("relay.log");
    let relay = relay_exporting_with(
        &env,
        &format!("https://localhost:{}", receiver.port()),
        &[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.ca),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &pki.client_cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &pki.client_key),
        ],
        "json",
        &log_path,
    );
    wait_until(
        "the span exported over TLS",
        Duration::from_secs(20),
        || async {
            let exported = exported.lock().expect("lock");
            exported
                .iter()
                .any(|(_, s)| text(attribute(s, "messaging.message.id")) == id.to_string())
        },
    )
    .await;
    assert_eq!(relay.stop().await, None, "the relay exits cleanly");
}

/// A client certificate without its key is a usage error naming the variables.
#[test]
fn a_client_certificate_without_its_key_is_a_usage_error() {
    let pki = crate::tls::pki();
    let out = testkit::relay_command()
        .args(["run", "--metrics-addr", "off"])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:1")
        .env("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &pki.client_cert)
        .env_remove("OTEL_EXPORTER_OTLP_CLIENT_KEY")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .output()
        .expect("run outbox-relay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")
            && stderr.contains("OTEL_EXPORTER_OTLP_CLIENT_KEY"),
        "{stderr}"
    );
}
