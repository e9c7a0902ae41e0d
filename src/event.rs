//! Domain types: the event a writer enqueues and the event the relay publishes, plus the rules that
//! keep both valid as NATS subjects and headers.

use std::collections::BTreeMap;

use bytes::Bytes;
use uuid::Uuid;

use crate::timestamp::Timestamp;

use crate::error::{Error, Result};

/// Column limits of `outbox_events` (see sql/migrations).
pub const MAX_EVENT_TYPE_LEN: usize = 100;
/// Longest `aggregate_type` / `aggregate_id`, in bytes.
pub const MAX_AGGREGATE_LEN: usize = 255;

/// JetStream stores a message's header block with a 16-bit length: every stream refuses a block
/// larger than this ("header size exceeds maximum allowed of 64k"), whatever its limits.
pub const MAX_HEADER_BLOCK_BYTES: usize = 65_535;

/// `(aggregate_type, aggregate_id)`: the unit of ordering.
pub(crate) type AggregateKey = (String, String);

/// An event to write into the outbox inside the application's transaction.
///
/// [`NewEvent::new`] takes any serializable payload; [`NewEvent::validate`] (also run by
/// [`crate::enqueue`] before anything is sent) refuses what cannot become a NATS subject or header:
///
/// ```
/// use outbox_relay::{ErrorKind, NewEvent};
///
/// #[derive(serde::Serialize)]
/// struct OrderCreated {
///     total: f64,
/// }
///
/// let event = NewEvent::new("order", "42", "order.created", &OrderCreated { total: 99.5 })?
///     .with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert!(event.validate().is_ok());
/// assert_eq!(event.payload["total"], 99.5);
///
/// // A wildcard would make a subject that matches other subjects.
/// let wildcard = NewEvent::new("order", "42", "order.*", &())?;
/// assert_eq!(wildcard.validate().unwrap_err().kind(), ErrorKind::InvalidEvent);
/// // The relay sets the deduplication header itself.
/// let spoofed = event.clone().with_header("Nats-Msg-Id", "mine");
/// assert!(spoofed.validate().unwrap_err().is_usage());
/// # Ok::<(), outbox_relay::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// What kind of thing the event is about (`order`); with `aggregate_id`, the unit of ordering.
    pub aggregate_type: String,
    /// Which one (`42`).
    pub aggregate_id: String,
    /// What happened (`order.created`): the last part of the subject.
    pub event_type: String,
    /// The event's body, published as JSON.
    pub payload: serde_json::Value,
    /// Extra NATS headers published with the event (for example a W3C `traceparent`).
    pub headers: BTreeMap<String, String>,
}

impl NewEvent {
    /// Builds an event from any serializable payload. The payload is converted to JSON now, so a
    /// payload that cannot be serialized is an error here rather than in the transaction.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &impl serde::Serialize,
    ) -> Result<Self> {
        let payload = serde_json::to_value(payload)
            .map_err(|e| Error::invalid_event(format!("payload is not serializable: {e}")))?;
        Ok(NewEvent {
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload,
            headers: BTreeMap::new(),
        })
    }

    /// Adds a header forwarded on the NATS message.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Carries a W3C trace context so a consumer can continue the trace of the writer's request.
    pub fn with_traceparent(self, traceparent: impl Into<String>) -> Self {
        self.with_header("traceparent", traceparent)
    }

    /// Checks everything the database and NATS would otherwise reject later, when it is too late to
    /// tell the writer.
    pub fn validate(&self) -> Result<()> {
        validate_parts(
            &self.aggregate_type,
            &self.aggregate_id,
            &self.event_type,
            &self.headers,
        )?;
        validate_payload(&self.payload)
    }
}

