//! The relay's PostgreSQL side: claiming, marking and failing rows. The relay loop sees
//! [`Claim`] and [`OutboxEvent`](crate::event::OutboxEvent), never SQL. One concept a file:
//! `stmt` (how a statement is sent, what a transaction starts with), `connection` (the worker
//! connection and its statements, the claims), `claim` (the open transaction and how it ends),
//! `row` (a claimed row decoded), `headers` (the headers' JSON), `grouping` (rows in groups to
//! publish), `transactions` (the transaction headers' placement) and `completion` (`--transactions
//! atomic`'s completion of a claim's transactions).

mod claim;
mod completion;
mod connection;
mod grouping;
mod headers;
mod row;
mod stmt;
mod transactions;

pub(crate) use claim::{BeforeCommit, Claim, Failure, OpenClaim};
pub(crate) use completion::{CommitOrder, Completion, TakenOrder};
pub(crate) use connection::{Prepare, Store};
pub(crate) use headers::headers_from_json;
pub(crate) use row::{read_claim, ClaimedRow};
pub(crate) use stmt::{Session, Stmt};
pub(crate) use transactions::{Runs, Split};
