//! The PostgreSQL side of `--source wal`: claiming streamed rows by id, the aggregates handed to
//! the table (`outbox_wal_deferred`), and, on a control connection, leadership and the slot.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;
use uuid::Uuid;

use super::publication::{self, Publication};
use super::{read_claim, ready, Claim, Statements, Stmt, Store};
use crate::config::WalMarking;
use crate::error::{Error, Result};
use crate::event::OutboxEvent;

/// `(aggregate_type, aggregate_id)`: the unit of ordering.
pub(crate) type AggregateKey = (String, String);

const CLAIM_IDS: &str = include_str!("../../sql/queries/claim_ids.sql");
const LOCK_IDS: &str = include_str!("../../sql/queries/lock_ids.sql");
const DELETE_PUBLISHED: &str = include_str!("../../sql/queries/delete_published.sql");
const DELETE_PUBLISHED_IDS: &str = include_str!("../../sql/queries/delete_published_ids.sql");
const ROW_STATES: &str = include_str!("../../sql/queries/row_states.sql");
const PENDING_OF: &str = include_str!("../../sql/queries/pending_of.sql");
const DEFER: &str = include_str!("../../sql/queries/defer.sql");
const UNDEFER: &str = include_str!("../../sql/queries/undefer.sql");
const DEFERRED: &str = include_str!("../../sql/queries/deferred.sql");
const WAL_LEAD: &str = include_str!("../../sql/queries/wal_lead.sql");
const WAL_STATE: &str = include_str!("../../sql/queries/wal_state.sql");
const CREATE_SLOT: &str = include_str!("../../sql/queries/create_slot.sql");
const DROP_SLOT: &str = include_str!("../../sql/queries/drop_slot.sql");
const CATCH_UP_AGAIN: &str = include_str!("../../sql/queries/wal_catch_up_again.sql");
const LISTEN: &str = include_str!("../../sql/queries/wal_listen.sql");
const SLOT_CREATED: &str = include_str!("../../sql/queries/slot_created.sql");
const SLOT_CAUGHT_UP: &str = include_str!("../../sql/queries/slot_caught_up.sql");
const SLOT_LAG: &str = include_str!("../../sql/queries/slot_lag.sql");

const UUIDS: &[Type] = &[Type::UUID_ARRAY];
const TIDS_UUIDS: &[Type] = &[Type::TEXT_ARRAY, Type::UUID_ARRAY];
const ROW_STATES_TYPES: &[Type] = &[Type::UUID_ARRAY, Type::INT8_ARRAY];
const KEYS: &[Type] = &[Type::TEXT_ARRAY, Type::TEXT_ARRAY];
const PENDING_OF_TYPES: &[Type] = &[Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::INT8];

/// The worker connection's statements of `--source wal`.
pub(crate) struct WalStatements {
    /// `claim_ids.sql` (marking) or `lock_ids.sql` (`--wal-marking delete`).
    claim_ids: Stmt,
    /// `--wal-marking delete`: by where the rows are (`delete_published.sql`), and by id
    /// (`delete_published_ids.sql`) for rows claimed from the table (the catch-up).
    delete_published: Option<(Stmt, Stmt)>,
    row_states: Stmt,
    pending_of: Stmt,
    defer: Stmt,
    undefer: Stmt,
}

impl WalStatements {
    pub async fn new(client: &Client, prepare: bool, marking: WalMarking) -> Result<WalStatements> {
        let (claim, delete) = match marking {
            WalMarking::Update => (CLAIM_IDS, None),
            WalMarking::Delete => (
                LOCK_IDS,
                Some((
                    Stmt::new(client, DELETE_PUBLISHED, TIDS_UUIDS, prepare).await?,
                    Stmt::new(client, DELETE_PUBLISHED_IDS, UUIDS, prepare).await?,
                )),
            ),
        };
        Ok(WalStatements {
            claim_ids: Stmt::new(client, claim, UUIDS, prepare).await?,
            delete_published: delete,
            row_states: Stmt::new(client, ROW_STATES, ROW_STATES_TYPES, prepare).await?,
            pending_of: Stmt::new(client, PENDING_OF, PENDING_OF_TYPES, prepare).await?,
            defer: Stmt::new(client, DEFER, KEYS, prepare).await?,
            undefer: Stmt::new(client, UNDEFER, KEYS, prepare).await?,
        })
    }

