//! The control connection of `--source wal` (leadership, the setup and the slot, the deferred
//! aggregates) and a short connection beside it while it waits.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use std::time::Duration;

use uuid::Uuid;

use super::publication::{self, Publication};
use crate::error::{Error, Result};
use crate::event::AggregateKey;

const DEFERRED: &str = include_str!("../../../sql/queries/wal/deferred.sql");
const WAL_LEAD: &str = include_str!("../../../sql/queries/wal/wal_lead.sql");
const WAL_STATE: &str = include_str!("../../../sql/queries/wal/wal_state.sql");
const CREATE_SLOT: &str = include_str!("../../../sql/queries/wal/create_slot.sql");
const DROP_SLOT: &str = include_str!("../../../sql/queries/wal/drop_slot.sql");
const CATCH_UP_AGAIN: &str = include_str!("../../../sql/queries/wal/wal_catch_up_again.sql");
const LISTEN: &str = include_str!("../../../sql/queries/wal/wal_listen.sql");
const DURABLE: &str = include_str!("../../../sql/queries/wal/control_durable.sql");
const SLOT_CREATED: &str = include_str!("../../../sql/queries/wal/slot_created.sql");
const SLOT_CAUGHT_UP: &str = include_str!("../../../sql/queries/wal/slot_caught_up.sql");
const SLOT_LAG: &str = include_str!("../../../sql/queries/wal/slot_lag.sql");
const BACKEND_PID: &str = include_str!("../../../sql/queries/wal/backend_pid.sql");
const WAITS_FOR: &str = include_str!("../../../sql/queries/wal/wal_waits_for.sql");
const CANCEL_BACKEND: &str = include_str!("../../../sql/queries/wal/cancel_backend.sql");
const STRANDED_SCAN: &str = include_str!("../../../sql/queries/wal/stranded_scan.sql");
const STRANDED_CHECK: &str = include_str!("../../../sql/queries/wal/stranded_check.sql");
const DEFER: &str = include_str!("../../../sql/queries/wal/defer.sql");
const BEGIN_CLAIM: &str = include_str!("../../../sql/queries/table/begin_claim.sql");

/// What the stream's fallback saw pending (see `stranded_scan.sql`).
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// The server's WAL insert position after the rows were seen: every one committed before it.
    pub lsn: u64,
    /// Each aggregate's oldest pending row that may go now, of aggregates not deferred.
    pub rows: Vec<(Uuid, AggregateKey)>,
    /// The last aggregate looked at: the next look goes on from there (`None`: from the start).
    pub next: Option<AggregateKey>,
}

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
    /// What the publication publishes.
    pub published: Publication,
    pub slot: Option<SlotInfo>,
    /// A row changed after its insert is marked (the version 6 trigger), so rows may be
    /// published from what the stream carried.
    pub rewrites_marked: bool,
}

impl WalState {
    /// The slot's catch-up from the table is recorded as done.
    fn caught_up(&self) -> bool {
        self.slot.as_ref().is_some_and(|s| s.caught_up)
    }
}

/// What a check while streaming calls for.
#[derive(Debug)]
pub(crate) enum Recheck {
    /// The publication no longer publishes the outbox's inserts: pgoutput says nothing about it
    /// (the stream goes on, empty). The relay refuses it, as at start.
    Refuse(Error),
    /// The slot's catch-up mark was taken away (`migrate --wal` repaired the publication): rows
    /// written before the repair are in no stream, so the relay leads again and catches up.
    CatchUp,
}

