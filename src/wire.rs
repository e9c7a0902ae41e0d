//! What an event looks like on NATS: the headers the relay sets on every message (part of the
//! interface: consumers read them), and the header map of an event. The subject is
//! `<subject_prefix>.<event_type>`, or what `subject_template` makes of the event;
//! `Nats-Msg-Id` is the event id, for JetStream's deduplication. With
//! [`HeaderFormat::CloudEvents`](crate::HeaderFormat) (or `Both`) the message carries the
//! CloudEvents NATS binding's `ce-*` headers: `ce-id` is the same id.

pub use crate::publisher::{
    headers, headers_as, CE_ID, CE_SOURCE, CE_SPECVERSION, CE_SUBJECT, CE_TIME, CE_TYPE,
    CONTENT_TYPE, HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
};
