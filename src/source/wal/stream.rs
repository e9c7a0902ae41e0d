//! The replication stream of `--source wal`: a logical replication connection (pgoutput, through
//! `pgwire-replication`) turned into the few facts the relay needs, in commit order: an outbox
//! row was inserted (its id and aggregate), a transaction committed, the server is idle at a
//! position. The pipeline (`source::wal::pipeline`) sees these, never the protocol.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{
    Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent, SslMode, TlsConfig,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_postgres::config::Host;
use uuid::Uuid;

use super::assemble::Assembler;
use super::pgoutput::{self, Message, Relation, Value};
use super::streamed::EventColumns;
use crate::db::tls::{Mode, RootCert, TlsSettings};
use crate::error::{Error, Result};
use crate::event::AggregateKey;
use crate::event::TransactionPosition;
use crate::source::wal::control::ServerAddr;
use crate::source::wal::pipeline::{Candidate, Streamed};

pub(crate) use crate::source::wal::pipeline::Change;

/// Where `id`, `aggregate_type` and `aggregate_id` are in a relation's tuples, and the other
/// columns of an event (`None`: the publication leaves some out).
#[derive(Debug, Clone, Copy)]
struct Columns {
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

/// A running replication stream from one slot.
///
/// A task of its own (the pump) takes each message from the replication client as it arrives and
/// decodes it at once: an insert keeps its id and aggregate, and the row's bytes go, except for
/// rows up to [`content_limit`] when `content` is on: those keep the event they describe, to be
/// published without reading the row again. What waits for the relay is decoded changes
/// (`buffer_events` at most: about a hundred bytes each, plus the content kept, at most half the
/// batch byte budget in all), never larger rows: a transaction of any size is held as its
/// candidates. The rows waiting undecoded in the client are bounded by [`raw_events`] (from the
/// batch byte budget).
pub(crate) struct Stream {
    changes: mpsc::Receiver<Result<Change>>,
    /// The position the relay is done with, for the pump to hand to the client.
    confirmed: watch::Sender<u64>,
    /// Tells the pump to stop (dropped: stop as well).
    stop: Option<oneshot::Sender<()>>,
    pump: Option<JoinHandle<()>>,
}

impl Stream {
    /// Starts streaming `slot` (from its confirmed position) with `publication`. `url` is a
    /// libpq connection string (the same forms and TLS settings as every connection of the relay).
    /// `server`: where the relay's control connection is (the stream must reach the same server).
    /// `table`: the outbox table; a publication for all tables streams others too.
    /// `buffer_events`: decoded changes held for the relay; `max_bytes`: the byte budget of a
    /// batch, which bounds the rows held undecoded ([`raw_events`]) and the content kept
    /// ([`content_limit`]). `content`: keep the content of small rows (rows changed after their
    /// insert are marked, so the relay can tell when it is the row as committed).
    pub async fn start(
        url: &str,
        server: ServerAddr,
        slot: &str,
        (publication, table): (&str, OutboxTable),
        buffer_events: usize,
        (max_bytes, content): (usize, bool),
    ) -> Result<Stream> {
        let (config, tls) = crate::db::parse_with_tls(url, URL_FIELD)?;
        let target = stream_host(&config, server).await;
        let raw = raw_events(max_bytes, buffer_events);
        let config = replication_config(&config, &tls, target, (slot, publication), raw)?;
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(replication_error)?;
        client.wait_started().await.map_err(replication_error)?;
        let (changes_tx, changes) = mpsc::channel(buffer_events.max(1));
        let (confirmed, confirmed_rx) = watch::channel(0);
        let (stop, stop_rx) = oneshot::channel();
        let decoder = Decoder {
            relations: HashMap::new(),
            table,
            xid: 0,
            content_limit: content.then(|| content_limit(max_bytes, buffer_events)),
        };
        // A transaction's inserts wait for its commit, as many as the relay holds decoded.
        let assembler = Assembler::new(buffer_events);
        let pump = tokio::spawn(pump(
            client,
            (decoder, assembler),
            changes_tx,
            confirmed_rx,
            stop_rx,
        ));
        Ok(Stream {
            changes,
            confirmed,
            stop: Some(stop),
            pump: Some(pump),
        })
    }

