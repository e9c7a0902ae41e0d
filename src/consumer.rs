//! Consumer-side helpers: idempotent handling of at-least-once deliveries (one event, or a
//! database transaction's events together), and reading what the relay's headers say in either
//! header format, the event's transaction included ([`transaction`], [`Transactions`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::error::Result;
use crate::event::TransactionPosition;
use crate::header::{
    CE_ID, CE_SUBJECT, CE_TRANSACTION_EVENTS, CE_TRANSACTION_ID, CE_TRANSACTION_INDEX, CE_TYPE,
    HEADER_AGGREGATE_ID, HEADER_EVENT_ID, HEADER_EVENT_TYPE, HEADER_TRANSACTION_EVENTS,
    HEADER_TRANSACTION_ID, HEADER_TRANSACTION_INDEX,
};

const PROCESS_ONCE: &str = include_str!("../sql/queries/consumer/process_once.sql");
const PROCESS_MANY_ONCE: &str = include_str!("../sql/queries/consumer/process_many_once.sql");

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

/// [`process_once`] for the events of one database transaction, handled together in the caller's
/// transaction: records every id in `processed_events` and returns those delivered for the first
/// time (the others were handled before). One statement whatever the number of events.
pub async fn process_many_once<C: GenericClient + Sync>(
    client: &C,
    event_ids: &[Uuid],
) -> Result<HashSet<Uuid>> {
    let rows = client
        .query_typed(PROCESS_MANY_ONCE, &[(&event_ids, Type::UUID_ARRAY)])
        .await?;
    rows.iter()
        .map(|row| Ok(row.try_get::<_, Uuid>("event_id")?))
        .collect()
}

/// Where a message's event stands in the database transaction that wrote it
/// (`Outbox-Transaction-*`, else CloudEvents' `ce-outboxtx*`); `None` for a message without a
/// transaction id (an event written before schema version 9, or not by the relay). `index` is 0
/// and `events` `None` where the message does not say them.
///
/// ```
/// use outbox_relay::consumer;
///
/// let mut headers = async_nats::HeaderMap::new();
/// headers.insert("Outbox-Transaction-Id", "7812");
/// headers.insert("Outbox-Transaction-Index", "2");
/// headers.insert("Outbox-Transaction-Events", "3");
/// let t = consumer::transaction(Some(&headers)).expect("a transaction");
/// assert_eq!((t.id, t.index, t.events), (7812, 2, Some(3)));
/// ```
pub fn transaction(headers: Option<&async_nats::HeaderMap>) -> Option<TransactionPosition> {
    let number = |names: &[&str]| first_of(headers, names).and_then(|v| v.parse::<u64>().ok());
    Some(TransactionPosition {
        id: number(&[HEADER_TRANSACTION_ID, CE_TRANSACTION_ID])?,
        index: number(&[HEADER_TRANSACTION_INDEX, CE_TRANSACTION_INDEX]).unwrap_or(0),
        events: number(&[HEADER_TRANSACTION_EVENTS, CE_TRANSACTION_EVENTS]),
    })
}

/// Collects the messages of database transactions until each is whole, to act on a transaction
/// at once (see `examples/consumer.rs --transactions`). Holds at most `limit` messages: a
/// consumer must leave them unacknowledged meanwhile, so its `max_ack_pending` must be above the
/// largest transaction it waits for (and its `ack_wait` longer than the wait). Pure: no I/O.
pub struct Transactions<T> {
    open: HashMap<u64, Open<T>>,
    buffered: usize,
    limit: usize,
}

struct Open<T> {
    events: Option<u64>,
    items: BTreeMap<u64, T>,
}

/// What [`Transactions::add`] did with a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Collected<T> {
    /// Its transaction is whole: every message of it, in the order its events were written.
    Whole(Vec<T>),
    /// Held until the rest of its transaction arrives.
    Held,
    /// The same event is held already (a redelivery): this copy is the caller's to settle.
    Duplicate(T),
    /// Not held: its position says nothing usable (no index), or `limit` messages are held. The
    /// caller handles it alone, or naks it to have it again later.
    Refused(T),
}

impl<T> Transactions<T> {
    /// Holds at most `limit` messages.
    pub fn new(limit: usize) -> Transactions<T> {
        Transactions {
            open: HashMap::new(),
            buffered: 0,
            limit,
        }
    }

