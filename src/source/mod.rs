//! The relay's sources of claimable work: the outbox table (`--source table`) and the logical
//! replication stream (`--source wal`).

pub(crate) mod table;
pub(crate) mod wal;