/// A claimed outbox row, as the relay publishes it.
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    /// The row's id: `Outbox-Event-Id` and `Nats-Msg-Id`.
    pub id: Uuid,
    /// Commit-independent position: the order within an aggregate.
    pub seq: i64,
    /// See [`NewEvent::aggregate_type`].
    pub aggregate_type: String,
    /// See [`NewEvent::aggregate_id`].
    pub aggregate_id: String,
    /// See [`NewEvent::event_type`].
    pub event_type: String,
    /// The JSON payload as PostgreSQL renders it: published as is, never re-serialized. Held once
    /// (the publish shares these bytes).
    pub payload: Bytes,
    /// The row's own headers (`traceparent`, ...), published after the outbox's.
    pub headers: BTreeMap<String, String>,
    /// Attempts spent before this one (rows written by raw SQL may hold any number).
    pub attempts: i32,
    /// When the row was written (the writer's `now()`).
    pub created_at: Timestamp,
    /// Why the row cannot be published as it is, found while reading it (headers that are not a
    /// JSON object, text that is not UTF-8): [`OutboxEvent::validate`] refuses it.
    pub defect: Option<String>,
    /// Where the event stands in the database transaction that wrote it (the
    /// `Outbox-Transaction-*` headers); `None` for a row without one (written before schema
    /// version 9, or with the column set to NULL), or before the relay looked it up.
    pub transaction: Option<TransactionPosition>,
}

/// An event's place in the database transaction that wrote it, as the relay found it in the
/// table when it published the event: what a consumer needs to act on a transaction as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionPosition {
    /// The writing transaction's id (`pg_current_xact_id()`, recorded in the row's `txid`): 64
    /// bits, unique for the life of the database cluster.
    pub id: u64,
    /// The event's place among the transaction's events, from 1, in the order they were written
    /// (0 while the relay has not placed it yet).
    pub index: u64,
    /// How many events the transaction wrote; `None` where it was not known yet when the event
    /// was published: a transaction larger than the wal stream holds at once (`--batch-size`
    /// events) carries its count on its last event only.
    pub events: Option<u64>,
}

impl TransactionPosition {
    /// The transaction `id`, the event's place in it not known yet (`index` 0).
    pub fn unplaced(id: u64) -> TransactionPosition {
        TransactionPosition {
            id,
            index: 0,
            events: None,
        }
    }

    /// The one event of transaction `id`: first of one.
    pub(crate) fn alone(id: u64) -> TransactionPosition {
        TransactionPosition {
            id,
            index: 1,
            events: Some(1),
        }
    }

    /// Both the event's place and the transaction's count are known.
    pub fn is_placed(&self) -> bool {
        self.index > 0 && self.events.is_some()
    }
}

