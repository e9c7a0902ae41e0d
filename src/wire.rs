//! What an event looks like on NATS: the headers the relay sets on every message (part of the
//! interface: consumers read them), and the header map of an event. The subject is
//! `<subject_prefix>.<event_type>`, or what `subject_template` makes of the event;
//! `Nats-Msg-Id` is the event id, for JetStream's deduplication. With
//! [`HeaderFormat::CloudEvents`](crate::HeaderFormat) (or `Both`) the message carries the
//! CloudEvents NATS binding's `ce-*` headers: `ce-id` is the same id.

pub use crate::header::{
    CE_ID, CE_SOURCE, CE_SPECVERSION, CE_SUBJECT, CE_TIME, CE_TRANSACTION_EVENTS,
    CE_TRANSACTION_ID, CE_TRANSACTION_INDEX, CE_TYPE, CONTENT_TYPE, HEADER_AGGREGATE_ID,
    HEADER_AGGREGATE_TYPE, HEADER_CREATED_AT, HEADER_EVENT_ID, HEADER_EVENT_TYPE,
    HEADER_TRANSACTION_EVENTS, HEADER_TRANSACTION_ID, HEADER_TRANSACTION_INDEX,
};

use crate::config::HeaderFormat;
use crate::event::OutboxEvent;

/// The header block as NATS writes it: `NATS/1.0\r\n`, `Name: value\r\n` per value, a blank line.
pub(crate) fn header_block_len(headers: &async_nats::HeaderMap) -> usize {
    let lines: usize = headers
        .iter()
        .map(|(name, values)| {
            values
                .iter()
                .map(|v| {
                    AsRef::<[u8]>::as_ref(name).len() + ": ".len() + v.as_str().len() + "\r\n".len()
                })
                .sum::<usize>()
        })
        .sum();
    "NATS/1.0\r\n".len() + lines + "\r\n".len()
}

/// The headers of the default [`HeaderFormat::Outbox`]: `Nats-Msg-Id` (JetStream dedup), the
/// `Outbox-*` metadata, and the row's own headers. Call it only for an event that passed
/// [`OutboxEvent::validate`].
pub fn headers(event: &OutboxEvent) -> async_nats::HeaderMap {
    headers_as(event, HeaderFormat::Outbox, "")
}

/// The headers of a message in `format`: the row's own headers first, then `Nats-Msg-Id` and the
/// metadata (which win over a row header of the same name). `ce_source` is used by the
/// CloudEvents formats only. Call it only for an event that passed [`OutboxEvent::validate`].
pub fn headers_as(
    event: &OutboxEvent,
    format: HeaderFormat,
    ce_source: &str,
) -> async_nats::HeaderMap {
    headers_with(event, format, ce_source, &[])
}

