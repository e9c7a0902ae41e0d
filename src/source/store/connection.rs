//! The worker connection ([`Store`]): opened lazily with the table's statements, reopened after
//! a loss, and the claims that open a transaction on it. The claim itself, its rows and what a
//! batch does in its transaction live in the sibling files.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;
use uuid::Uuid;

use super::claim::{Claim, OpenClaim};
use super::grouping::{group_claim, Grouped};
use super::row::read_claim;
use super::stmt::{Session, Stmt};
use super::transactions::Learnt;
use crate::config::Ordering;
use crate::error::Result;

const CLAIM_ORDERED: &str = include_str!("../../../sql/queries/table/claim_ordered.sql");
const CLAIM_UNORDERED: &str = include_str!("../../../sql/queries/table/claim_unordered.sql");
const CLAIM_HEADS: &str = include_str!("../../../sql/queries/table/claim_heads.sql");
const RELEASE: &str = include_str!("../../../sql/queries/table/release.sql");
const RECORD_FAILURES: &str = include_str!("../../../sql/queries/table/record_failures.sql");
const WAKE: &str = include_str!("../../../sql/queries/table/wake.sql");
const TRANSACTIONS: &str = include_str!("../../../sql/queries/table/transactions.sql");
const COMPLETE_TRANSACTIONS: &str =
    include_str!("../../../sql/queries/table/complete_transactions.sql");

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

/// The table's statements, prepared (or kept to send unnamed) on each new connection.
pub(super) struct Statements {
    claim_ordered: Stmt,
    claim_unordered: Stmt,
    claim_heads: Stmt,
    pub(super) release: Stmt,
    pub(super) record_failures: Stmt,
    /// `transactions.sql`, with what earlier batches learnt of the transactions they published
    /// part of.
    pub(super) transactions: (Stmt, std::sync::Mutex<Learnt>),
    /// `complete_transactions.sql` (`--transactions atomic`).
    pub(super) complete_transactions: Stmt,
}

/// Statements of another module prepared on the worker connection with the table's: when the
/// connection is opened, in the session's transaction (so that `--schema` resolves their tables),
/// and dropped with it. `()`: none (the table source).
pub(crate) trait Prepare: Sized {
    /// What decides which of them are prepared (fixed for the store's life).
    type Options: Send + Sync;

    /// Prepares them (or keeps them to send unnamed: `prepare` false) on a new connection.
    fn prepare(
        client: &Client,
        prepare: bool,
        options: &Self::Options,
    ) -> impl std::future::Future<Output = Result<Self>> + Send;
}

impl Prepare for () {
    type Options = ();

    async fn prepare(_: &Client, _: bool, _: &()) -> Result<()> {
        Ok(())
    }
}

/// An open worker connection with every statement prepared on it: the table's and `X`, another
/// module's. Dropping it drops them.
struct Connection<X> {
    client: Client,
    statements: Statements,
    theirs: X,
}

/// [`Store::ready`] with a store's fields borrowed apart (the connection's borrow lives on in the
/// claim while the others are used again).
macro_rules! ready {
    ($store:expr) => {
        Self::ready(
            &mut $store.conn,
            &mut $store.in_tx,
            &$store.url,
            &$store.session,
            &$store.options,
        )
    };
}

/// The worker connection with its statements (the table's and `X`); reconnects lazily after a
/// loss.
pub(crate) struct Store<X: Prepare = ()> {
    url: String,
    session: Session,
    /// Which of `X` are prepared.
    options: X::Options,
    conn: Option<Connection<X>>,
    /// A claim's transaction was left open (its batch failed half-way); roll it back first.
    in_tx: bool,
    /// Find ordered heads by hopping from aggregate to aggregate instead of walking the pending
    /// rows in seq order: cheaper while the backlog has fewer aggregates than the batch size.
    sparse: bool,
    /// Rows to claim at most next time, below the batch size after a claim over the byte budget.
    limit_hint: usize,
}

impl Store {
    pub fn new(url: String, session: Session) -> Self {
        Store {
            url,
            session,
            options: (),
            conn: None,
            in_tx: false,
            sparse: false,
            limit_hint: usize::MAX,
        }
    }

    /// This store (not connected yet) with `X` prepared on each of its connections too.
    pub fn with<X: Prepare>(self, options: X::Options) -> Store<X> {
        Store {
            url: self.url,
            session: self.session,
            options,
            conn: None,
            in_tx: false,
            sparse: false,
            limit_hint: usize::MAX,
        }
    }
}

