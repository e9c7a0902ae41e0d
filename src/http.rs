//! `/metrics`, `/healthz` and `/readyz` on one listener.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::listener::Signals;
use crate::metrics::Metrics;
use crate::publisher::Publisher;

#[derive(Clone)]
pub(crate) struct Health {
    pub metrics: Arc<Metrics>,
    pub signals: Arc<Signals>,
    /// Set once the relay's start-up found the broker.
    pub publisher: Arc<OnceLock<Publisher>>,
    /// With `NotifyMode::Poll` there is no listener to be connected.
    pub polling_only: bool,
}

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: CancellationToken,
) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "metrics server failed");
    }
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    h.metrics
        .broker_connected
        .set(i64::from(broker_connected(&h)));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.encode(),
    )
}

fn broker_connected(h: &Health) -> bool {
    h.publisher.get().is_some_and(Publisher::is_connected)
}

/// 200 when the database answers, the listener is connected (or the relay only polls) and NATS is
/// connected; 503 with the failing parts otherwise (also while the relay waits for them at start).
async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    let database = h.signals.database_ok.load(AtomicOrdering::Acquire);
    let listener = h.polling_only || h.signals.listener_connected.load(AtomicOrdering::Acquire);
    let broker = broker_connected(&h);
    let missing: Vec<&str> = [
        ("database", database),
        ("listener", listener),
        ("broker", broker),
    ]
    .into_iter()
    .filter(|(_, ok)| !ok)
    .map(|(part, _)| part)
    .collect();
    let body = serde_json::json!({
        "ready": missing.is_empty(),
        "database": database,
        "listener": listener,
        "broker": broker,
        "missing": missing,
    });
    let code = if database && listener && broker {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}
