//! The replication stream of `--source wal`: a logical replication connection (pgoutput, through
//! `pgwire-replication`) turned into the few facts the relay needs, in commit order: an outbox
//! row was inserted (its id and aggregate), a transaction committed, the server is idle at a
//! position. The pipeline (`source::wal::pipeline`) sees these, never the protocol.

mod connect;
mod decode;
mod pump;

use std::collections::HashMap;
use std::time::Duration;

use pgwire_replication::ReplicationClient;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::assemble::Assembler;
use crate::error::{Error, Result};
use crate::source::wal::control::ServerAddr;
use connect::{replication_config, replication_error, stream_host, URL_FIELD};
use decode::Decoder;
pub(crate) use decode::OutboxTable;
use pump::pump;

pub(crate) use crate::source::wal::pipeline::Change;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
