//! Versioned, idempotent schema migrations (`sql/migrations`), safe to run concurrently, and the
//! scripts of them for other migration tools.
//!
//! Applying them, checking them and granting privileges are operations on a database:
//! [`crate::ops::Outbox::migrate`], [`crate::ops::Outbox::applied`],
//! [`crate::ops::Outbox::check`], [`crate::ops::Outbox::grant`]. Statements with parameters go
//! out as unnamed statements with their parameter types, so these work through a transaction
//! pooler (PgBouncer in transaction mode).

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use crate::error::{Error, Result};
use crate::schema::Schema;

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
    Migration {
        version: 6,
        name: "wal_rewrites",
        sql: include_str!("../sql/migrations/0006_wal_rewrites.sql"),
    },
    Migration {
        version: 7,
        name: "status_indexes",
        sql: include_str!("../sql/migrations/0007_status_indexes.sql"),
    },
    Migration {
        version: 8,
        name: "relays",
        sql: include_str!("../sql/migrations/0008_relays.sql"),
    },
    Migration {
        version: 9,
        name: "transactions",
        sql: include_str!("../sql/migrations/0009_transactions.sql"),
    },
    Migration {
        version: 10,
        name: "kept_transactions",
        sql: include_str!("../sql/migrations/0010_kept_transactions.sql"),
    },
];

/// The newest schema version of this build (what `migrate` brings a database to).
pub fn current_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The oldest schema version this build runs against (the relay and the operator commands check
/// it): the current one and the one before it, so that relays can be upgraded before the schema
/// (a rolling upgrade). Anything older is refused at start with "run `outbox-relay migrate`": the
/// runtime never branches on what an older schema lacks.
pub const REQUIRED_VERSION: i32 = 9;

/// The migration lock (`migrate`, `migrate --wal`): one of them at a time per database.
pub(crate) const LOCK: &str = include_str!("../sql/queries/migrate/migrate_lock.sql");
const PREPARE: &str = include_str!("../sql/queries/migrate/migrate_prepare.sql");
const APPLIED: &str = include_str!("../sql/queries/migrate/migrate_applied.sql");
const RECORD: &str = include_str!("../sql/queries/migrate/migrate_record.sql");
const SCHEMA_VERSION: &str = include_str!("../sql/queries/migrate/schema_version.sql");
const SCHEMA_EXISTS: &str = include_str!("../sql/queries/migrate/schema_exists.sql");
const CREATE_SCHEMA: &str = include_str!("../sql/queries/migrate/create_schema.sql");
const GRANT_WRITER: &str = include_str!("../sql/queries/migrate/grant_writer.sql");
const GRANT_RELAY: &str = include_str!("../sql/queries/migrate/grant_relay.sql");

/// Creates `schema` if it does not exist (for `--schema`; the connection's search_path must name it).
async fn create_schema<C: GenericClient + Sync>(client: &C, schema: &Schema) -> Result<()> {
    let stmt: String = client
        .query_typed_one(CREATE_SCHEMA, &[(&schema.as_str(), Type::TEXT)])
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
pub(crate) async fn grant<C: GenericClient + Sync>(
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

/// Applies the missing migrations on `client` (in a transaction whose search_path names
/// `schema`, see [`crate::ops::Outbox::migrate`]): under the migration lock, taken before the
/// schema is created so that two runs at once do not both try to create it.
pub(crate) async fn apply<C: GenericClient + Sync>(
    client: &C,
    schema: Option<&Schema>,
) -> Result<Vec<i32>> {
    if let Some(schema) = schema {
        client.batch_execute(LOCK).await?;
        create_schema(client, schema).await?;
    }
    client.batch_execute(PREPARE).await?;
    let applied = applied(client).await?;
    let mut now = Vec::new();
    for m in pending(&applied) {
        tracing::info!(version = m.version, name = m.name, "applying migration");
        client.batch_execute(m.sql).await?;
        client
            .execute_typed(RECORD, &[(&m.version, Type::INT4), (&m.name, Type::TEXT)])
            .await?;
        now.push(m.version);
    }
    Ok(now)
}

/// The versions applied, oldest first; empty when the outbox schema does not exist yet.
pub(crate) async fn applied_if_any<C: GenericClient + Sync>(client: &C) -> Result<Vec<i32>> {
    let exists: bool = client.query_typed_one(SCHEMA_EXISTS, &[]).await?.get(0);
    if exists {
        applied(client).await
    } else {
        Ok(Vec::new())
    }
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

/// Fails as [`crate::ops::Outbox::check`] does when a migration of this build is not in `applied`.
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
pub fn script(schema: Option<&Schema>) -> String {
    script_from(schema, 1)
}

/// [`script`] with the migrations from version `from` on (for a database that has the earlier
/// ones): each is recorded in `outbox_schema_migrations` as `migrate` does.
pub fn script_from(schema: Option<&Schema>, from: i32) -> String {
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
pub fn script_as(schema: Option<&Schema>, from: i32, format: ScriptFormat) -> String {
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
        let quoted = schema.quoted();
        out.push_str(&format!("CREATE SCHEMA IF NOT EXISTS {quoted};\n"));
        if format == ScriptFormat::Script {
            out.push_str(&format!("{};\n", schema.set_local_search_path()));
        } else {
            // The tool records its own version in the same transaction, in a table it names
            // without a schema: keep its search_path behind ours.
            out.push_str(&format!(
                "SELECT set_config('search_path', concat_ws(', ', '{quoted}', nullif(current_setting('search_path'), '')), true);\n"
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
pub(crate) async fn check_schema<C: GenericClient + Sync>(client: &C) -> Result<()> {
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
        assert!(
            rest.contains("-- migration 0010_kept_transactions"),
            "{rest}"
        );
        assert!(
            rest.contains("CREATE TABLE IF NOT EXISTS outbox_kept_transactions"),
            "{rest}"
        );
        assert!(!rest.contains("-- migration 0009_"), "{rest}");
    }
}
