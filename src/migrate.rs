//! Versioned, idempotent schema migrations (`sql/migrations`), safe to run concurrently.
//!
//! Statements with parameters go out as unnamed statements with their parameter types, so these
//! work through a transaction pooler (PgBouncer in transaction mode). [`migrate_in`] and
//! [`grant_in`] apply a schema with `SET LOCAL` inside their own transaction instead of relying
//! on the connection's search_path (see [`crate::ops::transaction_in`]).

use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};

use crate::error::{Error, Result};
use crate::ops::transaction_in;
use crate::source::wal::publication::Publication;

/// One schema version.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in version order; recorded in `outbox_schema_migrations`.
    pub version: i32,
    /// The file name under `sql/migrations`.
    pub name: &'static str,
    /// The migration's SQL.
    pub sql: &'static str,
}

impl Migration {
    /// This migration as a file of its own, for tools that apply each file in a transaction of
    /// their own (sqlx, Flyway, Atlas, refinery): takes the migration lock, creates
    /// `outbox_schema_migrations` when missing, applies the SQL and records the version there,
    /// where the relay looks for it at start. No transaction control of its own.
    ///
    /// The text of a released migration never changes: sqlx keeps a checksum of it (see
    /// `outbox_relay::sqlx::migrator`), so this layout is fixed too.
    ///
    /// ```
    /// let first = &outbox_relay::migrate::MIGRATIONS[0];
    /// let sql = first.recorded_sql();
    /// assert!(sql.contains("CREATE TABLE IF NOT EXISTS outbox_events"));
    /// assert!(sql.contains("INSERT INTO outbox_schema_migrations (version, name) VALUES (1, 'outbox')"));
    /// ```
    pub fn recorded_sql(&self) -> String {
        format!(
            "{PREPARE}\n-- migration {:04}_{}\n{}\n{}",
            self.version,
            self.name,
            self.sql,
            self.record_statement()
        )
    }

    /// The statement that records this version as `migrate` does (a no-op when it is there).
    fn record_statement(&self) -> String {
        format!(
            "INSERT INTO outbox_schema_migrations (version, name) VALUES ({}, '{}') ON CONFLICT DO NOTHING;\n",
            self.version, self.name
        )
    }
}

/// Every migration, oldest first. Never edit a released one: add a new version.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "outbox",
        sql: include_str!("../sql/migrations/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        name: "edges",
        sql: include_str!("../sql/migrations/0002_edges.sql"),
    },
    Migration {
        version: 3,
        name: "statements",
        sql: include_str!("../sql/migrations/0003_statements.sql"),
    },
    Migration {
        version: 4,
        name: "processed_events_index",
        sql: include_str!("../sql/migrations/0004_processed_events_index.sql"),
    },
    Migration {
        version: 5,
        name: "wal",
        sql: include_str!("../sql/migrations/0005_wal.sql"),
    },
];

