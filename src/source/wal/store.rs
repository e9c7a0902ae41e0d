//! The worker connections' side of `--source wal`: claiming streamed rows by id, sweeping the
//! aggregates the table holds, and recording a batch's hand-over (`outbox_wal_deferred`) and
//! delete in its transaction. Built on the table source's [`Store`] (its connection, session and
//! claim), with statements of its own prepared on the same connection.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;
use uuid::Uuid;

use super::pipeline::{Candidate, Found, Round, Streamed};
use crate::config::WalMarking;
use crate::error::Result;
use crate::event::{AggregateKey, OutboxEvent};
use crate::source::store::{
    read_claim, BeforeCommit, Claim, ClaimedRow, OpenClaim, Split, Stmt, Store,
};

const CLAIM_IDS: &str = include_str!("../../../sql/queries/wal/claim_ids.sql");
const LOCK_IDS: &str = include_str!("../../../sql/queries/wal/lock_ids.sql");
const LOCK_STREAMED: &str = include_str!("../../../sql/queries/wal/lock_streamed.sql");
const DELETE_PUBLISHED: &str = include_str!("../../../sql/queries/wal/delete_published.sql");
const DELETE_PUBLISHED_IDS: &str =
    include_str!("../../../sql/queries/wal/delete_published_ids.sql");
const ROW_STATES: &str = include_str!("../../../sql/queries/wal/row_states.sql");
const PENDING_OF: &str = include_str!("../../../sql/queries/wal/pending_of.sql");
const SWEEP_ROUND: &str = include_str!("../../../sql/queries/wal/sweep_round.sql");
const DEFER: &str = include_str!("../../../sql/queries/wal/defer.sql");
const UNDEFER: &str = include_str!("../../../sql/queries/wal/undefer.sql");
const INSERT_POSITION: &str = include_str!("../../../sql/queries/wal/insert_position.sql");
const MARK_SPLIT: &str = include_str!("../../../sql/queries/wal/mark_split.sql");
const PURGE_TRANSACTIONS: &str = include_str!("../../../sql/queries/wal/purge_transactions.sql");
const RECORD_RUNS: &str = include_str!("../../../sql/queries/wal/record_runs.sql");
const HAS_KEPT: &str = include_str!("../../../sql/queries/wal/has_kept.sql");
const RECORD_KEPT: &str = include_str!("../../../sql/queries/wal/record_kept.sql");
const KEPT_ROUND: &str = include_str!("../../../sql/queries/wal/kept_round.sql");
const TEXTS: &[Type] = &[Type::TEXT_ARRAY];
const RUNS_TYPES: &[Type] = &[Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::INT8_ARRAY];
const RECORD_KEPT_TYPES: &[Type] = &[Type::TEXT_ARRAY, Type::TEXT_ARRAY];
const KEPT_ROUND_TYPES: &[Type] = &[Type::TEXT, Type::INT8];

/// Kept transactions looked at per round of [`WalStore::purge_kept`] (one probe of
/// `outbox_events_txid_idx` each).
pub(crate) const KEPT_ROUND_TRANSACTIONS: usize = 1_000;

const UUIDS: &[Type] = &[Type::UUID_ARRAY];
const SEQS_UUIDS: &[Type] = &[Type::INT8_ARRAY, Type::UUID_ARRAY];
const TIDS_UUIDS: &[Type] = &[Type::TEXT_ARRAY, Type::UUID_ARRAY];
const ROW_STATES_TYPES: &[Type] = &[Type::UUID_ARRAY, Type::INT8_ARRAY];
const KEYS: &[Type] = &[Type::TEXT_ARRAY, Type::TEXT_ARRAY];
const PENDING_OF_TYPES: &[Type] = &[Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::INT8];
const SWEEP_ROUND_TYPES: &[Type] = &[Type::TEXT, Type::TEXT, Type::INT8];

