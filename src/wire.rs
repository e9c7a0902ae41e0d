//! What an event looks like on NATS: the headers the relay sets on every message (part of the
//! interface: consumers read them), and the header map of an event. The subject is
//! `<subject_prefix>.<event_type>`; `Nats-Msg-Id` is the event id, for JetStream's deduplication.

pub use crate::publisher::{
    headers, HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
};
