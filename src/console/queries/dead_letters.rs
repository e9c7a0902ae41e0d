//! The filtered dead-letter list: its pages (keyset by seq or by time dead), its counts, the
//! bulk actions' batches and the causes. Each statement writes the filter and the cause expression
//! out as `dead_letter_filter.sql` and `error_cause.sql` have them (no text is spliced in at run
//! time: every file runs as it is); the test below keeps the copies equal.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use super::filter::{Filter, Key, Sort};
use crate::error::Result;
use crate::timestamp::Timestamp;

const PAGE: &str = include_str!("../../../sql/queries/console/dead_letters_page.sql");
const PAGE_BEFORE: &str = include_str!("../../../sql/queries/console/dead_letters_page_before.sql");
const PAGE_DEAD: &str = include_str!("../../../sql/queries/console/dead_letters_page_dead.sql");
const PAGE_DEAD_BEFORE: &str =
    include_str!("../../../sql/queries/console/dead_letters_page_dead_before.sql");
const TOTAL: &str = include_str!("../../../sql/queries/console/dead_letters_total.sql");
const COUNT: &str = include_str!("../../../sql/queries/console/dead_letters_count.sql");
const BATCH: &str = include_str!("../../../sql/queries/console/dead_letters_batch.sql");
const CAUSES: &str = include_str!("../../../sql/queries/console/dead_letter_causes.sql");
const UTC: &str = include_str!("../../../sql/queries/console/utc.sql");
const FILTER_TIME: &str = include_str!("../../../sql/queries/console/filter_time.sql");

/// One row of the dead-letter list.
#[derive(Debug, Clone)]
pub(crate) struct ListedDeadLetter {
    pub(crate) id: Uuid,
    pub(crate) seq: i64,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: Timestamp,
    pub(crate) dead_lettered_at: Timestamp,
    /// Its place in the list's order (either).
    pub(crate) key: Key,
}

fn typed<'a>(
    filter: &'a [Option<&'a str>],
    rest: &'a [(&'a (dyn ToSql + Sync), Type)],
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = filter
        .iter()
        .map(|v| (v as &(dyn ToSql + Sync), Type::TEXT))
        .collect();
    params.extend(rest.iter().map(|(v, t)| (*v, t.clone())));
    params
}

/// Where a page of the list starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum From {
    /// The first rows after this place ([`Key::START`]: the first page).
    After(Key),
    /// The last rows before this place (a previous page).
    Before(Key),
}

/// Up to `limit` dead letters matching `filter` from `from`, in the order `sort`.
pub(crate) async fn page<C: GenericClient + Sync>(
    client: &C,
    filter: &Filter,
    sort: Sort,
    from: From,
    limit: i64,
) -> Result<Vec<ListedDeadLetter>> {
    let values = filter.params();
    let (key, before) = match from {
        From::After(key) => (key, false),
        From::Before(key) => (key, true),
    };
    let rows = match sort {
        Sort::Seq => {
            let sql = if before { PAGE_BEFORE } else { PAGE };
            let rest: [(&(dyn ToSql + Sync), Type); 2] =
                [(&key.seq, Type::INT8), (&limit, Type::INT8)];
            client.query_typed(sql, &typed(&values, &rest)).await?
        }
        Sort::Dead => {
            let sql = if before { PAGE_DEAD_BEFORE } else { PAGE_DEAD };
            let rest: [(&(dyn ToSql + Sync), Type); 3] = [
                (&key.dead, Type::TIMESTAMPTZ),
                (&key.seq, Type::INT8),
                (&limit, Type::INT8),
            ];
            client.query_typed(sql, &typed(&values, &rest)).await?
        }
    };
    let mut rows = rows
        .iter()
        .map(|r| {
            let seq = r.try_get("seq")?;
            Ok(ListedDeadLetter {
                id: r.try_get("id")?,
                seq,
                aggregate_type: r.try_get("aggregate_type")?,
                aggregate_id: r.try_get("aggregate_id")?,
                event_type: r.try_get("event_type")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
                created_at: r.try_get("created_at")?,
                dead_lettered_at: r.try_get("dead_lettered_at")?,
                key: Key {
                    dead: r.try_get("dead_lettered_at")?,
                    seq,
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if before {
        rows.reverse();
    }
    Ok(rows)
}

/// How many dead letters match `filter`, counted up to `upto`.
pub(crate) async fn total<C: GenericClient + Sync>(
    client: &C,
    filter: &Filter,
    upto: i64,
) -> Result<i64> {
    let values = filter.params();
    let rest: [(&(dyn ToSql + Sync), Type); 1] = [(&upto, Type::INT8)];
    let row = client
        .query_typed_one(TOTAL, &typed(&values, &rest))
        .await?;
    Ok(row.try_get("total")?)
}

/// How many dead letters match `filter`, and the highest seq among them.
pub(crate) async fn count<C: GenericClient + Sync>(
    client: &C,
    filter: &Filter,
) -> Result<(i64, Option<i64>)> {
    let values = filter.params();
    let row = client.query_typed_one(COUNT, &typed(&values, &[])).await?;
    Ok((row.try_get("matching")?, row.try_get("upto")?))
}

/// The ids and seqs of up to `limit` dead letters matching `filter` with `after < seq <= upto`.
pub(crate) async fn batch<C: GenericClient + Sync>(
    client: &C,
    filter: &Filter,
    after: i64,
    upto: i64,
    limit: i64,
) -> Result<Vec<(Uuid, i64)>> {
    let values = filter.params();
    let rest: [(&(dyn ToSql + Sync), Type); 3] = [
        (&after, Type::INT8),
        (&upto, Type::INT8),
        (&limit, Type::INT8),
    ];
    let rows = client.query_typed(BATCH, &typed(&values, &rest)).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("seq")?)))
        .collect()
}

/// A time of the filter as an instant (`filter_time.sql`, read in UTC): the database's reading of
/// it, or its error (`22...`: not a time it reads).
pub(crate) async fn filter_time<C: GenericClient + Sync>(
    client: &C,
    time: super::TimeText<'_>,
) -> Result<Timestamp> {
    use super::TimeText;
    client.batch_execute(UTC).await?;
    let (text, ago, of_day) = match time {
        TimeText::Text(t) => (Some(t), None, None),
        TimeText::Ago(s) => (None, Some(s), None),
        TimeText::OfDay(s) => (None, None, Some(f64::from(s))),
    };
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&text, Type::TEXT),
        (&ago, Type::FLOAT8),
        (&of_day, Type::FLOAT8),
    ];
    Ok(client
        .query_typed_one(FILTER_TIME, &params)
        .await?
        .try_get("at")?)
}