/// The worker connection's statements of `--source wal`.
pub(crate) struct WalStatements {
    /// `claim_ids.sql` (marking) or `lock_ids.sql` (`--wal-marking delete`).
    claim_ids: Stmt,
    /// `--wal-marking delete`: `lock_streamed.sql`, for rows whose content the stream carried.
    lock_streamed: Option<Stmt>,
    /// `--wal-marking delete`: by where the rows are (`delete_published.sql`), and by id
    /// (`delete_published_ids.sql`) for rows claimed from the table (the catch-up).
    delete_published: Option<(Stmt, Stmt)>,
    /// `--wal-marking delete` on a schema whose rows record their transaction (version 9):
    /// `mark_split.sql`, `record_runs.sql` and `purge_transactions.sql`.
    split: Option<(Stmt, Stmt, Stmt)>,
    /// `--wal-marking delete` on a schema that records the transactions whose rows it keeps
    /// (version 10): `record_kept.sql` and `kept_round.sql`.
    kept: Option<(Stmt, Stmt)>,
    row_states: Stmt,
    pending_of: Stmt,
    /// `sweep_round.sql`: what a sweep serves, from `outbox_wal_deferred`.
    sweep_round: Stmt,
    defer: Stmt,
    undefer: Stmt,
}

impl WalStatements {
    /// `streamed`: prepare `lock_streamed.sql` (it reads version 6's `rewritten`).
    pub async fn new(
        client: &Client,
        prepare: bool,
        marking: WalMarking,
        streamed: bool,
        has_kept: bool,
    ) -> Result<WalStatements> {
        let (claim, delete, lock_streamed) = match marking {
            WalMarking::Update => (CLAIM_IDS, None, None),
            WalMarking::Delete => (
                LOCK_IDS,
                Some((
                    Stmt::new(client, DELETE_PUBLISHED, TIDS_UUIDS, prepare).await?,
                    Stmt::new(client, DELETE_PUBLISHED_IDS, UUIDS, prepare).await?,
                )),
                match streamed {
                    true => Some(Stmt::new(client, LOCK_STREAMED, SEQS_UUIDS, prepare).await?),
                    false => None,
                },
            ),
        };
        let split = match marking {
            WalMarking::Delete => Some((
                Stmt::new(client, MARK_SPLIT, UUIDS, prepare).await?,
                Stmt::new(client, RECORD_RUNS, RUNS_TYPES, prepare).await?,
                Stmt::new(client, PURGE_TRANSACTIONS, TEXTS, prepare).await?,
            )),
            _ => None,
        };
        let kept = match (&split, has_kept) {
            (Some(_), true) => Some((
                Stmt::new(client, RECORD_KEPT, RECORD_KEPT_TYPES, prepare).await?,
                Stmt::new(client, KEPT_ROUND, KEPT_ROUND_TYPES, prepare).await?,
            )),
            _ => None,
        };
        Ok(WalStatements {
            claim_ids: Stmt::new(client, claim, UUIDS, prepare).await?,
            lock_streamed,
            delete_published: delete,
            split,
            kept,
            row_states: Stmt::new(client, ROW_STATES, ROW_STATES_TYPES, prepare).await?,
            pending_of: Stmt::new(client, PENDING_OF, PENDING_OF_TYPES, prepare).await?,
            sweep_round: Stmt::new(client, SWEEP_ROUND, SWEEP_ROUND_TYPES, prepare).await?,
            defer: Stmt::new(client, DEFER, KEYS, prepare).await?,
            undefer: Stmt::new(client, UNDEFER, KEYS, prepare).await?,
        })
    }

