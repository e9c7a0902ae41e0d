//! The pump: the task that takes the client's messages as they come, decodes them and hands the
//! changes on, and hands the confirmed position to the client.

use pgwire_replication::{Lsn, PgWireError, ReplicationClient};
use tokio::sync::{mpsc, oneshot, watch};

use super::super::assemble::Assembler;
use super::connect::replication_error;
use super::decode::Decoder;
use super::{Change, STOP_TIMEOUT};
use crate::error::{Error, Result};

/// Takes the client's messages as they come, decodes them and hands the changes to the
/// [`Stream`] (waiting while it holds `buffer_events`); hands the confirmed position to the client.
/// Ends with the stream (after an error, sent on), when told to stop, or when the stream is gone.
pub(super) async fn pump(
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
