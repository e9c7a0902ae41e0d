//! The writer API for sqlx applications (the `sqlx` feature): the same statement, validation and
//! rows as [`crate::writer`], through any [`PgExecutor`]; and [`migrator`], the outbox schema as
//! sqlx migrations.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> outbox_relay::Result<()> {
//! use outbox_relay::NewEvent;
//!
//! let mut tx = pool.begin().await.expect("begin");
//! // ... the business writes, on `&mut *tx` ...
//! let event = NewEvent::new("order", "42", "order.created", &serde_json::json!({"total": 10}))?;
//! let id = outbox_relay::sqlx::enqueue(&mut *tx, &event).await?;
//! tx.commit().await.expect("commit");
//! # let _ = id;
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;

use ::sqlx::error::BoxDynError;
use ::sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use ::sqlx::postgres::{PgDatabaseError, PgExecutor};
use futures::future::BoxFuture;
use uuid::Uuid;

use crate::error::{is_transient_sqlstate, Error, Result};
use crate::event::NewEvent;
use crate::writer::Columns;

const ENQUEUE: &str = include_str!("../sql/queries/writer/enqueue.sql");

/// Writes one event. Pass the application's transaction (`&mut *tx`): the event then commits or
/// rolls back with the business data. A `&mut PgConnection` or a `&PgPool` works too, but then the
/// event commits on its own. Returns the event id (also its `Nats-Msg-Id`).
///
/// The statement is not cached as a named prepared statement, so this works through PgBouncer in
/// transaction mode; sqlx still parses and executes it in two round trips, so through such a
/// pooler pass a transaction (both then run on the same server connection).
pub async fn enqueue<'c, E>(executor: E, event: &NewEvent) -> Result<Uuid>
where
    E: PgExecutor<'c>,
{
    let ids = enqueue_many(executor, std::slice::from_ref(event)).await?;
    Ok(ids[0])
}

/// Writes several events in one statement, in the given order (their `seq` follows it).
/// All events are validated before anything is sent: one bad event writes none.
pub async fn enqueue_many<'c, E>(executor: E, events: &[NewEvent]) -> Result<Vec<Uuid>>
where
    E: PgExecutor<'c>,
{
    let Some(c) = Columns::of(events)? else {
        return Ok(Vec::new());
    };
    // Not kept as a named prepared statement on the connection: behind a transaction pooler the
    // next transaction may run on another server connection, where it does not exist (or where
    // another client's statement of the same name does).
    ::sqlx::query_scalar::<_, Uuid>(ENQUEUE)
        .persistent(false)
        .bind(c.aggregate_types)
        .bind(c.aggregate_ids)
        .bind(c.event_types)
        .bind(c.payloads)
        .bind(c.headers)
        .fetch_all(executor)
        .await
        .map_err(sqlx_error)
}

/// Where the outbox's migrations sit among the application's in `_sqlx_migrations`: outbox
/// version `n` is sqlx version `VERSION_BASE + n` (7250010000000001, ...). sqlx keeps one table of
/// versions per database, so the outbox's 1, 2, 3 would otherwise be the application's 1, 2, 3;
/// this range is above both numbering styles of `sqlx migrate add` (1, 2, ... and
/// `YYYYMMDDHHMMSS` timestamps).
pub const VERSION_BASE: i64 = 7_250_010_000_000_000;

/// The outbox migrations of this build as sqlx migrations, oldest first: versions from
/// [`VERSION_BASE`], each applied in a transaction, each recording itself in
/// `outbox_schema_migrations` too (see [`crate::migrate::Migration::recorded_sql`]), so that the
/// relay and `outbox-relay migrate --check` accept the schema, and `outbox-relay migrate` run
/// later finds nothing to do.
pub fn migrations() -> Vec<Migration> {
    crate::migrate::MIGRATIONS
        .iter()
        .map(|m| {
            Migration::new(
                VERSION_BASE + i64::from(m.version),
                Cow::Owned(format!("outbox-relay {:04}_{}", m.version, m.name)),
                MigrationType::Simple,
                Cow::Owned(m.recorded_sql()),
                false,
            )
        })
        .collect()
}