    /// With `--wal-marking delete`: the rows whose ack arrived leave the outbox, in the batch's
    /// transaction. Rows locked by this claim are found where the claim found them (`tids`); the
    /// others (claimed from the table) by id.
    ///
    /// The rows of a transaction not published whole (`split`) are marked instead, and deleted
    /// with the rest of their transaction once it is all published: the table keeps every row of
    /// a transaction until then, so that its count (the transaction headers) is read exactly.
    /// Where the schema has `outbox_kept_transactions`, a transaction kept is recorded there, so
    /// that [`WalStore::purge_kept`] finds it done when no batch holds it again.
    pub async fn delete_published(
        &self,
        client: &Client,
        published: &[Uuid],
        split: &Split,
        tids: &HashMap<Uuid, String>,
    ) -> Result<()> {
        let Some((by_tid, by_id)) = &self.delete_published else {
            return Ok(());
        };
        let kept: HashSet<&Uuid> = split.ids.iter().collect();
        let mut located = (Vec::new(), Vec::new());
        let mut rest = Vec::new();
        for id in published.iter().filter(|id| !kept.contains(id)) {
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
        // After the deletes: the purge finds a transaction done when none of its rows is pending.
        if let (Some((mark, runs, purge)), false) = (&self.split, split.txids.is_empty()) {
            if !split.ids.is_empty() {
                mark.execute(client, &[&split.ids]).await?;
            }
            if !split.runs.is_empty() {
                let txids: Vec<String> = split.runs.iter().map(|r| r.0.to_string()).collect();
                let firsts: Vec<i64> = split.runs.iter().map(|r| r.1).collect();
                let counts: Vec<i64> = split
                    .runs
                    .iter()
                    .map(|r| i64::try_from(r.2).unwrap_or(i64::MAX))
                    .collect();
                runs.execute(client, &[&txids, &firsts, &counts]).await?;
            }
            let txids: Vec<String> = split.txids.iter().map(u64::to_string).collect();
            let done = done_txids(purge.query(client, &[&txids]).await?)?;
            if let Some((record_kept, _)) = &self.kept {
                // Runs are recorded in outbox_transaction_runs already: only the others are kept
                // (recorded while not done, forgotten once done).
                let runs: HashSet<u64> = split.runs.iter().map(|r| r.0).collect();
                let (forget, keep): (Vec<String>, Vec<String>) = split
                    .txids
                    .iter()
                    .filter(|t| !runs.contains(t))
                    .map(u64::to_string)
                    .partition(|t| done.contains(t));
                if !keep.is_empty() || !forget.is_empty() {
                    record_kept.execute(client, &[&keep, &forget]).await?;
                }
            }
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

/// The transactions `purge_transactions.sql` found done.
fn done_txids(rows: Vec<tokio_postgres::Row>) -> Result<Vec<String>> {
    rows.iter()
        .map(|r| Ok(r.try_get::<_, String>("txid")?))
        .collect()
}

/// A claim by id: the open claim (no groups yet), the events it took, and what was found of each
/// candidate.
pub(crate) struct ClaimedIds {
    pub open: WalOpen,
    pub events: HashMap<Uuid, OutboxEvent>,
    pub found: HashMap<Uuid, Found>,
    /// Rows whose aggregate is not the one the stream carried (changed after the insert), with
    /// the aggregate the table holds them in: found [`Found::Pending`], not published by this
    /// claim; both aggregates go to the table.
    pub moved: HashMap<Uuid, AggregateKey>,
    /// Of the rows claimed, those with an older pending row of their aggregate: that row's id.
    pub prev: HashMap<Uuid, Uuid>,
    /// With `prev`: a WAL position past the commit of every row the claim saw (0 without).
    pub seen_at: u64,
}

/// A claim of the wal source left open while its connection serves other work (see
/// [`OpenClaim`]).
pub(crate) struct WalOpen {
    pub open: OpenClaim,
    /// `--wal-marking delete`: where each locked row is, so that the delete after the acks finds
    /// the rows without a primary-key probe each.
    tids: HashMap<Uuid, String>,
}

/// What the wal source records in a batch's transaction besides its outcome: the published rows
/// deleted (`--wal-marking delete`), the aggregates handed to the table and those taken back.
pub(crate) struct WalRecord<'a> {
    statements: &'a WalStatements,
    tids: HashMap<Uuid, String>,
    pub defer: Vec<AggregateKey>,
    pub undefer: Vec<AggregateKey>,
}

impl WalRecord<'_> {
    /// The claim left open again, with where its rows are.
    pub fn reopen(self, open: OpenClaim) -> WalOpen {
        WalOpen {
            open,
            tids: self.tids,
        }
    }
}

impl BeforeCommit for WalRecord<'_> {
    async fn run(self, client: &Client, published: &[Uuid], split: &Split) -> Result<()> {
        self.statements
            .delete_published(client, published, split, &self.tids)
            .await?;
        self.statements
            .hand_over(client, &self.defer, &self.undefer)
            .await
    }
}

/// A worker connection of the wal source: the table source's [`Store`] and the wal source's
/// statements on the same connection (prepared again whenever it is a new one).
pub(crate) struct WalStore {
    store: Store,
    marking: WalMarking,
    /// The schema marks rows changed after their insert (version 6).
    rewrites_marked: bool,
    /// The statements, with the generation of the connection they were prepared on and whether
    /// they publish streamed content.
    statements: Option<((u64, bool), WalStatements)>,
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
    /// Aggregates whose claim stopped at a row it could not take (held elsewhere).
    pub held: HashSet<AggregateKey>,
    /// The aggregates this sweep served (read from `outbox_wal_deferred`).
    pub served: Vec<AggregateKey>,
}

impl WalStore {
    pub fn new(store: Store, marking: WalMarking) -> WalStore {
        WalStore {
            store,
            marking,
            rewrites_marked: false,
            statements: None,
        }
    }

