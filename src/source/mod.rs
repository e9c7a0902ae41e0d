//! The relay's sources of claimable work: the outbox table (`--source table`) and the logical
//! replication stream (`--source wal`), and what both share: `batch` (publish, settle under the
//! policy, record) and `recovery` (after a failed batch, and pauses that yield to shutdown).

pub(crate) mod batch;
pub(crate) mod recovery;
pub(crate) mod table;
pub(crate) mod wal;
