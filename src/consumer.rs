//! Consumer-side helper for idempotent handling of at-least-once deliveries.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::error::Result;
use crate::header::{
    CE_ID, CE_SUBJECT, CE_TYPE, HEADER_AGGREGATE_ID, HEADER_EVENT_ID, HEADER_EVENT_TYPE,
};

const PROCESS_ONCE: &str = include_str!("../sql/queries/consumer/process_once.sql");

/// Records `event_id` in `processed_events` within the caller's transaction and returns `true` on
/// the first delivery, `false` on a repeat. Handle the event only when it returns `true`, in the
/// same transaction, and ack the message after the commit: a crash before the commit redelivers it,
/// a crash after it finds the id recorded. Works through a transaction pooler (unnamed statement).
///
/// ```no_run
/// # async fn example(
/// #     client: &mut tokio_postgres::Client,
/// #     message: async_nats::jetstream::Message,
/// # ) -> Result<(), async_nats::Error> {
/// use outbox_relay::{consumer, process_once};
///
/// let Some(event_id) = consumer::event_id(message.headers.as_ref()) else {
///     return Ok(()); // not published by the relay
/// };
/// let tx = client.transaction().await?;
/// if process_once(&tx, event_id).await? {
///     // The first delivery: handle the event here, with `tx`.
/// }
/// tx.commit().await?;
/// message.ack().await?; // after the commit: a redelivery then finds the id and skips
/// # Ok(())
/// # }
/// ```
pub async fn process_once<C: GenericClient + Sync>(client: &C, event_id: Uuid) -> Result<bool> {
    Ok(client
        .query_typed_opt(PROCESS_ONCE, &[(&event_id, Type::UUID)])
        .await?
        .is_some())
}

/// Reads the outbox id of a message published by the relay, whichever header format it was
/// published in: `Outbox-Event-Id`, else CloudEvents' `ce-id`.
///
/// ```
/// use outbox_relay::consumer;
///
/// // As published with `--headers cloudevents`:
/// let mut headers = async_nats::HeaderMap::new();
/// headers.insert("ce-id", "0b6f7c52-8f9e-4f4e-9d59-3f1c2a8b7e10");
/// headers.insert("ce-type", "order.created");
/// headers.insert("ce-subject", "42");
/// let id = consumer::event_id(Some(&headers)).expect("an outbox id");
/// assert_eq!(id.to_string(), "0b6f7c52-8f9e-4f4e-9d59-3f1c2a8b7e10");
/// assert_eq!(consumer::event_type(Some(&headers)), Some("order.created"));
/// assert_eq!(consumer::aggregate_id(Some(&headers)), Some("42"));
///
/// // A message from elsewhere has none.
/// assert_eq!(consumer::event_id(None), None);
/// ```
pub fn event_id(headers: Option<&async_nats::HeaderMap>) -> Option<Uuid> {
    first_of(headers, &[HEADER_EVENT_ID, CE_ID]).and_then(|v| Uuid::parse_str(v).ok())
}

/// The event's `aggregate_id`: `Outbox-Aggregate-Id`, else CloudEvents' `ce-subject`.
pub fn aggregate_id(headers: Option<&async_nats::HeaderMap>) -> Option<&str> {
    first_of(headers, &[HEADER_AGGREGATE_ID, CE_SUBJECT])
}

/// The event's `event_type`: `Outbox-Event-Type`, else CloudEvents' `ce-type`.
pub fn event_type(headers: Option<&async_nats::HeaderMap>) -> Option<&str> {
    first_of(headers, &[HEADER_EVENT_TYPE, CE_TYPE])
}

fn first_of<'a>(headers: Option<&'a async_nats::HeaderMap>, names: &[&str]) -> Option<&'a str> {
    let headers = headers?;
    names
        .iter()
        .find_map(|name| headers.get(*name).map(|v| v.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HeaderFormat;
    use crate::wire::headers_as;

    #[test]
    fn reads_either_header_format() {
        let event = crate::OutboxEvent {
            id: Uuid::from_u128(7),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "order.created".into(),
            payload: bytes::Bytes::from_static(b"{}"),
            headers: Default::default(),
            attempts: 0,
            created_at: crate::Timestamp::now(),
            defect: None,
        };
        for format in [
            HeaderFormat::Outbox,
            HeaderFormat::CloudEvents,
            HeaderFormat::Both,
        ] {
            let h = headers_as(&event, format, "/s");
            assert_eq!(event_id(Some(&h)), Some(event.id), "{format:?}");
            assert_eq!(aggregate_id(Some(&h)), Some("42"), "{format:?}");
            assert_eq!(event_type(Some(&h)), Some("order.created"), "{format:?}");
        }
        assert_eq!(event_id(None), None);
        let mut h = async_nats::HeaderMap::new();
        h.insert(CE_ID, "not-a-uuid");
        assert_eq!(event_id(Some(&h)), None);
    }
}
