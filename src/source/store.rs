//! The relay's PostgreSQL side: claiming, marking and failing rows. The relay loop sees
//! [`Claim`] and [`OutboxEvent`], never SQL.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, Row, Statement};
use uuid::Uuid;

use crate::config::Ordering;
use crate::error::Result;
use crate::event::{AggregateKey, OutboxEvent, TransactionPosition};
use crate::schema::Schema;
use crate::timestamp::Timestamp;

const CLAIM_ORDERED: &str = include_str!("../../sql/queries/table/claim_ordered.sql");
const CLAIM_UNORDERED: &str = include_str!("../../sql/queries/table/claim_unordered.sql");
const CLAIM_HEADS: &str = include_str!("../../sql/queries/table/claim_heads.sql");
const RELEASE: &str = include_str!("../../sql/queries/table/release.sql");
const RECORD_FAILURES: &str = include_str!("../../sql/queries/table/record_failures.sql");
const WAKE: &str = include_str!("../../sql/queries/table/wake.sql");
const BEGIN_CLAIM: &str = include_str!("../../sql/queries/table/begin_claim.sql");
const TRANSACTIONS: &str = include_str!("../../sql/queries/table/transactions.sql");
const COMPLETE_TRANSACTIONS: &str =
    include_str!("../../sql/queries/table/complete_transactions.sql");

/// What [`Claim::complete_transactions`] found: rows taken that must wait behind an older row of
/// their aggregate outside the batch, transactions that could not all be taken, and those too
/// large for one atomic batch.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    pub blocked: HashSet<Uuid>,
    pub incomplete: HashSet<u64>,
    pub split: HashSet<u64>,
}

/// What a source knows of commit order beyond the claim's snapshot, asked about the rows an atomic
/// completion takes from the table. The wal source's stream brings a commit before it is visible
/// (behind a synchronous standby, a round trip): the completion's check for an older pending row
/// of the aggregate cannot see it, the stream's order can.
pub(crate) trait CommitOrder: Sync {
    /// Of the rows `taken` (id, aggregate as the table holds it), with `claimed` (the claim's
    /// rows): where the rows the source knows stand, and which taken rows must wait.
    fn taken(&self, claimed: &HashSet<Uuid>, taken: &[(Uuid, &AggregateKey)]) -> TakenOrder;
}

/// What [`CommitOrder::taken`] says.
#[derive(Debug, Default)]
pub(crate) struct TakenOrder {
    /// The places in the source's order of the taken rows it knows and of the claim's rows of
    /// their aggregates: a taken row joins its group by it (by seq where any is missing).
    pub position: HashMap<Uuid, u64>,
    /// Taken rows that an earlier commit of their aggregate, neither in the claim nor taken, and
    /// not published, must precede (or whose place the source cannot tell yet).
    pub wait: HashSet<Uuid>,
}

/// A statement of the relay: prepared once per connection, or sent unnamed (parsed and planned
/// each time) where a transaction pooler does not keep prepared statements between transactions.
pub(crate) enum Stmt {
    Prepared(Statement),
    Unnamed(&'static str, &'static [Type]),
}

impl Stmt {
    pub(crate) async fn new(
        client: &Client,
        sql: &'static str,
        types: &'static [Type],
        prepare: bool,
    ) -> Result<Stmt> {
        Ok(if prepare {
            Stmt::Prepared(client.prepare_typed(sql, types).await?)
        } else {
            Stmt::Unnamed(sql, types)
        })
    }

    pub(crate) async fn query_raw(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<tokio_postgres::RowStream, tokio_postgres::Error> {
        match self {
            Stmt::Prepared(statement) => client.query_raw(statement, params.iter().copied()).await,
            Stmt::Unnamed(sql, types) => {
                let typed = params.iter().copied().zip(types.iter().cloned());
                client.query_typed_raw(sql, typed).await
            }
        }
    }

    pub(crate) async fn execute(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        match self {
            Stmt::Prepared(statement) => client.execute(statement, params).await,
            Stmt::Unnamed(sql, types) => {
                let typed: Vec<(&(dyn ToSql + Sync), Type)> =
                    params.iter().copied().zip(types.iter().cloned()).collect();
                client.execute_typed(sql, &typed).await
            }
        }
    }
}

const CLAIM_TYPES: &[Type] = &[Type::INT8, Type::INT8];
/// `claim_ordered.sql` also takes whether to find heads by hopping between aggregates.
const CLAIM_ORDERED_TYPES: &[Type] = &[Type::INT8, Type::INT8, Type::BOOL];
const RELEASE_TYPES: &[Type] = &[Type::UUID_ARRAY];
const TRANSACTIONS_TYPES: &[Type] = &[
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
];
const COMPLETE_TRANSACTIONS_TYPES: &[Type] = &[
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::UUID_ARRAY,
    Type::INT8,
    Type::BOOL,
    Type::INT8_ARRAY,
    Type::INT8,
];
const RECORD_FAILURES_TYPES: &[Type] = &[
    Type::UUID_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::BOOL_ARRAY,
    Type::INT4_ARRAY,
];

struct Statements {
    claim_ordered: Stmt,
    claim_unordered: Stmt,
    claim_heads: Stmt,
    release: Stmt,
    record_failures: Stmt,
    /// `transactions.sql`, with what earlier batches learnt of the transactions they published
    /// part of.
    transactions: (Stmt, std::sync::Mutex<Learnt>),
    /// `complete_transactions.sql` (`--transactions atomic`).
    complete_transactions: Stmt,
}

/// What the relay learnt of transactions a batch published part of, so that the next batch of
/// one asks less of the table: values a restart loses and the table gives again (it holds a
/// transaction's rows until all are published); at most [`LEARNT_MAX`] transactions.
#[derive(Default)]
pub(crate) struct Learnt(HashMap<u64, Known>);

#[derive(Debug, Clone, Copy)]
enum Known {
    /// Its rows are consecutive seqs from `first`: an event's place is its seq's distance from
    /// it; nothing to ask.
    Run { first: i64, events: u64 },
    /// The place of one of its rows (`seq`), which the next batch counts from.
    At { seq: i64, index: u64, events: u64 },
}

/// Transactions remembered at most by [`Learnt`] (forgotten all at once past it).
const LEARNT_MAX: usize = 4096;

/// How the worker connection talks to PostgreSQL: what a transaction starts with and whether
/// statements are prepared.
#[derive(Clone)]
pub(crate) struct Session {
    /// `BEGIN` with the transaction-local settings (search_path for `--schema`, planner
    /// settings): nothing stays on the connection after the transaction, so a transaction pooler
    /// can share it.
    begin: String,
    /// `--schema` applied to one statement run outside a claim.
    wrap: Option<String>,
    prepare: bool,
}

impl Session {
    pub fn new(schema: Option<&Schema>, prepare: bool) -> Session {
        let path = schema.map(|s| format!("{};\n", s.set_local_search_path()));
        // After the planner settings: the order of `SET LOCAL`s does not matter.
        let begin = match &path {
            Some(path) => format!("{BEGIN_CLAIM}{path}"),
            None => BEGIN_CLAIM.to_string(),
        };
        Session {
            begin,
            wrap: path,
            prepare,
        }
    }