/// [`headers_as`] with `trace` (the send span's context) in place of the row's trace headers: a
/// row's header of the same name whatever its case takes the new value, under its own name.
pub(crate) fn headers_with(
    event: &OutboxEvent,
    format: HeaderFormat,
    ce_source: &str,
    trace: &[(String, String)],
) -> async_nats::HeaderMap {
    use async_nats::header::HeaderName;
    // The relay's own names: built once, no copy per message.
    const EVENT_ID: HeaderName = HeaderName::from_static(HEADER_EVENT_ID);
    const AGGREGATE_TYPE: HeaderName = HeaderName::from_static(HEADER_AGGREGATE_TYPE);
    const AGGREGATE_ID: HeaderName = HeaderName::from_static(HEADER_AGGREGATE_ID);
    const EVENT_TYPE: HeaderName = HeaderName::from_static(HEADER_EVENT_TYPE);
    const CREATED_AT: HeaderName = HeaderName::from_static(HEADER_CREATED_AT);
    const SPECVERSION: HeaderName = HeaderName::from_static(CE_SPECVERSION);
    const ID: HeaderName = HeaderName::from_static(CE_ID);
    const TYPE: HeaderName = HeaderName::from_static(CE_TYPE);
    const SOURCE: HeaderName = HeaderName::from_static(CE_SOURCE);
    const TIME: HeaderName = HeaderName::from_static(CE_TIME);
    const SUBJECT: HeaderName = HeaderName::from_static(CE_SUBJECT);
    const MEDIA_TYPE: HeaderName = HeaderName::from_static(CONTENT_TYPE);
    const TRANSACTION_ID: HeaderName = HeaderName::from_static(HEADER_TRANSACTION_ID);
    const TRANSACTION_INDEX: HeaderName = HeaderName::from_static(HEADER_TRANSACTION_INDEX);
    const TRANSACTION_EVENTS: HeaderName = HeaderName::from_static(HEADER_TRANSACTION_EVENTS);
    const CE_TX_ID: HeaderName = HeaderName::from_static(CE_TRANSACTION_ID);
    const CE_TX_INDEX: HeaderName = HeaderName::from_static(CE_TRANSACTION_INDEX);
    const CE_TX_EVENTS: HeaderName = HeaderName::from_static(CE_TRANSACTION_EVENTS);

    let id = event.id.to_string();
    // RFC 3339 for every event that passed validation.
    let created_at = event.created_at.to_string();
    let outbox = matches!(format, HeaderFormat::Outbox | HeaderFormat::Both);
    let cloudevents = matches!(format, HeaderFormat::CloudEvents | HeaderFormat::Both);
    let mut h = async_nats::HeaderMap::new();
    let mut replaced = vec![false; trace.len()];
    for (name, value) in &event.headers {
        // NATS header names are case-sensitive: a row's `CE-Type` next to the relay's `ce-type`
        // would leave consumers two answers. The relay's own attributes win.
        if cloudevents && is_ce_attribute(name) {
            continue;
        }
        let value = match trace.iter().position(|(t, _)| t.eq_ignore_ascii_case(name)) {
            Some(i) => {
                replaced[i] = true;
                trace[i].1.as_str()
            }
            None => value.as_str(),
        };
        h.insert(name.as_str(), value);
    }
    for ((name, value), _) in trace.iter().zip(&replaced).filter(|(_, r)| !**r) {
        h.insert(name.as_str(), value.as_str());
    }
    h.insert(async_nats::header::NATS_MESSAGE_ID, id.clone());
    if outbox {
        h.insert(EVENT_ID, id.clone());
        h.insert(AGGREGATE_TYPE, event.aggregate_type.as_str());
        h.insert(AGGREGATE_ID, event.aggregate_id.as_str());
        h.insert(EVENT_TYPE, event.event_type.as_str());
        h.insert(CREATED_AT, created_at.clone());
    }
    // In every format: nothing else tells a consumer where a transaction ends.
    if let Some(t) = &event.transaction {
        let index = (t.index > 0).then(|| t.index.to_string());
        let events = t.events.map(|n| n.to_string());
        let names = [
            (
                outbox,
                [TRANSACTION_ID, TRANSACTION_INDEX, TRANSACTION_EVENTS],
            ),
            (cloudevents, [CE_TX_ID, CE_TX_INDEX, CE_TX_EVENTS]),
        ];
        for (_, [id_name, index_name, events_name]) in names.into_iter().filter(|(on, _)| *on) {
            h.insert(id_name, t.id.to_string());
            if let Some(index) = &index {
                h.insert(index_name, index.as_str());
            }
            if let Some(events) = &events {
                h.insert(events_name, events.as_str());
            }
        }
    }
    if cloudevents {
        h.insert(SPECVERSION, "1.0");
        h.insert(ID, id);
        h.insert(TYPE, event.event_type.as_str());
        h.insert(SOURCE, ce_source);
        h.insert(TIME, created_at);
        h.insert(SUBJECT, event.aggregate_id.as_str());
        // The payload is jsonb text; a row that names its own media type keeps it.
        if !event
            .headers
            .keys()
            .any(|name| name.eq_ignore_ascii_case(CONTENT_TYPE))
        {
            h.insert(MEDIA_TYPE, "application/json");
        }
    }
    h
}

