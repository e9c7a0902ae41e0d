//! The claim by id: streamed candidates claimed in a transaction (their content used where the
//! row is unchanged since), what became of the others, and the claim left open between the
//! pipeline's steps ([`WalOpen`]).

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

use tokio_postgres::Client;
use uuid::Uuid;

use super::states::RowState;
use super::{WalRecord, WalStatements, WalStore};
use crate::error::Result;
use crate::event::{AggregateKey, OutboxEvent};
use crate::source::store::{read_claim, Claim, ClaimedRow, OpenClaim};
use crate::source::wal::pipeline::{Candidate, Found, Streamed};

const INSERT_POSITION: &str = include_str!("../../../../sql/queries/wal/insert_position.sql");

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
    pub(super) tids: HashMap<Uuid, String>,
}

impl WalStore {
    /// A claim left open by [`WalStore::claim_ids`], to publish and record, with what to record
    /// besides its outcome.
    pub fn resume(
        &mut self,
        open: WalOpen,
        defer: Vec<AggregateKey>,
    ) -> Result<(Claim<'_>, WalRecord<'_>)> {
        let (claim, statements) = self.store.resume(open.open)?;
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
        let (mut claim, wal) = self.store.begin().await?;
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
}

/// Claims `candidates` inside the open transaction: their grouping and the ids marked.
pub(super) async fn claim_in(
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
pub(super) struct Taken {
    pub(super) claimed: HashMap<Uuid, OutboxEvent>,
    pub(super) tids: HashMap<Uuid, String>,
    /// Rows with an older pending row of their aggregate: its id (see lock_ids.sql).
    pub(super) prev: HashMap<Uuid, Uuid>,
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
