//! Consumer-side helper for idempotent handling of at-least-once deliveries.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::error::Result;

const PROCESS_ONCE: &str = include_str!("../sql/queries/process_once.sql");

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

/// Reads the outbox id of a message published by the relay (header `Outbox-Event-Id`).
pub fn event_id(headers: Option<&async_nats::HeaderMap>) -> Option<Uuid> {
    headers?
        .get(crate::publisher::HEADER_EVENT_ID)
        .and_then(|v| Uuid::parse_str(v.as_str()).ok())
}
