//! The relay: waits for PostgreSQL and NATS, starts its side tasks (listener, stats, retention,
//! HTTP), runs the batch processor until shutdown, then hands over to the other relays.
//!
//! - `processor`: the loop (drain, arm, wait, drain).
//! - `batch`: one batch (claim, publish, settle under [`crate::policy`], record, commit).

use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::DbClock;
use crate::config::{NotifyMode, RelayConfig, Settings, Source};
use crate::error::Result;
use crate::health::{Health, HealthReport};
use crate::metrics::Metrics;
use crate::policy::{start_backoff, trouble_backoff};
use crate::publisher::Publisher;
use crate::source::store::{Session, Store};
use crate::source::table::listener::Listener;
use crate::source::table::signals::Signals;

use crate::source::table::processor::Processor;
use crate::stop::or_stop;

/// A relay from the outbox table to JetStream. Build it with [`Relay::new`], then
/// [`Relay::run`] it until its shutdown token is cancelled.
///
/// Inside an application, next to its own work:
///
/// ```no_run
/// use outbox_relay::{Relay, RelayConfig};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let mut config = RelayConfig::new("postgres://relay@db:5432/app");
/// config.nats.url = "nats://nats:4222".into();
/// config.nats.create_stream = true;
/// config.metrics.addr = None; // the application serves `relay.metrics()` itself
/// let relay = Relay::new(config).await?; // validates; connecting happens in `run`
/// let metrics = relay.metrics();
/// let shutdown = CancellationToken::new();
/// let task = tokio::spawn(relay.run(shutdown.clone()));
///
/// // ... the application runs; `metrics.encode()` answers its own /metrics ...
/// tokio::signal::ctrl_c().await?;
/// shutdown.cancel(); // the batch in hand is finished and committed, other relays take over
/// task.await??;
/// # let _ = metrics;
/// # Ok(())
/// # }
/// ```
pub struct Relay {
    settings: Settings,
    /// Processor <-> listener: wake-ups and arming.
    signals: Arc<Signals>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// The database's clock, measured at start and by the stats task (see [`crate::clock`]).
    clock: Arc<DbClock>,
}

impl Relay {
    /// Validates the config. Connecting happens in [`Relay::run`], which waits for PostgreSQL and
    /// NATS to answer (they often start after the relay) and fails fast only on what waiting
    /// cannot heal.
    pub async fn new(config: RelayConfig) -> Result<Relay> {
        Self::with_metrics(config, Arc::new(Metrics::new())).await
    }

    /// Like [`Relay::new`], recording into the given metrics (so an application can serve them).
    /// Their event type cap is set to the config's `metrics.event_types_max`.
    pub async fn with_metrics(config: RelayConfig, metrics: Arc<Metrics>) -> Result<Relay> {
        crate::db::tls::install_default_provider();
        let settings = config.resolve()?;
        metrics.set_event_types_max(settings.config.metrics.event_types_max);
        let mode = settings.config.source.notify_mode;
        Ok(Relay {
            signals: Arc::new(Signals::new(mode == NotifyMode::Gated)),
            health: Arc::new(Health::new(metrics.clone(), mode == NotifyMode::Poll)),
            metrics,
            settings,
            clock: Arc::new(DbClock::default()),
        })
    }

    /// The validated configuration the relay runs with.
    pub fn config(&self) -> &RelayConfig {
        &self.settings.config
    }

    /// The metrics the relay records into (Prometheus text via [`Metrics::encode`]).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// What the relay knows about its connections now (what `/readyz` answers), for an embedding
    /// application's own health checks.
    pub fn health(&self) -> HealthReport {
        self.health.report()
    }

    /// Is the listener connected? (Also in [`Relay::health`].)
    pub fn listener_connected(&self) -> bool {
        self.health.report().listener
    }

