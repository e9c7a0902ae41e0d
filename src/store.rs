//! The relay's PostgreSQL side: claiming, marking and failing rows. The relay loop sees
//! [`Claim`] and [`OutboxEvent`], never SQL.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio_postgres::{Client, Row, Statement, Transaction};
use uuid::Uuid;

use crate::config::Ordering;
use crate::error::Result;
use crate::event::OutboxEvent;

const CLAIM_HEADS: &str = include_str!("../sql/queries/claim_heads.sql");
const CLAIM_FOLLOWERS: &str = include_str!("../sql/queries/claim_followers.sql");
const CLAIM_UNORDERED: &str = include_str!("../sql/queries/claim_unordered.sql");
const MARK_PUBLISHED: &str = include_str!("../sql/queries/mark_published.sql");
const RECORD_FAILURES: &str = include_str!("../sql/queries/record_failures.sql");
const WORKER_SESSION: &str = include_str!("../sql/queries/worker_session.sql");

struct Statements {
    claim_heads: Statement,
    claim_followers: Statement,
    claim_unordered: Statement,
    mark_published: Statement,
    record_failures: Statement,
}

/// The worker connection with its prepared statements; reconnects lazily after a loss.
pub(crate) struct Store {
    url: String,
    conn: Option<(Client, Statements)>,
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

/// Rows claimed in one open transaction, grouped so that each group must be published in order
/// (one aggregate per group; single rows with `Ordering::None`).
pub(crate) struct Claim<'a> {
    tx: Transaction<'a>,
    statements: &'a Statements,
    pub groups: Vec<Vec<OutboxEvent>>,
    /// Rows locked, including followers that are not eligible now.
    pub claimed: usize,
}

impl Store {
    pub fn new(url: String) -> Self {
        Store { url, conn: None }
    }

    /// Drops the connection after an error that may have broken it; the next claim reconnects.
    pub fn reset(&mut self) {
        self.conn = None;
    }

    pub fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(|(c, _)| !c.is_closed())
    }

    async fn connection(&mut self) -> Result<&mut (Client, Statements)> {
        if !self.is_connected() {
            self.conn = None;
        }
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => Self::open(&self.url).await?,
        };
        Ok(self.conn.insert(conn))
    }

    /// A new worker connection with its session settings and prepared statements.
    async fn open(url: &str) -> Result<(Client, Statements)> {
        let client = crate::db::connect(url, "outbox-relay").await?;
        client.batch_execute(WORKER_SESSION).await?;
        let statements = Statements {
            claim_heads: client.prepare(CLAIM_HEADS).await?,
            claim_followers: client.prepare(CLAIM_FOLLOWERS).await?,
            claim_unordered: client.prepare(CLAIM_UNORDERED).await?,
            mark_published: client.prepare(MARK_PUBLISHED).await?,
            record_failures: client.prepare(RECORD_FAILURES).await?,
        };
        Ok((client, statements))
    }

    /// Opens a transaction and claims up to `limit` rows with `FOR UPDATE SKIP LOCKED`.
    pub async fn claim(&mut self, ordering: Ordering, limit: usize) -> Result<Claim<'_>> {
        let (client, statements) = self.connection().await?;
        let tx = client.transaction().await?;
        let limit_i64 = limit as i64;
        let (groups, claimed) = match ordering {
            Ordering::None => {
                let rows = tx.query(&statements.claim_unordered, &[&limit_i64]).await?;
                let groups: Vec<Vec<OutboxEvent>> =
                    rows.iter().map(|r| vec![event_from_row(r)]).collect();
                let claimed = groups.len();
                (groups, claimed)
            }
            Ordering::Aggregate => {
                let heads: Vec<OutboxEvent> = tx
                    .query(&statements.claim_heads, &[&limit_i64])
                    .await?
                    .iter()
                    .map(event_from_row)
                    .collect();
                let mut claimed = heads.len();
                let room = limit.saturating_sub(heads.len());
                let followers = if room > 0 && !heads.is_empty() {
                    let types: Vec<&str> =
                        heads.iter().map(|e| e.aggregate_type.as_str()).collect();
                    let ids: Vec<&str> = heads.iter().map(|e| e.aggregate_id.as_str()).collect();
                    let seqs: Vec<i64> = heads.iter().map(|e| e.seq).collect();
                    let rows = tx
                        .query(
                            &statements.claim_followers,
                            &[&types, &ids, &seqs, &(room as i64)],
                        )
                        .await?;
                    claimed += rows.len();
                    rows.iter().map(event_from_row).collect()
                } else {
                    Vec::new()
                };
                (group_by_aggregate(heads, followers), claimed)
            }
        };
        Ok(Claim {
            tx,
            statements,
            groups,
            claimed,
        })
    }
}

/// Heads in seq order, each followed by its aggregate's followers up to the first one that is not
/// eligible (waiting for a retry or dead-lettered): publishing past it would break the order.
fn group_by_aggregate(
    heads: Vec<OutboxEvent>,
    followers: Vec<OutboxEvent>,
) -> Vec<Vec<OutboxEvent>> {
    let mut index: HashMap<(String, String), usize> = HashMap::with_capacity(heads.len());
    let mut groups: Vec<Vec<OutboxEvent>> = Vec::with_capacity(heads.len());
    let mut stopped = vec![false; heads.len()];
    for head in heads {
        index.insert(
            (head.aggregate_type.clone(), head.aggregate_id.clone()),
            groups.len(),
        );
        groups.push(vec![head]);
    }
    for f in followers {
        let key = (f.aggregate_type.clone(), f.aggregate_id.clone());
        let Some(&i) = index.get(&key) else { continue };
        if stopped[i] || !f.eligible {
            stopped[i] = true;
            continue;
        }
        groups[i].push(f);
    }
    groups
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
    /// Marks the acknowledged rows processed (one statement).
    pub async fn mark_published(&self, ids: &[Uuid]) -> Result<()> {
        if !ids.is_empty() {
            self.tx
                .execute(&self.statements.mark_published, &[&ids])
                .await?;
        }
        Ok(())
    }

    /// Records attempts, errors, retry times and dead letters (one statement).
    pub async fn record_failures(&self, failures: &[Failure]) -> Result<()> {
        if failures.is_empty() {
            return Ok(());
        }
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
        self.tx
            .execute(
                &self.statements.record_failures,
                &[&ids, &errors, &delays, &dead, &spent],
            )
            .await?;
        Ok(())
    }

    pub async fn commit(self) -> Result<()> {
        Ok(self.tx.commit().await?)
    }

    pub async fn rollback(self) -> Result<()> {
        Ok(self.tx.rollback().await?)
    }
}
