//! The claim's open transaction ([`Claim`]): its rows in groups to publish, and how it ends
//! (the unpublished put back, failures recorded, a source's own statements, then commit or
//! rollback); [`OpenClaim`] keeps it open while the store is lent elsewhere.

use std::collections::HashSet;
use std::time::Duration;

use tokio_postgres::Client;
use uuid::Uuid;

use super::connection::Statements;
use super::transactions::Split;
use crate::error::Result;
use crate::event::OutboxEvent;

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
/// [`Claim::finish_with`] puts back what was not published and commits; dropping it without
/// finishing leaves the transaction to be rolled back by the next claim (or by a lost connection).
pub(crate) struct Claim<'a> {
    pub(super) client: &'a Client,
    pub(super) statements: &'a Statements,
    pub(super) in_tx: &'a mut bool,
    pub groups: Vec<Vec<OutboxEvent>>,
    /// Rows locked, including followers that are not eligible now.
    pub claimed: usize,
    /// The claim stopped at a limit (the batch size or an aggregate's share of it): more rows are
    /// probably waiting, so the relay should claim again at once.
    pub full: bool,
    /// Rows the claim marked processed: the eligible ones.
    pub(super) marked: Vec<Uuid>,
    /// Its groups keep per-aggregate order (false: `--ordering none`, each event a group).
    pub ordered: bool,
}

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
    pub(super) groups: Vec<Vec<OutboxEvent>>,
    pub(super) claimed: usize,
    pub(super) full: bool,
    pub(super) marked: Vec<Uuid>,
    pub(super) ordered: bool,
}

impl OpenClaim {
    pub fn groups_mut(&mut self) -> &mut Vec<Vec<OutboxEvent>> {
        &mut self.groups
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
