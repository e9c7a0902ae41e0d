//! `/metrics`, `/healthz` and `/readyz` on one listener.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;

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
    pub publisher: Publisher,
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
        .set(i64::from(h.publisher.is_connected()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.encode(),
    )
}

/// 200 when the database answers, the listener is connected (or the relay only polls) and NATS is
/// connected; 503 with the failing parts otherwise.
async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    let database = h.signals.database_ok.load(AtomicOrdering::Acquire);
    let listener = h.polling_only || h.signals.listener_connected.load(AtomicOrdering::Acquire);
    let broker = h.publisher.is_connected();
    let body = serde_json::json!({
        "ready": database && listener && broker,
        "database": database,
        "listener": listener,
        "broker": broker,
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
