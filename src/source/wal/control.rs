//! The control connection of `--source wal` (leadership, the setup and the slot, the aggregates
//! the table holds) and a short connection beside it while it waits.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::error::Result;
use crate::event::AggregateKey;

const DEFERRED: &str = include_str!("../../../sql/queries/deferred.sql");
const WAL_LEAD: &str = include_str!("../../../sql/queries/wal_lead.sql");
const WAL_STATE: &str = include_str!("../../../sql/queries/wal_state.sql");
const CREATE_SLOT: &str = include_str!("../../../sql/queries/create_slot.sql");
const DROP_SLOT: &str = include_str!("../../../sql/queries/drop_slot.sql");
const LISTEN: &str = include_str!("../../../sql/queries/wal_listen.sql");
const SLOT_CREATED: &str = include_str!("../../../sql/queries/slot_created.sql");
const SLOT_CAUGHT_UP: &str = include_str!("../../../sql/queries/slot_caught_up.sql");
const SLOT_LAG: &str = include_str!("../../../sql/queries/slot_lag.sql");
const BACKEND_PID: &str = include_str!("../../../sql/queries/backend_pid.sql");
const WAITS_FOR: &str = include_str!("../../../sql/queries/wal_waits_for.sql");
const CANCEL_BACKEND: &str = include_str!("../../../sql/queries/cancel_backend.sql");

/// The relay's control connection of `--source wal`: leadership, the slot, the deferred
/// aggregates. A session of its own (never through a transaction pooler): its advisory lock is the
/// leadership.
pub(crate) struct Control {
    client: Client,
    /// Its server process: a statement it waits in is cancelled from [`Aside`].
    pid: i32,
    /// Notified on this outbox's NOTIFY channel: `dead-letters retry` (and a stopping relay of the
    /// table source) send one when rows become publishable again.
    woken: std::sync::Arc<tokio::sync::Notify>,
}

/// Where a server is, as a connection reached it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServerAddr {
    /// `None`: a Unix socket.
    pub ip: Option<std::net::IpAddr>,
    pub port: Option<u16>,
}

/// What PostgreSQL says about the replication setup.
#[derive(Debug, Clone)]
pub(crate) struct WalState {
    pub wal_level: String,
    /// The server the control connection reached: the leadership and the slot live there.
    pub server: ServerAddr,
    pub publication: String,
    pub publication_exists: bool,
    pub slot: Option<SlotInfo>,
}

#[derive(Debug, Clone)]
pub(crate) struct SlotInfo {
    pub plugin: Option<String>,
    /// The slot belongs to another database.
    pub other_database: Option<String>,
    /// `lost`: invalidated (it can no longer stream).
    pub wal_status: Option<String>,
    pub active_pid: Option<i32>,
    /// The catch-up from the table behind this slot is done.
    pub caught_up: bool,
}