    /// This session with `sql` (transaction-local settings of the caller's) also run at the
    /// start of every transaction, after the claim's own.
    pub fn begin_with(mut self, sql: &str) -> Session {
        self.begin.push_str(sql);
        self
    }

    /// `sql` (a statement that needs the outbox's schema) as a batch of its own.
    fn batch(&self, sql: &str) -> String {
        match &self.wrap {
            Some(path) => format!("BEGIN;\n{path}{sql};\nCOMMIT"),
            None => sql.to_string(),
        }
    }
}

/// [`Store::ready`] with a store's fields borrowed apart (the connection's borrow lives on in the
/// claim while the others are used again).
macro_rules! ready {
    ($store:expr) => {
        Store::ready(
            &mut $store.conn,
            &mut $store.in_tx,
            &$store.url,
            &$store.session,
            &mut $store.generation,
        )
    };
}

/// The worker connection with its statements; reconnects lazily after a loss.
pub(crate) struct Store {
    url: String,
    session: Session,
    conn: Option<(Client, Statements)>,
    /// A claim's transaction was left open (its batch failed half-way); roll it back first.
    in_tx: bool,
    /// Find ordered heads by hopping from aggregate to aggregate instead of walking the pending
    /// rows in seq order: cheaper while the backlog has fewer aggregates than the batch size.
    sparse: bool,
    /// Rows to claim at most next time, below the batch size after a claim over the byte budget.
    limit_hint: usize,
    /// Counts the connections opened: statements another module prepared on the connection stay
    /// valid while it is the same.
    generation: u64,
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
    /// Its groups keep per-aggregate order (false: `--ordering none`, each event a group).
    pub ordered: bool,
}

impl Store {
    pub fn new(url: String, session: Session) -> Self {
        Store {
            url,
            session,
            conn: None,
            in_tx: false,
            sparse: false,
            limit_hint: usize::MAX,
            generation: 0,
        }
    }

    /// From now on sends statements unnamed (see [`crate::error::Error::is_prepared_statement_lost`]).
    pub fn stop_preparing(&mut self) {
        self.session.prepare = false;
        self.reset();
    }

    /// Drops the connection after an error that may have broken it; the next claim reconnects.
    pub fn reset(&mut self) {
        self.conn = None;
        self.in_tx = false;
    }

