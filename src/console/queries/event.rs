//! One event as the detail view shows it, and the pending events waiting behind it.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::error::Result;
use crate::timestamp::Timestamp;

const DETAIL: &str = include_str!("../../../sql/queries/console/event_detail.sql");
const FOLLOWERS: &str = include_str!("../../../sql/queries/console/followers.sql");

/// One event as the detail view shows it.
#[derive(Debug, Clone)]
pub(crate) struct Detail {
    pub(crate) id: Uuid,
    pub(crate) seq: i64,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) payload: String,
    pub(crate) headers: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: Timestamp,
    pub(crate) dead_lettered_at: Option<Timestamp>,
    pub(crate) retry_after: Option<Timestamp>,
    pub(crate) processed_at: Option<Timestamp>,
    pub(crate) discarded_at: Option<Timestamp>,
    /// The database's clock when it was read (for the ages).
    pub(crate) now: Timestamp,
}

/// The event `id`, if there is one.
pub(crate) async fn detail<C: GenericClient + Sync>(
    client: &C,
    id: Uuid,
) -> Result<Option<Detail>> {
    let row = client.query_typed_opt(DETAIL, &[(&id, Type::UUID)]).await?;
    row.map(|r| {
        Ok(Detail {
            id: r.try_get("id")?,
            seq: r.try_get("seq")?,
            aggregate_type: r.try_get("aggregate_type")?,
            aggregate_id: r.try_get("aggregate_id")?,
            event_type: r.try_get("event_type")?,
            payload: r.try_get("payload")?,
            headers: r.try_get("headers")?,
            attempts: r.try_get("attempts")?,
            last_error: r.try_get("last_error")?,
            created_at: r.try_get("created_at")?,
            dead_lettered_at: r.try_get("dead_lettered_at")?,
            retry_after: r.try_get("retry_after")?,
            processed_at: r.try_get("processed_at")?,
            discarded_at: r.try_get("discarded_at")?,
            now: r.try_get("now")?,
        })
    })
    .transpose()
}

/// A pending event waiting behind a dead letter of its aggregate.
#[derive(Debug, Clone)]
pub(crate) struct Follower {
    pub(crate) id: Uuid,
    pub(crate) seq: i64,
    pub(crate) event_type: String,
    pub(crate) created_at: Timestamp,
}

/// Up to `limit` pending events of the aggregate after `seq`, and how many there are in all.
pub(crate) async fn followers<C: GenericClient + Sync>(
    client: &C,
    aggregate_type: &str,
    aggregate_id: &str,
    seq: i64,
    limit: i64,
) -> Result<(Vec<Follower>, i64)> {
    let rows = client
        .query_typed(
            FOLLOWERS,
            &[
                (&aggregate_type, Type::TEXT),
                (&aggregate_id, Type::TEXT),
                (&seq, Type::INT8),
                (&limit, Type::INT8),
            ],
        )
        .await?;
    let total = match rows.first() {
        Some(r) => r.try_get("total")?,
        None => 0,
    };
    let list = rows
        .iter()
        .map(|r| {
            Ok(Follower {
                id: r.try_get("id")?,
                seq: r.try_get("seq")?,
                event_type: r.try_get("event_type")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .collect::<Result<_>>()?;
    Ok((list, total))
}