    /// Whether a claim publishes a streamed row from the content the stream carried (when the
    /// row is unchanged since): with `--wal-marking delete`, whose claim only locks (marking
    /// writes the row in the claim, before it could tell), and a schema that marks rows changed
    /// after their insert (`rewrites_marked`, version 6).
    pub fn publishes_streamed(&self) -> bool {
        self.marking == WalMarking::Delete && self.rewrites_marked
    }

    /// Whether the schema marks rows changed after their insert (read before each stream).
    pub fn set_rewrites_marked(&mut self, rewrites_marked: bool) {
        self.rewrites_marked = rewrites_marked;
    }

    /// The table source's side of the connection.
    pub fn table(&mut self) -> &mut Store {
        &mut self.store
    }

    /// A claim from the table as the table source makes it (the catch-up behind a new slot),
    /// recorded as the wal source records its batches (published rows deleted with
    /// `--wal-marking delete`).
    pub async fn claim_table(
        &mut self,
        ordering: crate::config::Ordering,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Claim<'_>, WalRecord<'_>)> {
        self.ready().await?;
        let statements = prepared(&self.statements)?;
        let claim = self.store.claim(ordering, limit, max_bytes).await?;
        Ok((
            claim,
            WalRecord {
                statements,
                tids: HashMap::new(),
                defer: Vec::new(),
                undefer: Vec::new(),
            },
        ))
    }

    /// Drops the connection after an error that may have broken it; the next claim reconnects.
    pub fn reset(&mut self) {
        self.store.reset();
    }

    /// The connection with the wal statements prepared on it.
    async fn ready(&mut self) -> Result<()> {
        let streamed = self.publishes_streamed();
        let (client, generation, prepare, begin) = self.store.connection().await?;
        let key = (generation, streamed);
        if self.statements.as_ref().map(|(k, _)| *k) != Some(key) {
            // Probed and prepared inside a transaction with the session's settings: `--schema`
            // resolves.
            client.batch_execute(begin).await?;
            let has_kept = match self.marking {
                WalMarking::Delete => client
                    .query_typed(HAS_KEPT, &[])
                    .await?
                    .first()
                    .map(|row| row.try_get::<_, bool>("has_kept"))
                    .transpose()?
                    .unwrap_or(false),
                _ => false,
            };
            let statements =
                WalStatements::new(client, prepare, self.marking, key.1, has_kept).await?;
            client.batch_execute("COMMIT").await?;
            self.statements = Some((key, statements));
        }
        Ok(())
    }

    /// With `--wal-marking delete` on schema version 10: a round of the transactions whose
    /// published rows (or run) are kept, as `outbox_kept_transactions` and
    /// `outbox_transaction_runs` record them, at most [`KEPT_ROUND_TRANSACTIONS`] by txid after
    /// `after` ("0": from the start). Those with no pending row left (their other events
    /// published or discarded) leave the outbox in the round's transaction, whoever published
    /// them. Returns the last transaction looked at when the round was full (the next round starts
    /// after it), `None` when it reached the end; and how many were done. Nothing on an older
    /// schema or with marking.
    pub async fn purge_kept(&mut self, after: &str) -> Result<(Option<String>, usize)> {
        self.ready().await?;
        let wal = prepared(&self.statements)?;
        let (Some((_, _, purge)), Some((record_kept, round))) = (&wal.split, &wal.kept) else {
            return Ok((None, 0));
        };
        let claim = self.store.begin().await?;
        let client = claim.client();
        let limit = i64::try_from(KEPT_ROUND_TRANSACTIONS).unwrap_or(i64::MAX);
        let candidates = round
            .query(client, &[&after, &limit])
            .await?
            .iter()
            .map(|r| Ok(r.try_get::<_, String>("txid")?))
            .collect::<Result<Vec<String>>>()?;
        if candidates.is_empty() {
            claim.rollback().await?;
            return Ok((None, 0));
        }
        let done = done_txids(purge.query(client, &[&candidates]).await?)?;
        if !done.is_empty() {
            record_kept
                .execute(client, &[&Vec::<String>::new(), &done])
                .await?;
        }
        claim.commit().await?;
        let next = (candidates.len() >= KEPT_ROUND_TRANSACTIONS)
            .then(|| candidates.last().cloned())
            .flatten();
        Ok((next, done.len()))
    }

