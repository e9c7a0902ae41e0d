//! A transactional outbox for PostgreSQL that relays events to NATS JetStream.
//!
//! Writers put events into `outbox_events` inside their own transaction with [`enqueue`]; the
//! [`Relay`] publishes every committed event to JetStream at least once (exactly once into the
//! stream within its duplicate window, thanks to `Nats-Msg-Id`), in order per aggregate.
//!
//! Public (what an application embedding the relay or writing events needs):
//! - [`event`]: `NewEvent` (what writers enqueue), `OutboxEvent` (what the relay publishes), and the
//!   subject/header rules both obey. [`wire`]: the header names consumers read and the headers of
//!   a message.
//! - [`writer`]: `enqueue` / `enqueue_many`, for any tokio-postgres `GenericClient`; `sqlx`
//!   (feature `sqlx`): the same for sqlx executors.
//! - [`consumer`]: `process_once` for idempotent consumers; `event_id`, `aggregate_id` and
//!   `event_type` read a message's headers in either format (`Outbox-*` or CloudEvents).
//! - [`migrate`]: the versioned schema in `sql/migrations`, also as scripts for other migration
//!   tools; `sqlx::migrator` (feature `sqlx`): the same as a sqlx `Migrator`.
//! - [`config`]: `RelayConfig`, one section per part (`postgres`, `nats`, `publish`, `batch`,
//!   `retry`, `source`, `wal`, `retention`, `metrics`), each with defaults and `validate()`; with
//!   the feature `clap`, its enums are `clap::ValueEnum`s.
//! - [`Schema`]: the outbox's schema name, checked once, and every form it is applied in.
//! - [`Relay`]: runs the relay in the application's runtime; [`HealthReport`] and [`metrics`] for
//!   its health checks and `/metrics`.
//! - [`ops`]: [`ops::Outbox`], the operations handle: migrate, grants, the publication, status,
//!   dead letters, cleanup (the operator CLI and the relay's periodic tasks).
//! - `console` (feature `console`): the operator console in the browser, as a router to mount
//!   (`outbox-relay console` serves it).
//! - [`error`]: the opaque [`Error`] with [`ErrorKind`] and predicates; [`connect`] and [`redact`]
//!   (connections as the relay makes them; connection strings with passwords hidden).
//! - [`text`]: values from rows shown to people (pages, the text log) with control and hidden
//!   format characters escaped.
//!
//! Private (the relay's inside):
//! - `relay`: `Relay` (start-up waits, side tasks, shutdown and hand-over): resolves the config
//!   once and hands each part its section.
//! - `source`: what both sources share: `source::batch` (publish, settle under the policy,
//!   record), `source::atomic` (`--transactions atomic`: which events go out as which atomic
//!   batches), `source::recovery` (after a failed batch; pauses that yield to shutdown).
//! - `source::table` (`--source notify`): `processor` (drain, arm, wait, drain), `listener`
//!   (LISTEN/NOTIFY, arming), `signals` (wake reasons, the arming state machine), `store` (the
//!   worker connection and the claim from the table, `sql/queries`).
//! - `source::wal` (`--source wal`): `leader` (leadership, setup and slot checks, catch-up),
//!   `driver` (pipelined batches), `pipeline` (the pure state machine of streamed rows, batches and
//!   the confirmable position), `stream` and `pgoutput` (the replication connection), `store`
//!   and `control` (its queries), `publication`, `sweep` (aggregates the table holds).
//! - `policy`: the outcome of a publish and the retry and dead-letter rules that judge it, as pure
//!   functions.
//! - `health`: what the relay knows about its connections.
//! - `publisher`: everything NATS; `subject`: the subject template, parsed at start and rendered
//!   per row.
//! - `http` (feature `http`): `/metrics`, `/healthz`, `/readyz`; `background`: gauges and the
//!   retention of `outbox_events` and `processed_events`.
//! - `clock`: one clock; the database's, which every time the database wrote is compared with.
//! - `db` (with `db::conninfo`, `db::tls`): connections, libpq connection strings, `sslmode` over
//!   rustls; `redact`: passwords out of free text (a leaf, for errors); `header`: the header
//!   names (a leaf, shared by the event rules and `wire`); `timestamp`:
//!   PostgreSQL timestamps of any value without panics; `otel` (feature `otel`): the writer's
//!   trace context through the global propagator and the relay's PRODUCER span per publish.
//!
//! See docs/ARCHITECTURE.md for how the pieces fit.

#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (Cargo.toml) to label the items of optional features.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod background;
mod clock;
pub mod config;
#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
pub mod console;
pub mod consumer;
mod db;
pub mod error;
pub mod event;
mod header;
mod health;
#[cfg(feature = "http")]
mod http;
pub mod metrics;
pub mod migrate;
pub mod ops;
#[cfg(feature = "otel")]
mod otel;
mod policy;
mod publisher;
mod redact;
mod relay;
pub mod schema;
mod source;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx;
mod stop;
mod subject;
pub mod text;
mod timestamp;
pub mod wire;
pub mod writer;

pub use config::{
    HeaderFormat, NotifyMode, Ordering, PublishBatches, RelayConfig, Source, TransactionMode,
    WalMarking,
};
pub use consumer::process_once;
pub use db::connect;
pub use error::{Error, ErrorKind, Result};
pub use event::{NewEvent, OutboxEvent, TransactionPosition};
pub use health::HealthReport;
pub use redact::redact;
pub use relay::Relay;
pub use schema::Schema;
pub use timestamp::Timestamp;
pub use writer::{enqueue, enqueue_many};
