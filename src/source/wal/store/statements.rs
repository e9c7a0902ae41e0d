//! The wal source's statements, prepared on a worker connection when it is opened (with the
//! table's: [`Prepare`]): which ones depend on `--wal-marking` and on what the schema records.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::config::WalMarking;
use crate::error::Result;
use crate::source::store::{Prepare, Stmt};

const CLAIM_IDS: &str = include_str!("../../../../sql/queries/wal/claim_ids.sql");
const LOCK_IDS: &str = include_str!("../../../../sql/queries/wal/lock_ids.sql");
const LOCK_STREAMED: &str = include_str!("../../../../sql/queries/wal/lock_streamed.sql");
const DELETE_PUBLISHED: &str = include_str!("../../../../sql/queries/wal/delete_published.sql");
const DELETE_PUBLISHED_IDS: &str =
    include_str!("../../../../sql/queries/wal/delete_published_ids.sql");
const ROW_STATES: &str = include_str!("../../../../sql/queries/wal/row_states.sql");
const PENDING_OF: &str = include_str!("../../../../sql/queries/wal/pending_of.sql");
const SWEEP_ROUND: &str = include_str!("../../../../sql/queries/wal/sweep_round.sql");
const DEFER: &str = include_str!("../../../../sql/queries/wal/defer.sql");
const UNDEFER: &str = include_str!("../../../../sql/queries/wal/undefer.sql");
const MARK_SPLIT: &str = include_str!("../../../../sql/queries/wal/mark_split.sql");
const PURGE_TRANSACTIONS: &str = include_str!("../../../../sql/queries/wal/purge_transactions.sql");
const RECORD_RUNS: &str = include_str!("../../../../sql/queries/wal/record_runs.sql");
const RECORD_KEPT: &str = include_str!("../../../../sql/queries/wal/record_kept.sql");
const KEPT_ROUND: &str = include_str!("../../../../sql/queries/wal/kept_round.sql");
const HAS_KEPT: &str = include_str!("../../../../sql/queries/wal/has_kept.sql");
const TEXTS: &[Type] = &[Type::TEXT_ARRAY];
const RUNS_TYPES: &[Type] = &[Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::INT8_ARRAY];
const RECORD_KEPT_TYPES: &[Type] = &[Type::TEXT_ARRAY, Type::TEXT_ARRAY];
const KEPT_ROUND_TYPES: &[Type] = &[Type::TEXT, Type::INT8];

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
    pub(super) claim_ids: Stmt,
    /// `--wal-marking delete`: `lock_streamed.sql`, for rows whose content the stream carried.
    pub(super) lock_streamed: Option<Stmt>,
    /// `--wal-marking delete`: by where the rows are (`delete_published.sql`), and by id
    /// (`delete_published_ids.sql`) for rows claimed from the table (the catch-up).
    pub(super) delete_published: Option<(Stmt, Stmt)>,
    /// `--wal-marking delete` on a schema whose rows record their transaction (version 9):
    /// `mark_split.sql`, `record_runs.sql` and `purge_transactions.sql`.
    pub(super) split: Option<(Stmt, Stmt, Stmt)>,
    /// `--wal-marking delete` on a schema that records the transactions whose rows it keeps
    /// (version 10): `record_kept.sql` and `kept_round.sql`.
    pub(super) kept: Option<(Stmt, Stmt)>,
    pub(super) row_states: Stmt,
    pub(super) pending_of: Stmt,
    /// `sweep_round.sql`: what a sweep serves, from `outbox_wal_deferred`.
    pub(super) sweep_round: Stmt,
    pub(super) defer: Stmt,
    pub(super) undefer: Stmt,
}

impl Prepare for WalStatements {
    type Options = WalMarking;

    /// Probes the schema (in the transaction the store prepares in: `--schema` resolves) and
    /// prepares the statements `marking` and the schema need.
    async fn prepare(client: &Client, prepare: bool, marking: &WalMarking) -> Result<Self> {
        let has_kept = match marking {
            WalMarking::Delete => client
                .query_typed(HAS_KEPT, &[])
                .await?
                .first()
                .map(|row| row.try_get::<_, bool>("has_kept"))
                .transpose()?
                .unwrap_or(false),
            _ => false,
        };
        WalStatements::new(client, prepare, *marking, has_kept).await
    }
}

impl WalStatements {
    /// `lock_streamed.sql` reads version 6's `rewritten`, which every schema the relay runs on
    /// has ([`crate::migrate::REQUIRED_VERSION`]): prepared with `--wal-marking delete`, used
    /// when the stream carries content ([`super::WalStore::publishes_streamed`]).
    async fn new(
        client: &Client,
        prepare: bool,
        marking: WalMarking,
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
                Some(Stmt::new(client, LOCK_STREAMED, SEQS_UUIDS, prepare).await?),
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
}

impl Stmt {
    pub(super) async fn query(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let rows = self.query_raw(client, params).await?;
        futures::TryStreamExt::try_collect(rows).await
    }
}