impl<X: Prepare> Store<X> {
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
        if let Some(conn) = &self.conn {
            let token = conn.client.cancel_token();
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
    async fn open(url: &str, session: &Session, options: &X::Options) -> Result<Connection<X>> {
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
        let theirs = X::prepare(&client, prepare, options).await?;
        client.batch_execute("COMMIT").await?;
        Ok(Connection {
            client,
            statements,
            theirs,
        })
    }

    /// The connection (a store's fields, borrowed apart), opened when there is none or it
    /// closed, with no transaction open.
    async fn ready<'c>(
        conn: &'c mut Option<Connection<X>>,
        in_tx: &mut bool,
        url: &str,
        session: &Session,
        options: &X::Options,
    ) -> Result<&'c Connection<X>> {
        if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            *conn = None;
            *in_tx = false;
        }
        let opened = match conn.take() {
            Some(opened) => opened,
            None => Self::open(url, session, options).await?,
        };
        let conn = &*conn.insert(opened);
        if *in_tx {
            conn.client.batch_execute("ROLLBACK").await?;
            *in_tx = false;
        }
        Ok(conn)
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
        Ok(self.claim_with(ordering, false, limit, max_bytes).await?.0)
    }

    /// [`Store::claim`], with the statements of the module that extends the store (`X`) on the
    /// claim's connection.
    pub async fn claim_for(
        &mut self,
        ordering: Ordering,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Claim<'_>, &X)> {
        self.claim_with(ordering, false, limit, max_bytes).await
    }

    /// The first claim after a writer's notification at idle, in per-aggregate order: heads only
    /// (`claim_heads.sql`, half the cost of the full claim for the one event a notification
    /// usually brings). A claim that found any row is full: the full claim follows at once for the
    /// heads' followers and whatever came meanwhile.
    pub async fn claim_heads(&mut self, limit: usize, max_bytes: usize) -> Result<Claim<'_>> {
        Ok(self
            .claim_with(Ordering::Aggregate, true, limit, max_bytes)
            .await?
            .0)
    }

    async fn claim_with(
        &mut self,
        ordering: Ordering,
        heads: bool,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Claim<'_>, &X)> {
        let conn = ready!(self).await?;
        let (client, statements) = (&conn.client, &conn.statements);
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
        let claim = Claim {
            client,
            statements,
            in_tx: &mut self.in_tx,
            groups,
            claimed,
            full,
            marked,
            ordered: ordering == Ordering::Aggregate,
        };
        Ok((claim, &conn.theirs))
    }

    /// The statements of the module that extends the store (`X`), on the connection, opened if
    /// there is none.
    pub async fn theirs(&mut self) -> Result<&X> {
        Ok(&ready!(self).await?.theirs)
    }

    /// Opens a claim's transaction (with the session's settings) for another module's claim
    /// statements (`X`, returned with it): the claim starts empty ([`Claim::fill`]).
    pub async fn begin(&mut self) -> Result<(Claim<'_>, &X)> {
        let conn = ready!(self).await?;
        self.in_tx = true;
        conn.client.batch_execute(&self.session.begin).await?;
        let claim = Claim {
            client: &conn.client,
            statements: &conn.statements,
            in_tx: &mut self.in_tx,
            groups: Vec::new(),
            claimed: 0,
            full: false,
            marked: Vec::new(),
            ordered: true,
        };
        Ok((claim, &conn.theirs))
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

impl<X: Prepare> Store<X> {
    /// The claim opened on this store's connection by [`Claim::into_open`], to publish and
    /// finish, with `X` on its connection. Fails when the connection was lost meanwhile (the
    /// transaction is gone with it).
    pub fn resume(&mut self, open: OpenClaim) -> Result<(Claim<'_>, &X)> {
        let live = self.in_tx && self.conn.as_ref().is_some_and(|c| !c.client.is_closed());
        let Some(conn) = self.conn.as_ref().filter(|_| live) else {
            return Err(crate::error::Error::database_state(
                "the connection holding a claimed batch closed",
            ));
        };
        let claim = Claim {
            client: &conn.client,
            statements: &conn.statements,
            in_tx: &mut self.in_tx,
            groups: open.groups,
            claimed: open.claimed,
            full: open.full,
            marked: open.marked,
            ordered: open.ordered,
        };
        Ok((claim, &conn.theirs))
    }
}