    /// A claim left open by [`WalStore::claim_ids`], to publish and record, with what to record
    /// besides its outcome.
    pub fn resume(
        &mut self,
        open: WalOpen,
        defer: Vec<AggregateKey>,
    ) -> Result<(Claim<'_>, WalRecord<'_>)> {
        let statements = prepared(&self.statements)?;
        let claim = self.store.resume(open.open)?;
        Ok((
            claim,
            WalRecord {
                statements,
                tids: open.tids,
                defer,
                undefer: Vec::new(),
            },
        ))
    }

    /// Opens a transaction and claims the pending, eligible rows among `candidates`, skipping rows
    /// another session holds. Returns the claim (no groups yet: the pipeline decides what goes
    /// out), the events claimed, and what was found of each candidate.
    /// The candidates' content is taken (used once).
    pub async fn claim_ids(&mut self, candidates: &mut [Candidate]) -> Result<ClaimedIds> {
        self.ready().await?;
        let wal = prepared(&self.statements)?;
        let mut claim = self.store.begin().await?;
        let (taken, states, marked) = claim_in(claim.client(), wal, candidates).await?;
        let mut moved = HashMap::new();
        let mut found: HashMap<Uuid, Found> = states
            .into_iter()
            .map(|(id, state)| {
                let f = match state {
                    RowState::Pending => Found::Pending,
                    RowState::Moved(to) => {
                        moved.insert(id, to);
                        Found::Pending
                    }
                    RowState::Done => Found::Done,
                    RowState::NotVisible => Found::NotVisible,
                };
                (id, f)
            })
            .collect();
        found.extend(taken.claimed.keys().map(|id| (*id, Found::Claimed)));
        let seen_at = match taken.prev.is_empty() {
            true => 0,
            false => {
                let row = claim.client().query_typed(INSERT_POSITION, &[]).await?;
                let row = row.first().ok_or_else(|| {
                    crate::error::Error::database_state(
                        "the server answered no WAL insert position",
                    )
                })?;
                u64::from(row.try_get::<_, tokio_postgres::types::PgLsn>("lsn")?)
            }
        };
        claim.fill(Vec::new(), marked.len(), marked);
        Ok(ClaimedIds {
            open: WalOpen {
                open: claim.into_open(),
                tids: taken.tids,
            },
            events: taken.claimed,
            found,
            moved,
            prev: taken.prev,
            seen_at,
        })
    }

