//! The LISTEN connection: wakes the batch processor on `NOTIFY outbox_event`, reconnects with
//! backoff, and "arms" the writers' trigger while the relay is idle (see `outbox_events_notify` in
//! sql/migrations). The processor and the listener talk through [`Signals`].

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client, Statement};
use tokio_util::sync::CancellationToken;

use crate::config::NotifyMode;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

const LISTEN: &str = include_str!("../sql/queries/listen.sql");
const ARM: &str = include_str!("../sql/queries/arm.sql");
const DISARM: &str = include_str!("../sql/queries/disarm.sql");
const ARMED_BY_OTHER: &str = include_str!("../sql/queries/armed_by_other.sql");
const PING: &str = include_str!("../sql/queries/ping.sql");

/// How long arming may wait for writers that skipped their notification to commit. Past it the
/// processor polls and arming is tried again, so a long writer transaction costs latency of about
/// this much, never the fallback interval.
const ARM_LOCK_TIMEOUT: &str = "100ms";
/// Another relay is armed (its notifications reach us too): check again this often whether it is
/// still there.
const COVERED_RECHECK: Duration = Duration::from_secs(1);
const PING_INTERVAL: Duration = Duration::from_secs(5);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the processor was woken.
pub(crate) mod reason {
    pub const NOTIFY: u8 = 1;
    /// The listener armed: a catch-up poll is due (writers that skipped notifying have committed).
    pub const ARMED: u8 = 2;
    /// Arming is delayed by a long writer transaction: poll meanwhile.
    pub const POLL: u8 = 4;
    pub const RECONNECT: u8 = 8;
}

/// Wake-ups towards the processor and arm requests towards the listener. `Notify` keeps at most
/// one permit, so a burst of notifications costs one poll.
#[derive(Default)]
pub(crate) struct Signals {
    pub wake: Notify,
    reasons: AtomicU8,
    pub arm: Notify,
    /// A notification arrived: the listener disarms (writers stop paying while we drain).
    notified: Notify,
    pub listener_connected: AtomicBool,
    /// The last periodic database check succeeded (for /readyz).
    pub database_ok: AtomicBool,
}

impl Signals {
    pub fn wake(&self, reason: u8) {
        self.reasons.fetch_or(reason, AtomicOrdering::AcqRel);
        self.wake.notify_one();
    }

    /// Reasons gathered since the last call.
    pub fn take_reasons(&self) -> u8 {
        self.reasons.swap(0, AtomicOrdering::AcqRel)
    }
}

/// A listening connection with this outbox's arming key and statements.
struct Connected {
    client: Client,
    key: i64,
    arm: Statement,
    disarm: Statement,
    armed_by_other: Statement,
}

pub(crate) struct Listener {
    pub url: String,
    pub mode: NotifyMode,
    pub signals: Arc<Signals>,
    pub metrics: Arc<Metrics>,
}

impl Listener {
    /// Runs until `shutdown`: connect, LISTEN, wake the processor for a catch-up poll, serve, and on
    /// any loss reconnect with exponential backoff and jitter.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = backoff::ExponentialBackoffBuilder::new()
            .with_initial_interval(Duration::from_millis(100))
            .with_max_interval(Duration::from_secs(10))
            .with_randomization_factor(0.3)
            .with_max_elapsed_time(None)
            .build();
        let mut first = true;
        loop {
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.connect() => r,
            };
            match result {
                Ok((conn, closed)) => {
                    backoff.reset();
                    if !first {
                        self.metrics.listener_reconnects.inc();
                    }
                    first = false;
                    self.set_connected(true);
                    // LISTEN is in place: anything committed before it is found by this poll.
                    self.signals.wake(reason::RECONNECT);
                    let end = self.serve(&conn, closed, &shutdown).await;
                    self.set_connected(false);
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
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    fn set_connected(&self, up: bool) {
        self.signals
            .listener_connected
            .store(up, AtomicOrdering::Release);
        self.metrics.listener_connected.set(i64::from(up));
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
                    Some(Ok(AsyncMessage::Notification(_))) => {
                        signals.wake(reason::NOTIFY);
                        signals.notified.notify_one();
                    }
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

    /// Serves one connection until it fails (Err) or shutdown (Ok).
    async fn serve(
        &self,
        conn: &Connected,
        mut closed: tokio::sync::oneshot::Receiver<String>,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let mut armed = false;
        // Some(delay): try arming again after `delay` without waiting for a request.
        let mut rearm: Option<Duration> = None;
        let mut ping = tokio::time::interval(PING_INTERVAL);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let gated = self.mode == NotifyMode::Gated;
        loop {
            let retry = async {
                match rearm {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                why = &mut closed => {
                    let why = why.unwrap_or_else(|_| "connection task ended".into());
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        why,
                    )));
                }
                _ = self.signals.arm.notified(), if !armed => {
                    rearm = self.try_arm(conn, &mut armed).await?;
                }
                _ = retry, if !armed => {
                    rearm = self.try_arm(conn, &mut armed).await?;
                }
                _ = self.signals.notified.notified(), if armed && gated => {
                    conn.client.query(&conn.disarm, &[&conn.key]).await?;
                    armed = false;
                    rearm = None;
                    // The permit may be older than this arming; either way the processor must
                    // drain and ask to arm again, or writers would stop notifying for good.
                    self.signals.wake(reason::NOTIFY);
                }
                _ = ping.tick() => {
                    match tokio::time::timeout(PING_TIMEOUT, conn.client.simple_query(PING)).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(e.into()),
                        Err(_) => return Err(Error::Timeout(PING_TIMEOUT, "listener ping".into())),
                    }
                }
            }
        }
    }

    /// Takes the arming key. On success the processor gets a catch-up poll; when a long writer
    /// transaction holds it up, the processor polls now and arming is retried at once; when another
    /// relay is armed, its notifications reach us as well, and we check again later.
    async fn try_arm(&self, conn: &Connected, armed: &mut bool) -> Result<Option<Duration>> {
        match conn.client.query(&conn.arm, &[&conn.key]).await {
            Ok(_) => {
                *armed = true;
                self.signals.wake(reason::ARMED);
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
                    self.signals.wake(reason::POLL);
                    Ok(Some(Duration::ZERO))
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}