    /// At a shutdown that cannot wait for the work in hand (a statement waiting for a lock, a
    /// server that does not answer): asks the server to cancel what the connection runs (so that
    /// it does not go on holding the claim's row locks, or waiting, after the relay is gone),
    /// then drops it. Bounded.
    pub async fn cancel_and_reset(&mut self) {
        if let Some((client, _)) = &self.conn {
            let token = client.cancel_token();
            match crate::stop::last_words(crate::db::cancel(&self.url, &token)).await {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "cancelling a worker connection's statement failed")
                }
                None => tracing::debug!("cancelling a worker connection's statement timed out"),
            }
        }
        self.reset();
    }

    /// A new worker connection with its statements. No session state: settings are per
    /// transaction (see `begin_claim.sql`). Statements are prepared inside such a transaction, so
    /// that `--schema` resolves their tables.
    async fn open(url: &str, session: &Session) -> Result<(Client, Statements)> {
        let client = crate::db::connect(url, "outbox-relay").await?;
        let prepare = session.prepare;
        // In the session's transaction, where `--schema` resolves the table.
        client.batch_execute(&session.begin).await?;
        let statements = Statements {
            claim_ordered: Stmt::new(&client, CLAIM_ORDERED, CLAIM_ORDERED_TYPES, prepare).await?,
            claim_unordered: Stmt::new(&client, CLAIM_UNORDERED, CLAIM_TYPES, prepare).await?,
            claim_heads: Stmt::new(&client, CLAIM_HEADS, CLAIM_TYPES, prepare).await?,
            release: Stmt::new(&client, RELEASE, RELEASE_TYPES, prepare).await?,
            record_failures: Stmt::new(&client, RECORD_FAILURES, RECORD_FAILURES_TYPES, prepare)
                .await?,
            transactions: (
                Stmt::new(&client, TRANSACTIONS, TRANSACTIONS_TYPES, prepare).await?,
                std::sync::Mutex::new(Learnt::default()),
            ),
            complete_transactions: Stmt::new(
                &client,
                COMPLETE_TRANSACTIONS,
                COMPLETE_TRANSACTIONS_TYPES,
                prepare,
            )
            .await?,
        };
        client.batch_execute("COMMIT").await?;
        Ok((client, statements))
    }

    /// The connection (a store's fields, borrowed apart), opened when there is none or it
    /// closed, with no transaction open.
    async fn ready<'c>(
        conn: &'c mut Option<(Client, Statements)>,
        in_tx: &mut bool,
        url: &str,
        session: &Session,
        generation: &mut u64,
    ) -> Result<(&'c Client, &'c Statements)> {
        if conn.as_ref().is_some_and(|(c, _)| c.is_closed()) {
            *conn = None;
            *in_tx = false;
        }
        let opened = match conn.take() {
            Some(opened) => opened,
            None => {
                let opened = Self::open(url, session).await?;
                *generation += 1;
                opened
            }
        };
        let (client, statements) = &*conn.insert(opened);
        if *in_tx {
            client.batch_execute("ROLLBACK").await?;
            *in_tx = false;
        }
        Ok((client, statements))
    }

    /// Opens a transaction and claims up to `limit` rows and about `max_bytes` of payload with
    /// `FOR UPDATE SKIP LOCKED`, marking the publishable ones processed in the same statement. One
    /// round trip: BEGIN and the claim are sent together. Rows are read as they arrive, so the
    /// relay holds each payload once.
    pub async fn claim(
        &mut self,
        ordering: Ordering,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Claim<'_>> {
        self.claim_with(ordering, false, limit, max_bytes).await
    }

    /// The first claim after a writer's notification at idle, in per-aggregate order: heads only
    /// (`claim_heads.sql`, half the cost of the full claim for the one event a notification
    /// usually brings). A claim that found any row is full: the full claim follows at once for the
    /// heads' followers and whatever came meanwhile.
    pub async fn claim_heads(&mut self, limit: usize, max_bytes: usize) -> Result<Claim<'_>> {
        self.claim_with(Ordering::Aggregate, true, limit, max_bytes)
            .await
    }

    async fn claim_with(
        &mut self,
        ordering: Ordering,
        heads: bool,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Claim<'_>> {
        let (client, statements) = ready!(self).await?;
        let sparse = self.sparse && ordering == Ordering::Aggregate;
        let statement = match ordering {
            Ordering::None => &statements.claim_unordered,
            Ordering::Aggregate if heads => &statements.claim_heads,
            Ordering::Aggregate => &statements.claim_ordered,
        };
        // After a claim cut by the byte budget, claim about twice what fit then: every candidate's
        // size is measured (big payloads as text), so candidates far past the budget cost time.
        // The limit grows back while claims fit.
        let limit = limit.min(self.limit_hint.max(1));
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let bytes_i64 = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 3] = [&limit_i64, &bytes_i64, &sparse];
        self.in_tx = true;
        let (begun, rows) = futures::join!(
            client.batch_execute(&self.session.begin),
            read_claim(client, statement, claim_params(&params, ordering, heads))
        );
        let rows = match (begun, rows) {
            (Ok(()), rows) => rows?,
            (Err(e), Ok(rows)) => {
                // Cannot happen short of a server bug (BEGIN fails only where the claim would
                // too), but if it did the claim ran in its own transaction and committed its
                // marks: put them back before reporting the error, so no row is lost.
                let ids: Vec<Uuid> = rows
                    .iter()
                    .filter_map(|r| r.event.as_ref().map(|e| e.id))
                    .collect();
                self.in_tx = false;
                statements.release.execute(client, &[&ids]).await?;
                return Err(e.into());
            }
            (Err(e), Err(_)) => return Err(e.into()),
        };
        let mut grouped = group_claim(rows, ordering, limit);
        if heads {
            grouped.full = grouped.claimed > 0;
        } else {
            self.limit_hint = grouped.next_limit;
            if ordering == Ordering::Aggregate {
                self.sparse = grouped.sparse;
            }
        }
        let Grouped {
            groups,
            claimed,
            full,
            marked,
            ..
        } = grouped;
        Ok(Claim {
            client,
            statements,
            in_tx: &mut self.in_tx,
            groups,
            claimed,
            full,
            marked,
            ordered: ordering == Ordering::Aggregate,
        })
    }

    /// The connection, opened if there is none, with no transaction open, and its generation
    /// (statements prepared on it by another module are valid while that stays the same); and
    /// how to prepare them: whether to, and the `BEGIN` that resolves the outbox's schema.
    pub async fn connection(&mut self) -> Result<(&Client, u64, bool, &str)> {
        let (client, _) = ready!(self).await?;
        Ok((
            client,
            self.generation,
            self.session.prepare,
            &self.session.begin,
        ))
    }

    /// Opens a claim's transaction (with the session's settings) for another module's claim
    /// statements: the claim starts empty ([`Claim::fill`]).
    pub async fn begin(&mut self) -> Result<Claim<'_>> {
        let (client, statements) = ready!(self).await?;
        self.in_tx = true;
        client.batch_execute(&self.session.begin).await?;
        Ok(Claim {
            client,
            statements,
            in_tx: &mut self.in_tx,
            groups: Vec::new(),
            claimed: 0,
            full: false,
            marked: Vec::new(),
            ordered: true,
        })
    }

    /// Wakes the other relays of this outbox (a stopping relay hands its backlog over). Best
    /// effort, bounded: the others poll on their fallback interval anyway.
    pub async fn wake_others(&self) {
        // The worker connection may be gone or inside a failed batch's transaction (a stop right
        // after an error is when the others are needed most): a connection of its own.
        let wake = async {
            let client = crate::db::connect(&self.url, "outbox-relay").await?;
            client.batch_execute(&self.session.batch(WAKE)).await?;
            Ok::<_, crate::error::Error>(())
        };
        match crate::stop::last_words(wake).await {
            Some(Ok(())) => tracing::debug!("woke the other relays"),
            Some(Err(e)) => tracing::warn!(error = %e, "could not wake the other relays"),
            None => tracing::warn!("waking the other relays timed out"),
        }
    }
}

/// One row of a claim, in seq order. `event` is `Some` for a row marked processed by the claim (to
/// be published now); `None` for a row claimed but not publishable now: not eligible (waiting for
/// its retry, dead-lettered) or held back (behind a row locked by another session, or by the byte
/// budget: `held`). An aggregate stops at its first row without an event.
pub(crate) struct ClaimedRow {
    seq: i64,
    aggregate: (String, String),
    event: Option<OutboxEvent>,
    held: bool,
    /// Where the row is (`ctid`), when the statement returns it (the wal source's lock by id):
    /// its delete after the acks finds the row there.
    pub tid: Option<String>,
    /// The nearest older pending row of its aggregate, when the statement returns it (the wal
    /// source's claims by id).
    pub prev: Option<Uuid>,
}