impl OutboxEvent {
    /// An `order.created` event of aggregate `order`/`aggregate_id` with an empty payload, for
    /// unit tests.
    #[cfg(test)]
    pub(crate) fn sample(aggregate_id: &str) -> OutboxEvent {
        OutboxEvent {
            id: Uuid::new_v4(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: aggregate_id.into(),
            event_type: "created".into(),
            payload: Bytes::from_static(b"{}"),
            headers: Default::default(),
            attempts: 0,
            created_at: Timestamp::now(),
            defect: None,
            transaction: None,
        }
    }

    /// Rows written with plain SQL never went through [`NewEvent::validate`]; check them the same way.
    pub fn validate(&self) -> Result<()> {
        if let Some(defect) = &self.defect {
            return Err(Error::invalid_event(defect.clone()));
        }
        if let Err(why) = self.created_at.rfc3339() {
            return Err(Error::invalid_event(format!(
                "created_at {} cannot be sent as an RFC 3339 date: {why}",
                self.created_at
            )));
        }
        validate_parts(
            &self.aggregate_type,
            &self.aggregate_id,
            &self.event_type,
            &self.headers,
        )
    }
}

/// The rules a new event and a claimed row share: names, event type, headers and their block.
fn validate_parts(
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
    headers: &BTreeMap<String, String>,
) -> Result<()> {
    validate_name("aggregate_type", aggregate_type, MAX_AGGREGATE_LEN)?;
    validate_name("aggregate_id", aggregate_id, MAX_AGGREGATE_LEN)?;
    validate_event_type(event_type)?;
    validate_headers(headers)?;
    validate_header_block(aggregate_type, aggregate_id, event_type, headers)
}

fn validate_name(field: &str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid_event(format!("{field} is empty")));
    }
    if value.chars().count() > max {
        return Err(Error::invalid_event(format!(
            "{field} is longer than {max} characters"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid_event(format!(
            "{field} contains a control character (it is sent as a NATS header)"
        )));
    }
    if value.trim() != value {
        return Err(Error::invalid_event(format!(
            "{field} has leading or trailing whitespace (NATS header values are trimmed on receipt)"
        )));
    }
    Ok(())
}

/// PostgreSQL's jsonb cannot store `\u0000`; refuse it here instead of aborting the transaction.
fn validate_payload(payload: &serde_json::Value) -> Result<()> {
    fn has_nul(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(a) => a.iter().any(has_nul),
            serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    if has_nul(payload) {
        return Err(Error::invalid_event(
            "payload contains a NUL character, which PostgreSQL's jsonb cannot store",
        ));
    }
    Ok(())
}

/// `event_type` becomes the subject suffix, so each dot-separated token must be a literal NATS token:
/// non-empty, printable ASCII, no wildcard (`*`, `>`).
pub fn validate_event_type(event_type: &str) -> Result<()> {
    validate_name("event_type", event_type, MAX_EVENT_TYPE_LEN)?;
    for token in event_type.split('.') {
        if token.is_empty() {
            return Err(Error::invalid_event(format!(
                "event_type {event_type:?} has an empty subject token"
            )));
        }
        if let Some(c) = token
            .chars()
            .find(|c| !c.is_ascii_graphic() || *c == '*' || *c == '>')
        {
            return Err(Error::invalid_event(format!(
                "event_type {event_type:?} contains {c:?}, which cannot appear in a NATS subject token"
            )));
        }
    }
    Ok(())
}

/// The subject prefix follows the same token rules as an event type.
pub fn validate_subject_prefix(prefix: &str) -> Result<()> {
    validate_event_type(prefix).map_err(|e| match e.invalid_event_message() {
        Some(m) => Error::config("subject_prefix", m.replace("event_type", "prefix")),
        None => e,
    })
}

fn validate_headers(headers: &BTreeMap<String, String>) -> Result<()> {
    for (name, value) in headers {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_graphic() && c != ':') {
            return Err(Error::invalid_event(format!(
                "header name {name:?} is not a valid NATS header name"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("nats-") || lower.starts_with("outbox-") {
            // Nats-* are JetStream controls (Msg-Id, Expected-*, Rollup...): never from an event.
            return Err(Error::invalid_event(format!(
                "header {name:?} is reserved (Nats-* and Outbox-* are set by the relay)"
            )));
        }
        if lower == "traceparent" && !is_traceparent(value) {
            return Err(Error::invalid_event(format!(
                "traceparent {value:?} is not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)"
            )));
        }
        if value.chars().any(|c| c.is_control() && c != '\t') {
            return Err(Error::invalid_event(format!(
                "header {name:?} has a control character (line break, NUL...) in its value"
            )));
        }
        if value.trim() != value {
            return Err(Error::invalid_event(format!(
                "header {name:?} has leading or trailing whitespace (trimmed on receipt)"
            )));
        }
    }
    Ok(())
}

/// The header block the relay publishes, as NATS writes it (`NATS/1.0\r\n`, `Name: value\r\n` per
/// header, a blank line): the event's headers and the relay's own must fit JetStream's limit.
/// JetStream's refusal (error 10097) would look like broker trouble to the relay: no attempt spent,
/// the row retried for ever and its aggregate stuck, the relay backing off as if the broker were
/// down.
fn validate_header_block(
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
    headers: &BTreeMap<String, String>,
) -> Result<()> {
    use crate::header::{
        HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_ID,
        HEADER_EVENT_TYPE,
    };
    const UUID_LEN: usize = 36;
    /// `2024-01-01T00:00:00.000000Z`: every date that passes validation.
    const CREATED_AT_LEN: usize = 27;
    let line = |name: &str, value_len: usize| name.len() + ": ".len() + value_len + "\r\n".len();
    let relay = line("Nats-Msg-Id", UUID_LEN)
        + line(HEADER_EVENT_ID, UUID_LEN)
        + line(HEADER_AGGREGATE_TYPE, aggregate_type.len())
        + line(HEADER_AGGREGATE_ID, aggregate_id.len())
        + line(HEADER_EVENT_TYPE, event_type.len())
        + line(HEADER_CREATED_AT, CREATED_AT_LEN);
    let own: usize = headers.iter().map(|(n, v)| line(n, v.len())).sum();
    let size = "NATS/1.0\r\n".len() + relay + own + "\r\n".len();
    if size > MAX_HEADER_BLOCK_BYTES {
        return Err(Error::invalid_event(format!(
            "headers take {size} bytes with the relay's own, more than the {MAX_HEADER_BLOCK_BYTES} \
             JetStream stores"
        )));
    }
    Ok(())
}

/// `version-traceid-parentid-flags`, lowercase hex, as in the W3C Trace Context spec.
fn is_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    parts.len() >= 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event_type: &str) -> NewEvent {
        NewEvent::new("order", "42", event_type, &serde_json::json!({})).expect("payload")
    }

    #[test]
    fn accepts_dotted_event_types() {
        assert!(ev("order.created").validate().is_ok());
        assert!(ev("OrderCreated_v2").validate().is_ok());
    }

    #[test]
    fn refuses_what_cannot_be_a_subject() {
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a.*",
            "a.>",
            "ü",
            &"x".repeat(101),
        ] {
            assert!(ev(bad).validate().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn refuses_bad_names_and_headers() {
        let mut e = ev("a");
        e.aggregate_id = String::new();
        assert!(e.validate().is_err());
        assert!(ev("a").with_header("Nats-Msg-Id", "x").validate().is_err());
        assert!(ev("a")
            .with_header("Outbox-Event-Id", "x")
            .validate()
            .is_err());
        assert!(ev("a").with_header("x", "a\r\nb").validate().is_err());
        assert!(ev("a").with_header("bad name", "v").validate().is_err());
        assert!(ev("a")
            .with_header("Nats-Expected-Stream", "X")
            .validate()
            .is_err());
        assert!(ev("a").with_header("x", "nul\0").validate().is_err());
        assert!(ev("a").with_header("x", " padded ").validate().is_err());
        let mut e = ev("a");
        e.aggregate_id = "42 ".into();
        assert!(e.validate().is_err());
        let nul =
            NewEvent::new("order", "1", "a", &serde_json::json!({"k": "a\u{0}b"})).expect("event");
        assert!(nul.validate().is_err());
        assert!(ev("a")
            .with_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .validate()
            .is_ok());
    }

    #[test]
    fn refuses_headers_over_jetstream_limit() {
        // With ev("a"): "NATS/1.0\r\n" 10, the relay's six headers 231, "X-Big: " and "\r\n" 9,
        // the final "\r\n" 2.
        let fits = MAX_HEADER_BLOCK_BYTES - 252;
        assert!(ev("a")
            .with_header("X-Big", "v".repeat(fits))
            .validate()
            .is_ok());
        let over = ev("a").with_header("X-Big", "v".repeat(fits + 1));
        let error = over.validate().expect_err("one byte over").to_string();
        assert!(error.contains("65536"), "{error}");
        assert!(ev("a")
            .with_header("h".repeat(70_000), "v")
            .validate()
            .is_err());
        // The relay's own headers count: a longer aggregate leaves less room.
        let mut e = ev("a").with_header("X-Big", "v".repeat(fits));
        e.aggregate_id = "420".into();
        assert!(e.validate().is_err());
    }
}
