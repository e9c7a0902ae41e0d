//! `/metrics`, `/healthz` and `/readyz` on one listener.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::metrics::Metrics;

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let app = Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(Shared { metrics, health });
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "metrics server failed");
    }
}

async fn serve_metrics(State(s): State<Shared>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

/// 200 when the database answers, the listener is connected (or the relay only polls) and NATS is
/// connected; 503 with the failing parts otherwise (also while the relay waits for them at start).
async fn readyz(State(s): State<Shared>) -> impl IntoResponse {
    let report = s.health.report();
    let body = serde_json::json!({
        "ready": report.is_ready(),
        "database": report.database,
        "listener": report.listener,
        "broker": report.broker,
        "missing": report.missing(),
    });
    let code = if report.is_ready() {
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