impl ClaimedRow {
    /// The event, for a row the claim marked (or locked) to publish now.
    pub fn into_event(self) -> Option<OutboxEvent> {
        self.event
    }
}

/// The claim's parameters (rows, bytes, hop) as the statement takes them: the unordered claim has
/// no heads to find, and the heads-only claim does not hop.
fn claim_params<'a>(
    params: &'a [&'a (dyn ToSql + Sync); 3],
    ordering: Ordering,
    heads: bool,
) -> &'a [&'a (dyn ToSql + Sync)] {
    match ordering {
        Ordering::Aggregate if !heads => &params[..],
        _ => &params[..2],
    }
}

pub(crate) async fn read_claim(
    client: &Client,
    statement: &Stmt,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<ClaimedRow>> {
    let stream = statement.query_raw(client, params).await?;
    futures::pin_mut!(stream);
    let mut rows = Vec::new();
    while let Some(row) = stream.try_next().await? {
        rows.push(claimed_row(&row)?);
    }
    Ok(rows)
}

/// What a claim's rows mean for publishing and for the next claim.
#[derive(Debug)]
struct Grouped {
    groups: Vec<Vec<OutboxEvent>>,
    /// Rows locked, publishable or not.
    claimed: usize,
    /// More rows are probably waiting: claim again at once.
    full: bool,
    /// Rows marked processed by the claim (the events of `groups`).
    marked: Vec<Uuid>,
    /// Rows to claim at most next time: after a claim cut by the byte budget about twice what fit
    /// then (every candidate's size is measured, big payloads as text, so candidates far past the
    /// budget cost time); growing back while claims fit.
    next_limit: usize,
    /// A full batch with fewer heads than it could take: a deep backlog in few aggregates, where
    /// walking the seq index for heads visits every pending row. Hopping between aggregates is
    /// cheaper there, until either changes.
    sparse: bool,
}

/// Groups the rows of a claim of at most `limit` rows (see [`group_by_aggregate`]).
fn group_claim(mut rows: Vec<ClaimedRow>, ordering: Ordering, limit: usize) -> Grouped {
    rows.sort_by_key(|r| r.seq);
    let claimed = rows.len();
    let held = rows.iter().any(|r| r.held);
    let marked: Vec<Uuid> = rows
        .iter()
        .filter_map(|r| r.event.as_ref().map(|e| e.id))
        .collect();
    let next_limit = if held {
        marked.len().saturating_mul(2).max(1)
    } else {
        limit.saturating_mul(2)
    };
    match ordering {
        Ordering::None => Grouped {
            groups: rows
                .into_iter()
                .filter_map(|r| r.event.map(|e| vec![e]))
                .collect(),
            claimed,
            full: claimed >= limit || held,
            marked,
            next_limit,
            sparse: false,
        },
        Ordering::Aggregate => {
            let (groups, heads, deepest) = group_by_aggregate(rows);
            // The statement gives each aggregate at most this many followers (its share of the
            // room left after the heads); one that got them all probably has more.
            let share = limit.saturating_sub(1) / heads.max(1);
            let full = claimed >= limit || (share > 0 && deepest > share) || held;
            Grouped {
                groups,
                claimed,
                full,
                marked,
                next_limit,
                sparse: full && heads < limit,
            }
        }
    }
}

/// Claimed rows (in seq order) grouped by aggregate: each aggregate's rows from its head up to its
/// first row that is not to be published now (publishing past it would break the order). Returns
/// the groups, the number of aggregates claimed and the most rows claimed for one aggregate.
fn group_by_aggregate(rows: Vec<ClaimedRow>) -> (Vec<Vec<OutboxEvent>>, usize, usize) {
    struct Aggregate {
        /// The group still taking rows; `None` once the aggregate stopped.
        group: Option<usize>,
        rows: usize,
    }
    let mut index: HashMap<(String, String), Aggregate> = HashMap::new();
    let mut groups: Vec<Vec<OutboxEvent>> = Vec::new();
    for row in rows {
        match index.entry(row.aggregate) {
            Entry::Vacant(slot) => {
                let group = row.event.map(|e| {
                    groups.push(vec![e]);
                    groups.len() - 1
                });
                slot.insert(Aggregate { group, rows: 1 });
            }
            Entry::Occupied(mut slot) => {
                let aggregate = slot.get_mut();
                aggregate.rows += 1;
                match (aggregate.group, row.event) {
                    (Some(g), Some(event)) => groups[g].push(event),
                    _ => aggregate.group = None,
                }
            }
        }
    }
    let deepest = index.values().map(|a| a.rows).max().unwrap_or(0);
    (groups, index.len(), deepest)
}

/// Reads one row of a claim statement. Never fails on what a row holds (rows are written by raw
/// SQL too): a value the relay cannot use becomes the event's `defect`, and the event is
/// dead-lettered with it.
fn claimed_row(row: &Row) -> Result<ClaimedRow> {
    let aggregate_type = text(row, "aggregate_type")?;
    let aggregate_id = text(row, "aggregate_id")?;
    let seq: i64 = row.try_get("seq")?;
    let eligible: bool = row.try_get("eligible")?;
    let held: bool = row.try_get("held")?;
    let aggregate = (
        aggregate_type.clone().unwrap_or_else(|e| e),
        aggregate_id.clone().unwrap_or_else(|e| e),
    );
    if !eligible {
        return Ok(ClaimedRow {
            seq,
            aggregate,
            event: None,
            held,
            tid: None,
            prev: None,
        });
    }
    let mut defects = Vec::new();
    let mut take = |field: Result<String, String>| {
        field.unwrap_or_else(|e| {
            defects.push(e);
            String::new()
        })
    };
    let aggregate_type = take(aggregate_type);
    let aggregate_id = take(aggregate_id);
    let event_type = take(text(row, "event_type")?);
    let (headers, header_defect) = headers_from_json(row.try_get::<_, Option<&str>>("headers")?);
    defects.extend(header_defect);
    let payload: Option<Payload> = row.try_get("payload")?;
    let event = OutboxEvent {
        id: row.try_get("id")?,
        seq,
        aggregate_type,
        aggregate_id,
        event_type,
        payload: payload.map(|p| p.0).unwrap_or_default(),
        headers,
        attempts: row.try_get::<_, Option<i32>>("attempts")?.unwrap_or(0),
        created_at: row
            .try_get::<_, Option<Timestamp>>("created_at")?
            .unwrap_or_else(Timestamp::now),
        defect: (!defects.is_empty()).then(|| defects.join("; ")),
        // Placed in its transaction before it is published (`Claim::read_transactions`).
        transaction: match row.try_get::<_, Option<&str>>("txid") {
            Ok(Some(txid)) => txid.parse::<u64>().ok().map(TransactionPosition::unplaced),
            _ => None,
        },
    };
    // Only `lock_ids.sql` reads it (its last column).
    let tid = match row.columns().last() {
        Some(c) if c.name() == "tid" => row.try_get("tid")?,
        _ => None,
    };
    // Only the wal source's claims by id read it (after `held`).
    let prev = match row.columns().iter().skip(11).any(|c| c.name() == "prev") {
        true => row.try_get("prev")?,
        false => None,
    };
    Ok(ClaimedRow {
        seq,
        aggregate,
        event: Some(event),
        held,
        tid,
        prev,
    })
}

/// A text column as UTF-8, or why it is not (a database in SQL_ASCII can hold any bytes).
fn text(row: &Row, column: &str) -> Result<Result<String, String>> {
    let raw: Option<RawText> = row.try_get(column)?;
    Ok(match raw {
        None => Ok(String::new()),
        Some(RawText(bytes)) => String::from_utf8(bytes).map_err(|e| {
            let lossy = String::from_utf8_lossy(e.as_bytes()).into_owned();
            format!("{column} {lossy:?} is not valid UTF-8")
        }),
    })
}

/// A text value's bytes, whatever they are.
struct RawText(Vec<u8>);

impl<'a> FromSql<'a> for RawText {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(RawText(raw.to_vec()))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME)
    }
}

