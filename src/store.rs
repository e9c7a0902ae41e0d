//! The relay's PostgreSQL side: claiming, marking and failing rows. The relay loop sees
//! [`Claim`] and [`OutboxEvent`], never SQL.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};
use uuid::Uuid;

use crate::config::Ordering;
use crate::error::Result;
use crate::event::OutboxEvent;

/// The two ordered claims differ in how they find heads; followers and the mark are shared.
const CLAIM_ORDERED: &str = concat!(
    include_str!("../sql/queries/claim_ordered.sql"),
    include_str!("../sql/queries/claim_ordered_rest.sql")
);
const CLAIM_ORDERED_SPARSE: &str = concat!(
    include_str!("../sql/queries/claim_ordered_sparse.sql"),
    include_str!("../sql/queries/claim_ordered_rest.sql")
);
const CLAIM_UNORDERED: &str = include_str!("../sql/queries/claim_unordered.sql");
const RELEASE: &str = include_str!("../sql/queries/release.sql");
const RECORD_FAILURES: &str = include_str!("../sql/queries/record_failures.sql");
const WORKER_SESSION: &str = include_str!("../sql/queries/worker_session.sql");

struct Statements {
    claim_ordered: Statement,
    claim_ordered_sparse: Statement,
    claim_unordered: Statement,
    release: Statement,
    record_failures: Statement,
}

/// The worker connection with its prepared statements; reconnects lazily after a loss.
pub(crate) struct Store {
    url: String,
    conn: Option<(Client, Statements)>,
    /// A claim's transaction was left open (its batch failed half-way); roll it back first.
    in_tx: bool,
    /// Find ordered heads by hopping from aggregate to aggregate instead of walking the pending
    /// rows in seq order: cheaper while the backlog has fewer aggregates than the batch size.
    sparse: bool,
}

/// A failed publish of one row, as the relay decided to record it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub id: Uuid,
    pub error: String,
    /// Retry no sooner than this from now.
    pub retry_in: Duration,
    /// Give up: the row goes to `outbox_dead_letters`.
    pub dead_letter: bool,
    /// Counts against `max_attempts` (broker-wide trouble does not).
    pub spend_attempt: bool,
}

/// Rows claimed (and already marked processed) in one open transaction, grouped so that each
/// group must be published in order (one aggregate per group; single rows with `Ordering::None`).
/// [`Claim::finish`] puts back what was not published and commits; dropping it without finishing
/// leaves the transaction to be rolled back by the next claim (or by a lost connection).
pub(crate) struct Claim<'a> {
    client: &'a Client,
    statements: &'a Statements,
    in_tx: &'a mut bool,
    pub groups: Vec<Vec<OutboxEvent>>,
    /// Rows locked, including followers that are not eligible now.
    pub claimed: usize,
    /// The claim stopped at a limit (the batch size or an aggregate's share of it): more rows are
    /// probably waiting, so the relay should claim again at once.
    pub full: bool,
    /// Rows the claim marked processed: the eligible ones.
    marked: Vec<Uuid>,
}

impl Store {
    pub fn new(url: String) -> Self {
        Store {
            url,
            conn: None,
            in_tx: false,
            sparse: false,
        }
    }

    /// Drops the connection after an error that may have broken it; the next claim reconnects.
    pub fn reset(&mut self) {
        self.conn = None;
        self.in_tx = false;
    }

    pub fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(|(c, _)| !c.is_closed())
    }

    /// A new worker connection with its session settings and prepared statements.
    async fn open(url: &str) -> Result<(Client, Statements)> {
        let client = crate::db::connect(url, "outbox-relay").await?;
        client.batch_execute(WORKER_SESSION).await?;
        let statements = Statements {
            claim_ordered: client.prepare(CLAIM_ORDERED).await?,
            claim_ordered_sparse: client.prepare(CLAIM_ORDERED_SPARSE).await?,
            claim_unordered: client.prepare(CLAIM_UNORDERED).await?,
            release: client.prepare(RELEASE).await?,
            record_failures: client.prepare(RECORD_FAILURES).await?,
        };
        Ok((client, statements))
    }

    /// Opens a transaction and claims up to `limit` rows with `FOR UPDATE SKIP LOCKED`, marking
    /// the eligible ones processed in the same statement. One round trip: BEGIN and the claim are
    /// sent together.
    pub async fn claim(&mut self, ordering: Ordering, limit: usize) -> Result<Claim<'_>> {
        if !self.is_connected() {
            self.reset();
        }
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => Self::open(&self.url).await?,
        };
        let (client, statements) = &*self.conn.insert(conn);
        if self.in_tx {
            client.batch_execute("ROLLBACK").await?;
            self.in_tx = false;
        }
        let sparse = self.sparse && ordering == Ordering::Aggregate;
        let statement = match ordering {
            Ordering::None => &statements.claim_unordered,
            Ordering::Aggregate if sparse => &statements.claim_ordered_sparse,
            Ordering::Aggregate => &statements.claim_ordered,
        };
        let limit_i64 = limit as i64;
        let params: [&(dyn ToSql + Sync); 1] = [&limit_i64];
        self.in_tx = true;
        let (begun, rows) = futures::join!(
            client.batch_execute("BEGIN"),
            client.query(statement, &params)
        );
        let rows = match (begun, rows) {
            (Ok(()), rows) => rows?,
            (Err(e), Ok(rows)) => {
                // Cannot happen short of a server bug (BEGIN fails only where the claim would
                // too), but if it did the claim ran in its own transaction and committed its
                // marks: put them back before reporting the error, so no row is lost.
                let ids: Vec<Uuid> = rows.iter().map(|r| r.get("id")).collect();
                self.in_tx = false;
                client.execute(&statements.release, &[&ids]).await?;
                return Err(e.into());
            }
            (Err(e), Err(_)) => return Err(e.into()),
        };
        let mut events: Vec<OutboxEvent> = rows.iter().map(event_from_row).collect();
        events.sort_by_key(|e| e.seq);
        let claimed = events.len();
        let marked: Vec<Uuid> = events.iter().filter(|e| e.eligible).map(|e| e.id).collect();
        let (groups, full) = match ordering {
            Ordering::None => (
                events.into_iter().map(|e| vec![e]).collect(),
                claimed >= limit,
            ),
            Ordering::Aggregate => {
                let (groups, deepest) = group_by_aggregate(events);
                let heads = groups.len();
                // The statement gives each aggregate at most this many followers (its share of
                // the room left after the heads); one that got them all probably has more.
                let share = limit.saturating_sub(1) / heads.max(1);
                let full = claimed >= limit || (share > 0 && deepest > share);
                // A full batch with fewer heads than it could take: a deep backlog in few
                // aggregates, where walking the seq index for heads visits every pending row.
                // Hopping between aggregates is cheaper there, until either changes.
                self.sparse = full && heads < limit;
                (groups, full)
            }
        };
        Ok(Claim {
            client,
            statements,
            in_tx: &mut self.in_tx,
            groups,
            claimed,
            full,
            marked,
        })
    }
}

