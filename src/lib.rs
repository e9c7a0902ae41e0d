//! A transactional outbox for PostgreSQL that relays events to NATS JetStream.
//!
//! Writers put events into `outbox_events` inside their own transaction with [`enqueue`]; the
//! [`Relay`] publishes every committed event to JetStream at least once (exactly once into the
//! stream within its duplicate window, thanks to `Nats-Msg-Id`), in order per aggregate.
//!
//! Module map:
//! - [`event`]: `NewEvent` (what writers enqueue), `OutboxEvent` (what the relay publishes), and the
//!   subject/header rules both obey.
//! - [`writer`]: `enqueue` / `enqueue_many`, for any tokio-postgres `GenericClient`.
//! - [`consumer`]: `process_once` for idempotent consumers.
//! - [`migrate`]: the versioned schema in `sql/migrations`.
//! - [`config`]: `RelayConfig` with defaults and `validate()`.
//! - [`relay`]: the batch loop (claim, publish, record, commit).
//! - `store` (private): every relay query against PostgreSQL (`sql/queries`).
//! - `publisher` (mostly private): everything NATS.
//! - `listener` (private): LISTEN/NOTIFY, reconnects, arming of the notify trigger.
//! - [`ops`]: status, dead letters, cleanup (the operator CLI and the relay's periodic tasks).
//! - [`metrics`]: Prometheus metrics; `http` serves them with health endpoints.
//! - [`db`]: connections and secret redaction; [`tls`]: libpq `sslmode` over rustls.
//! - [`timestamp`]: PostgreSQL timestamps of any value (before 1970, infinities) without panics.
//! - `sqlx` (feature `sqlx`): `enqueue` for sqlx executors; `otel` (feature `otel`): trace context
//!   from the current tracing span.
//!
//! See docs/ARCHITECTURE.md for how the pieces fit.

mod background;
pub mod config;
pub mod consumer;
mod db;
pub mod error;
pub mod event;
mod health;
mod http;
mod listener;
pub mod metrics;
pub mod migrate;
pub mod ops;
#[cfg(feature = "otel")]
mod otel;
mod policy;
mod publisher;
mod relay;
mod signals;
#[cfg(feature = "sqlx")]
pub mod sqlx;
mod store;
mod timestamp;
mod tls;
pub mod wire;
pub mod writer;

pub use config::{NotifyMode, Ordering, RelayConfig};
pub use consumer::process_once;
pub use db::{connect, redact};
pub use error::{Error, ErrorKind, Result};
pub use event::{NewEvent, OutboxEvent};
pub use health::HealthReport;
pub use relay::Relay;
pub use timestamp::Timestamp;
pub use writer::{enqueue, enqueue_many};