    /// With `--wal-marking delete`: the rows whose ack arrived leave the outbox, in the batch's
    /// transaction. Rows locked by this claim are found where the claim found them (`tids`); the
    /// others (claimed from the table) by id.
    pub async fn delete_published(
        &self,
        client: &Client,
        published: &[Uuid],
        tids: &HashMap<Uuid, String>,
    ) -> Result<()> {
        let Some((by_tid, by_id)) = &self.delete_published else {
            return Ok(());
        };
        let mut located = (Vec::new(), Vec::new());
        let mut rest = Vec::new();
        for id in published {
            match tids.get(id) {
                Some(tid) => {
                    located.0.push(tid.as_str());
                    located.1.push(*id);
                }
                None => rest.push(*id),
            }
        }
        if !located.0.is_empty() {
            by_tid.execute(client, &[&located.0, &located.1]).await?;
        }
        if !rest.is_empty() {
            by_id.execute(client, &[&rest]).await?;
        }
        Ok(())
    }

    /// Records, in the batch's transaction, the aggregates handed to the table and those taken
    /// back from it.
    pub async fn hand_over(
        &self,
        client: &Client,
        defer: &[AggregateKey],
        undefer: &[AggregateKey],
    ) -> Result<()> {
        for (stmt, keys) in [(&self.defer, defer), (&self.undefer, undefer)] {
            if keys.is_empty() {
                continue;
            }
            let (types, ids): (Vec<&str>, Vec<&str>) =
                keys.iter().map(|(t, i)| (t.as_str(), i.as_str())).unzip();
            stmt.execute(client, &[&types, &ids]).await?;
        }
        Ok(())
    }
}

/// A row to claim by id: in the order to publish, with its aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub id: Uuid,
    pub aggregate: AggregateKey,
    /// The (32-bit) id of the transaction that wrote the row, from the stream; 0 for rows read
    /// from the table.
    pub xid: u32,
    /// The row's bytes as streamed (or measured in the table): what it weighs in a batch.
    pub size: usize,
}

/// What a sweep of aggregates handed to the table found besides its claim.
#[derive(Debug, Default)]
pub(crate) struct SweepInfo {
    /// Aggregates whose every pending row is in the claim (their events go back to the stream
    /// once these are published).
    pub complete: Vec<AggregateKey>,
    /// Aggregates without a pending row: taken back in this batch's transaction.
    pub cleared: Vec<AggregateKey>,
    /// The earliest retry due among the rows that are waiting for one.
    pub next_due: Option<Duration>,
}

