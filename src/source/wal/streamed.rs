//! A streamed insert's row as an event: what the wal source publishes without reading the row
//! again from the table, when the claim finds the row unchanged since its insert (its `xmin` is
//! the streamed transaction, and the transaction changed nothing of it: see the version 6
//! migration). Anything unusual (a NULL, text that is not UTF-8, headers that are not an object,
//! a date in another style, a row already marked) gives no content: the row is then read from the
//! table, where every such case has its own handling.

use bytes::Bytes;
use uuid::Uuid;

use super::pgoutput::{Relation, Value};
use crate::event::OutboxEvent;
use crate::source::store::headers_from_json;
use crate::timestamp::Timestamp;

/// Where the columns an event is built from are in a relation's tuples.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventColumns {
    aggregate_type: usize,
    aggregate_id: usize,
    seq: usize,
    event_type: usize,
    payload: usize,
    headers: usize,
    attempts: usize,
    created_at: usize,
    /// Must be NULL in an insert whose content is used.
    unmarked: [usize; 3],
}

impl EventColumns {
    /// The positions, if the relation carries every column (a publication's column list may
    /// leave some out).
    pub fn of(relation: &Relation) -> Option<EventColumns> {
        let at = |name: &str| relation.column(name);
        Some(EventColumns {
            aggregate_type: at("aggregate_type")?,
            aggregate_id: at("aggregate_id")?,
            seq: at("seq")?,
            event_type: at("event_type")?,
            payload: at("payload")?,
            headers: at("headers")?,
            attempts: at("attempts")?,
            created_at: at("created_at")?,
            unmarked: [
                at("processed_at")?,
                at("dead_lettered_at")?,
                at("retry_after")?,
            ],
        })
    }

    /// The event the inserted `values` describe (`id`: read already).
    pub fn event(&self, values: &[Value], id: Uuid) -> Option<OutboxEvent> {
        let text = |at: usize| match values.get(at) {
            Some(Value::Text(bytes)) => std::str::from_utf8(bytes).ok(),
            _ => None,
        };
        if self
            .unmarked
            .iter()
            .any(|&at| !matches!(values.get(at), Some(Value::Null)))
        {
            return None;
        }
        let headers = match values.get(self.headers) {
            Some(Value::Null) => Default::default(),
            Some(Value::Text(_)) => match headers_from_json(Some(text(self.headers)?)) {
                (headers, None) => headers,
                (_, Some(_defect)) => return None,
            },
            _ => return None,
        };
        let payload = match values.get(self.payload) {
            Some(Value::Text(bytes)) => Bytes::copy_from_slice(bytes),
            _ => return None,
        };
        Some(OutboxEvent {
            id,
            seq: text(self.seq)?.parse().ok()?,
            aggregate_type: text(self.aggregate_type)?.to_owned(),
            aggregate_id: text(self.aggregate_id)?.to_owned(),
            event_type: text(self.event_type)?.to_owned(),
            payload,
            headers,
            attempts: text(self.attempts)?.parse().ok()?,
            created_at: Timestamp::parse_iso(text(self.created_at)?)?,
            defect: None,
            transaction: None,
        })
    }
}

/// The outbox table's columns in an order of their own, for tests of decoding.
#[cfg(test)]
pub(crate) const TEST_COLUMNS: [&str; 12] = [
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "attempts",
    "created_at",
    "processed_at",
    "seq",
    "retry_after",
    "headers",
    "dead_lettered_at",
];

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: [&str; 12] = TEST_COLUMNS;

    fn relation() -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "outbox_events".into(),
            columns: COLUMNS.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn values<'a>(changes: &[(&str, Value<'a>)]) -> Vec<Value<'a>> {
        let mut v = vec![
            Value::Text(b"00000000-0000-0000-0000-000000000001"),
            Value::Text(b"order"),
            Value::Text(b"o-1"),
            Value::Text(b"order.created"),
            Value::Text(br#"{"total": 12.50}"#),
            Value::Text(b"0"),
            Value::Text(b"2026-12-05 11:44:54.123456+00"),
            Value::Null,
            Value::Text(b"42"),
            Value::Null,
            Value::Text(br#"{"traceparent": "00-ab", "n": 123456789012345678901234567890}"#),
            Value::Null,
        ];
        for (name, value) in changes {
            let at = COLUMNS.iter().position(|c| c == name).expect("a column");
            v[at] = value.clone();
        }
        v
    }

    fn event(changes: &[(&str, Value)]) -> Option<OutboxEvent> {
        let columns = EventColumns::of(&relation()).expect("every column");
        columns.event(&values(changes), Uuid::nil())
    }

    #[test]
    fn an_insert_becomes_the_event_the_table_would_give() {
        let e = event(&[]).expect("an event");
        assert_eq!((e.seq, e.attempts), (42, 0));
        assert_eq!(e.event_type, "order.created");
        assert_eq!(&e.payload[..], br#"{"total": 12.50}"#);
        assert_eq!(e.headers["traceparent"], "00-ab");
        // Every digit, as the table's read keeps them.
        assert_eq!(e.headers["n"], "123456789012345678901234567890");
        assert_eq!(
            e.created_at.to_string(),
            "2026-12-05T11:44:54.123456Z",
            "created_at"
        );
        assert!(event(&[("headers", Value::Null)]).is_some_and(|e| e.headers.is_empty()));
    }

    #[test]
    fn anything_unusual_is_read_from_the_table_instead() {
        for change in [
            ("processed_at", Value::Text(b"2026-12-05 11:44:54+00")),
            ("dead_lettered_at", Value::Text(b"2026-12-05 11:44:54+00")),
            ("retry_after", Value::Text(b"2026-12-05 11:44:54+00")),
            ("headers", Value::Text(b"[1]")),
            ("headers", Value::Text(b"{\"a\": 1")),
            ("event_type", Value::Text(b"\xff")),
            ("aggregate_id", Value::Text(b"o-\xff")),
            ("event_type", Value::Null),
            ("payload", Value::Unchanged),
            ("payload", Value::Binary(b"{}")),
            ("seq", Value::Text(b"x")),
            ("attempts", Value::Null),
            ("created_at", Value::Text(b"0099-01-01 00:00:00+00 BC")),
        ] {
            assert!(event(std::slice::from_ref(&change)).is_none(), "{change:?}");
        }
        let mut short = relation();
        short.columns.pop();
        assert!(EventColumns::of(&short).is_none());
    }
}