    /// Opens a transaction and claims, for aggregates handed to the table, their pending rows in
    /// seq order up to the first one that may not be published now, a sweep's slice of a batch
    /// in rows and bytes (a single larger row still goes alone), shared evenly among the
    /// aggregates whose oldest pending row may go now (not among those stuck behind a dead letter
    /// or a retry: a hot aggregate among a hundred blocked ones gets the whole batch). Aggregates
    /// with no pending row left are taken back in the same transaction.
    pub async fn sweep(
        &mut self,
        after: &AggregateKey,
        n: usize,
        serve: impl FnOnce(Vec<AggregateKey>) -> Round,
        batch: &crate::config::BatchConfig,
    ) -> Result<(Claim<'_>, WalRecord<'_>, SweepInfo)> {
        let (max_rows, max_bytes) = batch.sweep_slice();
        self.ready().await?;
        let wal = prepared(&self.statements)?;
        let mut claim = self.store.begin().await?;
        let client = claim.client();
        // What to serve: the durable record decides, in this transaction.
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        let chosen = wal
            .sweep_round
            .query(client, &[&after.0, &after.1, &limit])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<AggregateKey>>>()?;
        let round = serve(chosen);
        let (aggregates, frozen) = (&round.aggregates[..], &round.frozen);
        let keys = |aggregates: &[&AggregateKey]| -> (Vec<String>, Vec<String>) {
            aggregates
                .iter()
                .map(|(t, i)| (t.clone(), i.clone()))
                .unzip()
        };
        // First each aggregate's oldest pending row: which may go now.
        let all: Vec<&AggregateKey> = aggregates.iter().collect();
        let (types, ids) = keys(&all);
        let heads = wal.pending_of.query(client, &[&types, &ids, &1i64]).await?;
        let mut info = SweepInfo::default();
        let mut rows = Vec::with_capacity(heads.len());
        let mut going: Vec<&AggregateKey> = Vec::new();
        for row in heads {
            let key: AggregateKey = (row.try_get(1)?, row.try_get(2)?);
            let go = row.try_get::<_, bool>("eligible")? && !frozen.contains(&key);
            match go.then(|| aggregates.iter().find(|k| **k == key)).flatten() {
                Some(k) => going.push(k),
                None => rows.push(row),
            }
        }
        // Then those that may go, an even share of the batch each (one more than taken: an
        // aggregate that shows no more is complete).
        let per_aggregate = batch.per_aggregate(going.len());
        if !going.is_empty() {
            let limit = i64::try_from(per_aggregate.saturating_add(1)).unwrap_or(i64::MAX);
            let (types, ids) = keys(&going);
            rows.extend(
                wal.pending_of
                    .query(client, &[&types, &ids, &limit])
                    .await?,
            );
        }
        let mut pending: HashMap<AggregateKey, Vec<PendingRow>> = HashMap::new();
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
            // Frozen: the stream holds a row of it that may come first; only taken back when the
            // table has none.
            let share = if frozen.contains(key) {
                0
            } else {
                per_aggregate
            };
            for row in rows.iter().take(share) {
                let over = candidates.len() >= max_rows
                    || (!candidates.is_empty() && bytes.saturating_add(row.size) > max_bytes);
                if !row.eligible || over {
                    break;
                }
                bytes = bytes.saturating_add(row.size);
                candidates.push(Candidate {
                    transaction: None,
                    id: row.id,
                    aggregate: key.clone(),
                    xid: 0,
                    size: row.size,
                    content: None,
                });
                taken += 1;
            }
            if taken == rows.len() {
                info.complete.push(key.clone());
            }
        }
        let (mut taken, states, marked) = claim_in(client, wal, &mut candidates).await?;
        let grouping = group_candidates(&candidates, &mut taken.claimed, &states);
        // Read from the table in this transaction, every one is visible: none is carried.
        info.held.extend(grouping.defer.iter().cloned());
        info.held
            .extend(grouping.carry.iter().map(|c| c.aggregate.clone()));
        claim.fill(grouping.groups, marked.len(), marked);
        claim.full = candidates.len() >= max_rows;
        let record = WalRecord {
            statements: wal,
            tids: taken.tids,
            defer: grouping.defer,
            undefer: info.cleared.clone(),
        };
        info.served = round.aggregates;
        Ok((claim, record, info))
    }
}

/// The statements prepared on the store's connection (see [`WalStore::ready`]).
fn prepared(statements: &Option<((u64, bool), WalStatements)>) -> Result<&WalStatements> {
    statements.as_ref().map(|(_, s)| s).ok_or_else(|| {
        crate::error::Error::database_state("the connection holding a claimed batch closed")
    })
}

struct PendingRow {
    id: Uuid,
    eligible: bool,
    size: usize,
}