    /// Runs until `shutdown` is cancelled. First waits until PostgreSQL has the outbox schema and
    /// NATS the stream (creating it with `create_stream`), retrying with backoff and logging why;
    /// fails at once on what waiting cannot heal (credentials refused, TLS verification failed,
    /// schema missing, stream missing without `create_stream`). On shutdown the batch in hand is
    /// finished (bounded by the publish timeout) and committed, nothing is left locked, and the
    /// other relays are woken to take over what is left.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let tasks = CancellationToken::new();
        #[cfg_attr(not(feature = "http"), allow(unused_mut))]
        let mut handles = Vec::new();
        // Without the `http` feature, `validate` refused an address.
        #[cfg(feature = "http")]
        if let Some(addr) = self.settings.config.metrics.addr {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
            handles.push(tokio::spawn(crate::http::serve(
                listener,
                self.metrics.clone(),
                self.health.clone(),
                tasks.clone(),
            )));
        }
        let result = match self.start(&shutdown).await {
            Ok(Some(publisher)) => self.relay(publisher, &shutdown, &tasks, handles).await,
            Ok(None) => Ok(()), // shut down while waiting
            Err(e) => Err(e),
        };
        tasks.cancel();
        tracing::info!("relay stopped");
        result
    }

    /// Waits for the database (schema checked) and the broker (stream checked or created).
    /// `None`: shutdown came first.
    async fn start(&self, shutdown: &CancellationToken) -> Result<Option<Publisher>> {
        let config = &self.settings.config;
        let mut backoff = start_backoff();
        let mut database = false;
        let mut nats: Option<async_nats::Client> = None;
        loop {
            if !database {
                let Some(checked) = or_stop(shutdown, self.check_database()).await else {
                    return Ok(None);
                };
                match checked {
                    Ok(()) => {
                        database = true;
                        self.health.set_database(true);
                    }
                    Err(e) if e.heals_by_waiting() => {
                        tracing::warn!(error = %e, "database not ready; waiting")
                    }
                    Err(e) => return Err(e),
                }
            }
            if nats.is_none() {
                let health = self.health.clone();
                let connect =
                    crate::publisher::connect(&config.nats, move |up| health.set_broker_link(up));
                let Some(connected) = or_stop(shutdown, connect).await else {
                    return Ok(None);
                };
                match connected {
                    Ok(client) => nats = Some(client),
                    Err(e) if e.heals_by_waiting() => {
                        tracing::warn!(error = %e, "broker not ready; waiting")
                    }
                    Err(e) => return Err(e),
                }
            }
            if let (true, Some(client)) = (database, &nats) {
                let publisher = Publisher::new(
                    client.clone(),
                    &config.nats,
                    &config.publish,
                    &config.batch,
                    config.longest_redelivery_gap(),
                    self.clock.clone(),
                )?;
                let Some(ensured) = or_stop(shutdown, publisher.ensure_stream()).await else {
                    return Ok(None);
                };
                match ensured {
                    Ok(()) => {
                        self.health.broker_checked(publisher.is_connected());
                        return Ok(Some(publisher));
                    }
                    Err(e) if e.heals_by_waiting() => {
                        tracing::warn!(error = %e, "JetStream not ready; waiting")
                    }
                    Err(e) => return Err(e),
                }
            }
            let delay = backoff.next_backoff().unwrap_or(Duration::from_secs(5));
            if !crate::stop::pause(shutdown, delay).await {
                return Ok(None);
            }
        }
    }

    async fn check_database(&self) -> Result<()> {
        let postgres = &self.settings.config.postgres;
        let mut client = crate::db::connect(postgres.url.expose(), "outbox-relay").await?;
        crate::ops::Outbox::new(&mut client, self.settings.schema.clone())
            .check()
            .await?;
        // Before the first publish: the acks are timed on the database's clock.
        self.clock.measure(&client).await?;
        Ok(())
    }

    /// Starts the side tasks and runs the processor until shutdown, then hands over.
    async fn relay(
        &self,
        publisher: Publisher,
        shutdown: &CancellationToken,
        tasks: &CancellationToken,
        mut handles: Vec<JoinHandle<()>>,
    ) -> Result<()> {
        let config = &self.settings.config;
        let postgres = &config.postgres;
        let wal = config.source.source == Source::Wal;
        if config.source.notify_mode != NotifyMode::Poll && !wal {
            let listener = Listener {
                url: self.settings.listen_url.clone(),
                signals: self.signals.clone(),
                health: self.health.clone(),
                metrics: self.metrics.clone(),
            };
            handles.push(tokio::spawn(listener.run(tasks.clone())));
        }
        let database = crate::background::Database {
            url: postgres.url.clone(),
            schema: self.settings.schema.clone(),
        };
        handles.push(tokio::spawn(crate::background::stats(
            database.clone(),
            config.metrics.clone(),
            wal.then(|| self.settings.slot.clone()),
            self.metrics.clone(),
            self.health.clone(),
            self.clock.clone(),
            tasks.clone(),
        )));
        if config.retention.is_on() {
            handles.push(tokio::spawn(crate::background::retention(
                database,
                config.retention.clone(),
                self.metrics.clone(),
                tasks.clone(),
            )));
        }
        let session = Session::new(self.settings.schema.as_ref(), postgres.prepared_statements);
        let store =
            |session: &Session| Store::new(postgres.url.expose().to_string(), session.clone());
        let result = if wal {
            // The slot moves past what a batch recorded: its transactions commit durably.
            let session = session
                .clone()
                .begin_with(crate::source::wal::BEGIN_DURABLE);
            let mut relay = crate::source::wal::WalSource {
                batch: &config.batch,
                retry: &config.retry,
                source: &config.source,
                url: &self.settings.listen_url,
                publisher,
                metrics: &self.metrics,
                health: &self.health,
                stores: std::array::from_fn(|_| {
                    crate::source::wal::store::WalStore::new(store(&session), config.wal.marking)
                }),
                slot: self.settings.slot.clone(),
                trouble: trouble_backoff(),
                table: Default::default(),
            };
            // Leaving ends the control connection, and with it the leadership: a relay standing
            // by takes over within a second.
            relay.run(shutdown).await
        } else {
            let mut processor = Processor::new(
                (&config.batch, &config.retry, &config.source),
                publisher,
                &self.signals,
                &self.metrics,
                [store(&session), store(&session)],
            );
            let result = processor.run(shutdown).await;
            // Whatever is left is for the other relays: wake them rather than leave it to their
            // fallback poll (a rolling restart of two replicas would otherwise wait for it).
            processor.stores[0].wake_others().await;
            result
        };
        // The side tasks end at once (each of their waits races `tasks`); a task that does not
        // (a farewell statement) is given a moment, then aborted.
        tasks.cancel();
        let aborted = crate::stop::join(handles).await;
        if aborted > 0 {
            tracing::warn!(
                tasks = aborted,
                "side tasks still busy at shutdown were stopped"
            );
        }
        result
    }
}