    /// The next change, waiting for it. `None`: the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<Change>> {
        self.changes.recv().await.transpose()
    }

    /// The next change if one is there already (`None`: nothing without waiting).
    pub fn ready(&mut self) -> Result<Option<Change>> {
        match self.changes.try_recv() {
            Ok(change) => change.map(Some),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => {
                Err(Error::replication("the server ended the stream", true))
            }
        }
    }

    /// Everything up to `lsn` is done with: the slot may move past it (sent with the next
    /// standby status update).
    pub fn confirm(&self, lsn: u64) {
        self.confirmed.send_if_modified(|at| {
            let newer = lsn > *at;
            if newer {
                *at = lsn;
            }
            newer
        });
    }

    /// Ends the stream cleanly (the last confirmed position reaches the server), within a bound.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut pump) = self.pump.take() {
            // The pump bounds the client's shutdown itself; this bounds the pump.
            if tokio::time::timeout(STOP_TIMEOUT + Duration::from_secs(1), &mut pump)
                .await
                .is_err()
            {
                pump.abort();
            }
        }
    }
}

/// How long the client may take to end the stream cleanly.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The capacity of the replication client's channel: the messages it reads ahead of the pump,
/// each with its whole row (the client bounds its channel by count only). Derived from the byte
/// budget of a batch: rows of [`RAW_ROW_BYTES`] fill at most a quarter of it, 8 at the default
/// 32 MiB; at least 1, at most `buffer_events`. Besides these, the client holds the message it is
/// handing over and the one it reads. The channel is empty while the pump keeps up: it fills only
/// once `buffer_events` decoded changes wait for the relay.
fn raw_events(max_bytes: usize, buffer_events: usize) -> usize {
    (max_bytes / (4 * RAW_ROW_BYTES)).clamp(1, buffer_events.max(1))
}

/// The largest streamed row whose content the stream keeps: the decoded changes waiting for the
/// relay then hold at most half the batch byte budget (8 KiB a row at the default 32 MiB and batch
/// size 1000). Larger rows are read from the table.
fn content_limit(max_bytes: usize, buffer_events: usize) -> usize {
    max_bytes / (2 * buffer_events.max(1))
}

/// The row size [`raw_events`] plans for: 1 MiB, NATS's default `max_payload` (the largest event
/// it takes by default).
const RAW_ROW_BYTES: usize = 1024 * 1024;