/// What `state`, read while streaming, calls for; `was_caught_up`: the slot's catch-up mark at the
/// check before (before the first: as the leader knew it when the stream started).
pub(crate) fn recheck(state: &WalState, was_caught_up: bool) -> Option<Recheck> {
    if let Some(refusal) = state.published.refusal() {
        return Some(Recheck::Refuse(refusal));
    }
    (was_caught_up && !state.caught_up()).then_some(Recheck::CatchUp)
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
    /// `url` carries the outbox's schema in its session (see `Schema::session_url`).
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
        // What it records (the deferred aggregates at start, the slot's catch-up)
        // commits durably: the slot moves past it.
        client.batch_execute(DURABLE).await?;
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
        let published = self.publication().await?;
        Ok(WalState {
            wal_level: row.try_get("wal_level")?,
            server: ServerAddr {
                ip: addr.and_then(|a| a.parse().ok()),
                port: port.and_then(|p| u16::try_from(p).ok()),
            },
            publication: published.name.clone(),
            published,
            slot: exists.then(|| SlotInfo {
                plugin,
                other_database: database.filter(|d| *d != current),
                wal_status: row.try_get("wal_status").ok().flatten(),
                active_pid: row.try_get("active_pid").ok().flatten(),
                caught_up: row.try_get("caught_up").unwrap_or(false),
            }),
            rewrites_marked: row.try_get("rewrites_marked")?,
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

    /// This outbox's publication, as it is now.
    pub async fn publication(&self) -> Result<Publication> {
        Publication::read(&self.client).await
    }

    /// `slot` catches up from the table again before it streams: rows written while the
    /// publication did not publish them are in no stream. Best effort (the relay is refusing the
    /// publication; `migrate --wal` does this too when it repairs it).
    pub async fn catch_up_again(&self, slot: &str) {
        let result = self
            .client
            .query_typed(CATCH_UP_AGAIN, &[(&Some(slot), Type::TEXT)])
            .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, slot, "could not mark the slot to catch up from the table again");
        }
    }

    /// While `slot` streams: checks the setup now and every `every` until `stop`, and cancels
    /// `stop` when a check calls for it (see [`recheck`]). A failed check is left to the stream's
    /// own handling of a lost connection. `caught_up`: the slot's catch-up mark as the leader
    /// knew it before the stream started (it found the mark set, or set it after catching up):
    /// a mark taken away since (`migrate --wal` repaired the publication while the stream
    /// started) calls for a catch-up at the first check, as at any later one. A check that is
    /// still waiting for the database when `stop` comes (a lock on `outbox_wal_slots`) is left
    /// at once: then `true` besides, and the caller cancels the statement.
    pub async fn watch(
        &self,
        slot: &str,
        every: Duration,
        caught_up: bool,
        stop: &tokio_util::sync::CancellationToken,
    ) -> (Option<Recheck>, bool) {
        let mut caught_up = caught_up;
        loop {
            match crate::stop::or_stop(stop, self.state(slot)).await {
                None => return (None, true),
                Some(Ok(state)) => {
                    if let Some(verdict) = recheck(&state, caught_up) {
                        stop.cancel();
                        return (Some(verdict), false);
                    }
                    caught_up = state.caught_up();
                }
                Some(Err(e)) => tracing::debug!(error = %e, "checking the publication failed"),
            }
            if !crate::stop::pause(stop, every).await {
                return (None, false);
            }
        }
    }

    /// After the stream failed with `error`: when pgoutput did not find `publication` while it
    /// exists now, it was dropped and created again after the slot's position, and every start of
    /// the stream fails the same way (the slot decodes with the catalog of its past). The slot is
    /// dropped (once its walsender let go of it): the relay creates it again and catches up from
    /// the table, as for an invalidated slot.
    pub async fn drop_slot_predating(
        &self,
        slot: &str,
        publication: &str,
        error: &Error,
    ) -> Result<()> {
        if !publication::missing_in_stream(&error.to_string(), publication)
            || !self.publication().await?.exists
        {
            return Ok(());
        }
        tracing::error!(
            slot,
            publication,
            error = %error,
            "the replication slot cannot stream: the publication was dropped and created again after the slot's position (pgoutput looks it up as of each change it decodes, and the new one is not in the slot's past); dropping the slot, creating it again and catching up from the table: no event is lost, those written meanwhile go out in seq order"
        );
        let mut tries = 0;
        loop {
            match self.drop_slot(slot).await {
                // object_in_use: the walsender that failed has not let go of it yet.
                Err(e) if sqlstate_is(&e, "55006") && tries < DROP_TRIES => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                result => return result,
            }
        }
    }

    /// The aggregates deferred, and those with a pending row that may not be
    /// published now (`all_pending`: with any pending row), which are recorded as deferred
    /// before this returns: what the stream then leaves to the table is never known only
    /// in memory.
    /// The stream's fallback, first look: up to `limit` aggregates with a pending row, from
    /// `from` on (see `stranded_scan.sql`).
    pub async fn stranded_scan(&self, limit: usize, from: Option<&AggregateKey>) -> Result<Scan> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (t, i) = from.map_or(("", ""), |(t, i)| (t.as_str(), i.as_str()));
        self.client.batch_execute(BEGIN_CLAIM).await?;
        let rows = self
            .client
            .query_typed(
                STRANDED_SCAN,
                &[(&limit, Type::INT8), (&t, Type::TEXT), (&i, Type::TEXT)],
            )
            .await;
        self.client.batch_execute("COMMIT").await?;
        let rows = rows?;
        let mut scan = Scan::default();
        for row in &rows {
            let lsn: tokio_postgres::types::PgLsn = row.try_get("lsn")?;
            scan.lsn = scan.lsn.max(u64::from(lsn));
            let key: AggregateKey = (row.try_get("aggregate_type")?, row.try_get("aggregate_id")?);
            if row.try_get("candidate")? {
                scan.rows.push((row.try_get("id")?, key.clone()));
            }
            scan.next = Some(key);
        }
        if rows.len() < usize::try_from(limit).unwrap_or(usize::MAX) {
            // Round the whole outbox: the next look starts again.
            scan.next = None;
        }
        Ok(scan)
    }

    /// The stream's fallback, second look: of `ids`, the rows still pending and publishable.
    pub async fn stranded_check(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, AggregateKey)>> {
        let rows = self
            .client
            .query_typed(STRANDED_CHECK, &[(&ids, Type::UUID_ARRAY)])
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?))))
            .collect()
    }

    /// Defers `keys` (committed when this returns).
    pub async fn defer(&self, keys: &[AggregateKey]) -> Result<()> {
        let (types, ids): (Vec<&str>, Vec<&str>) =
            keys.iter().map(|(t, i)| (t.as_str(), i.as_str())).unzip();
        self.client
            .query_typed(
                DEFER,
                &[(&types, Type::TEXT_ARRAY), (&ids, Type::TEXT_ARRAY)],
            )
            .await?;
        Ok(())
    }

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