/// Claimed rows (in seq order) grouped by aggregate. The claim holds the head of every aggregate
/// it has rows of, so an aggregate's first row is its head; its followers come next, up to the
/// first one that is not eligible (waiting for a retry or dead-lettered): publishing past it would
/// break the order. Also returns the most rows claimed for one aggregate.
fn group_by_aggregate(events: Vec<OutboxEvent>) -> (Vec<Vec<OutboxEvent>>, usize) {
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    let mut groups: Vec<Vec<OutboxEvent>> = Vec::new();
    // Per group: rows claimed, and whether an ineligible row stopped it.
    let mut claimed: Vec<(usize, bool)> = Vec::new();
    for event in events {
        let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
        match index.entry(key) {
            Entry::Vacant(slot) => {
                slot.insert(groups.len());
                groups.push(vec![event]);
                claimed.push((1, false));
            }
            Entry::Occupied(slot) => {
                let i = *slot.get();
                let (rows, stopped) = &mut claimed[i];
                *rows += 1;
                *stopped |= !event.eligible;
                if !*stopped {
                    groups[i].push(event);
                }
            }
        }
    }
    let deepest = claimed.iter().map(|&(rows, _)| rows).max().unwrap_or(0);
    (groups, deepest)
}

fn event_from_row(row: &Row) -> OutboxEvent {
    let headers: Option<serde_json::Value> = row.get("headers");
    OutboxEvent {
        id: row.get("id"),
        seq: row.get("seq"),
        aggregate_type: row.get("aggregate_type"),
        aggregate_id: row.get("aggregate_id"),
        event_type: row.get("event_type"),
        payload: row.get("payload"),
        headers: headers_from_json(headers),
        attempts: row.get("attempts"),
        created_at: row.get("created_at"),
        eligible: row.get("eligible"),
    }
}

/// `headers` is a JSON object of strings; other value types are sent as their JSON text.
fn headers_from_json(value: Option<serde_json::Value>) -> BTreeMap<String, String> {
    match value {
        Some(serde_json::Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

impl Claim<'_> {
    /// Puts back the marked rows that were not published, records the failures (one statement
    /// each, only when needed) and commits.
    pub async fn finish(self, published: &[Uuid], failures: &[Failure]) -> Result<()> {
        let done: HashSet<Uuid> = published
            .iter()
            .chain(failures.iter().map(|f| &f.id))
            .copied()
            .collect();
        let held_back: Vec<Uuid> = self
            .marked
            .iter()
            .filter(|id| !done.contains(id))
            .copied()
            .collect();
        if !held_back.is_empty() {
            self.client
                .execute(&self.statements.release, &[&held_back])
                .await?;
        }
        if !failures.is_empty() {
            let ids: Vec<Uuid> = failures.iter().map(|f| f.id).collect();
            let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
            let delays: Vec<i64> = failures
                .iter()
                .map(|f| f.retry_in.as_millis().min(i64::MAX as u128) as i64)
                .collect();
            let dead: Vec<bool> = failures.iter().map(|f| f.dead_letter).collect();
            let spent: Vec<i32> = failures
                .iter()
                .map(|f| i32::from(f.spend_attempt))
                .collect();
            self.client
                .execute(
                    &self.statements.record_failures,
                    &[&ids, &errors, &delays, &dead, &spent],
                )
                .await?;
        }
        self.end("COMMIT").await
    }

    /// Undoes the claim: every row is pending again, no attempt spent.
    pub async fn rollback(self) -> Result<()> {
        self.end("ROLLBACK").await
    }

    async fn end(self, command: &str) -> Result<()> {
        self.client.batch_execute(command).await?;
        *self.in_tx = false;
        Ok(())
    }
}