/// Takes the client's messages as they come, decodes them and hands the changes to the
/// [`Stream`] (waiting while it holds `buffer_events`); hands the confirmed position to the client.
/// Ends with the stream (after an error, sent on), when told to stop, or when the stream is gone.
async fn pump(
    mut client: ReplicationClient,
    (mut decoder, mut assembler): (Decoder, Assembler),
    changes: mpsc::Sender<Result<Change>>,
    mut confirmed: watch::Receiver<u64>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut ready = Vec::new();
    loop {
        // A confirmation may cut a receive short: harmless while the worker runs (a channel
        // receive). Once the worker ended, the receive also takes its outcome, which can be taken
        // once: it is not cut short then.
        let event = if client.is_running() {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                Ok(()) = confirmed.changed() => {
                    client.update_applied_lsn(Lsn::from_u64(*confirmed.borrow_and_update()));
                    continue;
                }
                event = client.recv() => event,
            }
        } else {
            client.recv().await
        };
        let change = match event {
            Ok(None) => return,
            Ok(Some(event)) => match decoder.change(event) {
                Ok(None) => continue,
                Ok(Some(change)) => {
                    assembler.advance(change, &mut ready);
                    if ready.is_empty() {
                        continue;
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            },
            // After the worker ended (its outcome possibly lost to a receive cut short just as
            // it ended): the connection ended, and a new one heals it.
            Err(e @ PgWireError::Internal(_)) if !client.is_running() => {
                Err(Error::replication("replication connection ended", true).caused_by(e))
            }
            Err(e) => Err(replication_error(e)),
        };
        let failed = change.is_err();
        // The changes the assembler let go, in order; or the error alone (what it holds is
        // carried again by the next stream, from the last confirmed position).
        let mut sending: Vec<Result<Change>> = match change {
            Ok(()) => ready.drain(..).map(Ok).collect(),
            Err(e) => vec![Err(e)],
        };
        for change in sending.drain(..) {
            let permit = loop {
                tokio::select! {
                    biased;
                    _ = &mut stop => {
                        shut_down(client, &confirmed).await;
                        return;
                    }
                    Ok(()) = confirmed.changed() => {
                        client.update_applied_lsn(Lsn::from_u64(*confirmed.borrow_and_update()));
                    }
                    permit = changes.reserve() => match permit {
                        Ok(permit) => break permit,
                        Err(_) => return, // the stream is gone
                    },
                }
            };
            permit.send(change);
        }
        if failed {
            return;
        }
    }
    shut_down(client, &confirmed).await;
}

/// Hands the last confirmed position to the client and ends its stream, within [`STOP_TIMEOUT`].
async fn shut_down(mut client: ReplicationClient, confirmed: &watch::Receiver<u64>) {
    client.update_applied_lsn(Lsn::from_u64(*confirmed.borrow()));
    if tokio::time::timeout(STOP_TIMEOUT, client.shutdown())
        .await
        .is_err()
    {
        client.abort();
    }
}

/// Turns the client's events into changes.
struct Decoder {
    /// `None`: a table that is not the outbox's (its rows are not events).
    relations: HashMap<u32, Option<Columns>>,
    table: OutboxTable,
    /// The transaction whose changes come now (from its Begin).
    xid: u32,
    /// The largest row whose content is kept (`None`: none is).
    content_limit: Option<usize>,
}

impl Decoder {
    fn change(&mut self, event: ReplicationEvent) -> Result<Option<Change>> {
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

/// The flag whose URL the stream connects with.
const URL_FIELD: &str = "listen_database_url";

/// Which of the URL's hosts the stream connects to: the one that is `server`, where the control
/// connection is. A multi-host URL's hosts are tried in order (with `target_session_attrs`), so
/// the control connection may have reached a later one: the leadership and the slot live there,
/// and the first host may be down or a standby. One host, or none found to be that server (a
/// proxy or NAT between): the first.
async fn stream_host(config: &tokio_postgres::Config, server: ServerAddr) -> Target {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    // libpq: one port applies to every host; otherwise one each.
    let port_of = |i: usize| match ports {
        [one] => *one,
        _ => ports.get(i).copied().unwrap_or(5432),
    };
    // libpq: `hostaddr` is where to connect (no name lookup); `host` then only names the server
    // for TLS.
    let target = |i: usize| {
        let name = match hosts.get(i) {
            Some(Host::Tcp(host)) => Some(host.clone()),
            #[cfg(unix)]
            Some(Host::Unix(path)) => Some(path.to_string_lossy().into_owned()),
            None => None,
        };
        match addrs.get(i) {
            Some(addr) => Target {
                addr: addr.to_string(),
                port: port_of(i),
                tls_name: name,
            },
            None => Target {
                addr: name.unwrap_or_else(|| "localhost".to_string()),
                port: port_of(i),
                tls_name: None,
            },
        }
    };
    let count = hosts.len().max(addrs.len());
    if count < 2 {
        return target(0);
    }
    for i in 0..count.min(MAX_HOSTS) {
        let port = port_of(i);
        if server.port.is_some_and(|p| p != port) {
            continue;
        }
        let reached = match (hosts.get(i), server.ip) {
            #[cfg(unix)]
            (Some(Host::Unix(_)), ip) => ip.is_none(),
            (_, None) => false,
            (host, Some(ip)) => match (addrs.get(i), host) {
                (Some(addr), _) => addr.to_canonical() == ip.to_canonical(),
                (None, Some(Host::Tcp(name))) => resolves_to(name, port, ip).await,
                _ => false,
            },
        };
        if reached {
            return target(i);
        }
    }
    tracing::warn!(
        server_addr = ?server.ip,
        server_port = ?server.port,
        "none of the URL's hosts is the server the control connection reached; streaming from the first"
    );
    target(0)
}

/// Where the stream connects.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// A host name, a socket directory, or the address `hostaddr` gave.
    addr: String,
    port: u16,
    /// With `hostaddr`: the host's name, which TLS checks instead of the address.
    tls_name: Option<String>,
}

/// Hosts of a URL looked at (each may take a name lookup).
const MAX_HOSTS: usize = 16;

/// Whether `name` resolves to `ip` (bounded: a lookup that hangs counts as no).
async fn resolves_to(name: &str, port: u16, ip: std::net::IpAddr) -> bool {
    let lookup = tokio::net::lookup_host((name, port));
    match tokio::time::timeout(Duration::from_secs(5), lookup).await {
        Ok(Ok(mut found)) => found.any(|a| a.ip().to_canonical() == ip.to_canonical()),
        _ => false,
    }
}

/// The replication connection's settings from the relay's parsed connection string, to `target`.
fn replication_config(
    config: &tokio_postgres::Config,
    tls: &TlsSettings,
    target: Target,
    (slot, publication): (&str, &str),
    raw_events: usize,
) -> Result<ReplicationConfig> {
    let field = URL_FIELD;
    let user = config
        .get_user()
        .ok_or_else(|| Error::config(field, "names no user"))?
        .to_string();
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or(&user).to_string();
    let mut tls = tls_config(tls);
    if let Some(name) = target.tls_name {
        tls = tls.with_sni_hostname(name);
    }
    let mut replication =
        ReplicationConfig::new(target.addr, user, password, database, slot, publication)
            .with_port(target.port)
            .with_tls(tls)
            .with_application_name("outbox-relay-wal")
            // The confirmed position reaches the server within a second (the lag gauge, and the WAL
            // it can recycle); idle, a keepalive at least every 10 s.
            .with_status_interval(Duration::from_secs(1))
            .with_wakeup_interval(Duration::from_secs(10))
            .with_buffer_size(raw_events);
    if let Some(options) = config.get_options() {
        replication = replication.with_options(options);
    }
    Ok(replication)
}

/// The relay's TLS settings (sslmode, sslrootcert, sslcert, sslkey, and their variables) for the
/// replication connection.
fn tls_config(tls: &TlsSettings) -> TlsConfig {
    let root = match &tls.root_cert {
        Some(RootCert::File(path)) => Some(path.clone()),
        _ => None,
    };
    let mut config = match tls.mode {
        Mode::Disable => TlsConfig::disabled(),
        Mode::Prefer => TlsConfig {
            mode: SslMode::Prefer,
            ..TlsConfig::default()
        },
        // libpq: `require` with a root certificate verifies the chain.
        Mode::Require if root.is_some() => TlsConfig::verify_ca(root),
        Mode::Require => TlsConfig::require(),
        Mode::VerifyCa => TlsConfig::verify_ca(root),
        Mode::VerifyFull => TlsConfig::verify_full(root),
    };
    if let Some(cert) = &tls.client_cert {
        config = config.with_client_cert(cert.cert.clone(), cert.key.clone());
    }
    config
}

/// The replication client's errors as the relay's: I/O (the connection) heals by reconnecting;
/// credentials, TLS and the server's refusals (no slot, no privilege) are reported as they are,
/// and the relay checks the slot again before it retries.
fn replication_error(e: PgWireError) -> Error {
    let retryable = e.is_transient() || matches!(e, PgWireError::Server(_));
    let text = e.to_string();
    // Privileges and pg_hba.conf: 42501 insufficient_privilege, 28000 invalid_authorization.
    let refused = ["SQLSTATE 42501", "SQLSTATE 28000", "SQLSTATE 28P01"]
        .iter()
        .any(|code| text.contains(code));
    let fatal = e.is_auth() || e.is_tls() || refused;
    Error::replication("replication connection", retryable && !fatal).caused_by(e)
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn the_rows_read_ahead_take_a_quarter_of_the_byte_budget() {
        const MIB: usize = 1024 * 1024;
        assert_eq!(raw_events(32 * MIB, 2000), 8);
        assert_eq!(raw_events(64 * MIB, 2000), 16);
        // At least one, at most what the relay holds decoded.
        assert_eq!(raw_events(1, 2000), 1);
        assert_eq!(raw_events(4 * MIB - 1, 2000), 1);
        assert_eq!(raw_events(1024 * MIB, 20), 20);
        assert_eq!(raw_events(32 * MIB, 0), 1);
    }

    async fn target_for(url: &str, ip: Option<&str>, port: Option<u16>) -> Target {
        let config: tokio_postgres::Config = url.parse().expect("a connection string");
        let server = ServerAddr {
            ip: ip.map(|a| a.parse().expect("an address")),
            port,
        };
        stream_host(&config, server).await
    }

    #[tokio::test]
    async fn the_stream_goes_to_the_host_the_control_connection_reached() {
        // (URL, the server's address and port as the control connection saw them; expected
        // address to connect to, port, and the name TLS checks when it differs).
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<u16>,
            (&'static str, u16, Option<&'static str>),
        );
        let cases: &[Case] = &[
            // The second host, by address and port.
            (
                "host=127.0.0.2,127.0.0.1 port=6001,6002 user=u",
                Some("127.0.0.1"),
                Some(6002),
                ("127.0.0.1", 6002, None),
            ),
            // One port for every host; the address may come back IPv4-mapped.
            (
                "host=127.0.0.2,127.0.0.1 port=5432 user=u",
                Some("::ffff:127.0.0.1"),
                Some(5432),
                ("127.0.0.1", 5432, None),
            ),
            // hostaddr is where to connect (no lookup of the name); the name is what TLS checks.
            (
                "host=a.invalid,b.invalid hostaddr=10.1.1.1,127.0.0.1 port=5432 user=u",
                Some("127.0.0.1"),
                Some(5432),
                ("127.0.0.1", 5432, Some("b.invalid")),
            ),
            // A Unix socket: no address.
            (
                "host=127.0.0.2,/run/postgresql port=5432 user=u",
                None,
                None,
                ("/run/postgresql", 5432, None),
            ),
            // None of the hosts is the server (a proxy between): the first.
            (
                "host=127.0.0.2,127.0.0.3 port=5432 user=u",
                Some("10.9.9.9"),
                Some(5432),
                ("127.0.0.2", 5432, None),
            ),
            // One host: as written, whatever the server says.
            (
                "postgres://u@db.example:6000/x",
                Some("10.9.9.9"),
                Some(5432),
                ("db.example", 6000, None),
            ),
            (
                "hostaddr=127.0.0.5 port=5433 user=u",
                None,
                None,
                ("127.0.0.5", 5433, None),
            ),
            (
                "host=db.invalid hostaddr=127.0.0.5 port=5433 user=u",
                None,
                None,
                ("127.0.0.5", 5433, Some("db.invalid")),
            ),
        ];
        for (url, ip, port, (addr, expected_port, tls_name)) in cases {
            let expected = Target {
                addr: addr.to_string(),
                port: *expected_port,
                tls_name: tls_name.map(str::to_string),
            };
            assert_eq!(target_for(url, *ip, *port).await, expected, "{url}");
        }
    }
}
