//! The LISTEN connection: wakes the batch processor on the outbox's notifications, reconnects
//! with backoff, and "arms" the writers' trigger while the relay is idle (see
//! `outbox_events_notify` in sql/migrations). The processor and the listener talk through
//! [`Signals`]; the arming rules are its state machine ([`crate::source::table::signals::Arming`]).

use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use futures::StreamExt;
use tokio_postgres::{AsyncMessage, Client, Statement};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::source::table::signals::{ArmStep, Arming, Signals, Wake};
use crate::stop::{or_stop, pause};

const LISTEN: &str = include_str!("../../../sql/queries/table/listen.sql");
const ARM: &str = include_str!("../../../sql/queries/table/arm.sql");
const DISARM: &str = include_str!("../../../sql/queries/table/disarm.sql");
const ARMED_BY_OTHER: &str = include_str!("../../../sql/queries/table/armed_by_other.sql");
const PING: &str = include_str!("../../../sql/queries/table/ping.sql");

/// How long arming may wait for writers that skipped their notification to commit. Past it the
/// processor polls and arming is tried again, so a long writer transaction costs latency of about
/// this much, never the fallback interval.
const ARM_LOCK_TIMEOUT: &str = "100ms";
/// Another relay is armed (its notifications reach us too): check again this often whether it is
/// still there.
const COVERED_RECHECK: Duration = Duration::from_secs(1);
const PING_INTERVAL: Duration = Duration::from_secs(5);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// A listening connection with this outbox's arming key and statements.
struct Connected {
    client: Client,
    key: i64,
    arm: Statement,
    disarm: Statement,
    armed_by_other: Statement,
}

pub(crate) struct Listener {
    /// The LISTEN connection's URL, with the schema in its session (never pooled).
    pub url: String,
    pub signals: Arc<Signals>,
    pub health: Arc<Health>,
    pub metrics: Arc<Metrics>,
}

impl Listener {
    /// Runs until `shutdown`: connect, LISTEN, wake the processor for a catch-up poll, serve, and on
    /// any loss reconnect with exponential backoff and jitter.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = crate::policy::reconnect_backoff();
        let mut first = true;
        loop {
            let Some(result) = or_stop(&shutdown, self.connect()).await else {
                return;
            };
            match result {
                Ok((conn, closed)) => {
                    backoff.reset();
                    if !first {
                        self.metrics.listener_reconnects.inc();
                    }
                    first = false;
                    self.health.set_listener(true);
                    // LISTEN is in place: anything committed before it is found by this poll.
                    self.signals.wake(Wake::Reconnect);
                    let end = self.serve(&conn, closed, &shutdown).await;
                    self.health.set_listener(false);
                    self.signals.update_arming(Arming::lost);
                    match end {
                        Ok(()) => return,
                        Err(e) => {
                            tracing::warn!(error = %e, "listener connection lost; reconnecting")
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "listener cannot connect; retrying"),
            }
            let delay = backoff.next_backoff().unwrap_or(Duration::from_secs(10));
            if !pause(&shutdown, delay).await {
                return;
            }
        }
    }

    /// Connects and LISTENs. The connection is driven by its own task, which reads notifications
    /// continuously (also while a batch runs) and wakes the processor directly.
    async fn connect(&self) -> Result<(Connected, tokio::sync::oneshot::Receiver<String>)> {
        let (client, mut connection) =
            crate::db::connect_raw(&self.url, "listen_database_url", "outbox-relay-listener")
                .await?;
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        let signals = self.signals.clone();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            let why = loop {
                match messages.next().await {
                    Some(Ok(AsyncMessage::Notification(_))) => signals.notification(),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break e.to_string(),
                    None => break "connection closed".to_string(),
                }
            };
            let _ = closed_tx.send(why);
        });
        // Channel and key come from the schema (outbox_wakeup()): two outboxes in one database
        // never share them.
        let key: i64 = client
            .query_typed_one(
                LISTEN,
                &[(&ARM_LOCK_TIMEOUT, tokio_postgres::types::Type::TEXT)],
            )
            .await?
            .try_get("lock_key")?;
        let statements = (
            client.prepare(ARM).await?,
            client.prepare(DISARM).await?,
            client.prepare(ARMED_BY_OTHER).await?,
        );
        Ok((
            Connected {
                client,
                key,
                arm: statements.0,
                disarm: statements.1,
                armed_by_other: statements.2,
            },
            closed_rx,
        ))
    }

    /// Serves one connection until it fails (Err) or shutdown (Ok): arms and disarms as the
    /// state machine says, and pings.
    async fn serve(
        &self,
        conn: &Connected,
        mut closed: tokio::sync::oneshot::Receiver<String>,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        // Some(delay): look at the arming state again after `delay` without waiting for a change.
        let mut recheck: Option<Duration> = None;
        let mut ping = tokio::time::interval(PING_INTERVAL);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let retry = async {
                match recheck {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                why = &mut closed => {
                    let why = why.unwrap_or_else(|_| "connection task ended".into());
                    return Err(Error::from(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        why,
                    )));
                }
                _ = self.signals.arming_changed() => {}
                _ = retry => {}
                _ = ping.tick() => {
                    let ping = tokio::time::timeout(PING_TIMEOUT, conn.client.simple_query(PING));
                    match or_stop(shutdown, ping).await {
                        None => return Ok(()),
                        Some(Ok(Ok(_))) => {}
                        Some(Ok(Err(e))) => return Err(e.into()),
                        Some(Err(_)) => return Err(Error::timeout(PING_TIMEOUT, "listener ping")),
                    }
                    continue;
                }
            }
            match or_stop(shutdown, self.arm_step(conn)).await {
                Some(next) => recheck = next?,
                None => return Ok(()),
            }
        }
    }

    /// Arms or disarms as the state machine says; `Some(delay)`: look again after `delay`.
    async fn arm_step(&self, conn: &Connected) -> Result<Option<Duration>> {
        match self.signals.arm_step() {
            ArmStep::Arm => self.try_arm(conn).await,
            ArmStep::Disarm => {
                conn.client.query(&conn.disarm, &[&conn.key]).await?;
                self.signals.update_arming(Arming::disarmed);
                Ok(None)
            }
            ArmStep::Nothing => Ok(None),
        }
    }

    /// Takes the arming key. On success the processor gets a catch-up poll; when a long writer
    /// transaction holds it up, the processor polls now and arming is retried at once; when another
    /// relay is armed, its notifications reach us as well, and we check again later.
    async fn try_arm(&self, conn: &Connected) -> Result<Option<Duration>> {
        match conn.client.query(&conn.arm, &[&conn.key]).await {
            Ok(_) => {
                self.signals.update_arming(Arming::armed);
                self.signals.wake(Wake::Armed);
                Ok(None)
            }
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                let covered: bool = conn
                    .client
                    .query_one(&conn.armed_by_other, &[&conn.key])
                    .await?
                    .try_get(0)?;
                if covered {
                    Ok(Some(COVERED_RECHECK))
                } else {
                    self.signals.wake(Wake::Poll);
                    Ok(Some(Duration::ZERO))
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}
