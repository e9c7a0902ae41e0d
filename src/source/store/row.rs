//! A claim statement's rows as the relay reads them ([`ClaimedRow`], [`read_claim`]). Every claim
//! statement (`table/claim_*.sql`, `table/complete_transactions.sql`, `wal/claim_ids.sql`,
//! `wal/lock_ids.sql`) returns the same named columns (typed NULLs where one does not apply),
//! decoded by name only (`alone`: computed by the heads claim, false elsewhere); never a panic or
//! an error for what a row holds (rows are written by raw SQL too): a value the relay cannot use
//! becomes the event's defect.

use bytes::Bytes;
use futures::TryStreamExt;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, Row};
use uuid::Uuid;

use super::headers::headers_from_json;
use super::stmt::Stmt;
use crate::error::Result;
use crate::event::{OutboxEvent, TransactionPosition};
use crate::timestamp::Timestamp;

/// One row of a claim, in seq order. `event` is `Some` for a row marked processed by the claim (to
/// be published now); `None` for a row claimed but not publishable now: not eligible (waiting for
/// its retry, dead-lettered) or held back (behind a row locked by another session, or by the byte
/// budget: `held`). An aggregate stops at its first row without an event.
pub(crate) struct ClaimedRow {
    pub(super) seq: i64,
    pub(super) aggregate: (String, String),
    pub(super) event: Option<OutboxEvent>,
    pub(super) held: bool,
    /// Where the row is (`ctid`; NULL but in the wal source's lock by id, `lock_ids.sql`): its
    /// delete after the acks finds the row there.
    pub tid: Option<String>,
    /// The nearest older pending row of its aggregate (NULL but in the wal source's claims by
    /// id).
    pub prev: Option<Uuid>,
}

impl ClaimedRow {
    /// The event, for a row the claim marked (or locked) to publish now.
    pub fn into_event(self) -> Option<OutboxEvent> {
        self.event
    }
}

pub(crate) async fn read_claim(
    client: &Client,
    statement: &Stmt,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<ClaimedRow>> {
    let stream = statement.query_raw(client, params).await?;
    futures::pin_mut!(stream);
    let mut rows = Vec::new();
    while let Some(row) = stream.try_next().await? {
        rows.push(claimed_row(&row)?);
    }
    Ok(rows)
}

/// Reads one row of a claim statement. Never fails on what a row holds (rows are written by raw
/// SQL too): a value the relay cannot use becomes the event's `defect`, and the event is
/// dead-lettered with it.
pub(super) fn claimed_row(row: &Row) -> Result<ClaimedRow> {
    let aggregate_type = text(row, "aggregate_type")?;
    let aggregate_id = text(row, "aggregate_id")?;
    let seq: i64 = row.try_get("seq")?;
    let eligible: bool = row.try_get("eligible")?;
    let held: bool = row.try_get("held")?;
    let aggregate = (
        aggregate_type.clone().unwrap_or_else(|e| e),
        aggregate_id.clone().unwrap_or_else(|e| e),
    );
    if !eligible {
        return Ok(ClaimedRow {
            seq,
            aggregate,
            event: None,
            held,
            tid: None,
            prev: None,
        });
    }
    let mut defects = Vec::new();
    let mut take = |field: Result<String, String>| {
        field.unwrap_or_else(|e| {
            defects.push(e);
            String::new()
        })
    };
    let aggregate_type = take(aggregate_type);
    let aggregate_id = take(aggregate_id);
    let event_type = take(text(row, "event_type")?);
    let (headers, header_defect) = headers_from_json(row.try_get::<_, Option<&str>>("headers")?);
    defects.extend(header_defect);
    let payload: Option<Payload> = row.try_get("payload")?;
    let event =
        OutboxEvent {
            id: row.try_get("id")?,
            seq,
            aggregate_type,
            aggregate_id,
            event_type,
            payload: payload.map(|p| p.0).unwrap_or_default(),
            headers,
            attempts: row.try_get::<_, Option<i32>>("attempts")?.unwrap_or(0),
            created_at: row
                .try_get::<_, Option<Timestamp>>("created_at")?
                .unwrap_or_else(Timestamp::now),
            defect: (!defects.is_empty()).then(|| defects.join("; ")),
            // Placed in its transaction before it is published: here when the claim found the row
            // alone in it (`alone`: the one event of its transaction), otherwise by
            // `Claim::read_transactions`.
            transaction: match row.try_get::<_, Option<&str>>("txid") {
                Ok(Some(txid)) => txid.parse::<u64>().ok().map(|id| {
                    match row.try_get::<_, Option<bool>>("alone") {
                        Ok(Some(true)) => TransactionPosition::alone(id),
                        _ => TransactionPosition::unplaced(id),
                    }
                }),
                _ => None,
            },
        };
    Ok(ClaimedRow {
        seq,
        aggregate,
        event: Some(event),
        held,
        tid: row.try_get("tid")?,
        prev: row.try_get("prev")?,
    })
}

/// A text column as UTF-8, or why it is not (a database in SQL_ASCII can hold any bytes).
fn text(row: &Row, column: &str) -> Result<Result<String, String>> {
    let raw: Option<RawText> = row.try_get(column)?;
    Ok(match raw {
        None => Ok(String::new()),
        Some(RawText(bytes)) => String::from_utf8(bytes).map_err(|e| {
            let lossy = String::from_utf8_lossy(e.as_bytes()).into_owned();
            format!("{column} {lossy:?} is not valid UTF-8")
        }),
    })
}

/// A text value's bytes, whatever they are.
struct RawText(Vec<u8>);

impl<'a> FromSql<'a> for RawText {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(RawText(raw.to_vec()))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME)
    }
}

/// The payload's JSON text as the bytes that are published: copied once out of the row.
struct Payload(Bytes);

impl<'a> FromSql<'a> for Payload {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Payload(Bytes::copy_from_slice(raw)))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::TEXT | Type::VARCHAR)
    }
}
