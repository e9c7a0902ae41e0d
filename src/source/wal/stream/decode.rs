//! The replication client's events decoded as they arrive into the pipeline's changes: the outbox
//! table told from others, an insert's id, aggregate and transaction, its content kept when small.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use pgwire_replication::ReplicationEvent;
use uuid::Uuid;

use super::super::pgoutput::{self, Message, Relation, Value};
use super::super::streamed::EventColumns;
use super::Change;
use crate::error::{Error, Result};
use crate::event::AggregateKey;
use crate::event::TransactionPosition;
use crate::source::wal::pipeline::{Candidate, Streamed};

/// Where `id`, `aggregate_type` and `aggregate_id` are in a relation's tuples, and the other
/// columns of an event (`None`: the publication leaves some out).
#[derive(Debug, Clone, Copy)]
pub(super) struct Columns {
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    /// `txid` (schema version 9): the writing transaction's 64-bit id.
    txid: Option<usize>,
    event: Option<EventColumns>,
}

/// The outbox table's name (in its schema).
const TABLE_NAME: &str = "outbox_events";

/// The outbox table as the stream tells its inserts from other tables' (a publication for all
/// tables streams every table): by the relation id the leader read before the stream started. A
/// relation of the outbox table's schema and name with another id is a table of that name that
/// replaced it since (dropped and created again: the stream ends, and starts again with the id
/// read anew), or one it replaced (its changes come from before the slot's position moved past
/// them, and its rows went with it): those are `retired` and skipped.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutboxTable {
    /// `None`: every table streamed is taken for it.
    pub oid: Option<u32>,
    pub schema: String,
    /// Relation ids of tables that had the outbox table's name and are not it now.
    retired: HashSet<u32>,
    /// The relation id a stream ended on (0: none), for the leader to look at ([`Self::now`]).
    met: Arc<AtomicU32>,
}

impl OutboxTable {
    /// The table as the leader reads it before a stream starts. The relation a stream ended on,
    /// when it is not this table, and the table streamed before, when it is not this one, are
    /// retired: tables of the outbox's name dropped (or renamed away) since their changes.
    pub fn now(&mut self, oid: Option<u32>, schema: &str) {
        let met = self.met.swap(0, Ordering::Relaxed);
        for old in [self.oid, (met != 0).then_some(met)].into_iter().flatten() {
            if Some(old) != oid && self.retired.insert(old) {
                tracing::info!(
                    relation = old,
                    table = %format!("{schema}.{TABLE_NAME}"),
                    "a table of the outbox table's name that is gone: the stream skips its changes"
                );
            }
        }
        if let Some(oid) = oid {
            self.retired.remove(&oid);
        }
        self.oid = oid;
        self.schema = schema.to_string();
    }

    /// `relation` is a table of the outbox table's schema and name, with another id than the one
    /// streamed and not retired.
    fn replaced_by(&self, relation: &Relation) -> bool {
        self.oid.is_some_and(|oid| oid != relation.id)
            && relation.name == TABLE_NAME
            && relation.namespace == self.schema
            && !self.retired.contains(&relation.id)
    }
}

/// Turns the client's events into changes.
pub(super) struct Decoder {
    /// `None`: a table that is not the outbox's (its rows are not events).
    pub(super) relations: HashMap<u32, Option<Columns>>,
    pub(super) table: OutboxTable,
    /// The transaction whose changes come now (from its Begin).
    pub(super) xid: u32,
    /// The largest row whose content is kept (`None`: none is).
    pub(super) content_limit: Option<usize>,
}

impl Decoder {
    pub(super) fn change(&mut self, event: ReplicationEvent) -> Result<Option<Change>> {
        Ok(match event {
            ReplicationEvent::Begin { xid, .. } => {
                self.xid = xid;
                Some(Change::Begin)
            }
            ReplicationEvent::Commit { end_lsn, .. } => Some(Change::Commit {
                end: end_lsn.as_u64(),
            }),
            ReplicationEvent::KeepAlive { wal_end, .. } => Some(Change::Idle {
                wal_end: wal_end.as_u64(),
            }),
            ReplicationEvent::XLogData { data, .. } => {
                let size = data.len();
                match pgoutput::decode(&data).map_err(|e| {
                    Error::replication("in the replication stream", false).caused_by(e)
                })? {
                    Message::Relation(relation) => {
                        if self.table.replaced_by(&relation) {
                            // Its inserts are events the relay would otherwise skip while the
                            // slot moves past them. Nothing of this transaction was confirmed
                            // (its Begin came first): a new stream carries it again.
                            self.table.met.store(relation.id, Ordering::Relaxed);
                            return Err(Error::replication(
                                format!(
                                    "the stream carries a table named {}.{} as relation {}, the relay streamed relation {}: the outbox table was dropped and created again; streaming again with the table as it is now",
                                    relation.namespace,
                                    relation.name,
                                    relation.id,
                                    self.table.oid.unwrap_or_default()
                                ),
                                true,
                            ));
                        }
                        let columns = match self.table.oid {
                            Some(table) if table != relation.id => None,
                            _ => Some(columns(&relation)?),
                        };
                        self.relations.insert(relation.id, columns);
                        None
                    }
                    Message::Insert { relation, values } => {
                        let columns = self.relations.get(&relation).ok_or_else(|| {
                            Error::replication(
                                format!("insert into relation {relation} before its description"),
                                false,
                            )
                        })?;
                        match columns {
                            Some(columns) => {
                                let mut c = candidate(columns, &values, self.xid, size)?;
                                if self.content_limit.is_some_and(|limit| size <= limit) {
                                    c.content = columns
                                        .event
                                        .and_then(|e| e.event(&values, c.id))
                                        .map(|e| Streamed(Arc::new(e)));
                                }
                                Some(Change::Insert(c))
                            }
                            None => None,
                        }
                    }
                    Message::Other(_) => None,
                }
            }
            ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => None,
        })
    }
}

