//! The relay's sources of claimable work: the outbox table (`--source table`) and the logical
//! replication stream (`--source wal`), and what both share: `store` (the worker connection, its
//! session and prepared statements with their unnamed fallback, the claim's transaction, row
//! decoding and grouping, the transaction headers' placement, `--transactions atomic`'s
//! completion, and the table's claims, which the wal source's catch-up uses too), `batch` (publish,
//! settle under the policy, record) and `recovery` (after a failed batch, and pauses that yield to
//! shutdown).

pub(crate) mod atomic;
pub(crate) mod batch;
pub(crate) mod recovery;
pub(crate) mod store;
pub(crate) mod table;
pub(crate) mod wal;