/// One of the `ce-*` headers the relay sets, in any case.
fn is_ce_attribute(name: &str) -> bool {
    [
        CE_SPECVERSION,
        CE_ID,
        CE_TYPE,
        CE_SOURCE,
        CE_TIME,
        CE_SUBJECT,
        CE_TRANSACTION_ID,
        CE_TRANSACTION_INDEX,
        CE_TRANSACTION_EVENTS,
    ]
    .iter()
    .any(|ce| name.eq_ignore_ascii_case(ce))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> OutboxEvent {
        OutboxEvent {
            id: uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "order.created".into(),
            payload: bytes::Bytes::from_static(b"{}"),
            headers: [
                (
                    "traceparent".to_string(),
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string(),
                ),
                ("CE-Type".to_string(), "spoofed".to_string()),
            ]
            .into_iter()
            .collect(),
            attempts: 0,
            created_at: crate::Timestamp::now(),
            defect: None,
            transaction: None,
        }
    }

    fn get(h: &async_nats::HeaderMap, name: &str) -> Option<String> {
        h.get(name).map(|v| v.as_str().to_string())
    }

    #[test]
    fn header_formats() {
        let e = event();
        let id = e.id.to_string();
        let time = e.created_at.to_string();
        let outbox = headers_as(&e, HeaderFormat::Outbox, "/unused");
        assert_eq!(get(&outbox, "Nats-Msg-Id"), Some(id.clone()));
        assert_eq!(get(&outbox, HEADER_EVENT_ID), Some(id.clone()));
        assert_eq!(get(&outbox, CE_ID), None);
        // Without CloudEvents the row's headers pass as they are.
        assert_eq!(get(&outbox, "CE-Type"), Some("spoofed".into()));
        assert_eq!(outbox, headers(&e));

        let ce = headers_as(&e, HeaderFormat::CloudEvents, "/orders");
        assert_eq!(get(&ce, "Nats-Msg-Id"), Some(id.clone()));
        assert_eq!(get(&ce, HEADER_EVENT_ID), None);
        assert_eq!(get(&ce, CE_SPECVERSION).as_deref(), Some("1.0"));
        assert_eq!(get(&ce, CE_ID), Some(id.clone()));
        assert_eq!(get(&ce, CE_TYPE).as_deref(), Some("order.created"));
        assert_eq!(get(&ce, CE_SOURCE).as_deref(), Some("/orders"));
        assert_eq!(get(&ce, CE_TIME), Some(time));
        assert_eq!(get(&ce, CE_SUBJECT).as_deref(), Some("42"));
        assert_eq!(get(&ce, CONTENT_TYPE).as_deref(), Some("application/json"));
        assert_eq!(get(&ce, "CE-Type"), None, "the relay's ce-type wins");
        assert!(get(&ce, "traceparent").is_some());

        let both = headers_as(&e, HeaderFormat::Both, "/orders");
        assert_eq!(get(&both, HEADER_EVENT_ID), Some(id.clone()));
        assert_eq!(get(&both, CE_ID), Some(id));
        assert_eq!(both.len(), outbox.len() + ce.len() - 2 - 1);

        let mut typed = event();
        typed
            .headers
            .insert("Content-Type".into(), "application/cloudevents+json".into());
        let ce = headers_as(&typed, HeaderFormat::CloudEvents, "/orders");
        assert_eq!(get(&ce, CONTENT_TYPE), None, "the row's media type is kept");
        assert_eq!(
            get(&ce, "Content-Type").as_deref(),
            Some("application/cloudevents+json")
        );
    }

    #[test]
    fn transaction_headers_in_every_format() {
        let names = |format| match format {
            HeaderFormat::Outbox => vec![[
                HEADER_TRANSACTION_ID,
                HEADER_TRANSACTION_INDEX,
                HEADER_TRANSACTION_EVENTS,
            ]],
            HeaderFormat::CloudEvents => vec![[
                CE_TRANSACTION_ID,
                CE_TRANSACTION_INDEX,
                CE_TRANSACTION_EVENTS,
            ]],
            HeaderFormat::Both => vec![
                [
                    HEADER_TRANSACTION_ID,
                    HEADER_TRANSACTION_INDEX,
                    HEADER_TRANSACTION_EVENTS,
                ],
                [
                    CE_TRANSACTION_ID,
                    CE_TRANSACTION_INDEX,
                    CE_TRANSACTION_EVENTS,
                ],
            ],
        };
        let formats = [
            HeaderFormat::Outbox,
            HeaderFormat::CloudEvents,
            HeaderFormat::Both,
        ];
        let mut e = event();
        for format in formats {
            let h = headers_as(&e, format, "/orders");
            for [id, _, _] in names(format) {
                assert_eq!(get(&h, id), None, "a row without a transaction: {format:?}");
            }
        }
        e.transaction = Some(crate::event::TransactionPosition {
            id: u64::MAX,
            index: 3,
            events: Some(500),
        });
        e.headers
            .insert(CE_TRANSACTION_ID.into(), "forged by the row".into());
        for format in formats {
            let h = headers_as(&e, format, "/orders");
            for [id, index, events] in names(format) {
                assert_eq!(
                    get(&h, id).as_deref(),
                    Some("18446744073709551615"),
                    "{format:?}: the relay's value wins"
                );
                assert_eq!(get(&h, index).as_deref(), Some("3"));
                assert_eq!(get(&h, events).as_deref(), Some("500"));
            }
        }
        let ce = headers_as(&e, HeaderFormat::CloudEvents, "/orders");
        assert!(ce
            .iter()
            .all(|(name, _)| !name.to_string().starts_with("Outbox-")));
        // Not placed yet, and a count not known: only what is known.
        e.transaction = Some(crate::event::TransactionPosition::unplaced(7));
        let h = headers_as(&e, HeaderFormat::Outbox, "");
        assert_eq!(get(&h, HEADER_TRANSACTION_ID).as_deref(), Some("7"));
        assert_eq!(get(&h, HEADER_TRANSACTION_INDEX), None);
        assert_eq!(get(&h, HEADER_TRANSACTION_EVENTS), None);
    }

    #[test]
    fn header_block_length_is_what_nats_writes() {
        let mut h = async_nats::HeaderMap::new();
        assert_eq!(header_block_len(&h), "NATS/1.0\r\n\r\n".len());
        h.insert("A", "bc");
        assert_eq!(header_block_len(&h), "NATS/1.0\r\nA: bc\r\n\r\n".len());
    }
}
