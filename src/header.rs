//! The names of the headers the relay sets on every message: part of the interface (consumers
//! read them). A leaf, so that the event rules and the wire format share them without a circle;
//! public through [`crate::wire`].

/// The event's id (also sent as `Nats-Msg-Id`).
pub const HEADER_EVENT_ID: &str = "Outbox-Event-Id";
/// The event's `aggregate_type`.
pub const HEADER_AGGREGATE_TYPE: &str = "Outbox-Aggregate-Type";
/// The event's `aggregate_id`.
pub const HEADER_AGGREGATE_ID: &str = "Outbox-Aggregate-Id";
/// The event's `event_type`.
pub const HEADER_EVENT_TYPE: &str = "Outbox-Event-Type";
/// When the row was written, RFC 3339.
pub const HEADER_CREATED_AT: &str = "Outbox-Created-At";
/// The database transaction that wrote the event (its 64-bit id, decimal). Sent in every header
/// format, with the two below, when the row records its transaction (schema version 9).
pub const HEADER_TRANSACTION_ID: &str = "Outbox-Transaction-Id";
/// The event's place among its transaction's events, from 1, in the order they were written.
pub const HEADER_TRANSACTION_INDEX: &str = "Outbox-Transaction-Index";
/// How many events the transaction wrote.
pub const HEADER_TRANSACTION_EVENTS: &str = "Outbox-Transaction-Events";

/// With CloudEvents, the transaction as extension attributes (names of lowercase letters, as the
/// specification asks): `Outbox-Transaction-Id`.
pub const CE_TRANSACTION_ID: &str = "ce-outboxtxid";
/// CloudEvents' `Outbox-Transaction-Index`.
pub const CE_TRANSACTION_INDEX: &str = "ce-outboxtxindex";
/// CloudEvents' `Outbox-Transaction-Events`.
pub const CE_TRANSACTION_EVENTS: &str = "ce-outboxtxevents";

/// CloudEvents NATS binding, binary mode: `1.0`.
pub const CE_SPECVERSION: &str = "ce-specversion";
/// The event's id (the same as `Nats-Msg-Id`).
pub const CE_ID: &str = "ce-id";
/// The event's `event_type`.
pub const CE_TYPE: &str = "ce-type";
/// The producer (`ce_source` of the relay's config).
pub const CE_SOURCE: &str = "ce-source";
/// When the row was written, RFC 3339.
pub const CE_TIME: &str = "ce-time";
/// The event's `aggregate_id`: what the event is about, within its source.
pub const CE_SUBJECT: &str = "ce-subject";
/// The payload's media type (CloudEvents `datacontenttype`): `application/json`.
pub const CONTENT_TYPE: &str = "content-type";