impl Store {
    /// Opens a transaction and claims the pending, eligible rows among `candidates` (in the
    /// order to publish), skipping rows another session holds. Each aggregate stops at its first
    /// row that is still pending but was not claimed (held elsewhere, waiting for a retry,
    /// dead-lettered): that aggregate goes to [`Claim::defer`], and its rows after that one are
    /// put back at the commit. Rows published already (a replay) or deleted are skipped.
    pub async fn claim_ids(&mut self, candidates: &[Candidate]) -> Result<Claim<'_>> {
        let (client, statements) = ready!(self).await?;
        let wal = wal_statements(statements)?;
        self.in_tx = true;
        client.batch_execute(&self.session.begin).await?;
        let (grouping, marked, tids) = claim_in(client, wal, candidates).await?;
        Ok(Claim {
            client,
            statements,
            in_tx: &mut self.in_tx,
            claimed: marked.len(),
            groups: grouping.groups,
            full: false,
            marked,
            defer: grouping.defer,
            undefer: Vec::new(),
            carry: grouping.carry,
            tids,
        })
    }

    /// Opens a transaction and claims, for aggregates handed to the table, their pending rows in
    /// seq order up to the first one that may not be published now, at most `per_aggregate` of
    /// each, `max_rows` and about `max_bytes` in all (a single larger row still goes alone).
    /// Aggregates with no pending row left are taken back in the same transaction.
    pub async fn sweep(
        &mut self,
        aggregates: &[AggregateKey],
        per_aggregate: usize,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<(Claim<'_>, SweepInfo)> {
        let (client, statements) = ready!(self).await?;
        let wal = wal_statements(statements)?;
        self.in_tx = true;
        client.batch_execute(&self.session.begin).await?;
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates
            .iter()
            .map(|(t, i)| (t.as_str(), i.as_str()))
            .unzip();
        // One more than taken: an aggregate that shows no more is complete.
        let limit = i64::try_from(per_aggregate.saturating_add(1)).unwrap_or(i64::MAX);
        let rows = wal
            .pending_of
            .query(client, &[&types, &ids, &limit])
            .await?;
        let mut pending: HashMap<AggregateKey, Vec<PendingRow>> = HashMap::new();
        let mut info = SweepInfo::default();
        for row in &rows {
            let key: AggregateKey = (row.try_get(1)?, row.try_get(2)?);
            let due: Option<f64> = row.try_get("due_in_seconds")?;
            let eligible: bool = row.try_get("eligible")?;
            let dead: bool = row.try_get("dead")?;
            if !eligible && !dead {
                let due = Duration::from_secs_f64(due.unwrap_or(0.0).clamp(0.0, 1e9));
                info.next_due = Some(info.next_due.map_or(due, |d: Duration| d.min(due)));
            }
            pending.entry(key).or_default().push(PendingRow {
                id: row.try_get("id")?,
                eligible,
                size: usize::try_from(row.try_get::<_, Option<i32>>("size")?.unwrap_or(0))
                    .unwrap_or(0),
            });
        }
        let mut candidates = Vec::new();
        let mut bytes = 0usize;
        for key in aggregates {
            let Some(rows) = pending.remove(key) else {
                info.cleared.push(key.clone());
                continue;
            };
            let mut taken = 0;
            for row in rows.iter().take(per_aggregate) {
                let over = candidates.len() >= max_rows
                    || (!candidates.is_empty() && bytes.saturating_add(row.size) > max_bytes);
                if !row.eligible || over {
                    break;
                }
                bytes = bytes.saturating_add(row.size);
                candidates.push(Candidate {
                    id: row.id,
                    aggregate: key.clone(),
                    xid: 0,
                    size: row.size,
                });
                taken += 1;
            }
            if taken == rows.len() {
                info.complete.push(key.clone());
            }
        }
        let (grouping, marked, tids) = claim_in(client, wal, &candidates).await?;
        let claim = Claim {
            client,
            statements,
            in_tx: &mut self.in_tx,
            claimed: marked.len(),
            full: candidates.len() >= max_rows,
            groups: grouping.groups,
            marked,
            defer: grouping.defer,
            undefer: info.cleared.clone(),
            // Read from the table in this transaction: every one is visible.
            carry: grouping.carry,
            tids,
        };
        Ok((claim, info))
    }
}

struct PendingRow {
    id: Uuid,
    eligible: bool,
    size: usize,
}

fn wal_statements(statements: &Statements) -> Result<&WalStatements> {
    statements.wal.as_ref().ok_or_else(|| {
        Error::config(
            "source",
            "this connection was not opened for the wal source",
        )
    })
}

/// Claims `candidates` inside the open transaction: their grouping and the ids marked.
async fn claim_in(
    client: &Client,
    wal: &WalStatements,
    candidates: &[Candidate],
) -> Result<(Grouping, Vec<Uuid>, HashMap<Uuid, String>)> {
    if candidates.is_empty() {
        return Ok((Grouping::default(), Vec::new(), HashMap::new()));
    }
    let ids: Vec<Uuid> = candidates.iter().map(|c| c.id).collect();
    let mut taken = Taken::default();
    taken.add(read_claim(client, &wal.claim_ids, &[&ids]).await?);
    let (missing, xids): (Vec<Uuid>, Vec<i64>) = candidates
        .iter()
        .filter(|c| !taken.claimed.contains_key(&c.id))
        .map(|c| (c.id, i64::from(c.xid)))
        .unzip();
    let mut states = HashMap::new();
    if !missing.is_empty() {
        for row in wal.row_states.query(client, &[&missing, &xids]).await? {
            let state = match (row.try_get("found")?, row.try_get("pending")?) {
                (true, true) => RowState::Pending,
                (true, false) => RowState::Done,
                (false, _) if row.try_get("visible")? => RowState::Done,
                (false, _) => RowState::NotVisible,
            };
            states.insert(row.try_get::<_, Uuid>("id")?, state);
        }
    }
    // Each statement of the transaction takes its own snapshot: a streamed row whose transaction
    // became visible between the claim and `row_states` looks pending there, as if held by another
    // session. Claimed again now, it goes in this batch; only rows still not taken (held, or not
    // eligible) hand their aggregates to the table.
    let again: Vec<Uuid> = candidates
        .iter()
        .filter(|c| c.xid != 0 && states.get(&c.id) == Some(&RowState::Pending))
        .map(|c| c.id)
        .collect();
    if !again.is_empty() {
        taken.add(read_claim(client, &wal.claim_ids, &[&again]).await?);
        states.retain(|id, _| !taken.claimed.contains_key(id));
    }
    // Locked only (`--wal-marking delete`): nothing to put back at the commit.
    let marked = match wal.delete_published {
        Some(_) => Vec::new(),
        None => taken.claimed.keys().copied().collect(),
    };
    let grouping = group_candidates(candidates, &mut taken.claimed, &states);
    Ok((grouping, marked, taken.tids))
}