/// Attempts at dropping a slot its walsender still holds (100 ms apart).
const DROP_TRIES: u32 = 50;

fn sqlstate_is(e: &Error, code: &str) -> bool {
    e.as_db_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c.code() == code)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state(publication_exists: bool, caught_up: Option<bool>) -> WalState {
        WalState {
            wal_level: "logical".into(),
            server: ServerAddr::default(),
            publication: "outbox_relay".into(),
            published: Publication {
                name: "outbox_relay".into(),
                exists: publication_exists,
                inserts: publication_exists,
                lists_table: publication_exists,
                ..Publication::default()
            },
            slot: caught_up.map(|caught_up| SlotInfo {
                plugin: Some("pgoutput".into()),
                other_database: None,
                wal_status: Some("reserved".into()),
                active_pid: None,
                caught_up,
            }),
            rewrites_marked: true,
        }
    }

    #[test]
    fn a_check_while_streaming_refuses_a_broken_publication_and_catches_up_when_told_to() {
        assert!(recheck(&state(true, Some(true)), true).is_none());
        assert!(matches!(
            recheck(&state(false, Some(true)), true),
            Some(Recheck::Refuse(_))
        ));
        // The mark taken away since the check before, or since the leader found it set before
        // the first (`migrate --wal` repaired the publication), or the slot gone.
        assert!(matches!(
            recheck(&state(true, Some(false)), true),
            Some(Recheck::CatchUp)
        ));
        assert!(matches!(
            recheck(&state(true, None), true),
            Some(Recheck::CatchUp)
        ));
        // Once told, a check does not start over again while the mark stays away.
        assert!(recheck(&state(true, Some(false)), false).is_none());
    }
}