/// The payload's JSON text as the bytes that are published: copied once out of the row.
struct Payload(Bytes);

impl<'a> FromSql<'a> for Payload {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Payload(Bytes::copy_from_slice(raw)))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::TEXT | Type::VARCHAR)
    }
}

/// `headers` must be a JSON object (or null); string values are sent as they are, other values as
/// their JSON text as the row holds it (a number keeps every digit: jsonb stores numbers as
/// `numeric`, and no float is taken on the way; objects and arrays without their spaces).
/// Anything else is a defect of the row: it is dead-lettered rather than published without the
/// headers its writer meant it to have.
pub(crate) fn headers_from_json(text: Option<&str>) -> (BTreeMap<String, String>, Option<String>) {
    use serde_json::value::RawValue;
    let Some(text) = text else {
        return (BTreeMap::new(), None);
    };
    let defect = |why: String| (BTreeMap::new(), Some(why));
    let raw: &RawValue = match serde_json::from_str(text) {
        Ok(raw) => raw,
        Err(e) => return defect(format!("headers cannot be read as JSON: {e}")),
    };
    let kind = match raw.get().as_bytes().first() {
        Some(b'{') => None,
        Some(b'n') => return (BTreeMap::new(), None),
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b't' | b'f') => Some("a boolean"),
        _ => Some("a number"),
    };
    if let Some(kind) = kind {
        return defect(format!("headers must be a JSON object, found {kind}"));
    }
    // A raw value borrows its text as written (escapes and all); names are read unescaped.
    match serde_json::from_str::<BTreeMap<String, &RawValue>>(raw.get()) {
        Ok(members) => (
            members
                .into_iter()
                .map(|(name, value)| (name, header_value(value)))
                .collect(),
            None,
        ),
        Err(e) => defect(format!("headers cannot be read as JSON: {e}")),
    }
}

/// One header value from its JSON text: a string unquoted, anything else as written, compact.
fn header_value(raw: &serde_json::value::RawValue) -> String {
    let text = raw.get();
    if text.starts_with('"') {
        // Valid JSON (the parser checked it), so this holds.
        return serde_json::from_str(text).unwrap_or_else(|_| text.to_owned());
    }
    compact_json(text)
}

/// `text` (valid JSON) without the whitespace between its tokens; strings and numbers unchanged.
fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}

/// The events a batch published whose transaction it did not publish whole (its other events
/// went in other batches, or are not published yet), and those transactions (their `txid`s). The
/// wal source, which deletes what it publishes, keeps these rows in the table (marked) until the
/// whole transaction is published: a transaction's count is read from the table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Split {
    /// The published events to keep (marked): those of split transactions that are not runs.
    pub ids: Vec<Uuid>,
    /// Every split transaction.
    pub txids: Vec<u64>,
    /// The split transactions of consecutive seqs: (txid, first seq, count), kept instead of
    /// their rows.
    pub runs: Vec<(u64, i64, u64)>,
}

/// The transactions of a batch whose rows are consecutive seqs: txid -> (first seq, count).
pub(crate) type Runs = HashMap<u64, (i64, u64)>;

/// More statements of a batch's transaction, after its outcome is recorded and before its commit.
pub(crate) trait BeforeCommit {
    /// `published`: the events acked; `split`: those of them whose transaction is not published
    /// whole.
    fn run(
        self,
        client: &Client,
        published: &[Uuid],
        split: &Split,
    ) -> impl std::future::Future<Output = Result<()>> + Send;
}

impl BeforeCommit for () {
    async fn run(self, _: &Client, _: &[Uuid], _: &Split) -> Result<()> {
        Ok(())
    }
}

/// A claim whose transaction stays open on its store's connection while the store is free for
/// other borrows: a pipelined source claims the next batch while the one before is published.
pub(crate) struct OpenClaim {
    groups: Vec<Vec<OutboxEvent>>,
    claimed: usize,
    full: bool,
    marked: Vec<Uuid>,
    ordered: bool,
}

impl OpenClaim {
    pub fn groups_mut(&mut self) -> &mut Vec<Vec<OutboxEvent>> {
        &mut self.groups
    }
}