/// Rows a claim by id took: their events, and where they are (see [`Claim`]'s `tids`).
#[derive(Default)]
struct Taken {
    claimed: HashMap<Uuid, OutboxEvent>,
    tids: HashMap<Uuid, String>,
}

impl Taken {
    fn add(&mut self, rows: Vec<super::ClaimedRow>) {
        self.claimed.reserve(rows.len());
        for row in rows {
            if let Some(event) = row.event {
                if let Some(tid) = row.tid {
                    self.tids.insert(event.id, tid);
                }
                self.claimed.insert(event.id, event);
            }
        }
    }
}

/// What became of a candidate the claim did not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowState {
    /// Still to publish, but held elsewhere or not eligible now.
    Pending,
    /// Published already (a replay), or deleted.
    Done,
    /// Its transaction is not visible yet.
    NotVisible,
}

/// A claim by id, grouped (see [`group_candidates`]).
#[derive(Debug, Default)]
struct Grouping {
    groups: Vec<Vec<OutboxEvent>>,
    /// Aggregates to hand to the table.
    defer: Vec<AggregateKey>,
    /// Candidates to claim again shortly, in order.
    carry: Vec<Candidate>,
}

/// Groups the claimed events by aggregate in candidate order. `states` says what became of each
/// candidate not claimed. An aggregate stops at its first candidate that:
/// - is still pending but was not claimed (held by another session, not eligible): the aggregate
///   is handed to the table;
/// - is not visible yet: its transaction's commit reached the stream before the transaction
///   became visible to other sessions (PostgreSQL writes the commit record first). That candidate
///   and the aggregate's later ones are carried to the next claim.
///
/// Candidates published already (a replay) or deleted are skipped. Claimed events after a stop
/// stay in `claimed` (the commit puts them back).
fn group_candidates(
    candidates: &[Candidate],
    claimed: &mut HashMap<Uuid, OutboxEvent>,
    states: &HashMap<Uuid, RowState>,
) -> Grouping {
    let mut out = Grouping::default();
    let mut group_of: HashMap<&AggregateKey, usize> = HashMap::new();
    let mut stopped: HashSet<&AggregateKey> = HashSet::new();
    let mut carried: HashSet<&AggregateKey> = HashSet::new();
    for c in candidates {
        if carried.contains(&c.aggregate) {
            out.carry.push(c.clone());
            continue;
        }
        if stopped.contains(&c.aggregate) {
            continue;
        }
        match claimed.remove(&c.id) {
            Some(event) => match group_of.get(&c.aggregate) {
                Some(&g) => out.groups[g].push(event),
                None => {
                    group_of.insert(&c.aggregate, out.groups.len());
                    out.groups.push(vec![event]);
                }
            },
            None => match states.get(&c.id) {
                Some(RowState::Pending) => {
                    stopped.insert(&c.aggregate);
                    out.defer.push(c.aggregate.clone());
                }
                Some(RowState::Done) => {}
                Some(RowState::NotVisible) | None => {
                    carried.insert(&c.aggregate);
                    out.carry.push(c.clone());
                }
            },
        }
    }
    out
}

impl Stmt {
    async fn query(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let rows = self.query_raw(client, params).await?;
        futures::TryStreamExt::try_collect(rows).await
    }
}