/// Dead letters of one cause (see [`causes`]).
#[derive(Debug, Clone)]
pub(crate) struct Cause {
    /// The error text without what varies (`error_cause.sql`; [`NO_ERROR_TEXT`] without any).
    pub(crate) cause: String,
    pub(crate) dead_letters: i64,
    pub(crate) first_seen: Timestamp,
    pub(crate) last_seen: Timestamp,
}

/// The dead letters matching `filter` by cause, most frequent first, at most `limit` causes, among
/// at most `looked` dead letters; and how many were looked at (below `looked`: every match).
pub(crate) async fn causes<C: GenericClient + Sync>(
    client: &C,
    filter: &Filter,
    looked: i64,
    limit: i64,
) -> Result<(Vec<Cause>, i64)> {
    let values = filter.params();
    let rest: [(&(dyn ToSql + Sync), Type); 2] = [(&looked, Type::INT8), (&limit, Type::INT8)];
    let rows = client.query_typed(CAUSES, &typed(&values, &rest)).await?;
    let mut looked_at = 0;
    let causes = rows
        .iter()
        .map(|r| {
            looked_at = r.try_get("looked_at")?;
            Ok(Cause {
                cause: r.try_get("cause")?,
                dead_letters: r.try_get("dead_letters")?,
                first_seen: r.try_get("first_seen")?,
                last_seen: r.try_get("last_seen")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((causes, looked_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILTER: &str = include_str!("../../../sql/queries/console/dead_letter_filter.sql");
    const CAUSE: &str = include_str!("../../../sql/queries/console/error_cause.sql");

    /// The text between `/* {name} */` and `/* end {name} */` in `sql`, each time it occurs.
    fn fragments<'a>(sql: &'a str, name: &str) -> Vec<&'a str> {
        let (open, close) = (format!("/* {name} */"), format!("/* end {name} */"));
        let mut found = Vec::new();
        let mut rest = sql;
        while let Some(start) = rest.find(&open) {
            let after = &rest[start + open.len()..];
            let end = after.find(&close).expect(&close);
            found.push(&after[..end]);
            rest = &after[end + close.len()..];
        }
        found
    }

    /// Every statement that applies the filter, or computes a cause, has the canonical text of it
    /// exactly (`dead_letter_filter.sql`, `error_cause.sql`): written out in each file, the copies
    /// cannot drift apart.
    #[test]
    fn every_statement_writes_out_the_canonical_filter_and_cause() {
        let [filter] = fragments(FILTER, "dead_letter_filter.sql")[..] else {
            panic!("dead_letter_filter.sql has one filter")
        };
        let [cause] = fragments(CAUSE, "error_cause.sql")[..] else {
            panic!("error_cause.sql has one cause")
        };
        assert_eq!(fragments(filter, "error_cause.sql"), [cause]);
        let filtered = [
            PAGE,
            PAGE_BEFORE,
            PAGE_DEAD,
            PAGE_DEAD_BEFORE,
            TOTAL,
            COUNT,
            BATCH,
            CAUSES,
        ];
        for sql in filtered {
            assert_eq!(fragments(sql, "dead_letter_filter.sql"), [filter], "{sql}");
            assert!(!sql.contains("error_cause("), "no pseudo-call left: {sql}");
        }
        // The causes' statement computes the cause outside its filter too.
        assert_eq!(fragments(CAUSES, "error_cause.sql"), [cause, cause]);
    }
}