    /// Adds `item`, the message of the event at `position`.
    pub fn add(&mut self, position: TransactionPosition, item: T) -> Collected<T> {
        if position.index == 0 || position.events.is_some_and(|n| position.index > n) {
            return Collected::Refused(item);
        }
        let open = self.open.get(&position.id);
        if open.is_some_and(|o| o.items.contains_key(&position.index)) {
            return Collected::Duplicate(item);
        }
        let events = position.events.or_else(|| open.and_then(|o| o.events));
        let held_here = open.map_or(0, |o| o.items.len()) as u64;
        let whole_now = events == Some(held_here + 1);
        if !whole_now && self.buffered >= self.limit {
            return Collected::Refused(item);
        }
        let open = self.open.entry(position.id).or_insert_with(|| Open {
            events: None,
            items: BTreeMap::new(),
        });
        open.events = events;
        open.items.insert(position.index, item);
        self.buffered += 1;
        if whole_now {
            let whole = self.take(position.id);
            return Collected::Whole(whole);
        }
        Collected::Held
    }

    /// Gives up waiting for transaction `id` (an event of it dead-lettered, say): its messages
    /// held so far, in order.
    pub fn take(&mut self, id: u64) -> Vec<T> {
        let items: Vec<T> = self
            .open
            .remove(&id)
            .map(|o| o.items.into_values().collect())
            .unwrap_or_default();
        self.buffered -= items.len();
        items
    }

    /// The transactions waiting for more of their events.
    pub fn waiting(&self) -> impl Iterator<Item = u64> + '_ {
        self.open.keys().copied()
    }

    /// Messages buffered until their transaction is complete (the public name stays `held`).
    pub fn held(&self) -> usize {
        self.buffered
    }
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

    fn at(id: u64, index: u64, events: Option<u64>) -> TransactionPosition {
        TransactionPosition { id, index, events }
    }

    #[test]
    fn transactions_are_whole_in_any_arrival_order_once_each() {
        let mut t = Transactions::new(100);
        assert_eq!(t.add(at(1, 1, Some(1)), "a"), Collected::Whole(vec!["a"]));
        assert_eq!(t.add(at(2, 3, Some(3)), "c"), Collected::Held);
        assert_eq!(t.add(at(3, 1, Some(2)), "x"), Collected::Held);
        assert_eq!(t.add(at(2, 1, Some(3)), "a"), Collected::Held);
        assert_eq!(
            t.add(at(2, 3, Some(3)), "c again"),
            Collected::Duplicate("c again")
        );
        assert_eq!(t.held(), 3);
        assert_eq!(
            t.add(at(2, 2, Some(3)), "b"),
            Collected::Whole(vec!["a", "b", "c"])
        );
        assert_eq!(t.held(), 1);
        assert_eq!(t.waiting().collect::<Vec<_>>(), vec![3]);
        assert_eq!(t.take(3), vec!["x"]);
        assert_eq!(t.held(), 0);
    }

    #[test]
    fn a_count_from_any_event_of_the_transaction_serves() {
        let mut t = Transactions::new(100);
        assert_eq!(t.add(at(5, 2, None), 2), Collected::Held);
        assert_eq!(t.add(at(5, 3, Some(3)), 3), Collected::Held);
        assert_eq!(t.add(at(5, 1, None), 1), Collected::Whole(vec![1, 2, 3]));
    }

    #[test]
    fn bounded_and_refusing_what_it_cannot_place() {
        let mut t = Transactions::new(2);
        assert_eq!(
            t.add(at(1, 0, Some(2)), "no index"),
            Collected::Refused("no index")
        );
        assert_eq!(
            t.add(at(1, 3, Some(2)), "past the count"),
            Collected::Refused("past the count")
        );
        assert_eq!(t.add(at(1, 1, Some(3)), "a"), Collected::Held);
        assert_eq!(t.add(at(2, 1, Some(2)), "x"), Collected::Held);
        assert_eq!(t.add(at(3, 1, Some(2)), "full"), Collected::Refused("full"));
        // The message that completes a transaction is taken even when full.
        assert_eq!(
            t.add(at(2, 2, Some(2)), "y"),
            Collected::Whole(vec!["x", "y"])
        );
    }

    #[test]
    fn reads_the_transaction_in_either_format() {
        let mut event = crate::OutboxEvent::sample("42");
        event.transaction = Some(at(99, 2, Some(4)));
        for format in [
            crate::config::HeaderFormat::Outbox,
            crate::config::HeaderFormat::CloudEvents,
            crate::config::HeaderFormat::Both,
        ] {
            let h = crate::wire::headers_as(&event, format, "/s");
            assert_eq!(transaction(Some(&h)), event.transaction, "{format:?}");
        }
        event.transaction = None;
        let h = crate::wire::headers_as(&event, crate::config::HeaderFormat::Outbox, "/s");
        assert_eq!(transaction(Some(&h)), None);
        assert_eq!(transaction(None), None);
    }
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
            transaction: None,
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
