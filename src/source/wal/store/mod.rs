//! The worker connections' side of `--source wal`: claiming streamed rows by id, sweeping the
//! aggregates the table holds, and recording a batch's hand-over (`outbox_wal_deferred`) and
//! delete in its transaction. Built on the table source's [`Store`](crate::source::store::Store)
//! (its connection, session and claim), with statements of its own prepared on the same
//! connection. One concept a file: `statements` (the wal statements and when each is prepared),
//! `connection` ([`WalStore`]: the connection with them), `claim` (the claim by id, [`WalOpen`]),
//! `states` (what became of the candidates not taken, and the claim grouped by it; unit-tested),
//! `sweep` (a sweep's claim, [`SweepInfo`](sweep::SweepInfo)), `record` (what a batch records
//! before its commit, [`WalRecord`]) and `kept` (the kept transactions' purge).

mod claim;
mod connection;
mod kept;
mod record;
mod statements;
mod states;
mod sweep;

pub(crate) use claim::WalOpen;
pub(crate) use connection::WalStore;
pub(crate) use record::WalRecord;
pub(crate) use statements::WalStatements;