/// The newest schema version of this build (what `migrate` brings a database to).
pub fn current_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The oldest schema version this build runs against (the relay and the operator commands check
/// it). Lower than [`current_version`] while the newer versions only add what works without them
/// (version 4: an index that makes the processed_events retention faster), so a relay can be
/// upgraded before the schema.
pub const REQUIRED_VERSION: i32 = 3;

/// The oldest schema version `--source wal` runs against (version 5: the publication's name and
/// the table of deferred aggregates).
pub const WAL_REQUIRED_VERSION: i32 = 5;

const LOCK: &str = include_str!("../sql/queries/migrate_lock.sql");
const PREPARE: &str = include_str!("../sql/queries/migrate_prepare.sql");
const APPLIED: &str = include_str!("../sql/queries/migrate_applied.sql");
const RECORD: &str = include_str!("../sql/queries/migrate_record.sql");
const SCHEMA_VERSION: &str = include_str!("../sql/queries/schema_version.sql");
const SCHEMA_EXISTS: &str = include_str!("../sql/queries/schema_exists.sql");
const CREATE_SCHEMA: &str = include_str!("../sql/queries/create_schema.sql");
const GRANT_WRITER: &str = include_str!("../sql/queries/grant_writer.sql");
const GRANT_RELAY: &str = include_str!("../sql/queries/grant_relay.sql");
const CATCH_UP_AGAIN: &str = include_str!("../sql/queries/wal_catch_up_again.sql");

/// Creates the publication `--source wal` streams from (`migrate --wal`), unless it exists, and
/// repairs one that does not publish every insert into the outbox's table (see
/// [`ensure_publication_in`]). Returns its name and whether it was created now.
pub async fn create_publication_in(
    client: &mut Client,
    schema: Option<&str>,
) -> Result<(String, bool)> {
    let setup = ensure_publication_in(client, schema).await?;
    Ok((setup.name, setup.created))
}

/// What [`ensure_publication_in`] found and did.
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

/// Makes the publication `--source wal` streams from publish every insert into the outbox's table:
/// creates it, or repairs one changed by hand (adds the table back, gives `publish` its inserts,
/// drops a row filter or column list; one `FOR ALL TABLES` stays so). After a repair the outbox's
/// slots catch up from the table before they stream, since the rows written meanwhile are in no
/// stream. Fails naming what is wrong when it cannot repair it.
pub async fn ensure_publication_in(
    client: &mut Client,
    schema: Option<&str>,
) -> Result<PublicationSetup> {
    let tx = transaction_in(client, schema).await?;
    tx.batch_execute(LOCK).await?;
    let found = Publication::read(&tx).await?;
    let problem = found.problem();
    for stmt in found.repair() {
        if let Err(e) = tx.batch_execute(stmt).await {
            return Err(Error::replication(
                format!(
                    "{}; repairing it failed ({stmt}): {e}",
                    problem.as_deref().unwrap_or("publication")
                ),
                false,
            ));
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

/// Creates `schema` if it does not exist (for `--schema`; the connection's search_path must name it).
pub async fn create_schema<C: GenericClient + Sync>(client: &C, schema: &str) -> Result<()> {
    let stmt: String = client
        .query_typed_one(CREATE_SCHEMA, &[(&schema, Type::TEXT)])
        .await?
        .get(0);
    client.batch_execute(&stmt).await?;
    Ok(())
}

/// Who gets which privileges (see `sql/queries/grant_*.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grantee {
    /// INSERT into the outbox (applications calling `enqueue`), plus `processed_events`.
    Writer,
    /// SELECT/UPDATE/DELETE on the outbox, and deleting old rows of `processed_events`: the
    /// relay and the operator commands.
    Relay,
}

/// Grants `role` the least privileges its job needs, in the connection's current schema.
pub async fn grant<C: GenericClient + Sync>(
    client: &C,
    role: &str,
    grantee: Grantee,
) -> Result<()> {
    let sql = match grantee {
        Grantee::Writer => GRANT_WRITER,
        Grantee::Relay => GRANT_RELAY,
    };
    for row in client.query_typed(sql, &[(&role, Type::TEXT)]).await? {
        let stmt: String = row.get(0);
        client.batch_execute(&stmt).await?;
    }
    Ok(())
}

/// [`grant`] in `schema` (`None`: the connection's search_path), in a transaction of its own.
pub async fn grant_in(
    client: &mut Client,
    schema: Option<&str>,
    role: &str,
    grantee: Grantee,
) -> Result<()> {
    let tx = transaction_in(client, schema).await?;
    grant(&tx, role, grantee).await?;
    tx.commit().await?;
    Ok(())
}

/// Applies the missing migrations in one transaction, under an advisory lock so that two `migrate`
/// runs at once apply each version once. Returns the versions applied now (empty: up to date).
///
/// ```no_run
/// # async fn example() -> outbox_relay::Result<()> {
/// use outbox_relay::migrate;
///
/// let mut client = outbox_relay::connect("postgres://admin@db:5432/app", "app-migrate").await?;
/// let applied = migrate::migrate(&mut client).await?;
/// println!("applied {applied:?}; schema version {}", migrate::current_version());
///
/// // Or, where the schema is applied by another tool, only check it (a deploy gate):
/// let applied = migrate::applied_in(&mut client, None).await?;
/// migrate::require_applied(&applied)?; // an error naming `outbox-relay migrate` if behind
/// # Ok(())
/// # }
/// ```
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>> {
    migrate_in(client, None).await
}

/// [`migrate`] into `schema` (`None`: the connection's search_path): creates the schema when it
/// is missing and applies the missing migrations there, all in one transaction that sets the
/// search_path with `SET LOCAL` and takes the migration lock before creating the schema.
pub async fn migrate_in(client: &mut Client, schema: Option<&str>) -> Result<Vec<i32>> {
    let tx = transaction_in(client, schema).await?;
    if let Some(schema) = schema {
        // Under the lock: two runs at once must not both try to create the schema.
        tx.batch_execute(LOCK).await?;
        create_schema(&tx, schema).await?;
    }
    tx.batch_execute(PREPARE).await?;
    let applied = applied(&tx).await?;
    let mut now = Vec::new();
    for m in pending(&applied) {
        tracing::info!(version = m.version, name = m.name, "applying migration");
        tx.batch_execute(m.sql).await?;
        tx.execute_typed(RECORD, &[(&m.version, Type::INT4), (&m.name, Type::TEXT)])
            .await?;
        now.push(m.version);
    }
    tx.commit().await?;
    Ok(now)
}

/// The versions applied in `schema` (`None`: the connection's search_path), oldest first; empty
/// when the outbox schema does not exist yet. Read in a transaction of its own.
pub async fn applied_in(client: &mut Client, schema: Option<&str>) -> Result<Vec<i32>> {
    let tx = transaction_in(client, schema).await?;
    let exists: bool = tx.query_typed_one(SCHEMA_EXISTS, &[]).await?.get(0);
    let versions = if exists {
        applied(&tx).await?
    } else {
        Vec::new()
    };
    tx.commit().await?;
    Ok(versions)
}

/// The versions recorded in `outbox_schema_migrations`, oldest first (the table must exist).
async fn applied<C: GenericClient + Sync>(client: &C) -> Result<Vec<i32>> {
    Ok(client
        .query_typed(APPLIED, &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The migrations of this build that `applied` does not hold, in order.
pub fn pending(applied: &[i32]) -> Vec<&'static Migration> {
    MIGRATIONS
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .collect()
}

/// Fails as [`check_schema`] does when a migration of this build is not in `applied`.
pub fn require_applied(applied: &[i32]) -> Result<()> {
    if pending(applied).is_empty() {
        Ok(())
    } else {
        Err(Error::schema_missing(
            applied.iter().copied().max(),
            current_version(),
        ))
    }
}

/// The whole migration as one script, for users who apply migrations with their own tool.
pub fn script(schema: Option<&str>) -> String {
    script_from(schema, 1)
}

/// [`script`] with the migrations from version `from` on (for a database that has the earlier
/// ones): each is recorded in `outbox_schema_migrations` as `migrate` does.
pub fn script_from(schema: Option<&str>, from: i32) -> String {
    script_as(schema, from, ScriptFormat::Script)
}

/// The shapes `migrate --print --format` writes the migrations in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ScriptFormat {
    /// One transaction of its own (`BEGIN` ... `COMMIT`), for `psql -f`.
    #[default]
    Script,
    /// No transaction control: for tools that run each migration file in a transaction they open
    /// themselves (Flyway, Atlas, refinery), where a `COMMIT` inside the file would end theirs.
    Bare,
    /// [`ScriptFormat::Bare`] as a goose migration: `-- +goose Up` and the whole script as one
    /// statement block, because goose splits statements at semicolons, also inside the `$$`
    /// bodies of the functions.
    Goose,
}

/// The migrations from version `from` on in `format`; each is recorded in
/// `outbox_schema_migrations` as `migrate` does, so that the relay accepts the schema.
///
/// ```
/// use outbox_relay::migrate::{script_as, ScriptFormat};
///
/// let goose = script_as(None, 1, ScriptFormat::Goose);
/// assert!(goose.starts_with("-- +goose Up\n-- +goose StatementBegin\n"));
/// assert!(!goose.contains("\nCOMMIT;"));
/// ```
pub fn script_as(schema: Option<&str>, from: i32, format: ScriptFormat) -> String {
    let mut out = String::new();
    match format {
        ScriptFormat::Script => out.push_str("-- outbox-relay schema; apply in one transaction.\nBEGIN;\n"),
        ScriptFormat::Bare => out.push_str(
            "-- outbox-relay schema; apply in one transaction (this file holds no BEGIN/COMMIT).\n",
        ),
        ScriptFormat::Goose => out.push_str(
            "-- +goose Up\n-- +goose StatementBegin\n-- outbox-relay schema (goose runs it in a transaction).\n",
        ),
    }
    if let Some(schema) = schema {
        out.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";\n"));
        if format == ScriptFormat::Script {
            out.push_str(&format!("{};\n", crate::db::set_local_search_path(schema)));
        } else {
            // The tool records its own version in the same transaction, in a table it names
            // without a schema: keep its search_path behind ours.
            out.push_str(&format!(
                "SELECT set_config('search_path', concat_ws(', ', '\"{schema}\"', nullif(current_setting('search_path'), '')), true);\n"
            ));
        }
    }
    out.push_str(PREPARE);
    for m in MIGRATIONS.iter().filter(|m| m.version >= from) {
        out.push_str(&format!(
            "\n-- migration {:04}_{}\n{}\n{}",
            m.version,
            m.name,
            m.sql,
            m.record_statement()
        ));
    }
    match format {
        ScriptFormat::Script => out.push_str("COMMIT;\n"),
        ScriptFormat::Bare => {}
        ScriptFormat::Goose => out.push_str("-- +goose StatementEnd\n"),
    }
    out
}

/// Fails with a message telling the user to run `outbox-relay migrate` when the schema is missing
/// or older than this build needs ([`REQUIRED_VERSION`]).
pub async fn check_schema<C: GenericClient + Sync>(client: &C) -> Result<()> {
    let exists: bool = client.query_typed_one(SCHEMA_EXISTS, &[]).await?.get(0);
    let found: Option<i32> = if exists {
        client.query_typed_one(SCHEMA_VERSION, &[]).await?.get(0)
    } else {
        None
    };
    let need = REQUIRED_VERSION;
    match found {
        Some(v) if v >= need => Ok(()),
        found => Err(Error::schema_missing(found, need)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_in_order_and_the_required_one_exists() {
        let versions: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
        let expected: Vec<i32> = (1..=versions.len() as i32).collect();
        assert_eq!(versions, expected);
        assert!(versions.contains(&REQUIRED_VERSION));
        assert!(REQUIRED_VERSION <= current_version());
    }

    #[test]
    fn script_from_the_latest_version_has_only_that_migration() {
        let rest = script_from(None, current_version());
        assert!(rest.contains("-- migration 0005_wal"), "{rest}");
        assert!(rest.contains("outbox_wal_deferred"), "{rest}");
        assert!(!rest.contains("-- migration 0004_"), "{rest}");
    }
}