impl Control {
    /// `url` carries the outbox's schema in its session (see `db::with_schema`).
    pub async fn connect(url: &str) -> Result<Control> {
        let (client, mut connection) =
            crate::db::connect_raw(url, "listen_database_url", "outbox-relay-wal").await?;
        let woken = std::sync::Arc::new(tokio::sync::Notify::new());
        let notify = woken.clone();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = futures::StreamExt::next(&mut messages).await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notification(_)) => notify.notify_one(),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "control connection closed");
                        break;
                    }
                }
            }
        });
        client.batch_execute(LISTEN).await?;
        let pid = client.query_typed_one(BACKEND_PID, &[]).await?.try_get(0)?;
        Ok(Control { client, pid, woken })
    }

    /// The control connection's server process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for a notification on this outbox's channel.
    pub async fn woken(&self) {
        self.woken.notified().await
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Takes the leadership of `slot` if no other relay holds it (held until this connection
    /// ends).
    pub async fn try_lead(&self, slot: &str) -> Result<bool> {
        let row = self
            .client
            .query_typed_one(WAL_LEAD, &[(&slot, Type::TEXT)])
            .await?;
        Ok(row.try_get(0)?)
    }

    pub async fn state(&self, slot: &str) -> Result<WalState> {
        let row = self
            .client
            .query_typed_one(WAL_STATE, &[(&slot, Type::TEXT)])
            .await?;
        let plugin: Option<String> = row.try_get("plugin")?;
        let database: Option<String> = row.try_get("database")?;
        let current: String = row.try_get("current_database")?;
        let exists = plugin.is_some() || database.is_some();
        let addr: Option<String> = row.try_get("server_addr")?;
        let port: Option<i32> = row.try_get("server_port")?;
        Ok(WalState {
            wal_level: row.try_get("wal_level")?,
            server: ServerAddr {
                ip: addr.and_then(|a| a.parse().ok()),
                port: port.and_then(|p| u16::try_from(p).ok()),
            },
            publication: row.try_get("publication")?,
            publication_exists: row.try_get("publication_exists")?,
            slot: exists.then(|| SlotInfo {
                plugin,
                other_database: database.filter(|d| *d != current),
                wal_status: row.try_get("wal_status").ok().flatten(),
                active_pid: row.try_get("active_pid").ok().flatten(),
                caught_up: row.try_get("caught_up").unwrap_or(false),
            }),
        })
    }

    /// Creates the slot (its catch-up from the table to do); returns its consistent point.
    pub async fn create_slot(&self, slot: &str) -> Result<String> {
        self.client
            .query_typed(SLOT_CREATED, &[(&slot, Type::TEXT)])
            .await?;
        let row = self
            .client
            .query_typed_one(CREATE_SLOT, &[(&slot, Type::TEXT)])
            .await?;
        Ok(row.try_get(0)?)
    }

    /// The catch-up from the table behind `slot` is done.
    pub async fn caught_up(&self, slot: &str) -> Result<()> {
        self.client
            .query_typed(SLOT_CAUGHT_UP, &[(&slot, Type::TEXT)])
            .await?;
        Ok(())
    }

    pub async fn drop_slot(&self, slot: &str) -> Result<()> {
        self.client
            .query_typed(DROP_SLOT, &[(&slot, Type::TEXT)])
            .await?;
        Ok(())
    }

    /// The aggregates handed to the table, and those with a pending row that may not be
    /// published now (`all_pending`: with any pending row).
    pub async fn deferred(&self, all_pending: bool) -> Result<Vec<AggregateKey>> {
        let rows = self
            .client
            .query_typed(DEFERRED, &[(&all_pending, Type::BOOL)])
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }
}

/// A short connection beside the control connection while that one waits in a statement: what
/// the wait is for, and cancelling it.
pub(crate) struct Aside {
    client: Client,
}

impl Aside {
    pub async fn connect(url: &str) -> Result<Aside> {
        let (client, connection) =
            crate::db::connect_raw(url, "listen_database_url", "outbox-relay-wal").await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Aside { client })
    }

    /// What creating a slot on `pid` waits for: open transactions and prepared ones, oldest
    /// first, described for the log.
    pub async fn slot_waits_for(&self, pid: i32) -> Result<Vec<String>> {
        let rows = self
            .client
            .query_typed(WAITS_FOR, &[(&pid, Type::INT4)])
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Cancels the statement `pid` runs.
    pub async fn cancel(&self, pid: i32) -> Result<()> {
        self.client
            .query_typed(CANCEL_BACKEND, &[(&pid, Type::INT4)])
            .await?;
        Ok(())
    }
}

/// The WAL slot `slot` retains, in bytes (for the stats task's gauge); `None` while it does not
/// exist.
pub(crate) async fn slot_lag(client: &Client, slot: &str) -> Result<Option<f64>> {
    let rows = client.query_typed(SLOT_LAG, &[(&slot, Type::TEXT)]).await?;
    match rows.first() {
        Some(row) => Ok(Some(row.try_get("retained_bytes")?)),
        None => Ok(None),
    }
}
