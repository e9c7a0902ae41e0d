//! The writer API: put events into the outbox inside the application's own transaction.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::error::Result;
use crate::event::NewEvent;

const ENQUEUE: &str = include_str!("../sql/queries/writer/enqueue.sql");

/// Writes one event. Pass the application's `Transaction`: the event then commits or rolls back
/// with the business data. Returns the event id (also its `Nats-Msg-Id`).
///
/// The outbox table is found through the connection's search_path. The statement is unnamed (no
/// prepared statement outlives it), so this works through PgBouncer in transaction mode too.
///
/// ```no_run
/// # async fn example(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_relay::{enqueue, NewEvent};
/// use serde_json::json;
///
/// let tx = client.transaction().await?;
/// tx.execute("INSERT INTO orders (id, total) VALUES (42, 99.5)", &[]).await?;
/// let event = NewEvent::new("order", "42", "order.created", &json!({ "total": 99.5 }))?;
/// let event_id = enqueue(&tx, &event).await?;
/// // Published once this commits; never if the transaction rolls back.
/// tx.commit().await?;
/// # let _ = event_id;
/// # Ok(())
/// # }
/// ```
pub async fn enqueue<C: GenericClient + Sync>(client: &C, event: &NewEvent) -> Result<Uuid> {
    let ids = enqueue_many(client, std::slice::from_ref(event)).await?;
    Ok(ids[0])
}

/// Writes several events in one statement, in the given order (their `seq` follows it).
/// All events are validated before anything is sent: one bad event writes none.
///
/// ```no_run
/// # async fn example(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_relay::{enqueue_many, NewEvent};
/// use serde_json::json;
///
/// let tx = client.transaction().await?;
/// let events = [
///     NewEvent::new("order", "42", "order.paid", &json!({ "amount": 99.5 }))?,
///     NewEvent::new("order", "42", "order.shipped", &json!({ "carrier": "post" }))?,
/// ];
/// let ids = enqueue_many(&tx, &events).await?; // in this order, also on the stream
/// tx.commit().await?;
/// assert_eq!(ids.len(), 2);
/// # Ok(())
/// # }
/// ```
pub async fn enqueue_many<C: GenericClient + Sync>(
    client: &C,
    events: &[NewEvent],
) -> Result<Vec<Uuid>> {
    let Some(c) = Columns::of(events)? else {
        return Ok(Vec::new());
    };
    // An unnamed statement with its parameter types: one round trip, and nothing prepared stays
    // behind on the server connection, so it works through a transaction pooler.
    let rows = client
        .query_typed(
            ENQUEUE,
            &[
                (&c.aggregate_types, Type::VARCHAR_ARRAY),
                (&c.aggregate_ids, Type::VARCHAR_ARRAY),
                (&c.event_types, Type::VARCHAR_ARRAY),
                (&c.payloads, Type::JSONB_ARRAY),
                (&c.headers, Type::JSONB_ARRAY),
            ],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The statement's parameters: one array per column, after validating every event (one bad event
/// writes none). Shared with the sqlx writer so that both write the same rows.
pub(crate) struct Columns<'a> {
    pub aggregate_types: Vec<&'a str>,
    pub aggregate_ids: Vec<&'a str>,
    pub event_types: Vec<&'a str>,
    pub payloads: Vec<&'a serde_json::Value>,
    pub headers: Vec<Option<serde_json::Value>>,
}

impl<'a> Columns<'a> {
    /// `None` for no events: nothing to write.
    pub fn of(events: &'a [NewEvent]) -> Result<Option<Self>> {
        if events.is_empty() {
            return Ok(None);
        }
        for event in events {
            event.validate()?;
        }
        Ok(Some(Columns {
            aggregate_types: events.iter().map(|e| e.aggregate_type.as_str()).collect(),
            aggregate_ids: events.iter().map(|e| e.aggregate_id.as_str()).collect(),
            event_types: events.iter().map(|e| e.event_type.as_str()).collect(),
            payloads: events.iter().map(|e| &e.payload).collect(),
            headers: headers_column(events),
        }))
    }
}

/// The `headers` column of each event: a JSON object of its headers, NULL when it has none.
///
/// With the `otel` feature, an event without a `traceparent` header also gets the trace context of
/// the current span (`traceparent`, and `tracestate` unless the event has one). Shared with the sqlx
/// writer so that both write the same rows.
fn headers_column(events: &[NewEvent]) -> Vec<Option<serde_json::Value>> {
    #[cfg(feature = "otel")]
    let trace = if events.iter().any(|e| !has_header(e, "traceparent")) {
        crate::otel::current_trace_headers()
    } else {
        Vec::new()
    };
    #[cfg(not(feature = "otel"))]
    let trace: Vec<(String, String)> = Vec::new();
    events
        .iter()
        .map(|e| {
            let mut object: serde_json::Map<String, serde_json::Value> = e
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            if !has_header(e, "traceparent") {
                for (k, v) in &trace {
                    if !has_header(e, k) {
                        object.insert(k.clone(), serde_json::Value::String(v.clone()));
                    }
                }
            }
            (!object.is_empty()).then_some(serde_json::Value::Object(object))
        })
        .collect()
}

/// Header names are matched like HTTP's: `Traceparent` is the `traceparent` header.
fn has_header(event: &NewEvent, name: &str) -> bool {
    event.headers.keys().any(|k| k.eq_ignore_ascii_case(name))
}
