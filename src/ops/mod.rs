//! Operations on an outbox: migrate, grant, the publication of `--source wal`, status, dead
//! letters, cleanup (of the outbox and of `processed_events`), all through one handle,
//! [`Outbox`]. Shared by the CLI and the relay's own periodic tasks (gauges, `--retention`,
//! `--processed-events-retention`).
//!
//! Every statement is sent as an unnamed statement with its parameter types (one round trip, no
//! named prepared statement left on the server), so these work through a transaction pooler such
//! as PgBouncer in transaction mode.
//!
//! Each operation runs in a transaction of its own (cleanup and the retry of every dead letter:
//! one per batch) that first sets the search_path to the outbox's schema with `SET LOCAL`
//! ([`Schema::set_local_search_path`]); the queue and read commands check the schema version in
//! it too. Nothing of that outlives the transaction, so the server connection goes back to a
//! pooler unchanged, and `--schema` needs no `options` in the connection URL (which PgBouncer
//! refuses).
//!
//! ```no_run
//! # async fn example() -> outbox_relay::Result<()> {
//! use std::time::Duration;
//! use outbox_relay::ops::Outbox;
//! use outbox_relay::Schema;
//!
//! let mut client = outbox_relay::connect("postgres://relay@db:5432/app", "ops").await?;
//! let mut outbox = Outbox::new(&mut client, Schema::optional(Some("billing"))?);
//! let status = outbox.status().await?;
//! println!("{} pending, {} dead letters", status.pending, status.dead_letters);
//! for dead in outbox.dead_letters(20, None).await? {
//!     println!("{} {}: {:?}", dead.id, dead.event_type, dead.last_error);
//! }
//! let retried = outbox.retry_dead_letters(None).await?; // all of them
//! let week = Duration::from_secs(7 * 24 * 3600);
//! let deleted = outbox.cleanup(week, 1000).await?;
//! println!("retried {}, deleted {deleted} old rows", retried.len());
//! # Ok(())
//! # }
//! ```

mod cleanup;
mod dead_letters;
mod publication;
mod status;

use tokio_postgres::{Client, Transaction};

use crate::error::{Error, Result};
use crate::migrate::{self, Grantee};
use crate::schema::Schema;

pub use cleanup::Retained;
pub use dead_letters::{DeadLetter, RetryCandidate};
pub use publication::PublicationSetup;
#[cfg(feature = "console")]
pub(crate) use status::{read_blocked_aggregates, read_status, read_wal_slots};
pub use status::{BlockedAggregate, Overview, Status, WalSlot};

/// The operations on one outbox: a connection and the outbox's schema (`None`: the connection's
/// own search_path). Each method runs in a transaction of its own (see the module
/// documentation); the queue and read commands first check that the schema is there and current
/// (an error naming `outbox-relay migrate` otherwise), `migrate`, `applied`, `grant` and the
/// publication's setup do not.
#[derive(Debug)]
pub struct Outbox<'c> {
    client: &'c mut Client,
    schema: Option<Schema>,
}

impl<'c> Outbox<'c> {
    /// The outbox in `schema` on `client`.
    pub fn new(client: &'c mut Client, schema: Option<Schema>) -> Self {
        Outbox { client, schema }
    }

    /// The outbox's schema (`None`: the connection's search_path).
    pub fn schema(&self) -> Option<&Schema> {
        self.schema.as_ref()
    }

    /// A transaction whose statements find the outbox objects in the schema: it starts with
    /// `SET LOCAL search_path`, which ends with the transaction (commit or rollback), so no
    /// session state is left on the connection. Without a schema, a plain transaction.
    async fn transaction(&mut self) -> Result<Transaction<'_>> {
        let tx = self.client.transaction().await?;
        if let Some(schema) = &self.schema {
            tx.batch_execute(&schema.set_local_search_path()).await?;
        }
        Ok(tx)
    }

    /// [`Outbox::transaction`], after checking in it that the schema is there and current.
    pub(crate) async fn checked_transaction(&mut self) -> Result<Transaction<'_>> {
        let tx = self.transaction().await?;
        migrate::check_schema(&tx).await?;
        Ok(tx)
    }

    /// Fails with a message telling the user to run `outbox-relay migrate` when the schema is
    /// missing or older than this build needs ([`migrate::REQUIRED_VERSION`]).
    pub async fn check(&mut self) -> Result<()> {
        self.checked_transaction().await?.commit().await?;
        Ok(())
    }

    /// Applies the missing migrations in one transaction, under an advisory lock so that two
    /// `migrate` runs at once apply each version once; with a schema, creates it first when it
    /// is missing. Returns the versions applied now (empty: up to date).
    ///
    /// ```no_run
    /// # async fn example() -> outbox_relay::Result<()> {
    /// use outbox_relay::migrate;
    /// use outbox_relay::ops::Outbox;
    ///
    /// let mut client = outbox_relay::connect("postgres://admin@db:5432/app", "app-migrate").await?;
    /// let mut outbox = Outbox::new(&mut client, None);
    /// let applied = outbox.migrate().await?;
    /// println!("applied {applied:?}; schema version {}", migrate::current_version());
    ///
    /// // Or, where the schema is applied by another tool, only check it (a deploy gate):
    /// let applied = outbox.applied().await?;
    /// migrate::require_applied(&applied)?; // an error naming `outbox-relay migrate` if behind
    /// # Ok(())
    /// # }
    /// ```
    pub async fn migrate(&mut self) -> Result<Vec<i32>> {
        let schema = self.schema.clone();
        let tx = self.transaction().await?;
        let applied = migrate::apply(&tx, schema.as_ref()).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// The schema versions applied, oldest first; empty when the outbox schema does not exist
    /// yet (see [`migrate::require_applied`], [`migrate::pending`]).
    pub async fn applied(&mut self) -> Result<Vec<i32>> {
        let tx = self.transaction().await?;
        let versions = migrate::applied_if_any(&tx).await?;
        tx.commit().await?;
        Ok(versions)
    }

    /// Grants `role` the least privileges its job needs on the outbox's objects.
    pub async fn grant(&mut self, role: &str, grantee: Grantee) -> Result<()> {
        let tx = self.transaction().await?;
        migrate::grant(&tx, role, grantee).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// How far a batched operator command ([`Outbox::cleanup_table`],
/// [`Outbox::retry_all_dead_letters`]) has come: reported after each committed batch, so that a
/// caller can show progress (the CLI draws it on a terminal). Everything counted is committed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Rows changed (deleted, retried) so far.
    pub rows: u64,
    /// Batches committed so far.
    pub batches: u64,
}

impl Progress {
    fn add_batch(&mut self, rows: u64) {
        self.rows += rows;
        self.batches += 1;
    }
}

/// Batched commands stop at the first batch smaller than `batch_size`: below 1 that would never
/// happen.
fn check_batch_size(batch_size: i64) -> Result<()> {
    if batch_size < 1 {
        return Err(Error::config("batch_size", "must be at least 1"));
    }
    Ok(())
}