/// The outbox schema as a sqlx [`Migrator`], for applications that migrate with sqlx: run it
/// where the application runs its own `sqlx::migrate!()`, on the same database. It records its
/// versions in `_sqlx_migrations` (from [`VERSION_BASE`]) and ignores the application's versions
/// there ([`Migrator::set_ignore_missing`]); the application's own migrator must ignore the
/// outbox's likewise (`set_ignore_missing(true)`, or `sqlx migrate run --ignore-missing`), since
/// sqlx otherwise refuses a database holding versions it does not know. Running it again applies
/// nothing. The outbox goes where the connection's search_path puts new objects, as with
/// `outbox-relay migrate` without `--schema`.
///
/// Both also take PostgreSQL advisory locks, so the migrator, `outbox-relay migrate` and other
/// instances of the application may start at once.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// // The outbox first: the application's migrations may refer to `outbox_events`.
/// outbox_relay::sqlx::migrator().await?.run(&pool).await?;
///
/// // The application's own migrations (`sqlx::migrate!()` embeds ./migrations), which must not
/// // trip over the outbox's versions in `_sqlx_migrations`:
/// let mut app = sqlx::migrate::Migrator::new(std::path::Path::new("./migrations")).await?;
/// app.set_ignore_missing(true);
/// app.run(&pool).await?;
/// # Ok(())
/// # }
/// ```
pub async fn migrator() -> Result<Migrator> {
    let mut migrator = Migrator::new(Embedded(migrations()))
        .await
        .map_err(|e| Error::sqlx(e.to_string(), false))?;
    migrator.set_ignore_missing(true);
    Ok(migrator)
}

/// The migrations compiled into this crate, as the source sqlx builds a [`Migrator`] from.
#[derive(Debug)]
struct Embedded(Vec<Migration>);

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> BoxFuture<'static, std::result::Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async move { Ok(self.0) })
    }
}

/// Keeps the server's message and classifies the error like the tokio-postgres path does.
fn sqlx_error(e: ::sqlx::Error) -> Error {
    let retryable = is_transient(&e);
    let message = match &e {
        ::sqlx::Error::Database(db) => match db.try_downcast_ref::<PgDatabaseError>() {
            Some(pg) => {
                // As libpq spells it: ERROR, FATAL, PANIC.
                let severity = format!("{:?}", pg.severity()).to_uppercase();
                let mut out = format!("{severity}: {} [{}]", pg.message(), pg.code());
                if let Some(detail) = pg.detail() {
                    out.push_str(&format!(" ({detail})"));
                }
                out
            }
            None => db.message().to_owned(),
        },
        other => other.to_string(),
    };
    Error::sqlx(message, retryable)
}

/// Connection loss, shutdown, serialization failures: the statement may succeed on a new try.
fn is_transient(e: &::sqlx::Error) -> bool {
    match e {
        ::sqlx::Error::Database(db) => db.code().is_some_and(|code| is_transient_sqlstate(&code)),
        ::sqlx::Error::Io(_)
        | ::sqlx::Error::Tls(_)
        | ::sqlx::Error::Protocol(_)
        | ::sqlx::Error::PoolTimedOut
        | ::sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlx_migrations_follow_the_embedded_ones() {
        let ours = migrations();
        assert_eq!(ours.len(), crate::migrate::MIGRATIONS.len());
        for (sqlx, m) in ours.iter().zip(crate::migrate::MIGRATIONS) {
            assert_eq!(sqlx.version, VERSION_BASE + i64::from(m.version));
            assert!(sqlx.sql.contains(m.sql));
            assert!(!sqlx.no_tx);
        }
    }

    /// sqlx refuses to run when an applied migration's checksum changed, so the SQL it is given for
    /// a released migration must stay byte for byte what it was.
    #[test]
    fn sqlx_checksums_of_released_migrations_are_stable() {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let pinned = [
            (1, "5ad3ad66899eeef1605fa3fbb02d56f6e0b5f6b5d990b1aac5d892f1481b23d21115cf21e7bc2ca1e30b5640d1e6c46a"),
            (2, "b06320976d5f5cfc0986ecaca3d71432ef7fa43939f9721df02a46ed740ea26a84a2f763480787c89607377669c19e8a"),
            (3, "e13b6348f284b3fd57acc0d04e312c2ec2a68d76658d991c06d29c520b6283f0b9a46a933d2947b0ae3961bac18b0a07"),
            (4, "626935a6678a3da82a8f7cd71e6c45fe33156e973c619146c551ef28a93c78e6431b4ce0d44f94ab35fdc01a02835158"),
        ];
        let ours = migrations();
        for (version, checksum) in pinned {
            let m = ours
                .iter()
                .find(|m| m.version == VERSION_BASE + version)
                .expect("released migration");
            assert_eq!(hex(&m.checksum), checksum, "version {version}");
        }
    }

    #[test]
    fn maps_driver_errors() {
        let io = sqlx_error(::sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        )));
        assert!(io.is_retryable(), "{io}");
        assert!(io.to_string().contains("reset"), "{io}");
        let decode = sqlx_error(::sqlx::Error::RowNotFound);
        assert!(!decode.is_retryable(), "{decode}");
        assert!(!decode.is_usage());
    }
}
