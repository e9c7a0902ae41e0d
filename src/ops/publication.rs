//! The publication `--source wal` streams from: created, or repaired when changed by hand.

use tokio_postgres::types::Type;

use super::Outbox;
use crate::error::{Error, Result};
use crate::migrate;
use crate::source::wal::publication::Publication;

const CATCH_UP_AGAIN: &str = include_str!("../../sql/queries/wal/wal_catch_up_again.sql");

impl Outbox<'_> {
    /// Creates the publication `--source wal` streams from (`migrate --wal`), unless it exists,
    /// and repairs one that does not publish every insert into the outbox's table (see
    /// [`Outbox::ensure_publication`]). Returns its name and whether it was created now.
    pub async fn create_publication(&mut self) -> Result<(String, bool)> {
        let setup = self.ensure_publication().await?;
        Ok((setup.name, setup.created))
    }

    /// Makes the publication `--source wal` streams from publish every insert into the outbox's
    /// table: creates it, or repairs one changed by hand (adds the table back, gives `publish`
    /// its inserts, drops a row filter or column list; one `FOR ALL TABLES` stays so). After a
    /// repair the outbox's slots catch up from the table before they stream, since the rows
    /// written meanwhile are in no stream. Fails naming what is wrong when it cannot repair it.
    pub async fn ensure_publication(&mut self) -> Result<PublicationSetup> {
        let tx = self.transaction().await?;
        tx.batch_execute(migrate::LOCK).await?;
        let found = Publication::read(&tx).await?;
        let problem = found.problem();
        for stmt in found.repair() {
            if let Err(e) = tx.batch_execute(stmt).await {
                return Err(Error::replication(
                    format!(
                        "{}; repairing it failed ({stmt})",
                        problem.as_deref().unwrap_or("publication")
                    ),
                    false,
                )
                .caused_by(e));
            }
        }
        if problem.is_some() {
            if let Some(still) = Publication::read(&tx).await?.problem() {
                return Err(Error::replication(
                    format!("{still} after `migrate --wal` repaired it: fix it by hand"),
                    false,
                ));
            }
        }
        let repaired = found.flaws_described().filter(|_| found.exists);
        if repaired.is_some() {
            tx.execute_typed(CATCH_UP_AGAIN, &[(&None::<&str>, Type::TEXT)])
                .await?;
        }
        tx.commit().await?;
        Ok(PublicationSetup {
            name: found.name,
            created: !found.exists,
            repaired,
        })
    }
}

/// What [`Outbox::ensure_publication`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublicationSetup {
    /// The publication's name (`outbox_wal_publication()`).
    pub name: String,
    /// It did not exist: created now.
    pub created: bool,
    /// It existed but did not publish every insert into the outbox's table (changed by hand):
    /// what was wrong, repaired now.
    pub repaired: Option<String>,
}