fn columns(relation: &Relation) -> Result<Columns> {
    let find = |name: &str| {
        relation.column(name).ok_or_else(|| {
            Error::replication(
                format!(
                    "the publication streams {}.{} without its column {name} (a column list): run `outbox-relay migrate --wal`",
                    relation.namespace, relation.name
                ),
                false,
            )
        })
    };
    Ok(Columns {
        id: find("id")?,
        aggregate_type: find("aggregate_type")?,
        aggregate_id: find("aggregate_id")?,
        txid: relation.column("txid"),
        event: EventColumns::of(relation),
    })
}

/// The row's id and aggregate from its text values. The id is a uuid column, so it always parses;
/// the aggregate is taken as PostgreSQL sent it (lossily for bytes that are not UTF-8, which only a
/// SQL_ASCII database holds: the same bytes always give the same key).
fn candidate(columns: &Columns, values: &[Value], xid: u32, size: usize) -> Result<Candidate> {
    let text = |at: usize, name: &str| match values.get(at) {
        Some(Value::Text(bytes)) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Some(Value::Null) => Ok(String::new()),
        _ => Err(Error::replication(
            format!("an inserted row has no text value for {name}"),
            false,
        )),
    };
    let id = match values.get(columns.id) {
        Some(Value::Text(bytes)) => Uuid::try_parse_ascii(bytes).map_err(|e| {
            let id = String::from_utf8_lossy(bytes);
            Error::replication(format!("id {id:?} is not a uuid"), false).caused_by(e)
        })?,
        _ => {
            return Err(Error::replication(
                "an inserted row has no text value for id",
                false,
            ))
        }
    };
    let aggregate: AggregateKey = (
        text(columns.aggregate_type, "aggregate_type")?,
        text(columns.aggregate_id, "aggregate_id")?,
    );
    // xid8 as text: an unsigned 64-bit number. NULL or absent: no transaction headers.
    let transaction = match columns.txid.and_then(|at| values.get(at)) {
        Some(Value::Text(bytes)) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
            .map(|id| TransactionPosition {
                id,
                index: 0,
                events: None,
            }),
        _ => None,
    };
    Ok(Candidate {
        transaction,
        id,
        aggregate,
        xid,
        size,
        content: None,
    })
}

#[cfg(test)]
mod tests {
    use pgwire_replication::Lsn;

    use super::*;