/// Claims `candidates` inside the open transaction: their grouping and the ids marked.
async fn claim_in(
    client: &Client,
    wal: &WalStatements,
    candidates: &mut [Candidate],
) -> Result<(Taken, HashMap<Uuid, RowState>, Vec<Uuid>)> {
    if candidates.is_empty() {
        return Ok((Taken::default(), HashMap::new(), Vec::new()));
    }
    let mut taken = Taken::default();
    // Rows whose content the stream carried are locked without reading it; read are the others,
    // and those changed since the streamed transaction.
    let mut read: Vec<Uuid> = Vec::with_capacity(candidates.len());
    match &wal.lock_streamed {
        Some(lock) if candidates.iter().any(|c| c.content.is_some()) => {
            let mut streamed: HashMap<Uuid, (u32, Streamed)> = HashMap::new();
            // Found by seq (see lock_streamed.sql), in stream order: close seqs probed together.
            let (mut seqs, mut ids) = (Vec::new(), Vec::new());
            for c in candidates.iter_mut() {
                match c.content.take() {
                    Some(content) if c.xid != 0 => {
                        seqs.push(content.0.seq);
                        ids.push(c.id);
                        streamed.insert(c.id, (c.xid, content));
                    }
                    _ => read.push(c.id),
                }
            }
            for row in lock.query(client, &[&seqs, &ids]).await? {
                let id: Uuid = row.try_get("id")?;
                if let Some(prev) = row.try_get::<_, Option<Uuid>>("prev")? {
                    taken.prev.insert(id, prev);
                }
                let xmin: i64 = row.try_get("xmin")?;
                let rewritten: bool = row.try_get("rewritten")?;
                let content = streamed.remove(&id).and_then(|(xid, content)| {
                    let same = !rewritten && u32::try_from(xmin).is_ok_and(|x| x == xid);
                    same.then_some(content)
                });
                match content {
                    Some(content) => {
                        taken.tids.insert(id, row.try_get("tid")?);
                        taken.claimed.insert(id, Arc::unwrap_or_clone(content.0));
                    }
                    None => read.push(id),
                }
            }
        }
        _ => read.extend(candidates.iter().map(|c| c.id)),
    }
    tracing::debug!(
        from_stream = taken.claimed.len(),
        from_table = read.len(),
        "rows claimed by id"
    );
    if !read.is_empty() {
        taken.add(read_claim(client, &wal.claim_ids, &[&read]).await?);
    }
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
    // Where each streamed row stands in its transaction: the stream's numbering (the table's
    // rows of a transaction published before are deleted with `--wal-marking delete`).
    for c in candidates.iter() {
        if let (Some(t), Some(event)) = (c.transaction, taken.claimed.get_mut(&c.id)) {
            event.transaction = Some(t);
        }
    }
    // The table is the truth: a row whose aggregate is not the one its candidate carries (the
    // stream's copy, or what the sweep read a statement ago) was changed after its insert, and
    // was decided on for the wrong aggregate. It is not published by this claim (it stays
    // pending: marked rows are put back at the commit); both aggregates go to the table, which
    // publishes it in the order of the aggregate it is in now.
    for c in candidates.iter() {
        let Some(event) = taken.claimed.get(&c.id) else {
            continue;
        };
        if event.aggregate_type != c.aggregate.0 || event.aggregate_id != c.aggregate.1 {
            let to = (event.aggregate_type.clone(), event.aggregate_id.clone());
            tracing::warn!(
                event_id = %c.id,
                aggregate_id = %c.aggregate.1,
                moved_to = %to.1,
                "an event's aggregate changed after its insert; it goes out from the table in its new aggregate's order"
            );
            taken.claimed.remove(&c.id);
            taken.tids.remove(&c.id);
            taken.prev.remove(&c.id);
            states.insert(c.id, RowState::Moved(to));
        }
    }
    Ok((taken, states, marked))
}

/// Rows a claim by id took: their events, and where they are (see [`Claim`]'s `tids`).
#[derive(Default)]
struct Taken {
    claimed: HashMap<Uuid, OutboxEvent>,
    tids: HashMap<Uuid, String>,
    /// Rows with an older pending row of their aggregate: its id (see lock_ids.sql).
    prev: HashMap<Uuid, Uuid>,
}

impl Taken {
    fn add(&mut self, rows: Vec<ClaimedRow>) {
        self.claimed.reserve(rows.len());
        for mut row in rows {
            let tid = row.tid.take();
            let prev = row.prev.take();
            if let Some(event) = row.into_event() {
                if let Some(tid) = tid {
                    self.tids.insert(event.id, tid);
                }
                if let Some(prev) = prev {
                    self.prev.insert(event.id, prev);
                }
                self.claimed.insert(event.id, event);
            }
        }
    }
}

/// What became of a candidate the claim did not take.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RowState {
    /// Still to publish, but held elsewhere or not eligible now.
    Pending,
    /// Pending in another aggregate than the candidate's (changed after its insert).
    Moved(AggregateKey),
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
                Some(RowState::Moved(to)) => {
                    stopped.insert(&c.aggregate);
                    out.defer.push(c.aggregate.clone());
                    out.defer.push(to.clone());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(aggregate: &str) -> Candidate {
        Candidate {
            transaction: None,
            id: Uuid::new_v4(),
            aggregate: ("order".into(), aggregate.into()),
            xid: 0,
            size: 0,
            content: None,
        }
    }

    fn event(c: &Candidate) -> OutboxEvent {
        OutboxEvent {
            id: c.id,
            ..OutboxEvent::sample(&c.aggregate.1)
        }
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
        .into_iter()
        .collect();
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