/// The relay's control connection of `--source wal`: leadership, the slot, the deferred
/// aggregates. A session of its own (never through a transaction pooler): its advisory lock is the
/// leadership.
pub(crate) struct Control {
    client: Client,
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
/// check before (`None`: no check before).
pub(crate) fn recheck(state: &WalState, was_caught_up: Option<bool>) -> Option<Recheck> {
    if let Some(refusal) = state.published.refusal() {
        return Some(Recheck::Refuse(refusal));
    }
    (was_caught_up == Some(true) && !state.caught_up()).then_some(Recheck::CatchUp)
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
        Ok(Control { client, woken })
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
    /// own handling of a lost connection.
    pub async fn watch(
        &self,
        slot: &str,
        every: Duration,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Option<Recheck> {
        let mut caught_up = None;
        loop {
            match self.state(slot).await {
                Ok(state) => {
                    if let Some(verdict) = recheck(&state, caught_up) {
                        stop.cancel();
                        return Some(verdict);
                    }
                    caught_up = Some(state.caught_up());
                }
                Err(e) => tracing::debug!(error = %e, "checking the publication failed"),
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(every) => {}
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

/// Attempts at dropping a slot its walsender still holds (100 ms apart).
const DROP_TRIES: u32 = 50;

fn sqlstate_is(e: &Error, code: &str) -> bool {
    e.as_db_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c.code() == code)
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

    fn candidate(aggregate: &str) -> Candidate {
        Candidate {
            id: Uuid::new_v4(),
            aggregate: ("order".into(), aggregate.into()),
            xid: 0,
            size: 0,
        }
    }

    fn event(c: &Candidate) -> OutboxEvent {
        OutboxEvent {
            id: c.id,
            ..OutboxEvent::sample(&c.aggregate.1)
        }
    }

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
        }
    }

    #[test]
    fn a_check_while_streaming_refuses_a_broken_publication_and_catches_up_when_told_to() {
        assert!(recheck(&state(true, Some(true)), None).is_none());
        assert!(recheck(&state(true, Some(true)), Some(true)).is_none());
        assert!(matches!(
            recheck(&state(false, Some(true)), Some(true)),
            Some(Recheck::Refuse(_))
        ));
        // The mark taken away since the check before (`migrate --wal` repaired the publication),
        // or the slot gone.
        assert!(matches!(
            recheck(&state(true, Some(false)), Some(true)),
            Some(Recheck::CatchUp)
        ));
        assert!(matches!(
            recheck(&state(true, None), Some(true)),
            Some(Recheck::CatchUp)
        ));
        // A slot never marked (created by hand: no row) does not start over at every check.
        assert!(recheck(&state(true, Some(false)), None).is_none());
        assert!(recheck(&state(true, Some(false)), Some(false)).is_none());
    }

    #[test]
    fn candidates_group_in_their_order_and_stop_where_they_cannot_go_on() {
        // a1 a2(held elsewhere) a3 | b1 b2 | c1(published already) c2 | d1(not visible yet) d2
        let c = [
            candidate("a"),
            candidate("b"),
            candidate("a"),
            candidate("c"),
            candidate("b"),
            candidate("a"),
            candidate("c"),
            candidate("d"),
            candidate("d"),
        ];
        let not_claimed = [c[2].id, c[3].id, c[7].id];
        let mut claimed: HashMap<Uuid, OutboxEvent> = c
            .iter()
            .filter(|x| !not_claimed.contains(&x.id))
            .map(|x| (x.id, event(x)))
            .collect();
        let states: HashMap<Uuid, RowState> = [
            (c[2].id, RowState::Pending),
            (c[3].id, RowState::Done),
            (c[7].id, RowState::NotVisible),
        ]
        .into();
        let g = group_candidates(&c, &mut claimed, &states);
        let ids: Vec<Vec<Uuid>> = g
            .groups
            .iter()
            .map(|g| g.iter().map(|e| e.id).collect())
            .collect();
        assert_eq!(ids, [vec![c[0].id], vec![c[1].id, c[4].id], vec![c[6].id]]);
        assert_eq!(g.defer, [("order".to_string(), "a".to_string())]);
        assert_eq!(g.carry, [c[7].clone(), c[8].clone()]);
        // a3 and d2 were claimed but come after a stop: left for the commit to put back.
        let mut left: Vec<Uuid> = claimed.keys().copied().collect();
        left.sort();
        let mut expected = vec![c[5].id, c[8].id];
        expected.sort();
        assert_eq!(left, expected);
    }
}