    #[test]
    fn small_inserts_keep_their_content() {
        use bytes::Bytes;
        const COLUMNS: [&str; 12] = crate::source::wal::streamed::TEST_COLUMNS;
        let xlog = |data: Vec<u8>| ReplicationEvent::XLogData {
            wal_start: Lsn::from_u64(0),
            wal_end: Lsn::from_u64(0),
            server_time_micros: 0,
            data: Bytes::from(data),
        };
        let mut relation = vec![b'R'];
        relation.extend(7u32.to_be_bytes());
        relation.extend(b"public\0outbox_events\0");
        relation.push(b'd');
        relation.extend(12u16.to_be_bytes());
        for name in COLUMNS {
            relation.push(0);
            relation.extend(name.as_bytes());
            relation.push(0);
            relation.extend(25u32.to_be_bytes());
            relation.extend(u32::MAX.to_be_bytes());
        }
        // An insert of row `n` with a payload of `payload_bytes`.
        let insert = |n: u8, payload_bytes: usize| {
            let id = Uuid::from_bytes([n; 16]).to_string();
            let payload = format!("\"{}\"", "x".repeat(payload_bytes));
            let values: [Option<&str>; 12] = [
                Some(&id),
                Some("order"),
                Some("a"),
                Some("order.created"),
                Some(&payload),
                Some("0"),
                Some("2026-12-05 11:44:54.123456+00"),
                None,
                Some("1"),
                None,
                None,
                None,
            ];
            let mut b = vec![b'I'];
            b.extend(7u32.to_be_bytes());
            b.push(b'N');
            b.extend(12u16.to_be_bytes());
            for v in values {
                match v {
                    None => b.push(b'n'),
                    Some(text) => {
                        b.push(b't');
                        b.extend(u32::try_from(text.len()).expect("short").to_be_bytes());
                        b.extend(text.as_bytes());
                    }
                }
            }
            xlog(b)
        };
        let begin = ReplicationEvent::Begin {
            final_lsn: Lsn::from_u64(0),
            xid: 5,
            commit_time_micros: 0,
        };
        for (limit, payload, kept) in [
            (Some(1000), 10, true),
            (Some(1000), 2000, false),
            (None, 10, false),
        ] {
            let mut d = Decoder {
                relations: HashMap::new(),
                table: OutboxTable {
                    oid: Some(7),
                    schema: "public".into(),
                    ..OutboxTable::default()
                },
                xid: 0,
                content_limit: limit,
            };
            assert!(d
                .change(xlog(relation.clone()))
                .expect("relation")
                .is_none());
            assert_eq!(d.change(begin.clone()).expect("begin"), Some(Change::Begin));
            let Some(Change::Insert(c)) = d.change(insert(1, payload)).expect("insert") else {
                panic!("an insert")
            };
            assert_eq!(c.xid, 5);
            assert_eq!(c.content.is_some(), kept, "{limit:?} {payload}");
            if let Some(content) = c.content {
                assert_eq!((content.0.id, content.0.seq), (c.id, 1));
                assert_eq!(content.0.event_type, "order.created");
                assert_eq!(content.0.payload.len(), payload + 2);
            }
        }
    }

    /// A pgoutput Relation message: `id`, `schema`.`name`, the columns the relay reads.
    fn relation_message(id: u32, schema: &str, name: &str) -> ReplicationEvent {
        let mut b = vec![b'R'];
        b.extend(id.to_be_bytes());
        for s in [schema, name] {
            b.extend(s.as_bytes());
            b.push(0);
        }
        b.push(b'd');
        let columns = ["id", "aggregate_type", "aggregate_id"];
        b.extend(u16::try_from(columns.len()).expect("few").to_be_bytes());
        for column in columns {
            b.push(0);
            b.extend(column.as_bytes());
            b.push(0);
            b.extend(25u32.to_be_bytes());
            b.extend(u32::MAX.to_be_bytes());
        }
        ReplicationEvent::XLogData {
            wal_start: Lsn::from_u64(0),
            wal_end: Lsn::from_u64(0),
            server_time_micros: 0,
            data: bytes::Bytes::from(b),
        }
    }

    #[test]
    fn a_table_of_the_outbox_tables_name_with_another_id_ends_the_stream_or_is_skipped() {
        let mut table = OutboxTable::default();
        table.now(Some(7), "public");
        let decoder = |table: &OutboxTable| Decoder {
            relations: HashMap::new(),
            table: table.clone(),
            xid: 0,
            content_limit: None,
        };
        let mut d = decoder(&table);
        // Other tables, and the outbox table of another schema, are skipped; the table is read.
        for (id, schema, name) in [(8, "public", "orders"), (9, "app", "outbox_events")] {
            assert!(d
                .change(relation_message(id, schema, name))
                .expect("skipped")
                .is_none());
            assert_eq!(d.relations.get(&id).map(Option::is_some), Some(false));
        }
        assert!(d
            .change(relation_message(7, "public", "outbox_events"))
            .expect("the table")
            .is_none());
        assert_eq!(d.relations.get(&7).map(Option::is_some), Some(true));
        // Created again: the stream ends, retryable, and the leader learns the id.
        let e = d
            .change(relation_message(12, "public", "outbox_events"))
            .expect_err("the table was created again");
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains("dropped and created again"), "{e}");
        // The leader reads the new table: the stream takes it, and skips the old one (its
        // changes from before the drop, when the stream starts from before it).
        table.now(Some(12), "public");
        let mut d = decoder(&table);
        assert!(d
            .change(relation_message(7, "public", "outbox_events"))
            .expect("retired")
            .is_none());
        assert_eq!(d.relations.get(&7).map(Option::is_some), Some(false));
        assert!(d
            .change(relation_message(12, "public", "outbox_events"))
            .expect("the table")
            .is_none());
        assert_eq!(d.relations.get(&12).map(Option::is_some), Some(true));
        // A stream that ended on a table gone again by the time the leader looks (13): retired.
        let e = d.change(relation_message(13, "public", "outbox_events"));
        assert!(e.is_err());
        table.now(Some(12), "public");
        let mut d = decoder(&table);
        assert!(d
            .change(relation_message(13, "public", "outbox_events"))
            .expect("retired")
            .is_none());
    }
}