impl Store {
    /// The claim opened on this store's connection by [`Claim::into_open`], to publish and
    /// finish. Fails when the connection was lost meanwhile (the transaction is gone with it).
    pub fn resume(&mut self, open: OpenClaim) -> Result<Claim<'_>> {
        let live = self.in_tx && self.conn.as_ref().is_some_and(|(c, _)| !c.is_closed());
        let Some((client, statements)) = self.conn.as_ref().filter(|_| live) else {
            return Err(crate::error::Error::replication(
                "the connection holding a claimed batch closed",
                true,
            ));
        };
        Ok(Claim {
            client,
            statements,
            in_tx: &mut self.in_tx,
            groups: open.groups,
            claimed: open.claimed,
            full: open.full,
            marked: open.marked,
            ordered: open.ordered,
        })
    }
}

impl Claim<'_> {
    /// Leaves the transaction open and the store free (see [`OpenClaim`]).
    pub fn into_open(self) -> OpenClaim {
        OpenClaim {
            groups: self.groups,
            claimed: self.claimed,
            full: self.full,
            marked: self.marked,
            ordered: self.ordered,
        }
    }

    /// The claim's connection, for statements of another module inside its transaction.
    pub fn client(&self) -> &Client {
        self.client
    }

    /// Places each event to publish in its transaction where its source did not (the wal stream
    /// places the rows it carried, with the count when the commit came within its hold): one
    /// statement in the claim's transaction (`transactions.sql`). Returns the transactions found to
    /// be runs of consecutive seqs.
    pub async fn read_transactions(&mut self) -> Result<Runs> {
        let (statement, learnt) = &self.statements.transactions;
        // Per transaction: lowest and highest seq in the batch, events in the batch. Asked for:
        // the transactions with an event not placed, and those placed (by the wal stream) that
        // the batch holds only part of, whose rows the wal source must know to be a run or not.
        let mut spans: BTreeMap<u64, (i64, i64, i64)> = BTreeMap::new();
        let mut unplaced: HashSet<u64> = HashSet::new();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for e in self.groups.iter().flatten() {
            if let Some(t) = e.transaction {
                let span = spans.entry(t.id).or_insert((e.seq, e.seq, 0));
                span.0 = span.0.min(e.seq);
                span.1 = span.1.max(e.seq);
                span.2 += 1;
                match t.events.filter(|_| t.is_placed()) {
                    Some(events) => {
                        counts.insert(t.id, events);
                    }
                    None => {
                        unplaced.insert(t.id);
                    }
                }
            }
        }
        spans.retain(|txid, (_, _, n)| {
            unplaced.contains(txid)
                || counts
                    .get(txid)
                    .is_some_and(|events| u64::try_from(*n).unwrap_or(0) != *events)
        });
        if spans.is_empty() {
            return Ok(Runs::new());
        }
        let known: HashMap<u64, Known> = {
            let learnt = learnt.lock().unwrap_or_else(|e| e.into_inner());
            spans
                .keys()
                .filter_map(|txid| learnt.0.get(txid).map(|k| (*txid, *k)))
                .collect()
        };
        // Placed by seq: (place, count); or by transaction: numbered in the batch (`Whole`) or
        // by seq from the first (`Run`).
        let mut placed: HashMap<i64, (u64, u64)> = HashMap::new();
        let mut whole: HashMap<u64, u64> = HashMap::new();
        let mut runs = Runs::new();
        for (txid, k) in &known {
            if let Known::Run { first, events } = k {
                runs.insert(*txid, (*first, *events));
            }
        }
        let ask: Vec<(&u64, &(i64, i64, i64))> = spans
            .iter()
            .filter(|(txid, _)| !runs.contains_key(txid))
            .collect();
        if !ask.is_empty() {
            let mut params: (Vec<String>, Vec<i64>, Vec<i64>, Vec<i64>) = Default::default();
            // What an earlier batch learnt: a seq, its place, the count.
            let mut at: [Vec<Option<i64>>; 3] = Default::default();
            for (txid, (lo, hi, n)) in &ask {
                params.0.push(txid.to_string());
                params.1.push(*lo);
                params.2.push(*hi);
                params.3.push(*n);
                let (seq, index, events) = match known.get(txid) {
                    Some(Known::At { seq, index, events }) => (
                        Some(*seq),
                        i64::try_from(*index).ok(),
                        i64::try_from(*events).ok(),
                    ),
                    _ => (None, None, None),
                };
                at[0].push(seq);
                at[1].push(index);
                at[2].push(events);
            }
            let args: [&(dyn ToSql + Sync); 7] = [
                &params.0, &params.1, &params.2, &params.3, &at[0], &at[1], &at[2],
            ];
            let stream = statement.query_raw(self.client, &args).await?;
            futures::pin_mut!(stream);
            let number = |v: i64| u64::try_from(v).unwrap_or(0);
            while let Some(row) = stream.try_next().await? {
                let Ok(txid) = row.try_get::<_, &str>("txid")?.parse::<u64>() else {
                    continue;
                };
                let events = number(row.try_get::<_, i64>("events")?);
                match row.try_get::<_, &str>("kind")? {
                    "whole" => {
                        whole.insert(txid, events);
                    }
                    "run" => {
                        if let Some(first) = row.try_get::<_, Option<i64>>("first")? {
                            runs.insert(txid, (first, events));
                        }
                    }
                    _ => {
                        if let (Some(seq), Some(position)) = (
                            row.try_get::<_, Option<i64>>("seq")?,
                            row.try_get::<_, Option<i64>>("position")?,
                        ) {
                            placed.insert(seq, (number(position), events));
                        }
                    }
                }
            }
        }
        // Whole transactions are numbered in the batch, in seq order.
        let mut ranks: HashMap<u64, Vec<i64>> = HashMap::new();
        for e in self.groups.iter().flatten() {
            if let Some(t) = e
                .transaction
                .filter(|t| !t.is_placed() && whole.contains_key(&t.id))
            {
                ranks.entry(t.id).or_default().push(e.seq);
            }
        }
        for seqs in ranks.values_mut() {
            seqs.sort_unstable();
        }
        for event in self.groups.iter_mut().flatten() {
            let seq = event.seq;
            let Some(t) = event.transaction.as_mut().filter(|t| !t.is_placed()) else {
                continue;
            };
            let found = if let Some(&(first, events)) = runs.get(&t.id) {
                u64::try_from(seq - first + 1)
                    .ok()
                    .map(|index| (index, events))
            } else if let Some(&(index, events)) = placed.get(&seq) {
                Some((index, events))
            } else if let (Some(&events), Some(seqs)) = (whole.get(&t.id), ranks.get(&t.id)) {
                seqs.binary_search(&seq)
                    .ok()
                    .map(|at| (at as u64 + 1, events))
            } else {
                None
            };
            if let Some((index, events)) =
                found.filter(|(index, events)| *index >= 1 && index <= events)
            {
                t.index = index;
                t.events = Some(events);
            }
        }
        // What the next batch of a transaction published in part starts from.
        let mut learnt = learnt.lock().unwrap_or_else(|e| e.into_inner());
        if learnt.0.len() > LEARNT_MAX {
            learnt.0.clear();
        }
        for (txid, (_, hi, _)) in &spans {
            if let Some(&(first, events)) = runs.get(txid) {
                learnt.0.insert(*txid, Known::Run { first, events });
            } else if let Some(&(index, events)) = placed.get(hi) {
                learnt.0.insert(
                    *txid,
                    Known::At {
                        seq: *hi,
                        index,
                        events,
                    },
                );
            }
        }
        Ok(runs)
    }

    /// `--transactions atomic`: takes the pending rest of each transaction the claim holds events
    /// of (up to `limit` events; `ordered`: the claim keeps per-aggregate order), so that it goes
    /// out whole (`complete_transactions.sql`). The rows taken join their aggregates' groups (or
    /// new ones) in seq order, or in `order`'s where it knows them, and are put back at the finish
    /// unless published or failed; a row `order` says must wait is blocked.
    pub async fn complete_transactions(
        &mut self,
        limit: usize,
        max_bytes: usize,
        ordered: bool,
        order: Option<&dyn CommitOrder>,
    ) -> Result<Completion> {
        let mut completion = Completion::default();
        let statement = &self.statements.complete_transactions;
        // Per transaction: events and bytes the claim holds (bytes as the payload and headers
        // the relay read, near enough to `outbox_row_size()`).
        let mut here: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
        let mut ids: Vec<Uuid> = Vec::new();
        for e in self.groups.iter().flatten() {
            if let Some(t) = e.transaction.filter(|t| t.events != Some(1)) {
                let entry = here.entry(t.id).or_default();
                let headers: usize = e.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
                entry.0 += 1;
                entry.1 = entry
                    .1
                    .saturating_add(i64::try_from(e.payload.len() + headers).unwrap_or(i64::MAX));
                ids.push(e.id);
            }
        }
        if here.is_empty() {
            return Ok(completion);
        }
        let txids: Vec<String> = here.keys().map(u64::to_string).collect();
        let (counts, bytes): (Vec<i64>, Vec<i64>) = here.into_values().unzip();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        let stream = statement
            .query_raw(
                self.client,
                &[&txids, &counts, &ids, &limit, &ordered, &bytes, &max_bytes],
            )
            .await?;
        futures::pin_mut!(stream);
        let mut taken: Vec<(ClaimedRow, bool)> = Vec::new();
        while let Some(row) = stream.try_next().await? {
            let kind: &str = row.try_get("kind")?;
            let txid = || {
                row.try_get::<_, Option<&str>>("txid")
                    .ok()
                    .flatten()
                    .and_then(|t| t.parse::<u64>().ok())
            };
            match kind {
                "split" => completion.split.extend(txid()),
                "incomplete" => completion.incomplete.extend(txid()),
                _ => taken.push((claimed_row(&row)?, row.try_get("blocked")?)),
            }
        }
        // The source's order, where it knows more than the claim's snapshot (rows taken only).
        let taken_order = match order.filter(|_| ordered && !taken.is_empty()) {
            Some(order) => {
                let claimed: HashSet<Uuid> = self.groups.iter().flatten().map(|e| e.id).collect();
                let rows: Vec<(Uuid, &AggregateKey)> = taken
                    .iter()
                    .filter_map(|(row, _)| row.event.as_ref().map(|e| (e.id, &row.aggregate)))
                    .collect();
                order.taken(&claimed, &rows)
            }
            None => TakenOrder::default(),
        };
        let mut at: HashMap<(String, String), usize> = HashMap::new();
        for (g, group) in self.groups.iter().enumerate() {
            if let Some(e) = group.first() {
                at.insert((e.aggregate_type.clone(), e.aggregate_id.clone()), g);
            }
        }
        for (row, blocked) in taken {
            let aggregate = row.aggregate.clone();
            let Some(event) = row.into_event() else {
                continue;
            };
            self.marked.push(event.id);
            self.claimed += 1;
            if blocked || taken_order.wait.contains(&event.id) {
                completion.blocked.insert(event.id);
            }
            match at.get(&aggregate).filter(|_| ordered) {
                Some(&g) => {
                    let group = &mut self.groups[g];
                    let position = &taken_order.position;
                    let place = match position.get(&event.id) {
                        Some(p) if group.iter().all(|e| position.contains_key(&e.id)) => {
                            group.partition_point(|e| position.get(&e.id).is_some_and(|q| q < p))
                        }
                        _ => group.partition_point(|e| e.seq < event.seq),
                    };
                    group.insert(place, event);
                }
                None => {
                    if ordered {
                        at.insert(aggregate, self.groups.len());
                    }
                    self.groups.push(vec![event]);
                }
            }
        }
        Ok(completion)
    }

    /// What another module's claim statements took: the groups to publish, the rows locked and
    /// the rows marked processed (put back at the finish unless published or failed).
    pub fn fill(&mut self, groups: Vec<Vec<OutboxEvent>>, claimed: usize, marked: Vec<Uuid>) {
        self.groups = groups;
        self.claimed = claimed;
        self.marked = marked;
    }

    /// Puts back the marked rows that were not published, records the failures (one statement
    /// each, only when needed), runs `before_commit` (a source's own bookkeeping of the batch, or
    /// `()`) and commits.
    pub async fn finish_with(
        self,
        published: &[Uuid],
        failures: &[Failure],
        split: &Split,
        before_commit: impl BeforeCommit,
    ) -> Result<()> {
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
            self.statements
                .release
                .execute(self.client, &[&held_back])
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
            self.statements
                .record_failures
                .execute(self.client, &[&ids, &errors, &delays, &dead, &spent])
                .await?;
        }
        before_commit.run(self.client, published, split).await?;
        self.end("COMMIT").await
    }

    /// Commits what another module's statements did in the claim's transaction (no rows of its
    /// own to record).
    pub async fn commit(self) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_keep_the_rows_text() {
        let (h, defect) = headers_from_json(Some(
            r#"{"big": 123456789012345678901234567890, "dec": 0.12345678901234567890,
                "s": "a \"q\" \u00e9", "o": {"k": [1, "a b", {"x": null}]}, "t": true}"#,
        ));
        assert_eq!(defect, None);
        assert_eq!(h["big"], "123456789012345678901234567890");
        assert_eq!(h["dec"], "0.12345678901234567890");
        assert_eq!(h["s"], "a \"q\" \u{e9}");
        assert_eq!(h["o"], r#"{"k":[1,"a b",{"x":null}]}"#);
        assert_eq!(h["t"], "true");
        assert_eq!(headers_from_json(Some("null")), (BTreeMap::new(), None));
        for (text, why) in [
            ("[1]", "found an array"),
            ("\"x\"", "found a string"),
            ("false", "found a boolean"),
            ("12", "found a number"),
            ("{", "cannot be read as JSON"),
        ] {
            let (h, defect) = headers_from_json(Some(text));
            assert!(h.is_empty());
            assert!(defect.is_some_and(|d| d.contains(why)), "{text}");
        }
    }

    /// A claimed row of aggregate `a` at `seq`: published now (`Some`), or not (`None`: waiting
    /// for its retry, dead, or held back).
    fn row(a: &str, seq: i64, publish: bool) -> ClaimedRow {
        ClaimedRow {
            seq,
            aggregate: ("order".into(), a.into()),
            event: publish.then(|| OutboxEvent {
                id: Uuid::new_v4(),
                seq,
                aggregate_type: "order".into(),
                aggregate_id: a.into(),
                event_type: "created".into(),
                payload: Bytes::from_static(b"{}"),
                headers: BTreeMap::new(),
                attempts: 0,
                created_at: Timestamp::now(),
                defect: None,
                transaction: None,
            }),
            held: false,
            tid: None,
            prev: None,
        }
    }

    fn held(a: &str, seq: i64) -> ClaimedRow {
        ClaimedRow {
            held: true,
            ..row(a, seq, false)
        }
    }

    /// Each group as (aggregate, seqs).
    fn shape(groups: &[Vec<OutboxEvent>]) -> Vec<(String, Vec<i64>)> {
        groups
            .iter()
            .map(|g| (g[0].aggregate_id.clone(), g.iter().map(|e| e.seq).collect()))
            .collect()
    }

    #[test]
    fn groups_follow_seq_order_per_aggregate_and_stop_at_the_first_gap() {
        // Out of order as the statement may return them; b's head waits for a retry, c stops
        // before its unpublishable row.
        let rows = vec![
            row("a", 5, true),
            row("a", 1, true),
            row("b", 2, false),
            row("b", 3, true),
            row("c", 4, true),
            row("c", 6, false),
            row("c", 7, true),
        ];
        let g = group_claim(rows, Ordering::Aggregate, 100);
        assert_eq!(
            shape(&g.groups),
            [("a".to_string(), vec![1, 5]), ("c".to_string(), vec![4])]
        );
        assert_eq!(g.claimed, 7);
        // Every row the claim marked: b's and c's beyond their gap are put back by `finish`.
        assert_eq!(g.marked.len(), 5);
        assert!(!g.full);
        assert!(!g.sparse);
        assert_eq!(g.next_limit, 200);
    }

    #[test]
    fn a_claim_is_full_at_the_limit_or_when_an_aggregate_took_its_whole_share() {
        let at_limit: Vec<_> = (0..4).map(|i| row(&format!("x{i}"), i, true)).collect();
        assert!(group_claim(at_limit, Ordering::Aggregate, 4).full);
        // Two heads, limit 5: each aggregate may take (5 - 1) / 2 = 2 followers; `a` took 3 rows.
        let deep = vec![
            row("a", 1, true),
            row("b", 2, true),
            row("a", 3, true),
            row("a", 4, true),
        ];
        let g = group_claim(deep, Ordering::Aggregate, 5);
        assert!(g.full);
        assert!(
            g.sparse,
            "full with fewer heads than the limit: hop between aggregates"
        );
        let shallow = vec![row("a", 1, true), row("b", 2, true), row("a", 3, true)];
        assert!(!group_claim(shallow, Ordering::Aggregate, 5).full);
    }

    #[test]
    fn the_byte_budget_marks_the_claim_full_and_shrinks_the_next() {
        let rows = vec![row("a", 1, true), row("b", 2, true), held("c", 3)];
        let g = group_claim(rows, Ordering::Aggregate, 1000);
        assert!(g.full);
        assert_eq!(g.next_limit, 4, "twice what fit");
        assert_eq!(g.groups.len(), 2);
        let alone = group_claim(vec![held("big", 1)], Ordering::Aggregate, 1000);
        assert_eq!(alone.next_limit, 1);
    }

    #[test]
    fn without_ordering_every_published_row_is_a_group_of_its_own() {
        let rows = vec![row("a", 2, true), row("a", 1, true), row("b", 3, false)];
        let g = group_claim(rows, Ordering::None, 3);
        assert_eq!(
            shape(&g.groups),
            [("a".to_string(), vec![1]), ("a".to_string(), vec![2])]
        );
        assert!(g.full, "claimed as many as the limit");
        assert!(!g.sparse);
        let g = group_claim(vec![row("a", 1, true)], Ordering::None, 3);
        assert!(!g.full);
    }
}
