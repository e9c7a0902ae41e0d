//! The writer API for sqlx applications (the `sqlx` feature): the same statement, validation and
//! rows as [`crate::writer`], through any [`PgExecutor`].
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

use ::sqlx::postgres::{PgDatabaseError, PgExecutor};
use uuid::Uuid;

use crate::error::{is_transient_sqlstate, Error, Result};
use crate::event::NewEvent;
use crate::writer::Columns;

const ENQUEUE: &str = include_str!("../sql/queries/enqueue.sql");

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
