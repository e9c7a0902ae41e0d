//! Every database call of the console, in one place: reads in a transaction of their own that
//! sets the search_path and checks the schema version (`ops::Outbox`'s checked transaction), and the
//! changes through the operator commands' own functions (`ops`), so that the console retries and
//! discards exactly as `outbox-relay dead-letters` does (same statements, same wake-up of the
//! relays, same order rules).

use tokio_postgres::Client;
use uuid::Uuid;

use super::queries::{
    self, Cause, Detail, Filter, Follower, ListedDeadLetter, RelayConnection, ReportedRelay,
};
use crate::error::Result;
use crate::ops::{self, Outbox};
use crate::schema::Schema;

/// Blocked aggregates the overview lists at most.
const BLOCKED_LISTED: i64 = 20;
/// Blocked aggregates the overview counts at most: counting every one of a million takes a
/// quarter of a second, more than the rest of the overview together. The page shows more as
/// "10,000+"; `outbox-relay status` counts them all.
pub(crate) const BLOCKED_COUNTED: i64 = 10_000;
/// Dead letters the causes are counted among at most: the cause is a few regular expressions per
/// row, and a million dead letters would take seconds. The pages say when the count stopped there.
pub(crate) const CAUSES_LOOKED: i64 = 10_000;
/// Causes the overview lists at most.
const CAUSES_ON_OVERVIEW: i64 = 5;
/// Causes the dead-letter list shows at most above its rows.
const CAUSES_LISTED: i64 = 20;
/// Followers the detail view lists at most.
const FOLLOWERS_LISTED: i64 = 50;

/// The operations handle on `client` for the console's schema (checked when the console was
/// built; checked again here, which costs nothing).
fn outbox<'c>(client: &'c mut Client, schema: Option<&str>) -> Result<Outbox<'c>> {
    Ok(Outbox::new(client, Schema::optional(schema)?))
}

/// What the overview shows.
pub(crate) struct Overview {
    pub(crate) status: ops::Status,
    pub(crate) blocked: Vec<ops::BlockedAggregate>,
    pub(crate) wal_slots: Vec<ops::WalSlot>,
    pub(crate) per_minute: queries::PerMinute,
    /// Connections by application name (what the overview lists while no relay reports itself).
    pub(crate) relays: Vec<RelayConnection>,
    /// The relays reporting themselves.
    pub(crate) reported: Vec<ReportedRelay>,
    /// The most frequent causes of the dead letters, and how many dead letters they were counted
    /// among.
    pub(crate) causes: (Vec<Cause>, i64),
    /// The database's clock (for the ages shown).
    pub(crate) now: crate::timestamp::Timestamp,
}

/// The overview, read in one transaction.
pub(crate) async fn overview(client: &mut Client, schema: Option<&str>) -> Result<Overview> {
    let mut outbox = outbox(client, schema)?;
    let tx = outbox.checked_transaction().await?;
    let overview = Overview {
        status: ops::read_status(&tx, Some(BLOCKED_COUNTED + 1)).await?,
        blocked: ops::read_blocked_aggregates(&tx, BLOCKED_LISTED).await?,
        wal_slots: ops::read_wal_slots(&tx).await?,
        per_minute: queries::per_minute(&tx).await?,
        relays: queries::relays(&tx).await?,
        reported: queries::reported_relays(&tx).await?,
        causes: queries::causes(&tx, &Filter::default(), CAUSES_LOOKED, CAUSES_ON_OVERVIEW).await?,
        now: queries::db_now(&tx).await?,
    };
    tx.commit().await?;
    Ok(overview)
}

/// Dead letters the list's total counts at most (more show as "10,000+"); a bulk action counts
/// them all before it asks to confirm.
pub(crate) const TOTAL_COUNTED: i64 = 10_000;

/// One page of the dead-letter list.
pub(crate) struct Listed {
    pub(crate) rows: Vec<ListedDeadLetter>,
    /// How many match the filter, counted up to [`TOTAL_COUNTED`] + 1.
    pub(crate) total: i64,
    /// The causes of the matching dead letters, and how many they were counted among (when
    /// asked for: the first page).
    pub(crate) causes: Option<(Vec<Cause>, i64)>,
    /// The database's clock.
    pub(crate) now: crate::timestamp::Timestamp,
}

/// One page of the dead-letter list, with the total, the causes (`with_causes`) and the
/// database's clock, in one transaction. The causes count the matches up to [`CAUSES_LOOKED`]:
/// below that, their count is the total, and the matches are not read a second time for it.
pub(crate) async fn page(
    client: &mut Client,
    schema: Option<&str>,
    filter: &Filter,
    sort: queries::Sort,
    from: queries::From,
    limit: i64,
    with_causes: bool,
) -> Result<Listed> {
    let mut outbox = outbox(client, schema)?;
    let tx = outbox.checked_transaction().await?;
    let rows = queries::page(&tx, filter, sort, from, limit).await?;
    let causes = match with_causes {
        true => Some(queries::causes(&tx, filter, CAUSES_LOOKED, CAUSES_LISTED).await?),
        false => None,
    };
    let total = match &causes {
        Some((_, looked_at)) if *looked_at < CAUSES_LOOKED => *looked_at,
        _ => queries::total(&tx, filter, TOTAL_COUNTED + 1).await?,
    };
    let now = queries::db_now(&tx).await?;
    tx.commit().await?;
    Ok(Listed {
        rows,
        total,
        causes,
        now,
    })
}

/// A field of the filter refused, and why (the form comes back with it marked).
pub(crate) type Refused = (&'static str, String);

/// `filter` as the statements take it: its times ("dead since", "dead before") read as the pages
/// show times (UTC), relative ones from the database's clock, each written back as an instant
/// with its zone, so that a bulk action confirmed now acts on the same times later. `Ok(Err)`: a
/// time it does not read. Without times, `filter` as it is, without a connection.
pub(crate) async fn resolve(
    client: &mut Client,
    schema: Option<&str>,
    filter: &Filter,
) -> Result<std::result::Result<Filter, Refused>> {
    if filter.since.is_none() && filter.until.is_none() {
        return Ok(Ok(filter.clone()));
    }
    let mut resolved = filter.clone();
    let mut outbox = outbox(client, schema)?;
    let tx = outbox.checked_transaction().await?;
    for (name, field) in [
        ("since", &mut resolved.since),
        ("until", &mut resolved.until),
    ] {
        let Some(typed) = field.as_deref() else {
            continue;
        };
        let refused = |why: &str| {
            (
                name,
                format!(
                    "the filter is not valid: {name}: not a time the console reads ({why}): \
                     write it as the pages show \
                     times (2026-12-07 04:29:00, read as UTC), a time of day (04:29, the last \
                     one, UTC) or a time ago (10 minutes ago, -5 min)"
                ),
            )
        };
        let at = match queries::filter_time(&tx, queries::read_time(typed)).await {
            Ok(at) => at,
            Err(e) => match e.as_db_error().and_then(|d| d.as_db_error()) {
                Some(d) if d.code().code().starts_with("22") => {
                    return Ok(Err(refused(d.message())));
                }
                _ => return Err(e),
            },
        };
        *field = Some(match (at.rfc3339(), at.is_finite()) {
            (Ok(text), _) => text,
            (Err(_), false) => at.to_string(),
            (Err(why), true) => return Ok(Err(refused(&why))),
        });
    }
    tx.commit().await?;
    Ok(Ok(resolved))
}

/// How many dead letters match, and the highest seq among them.
pub(crate) async fn count(
    client: &mut Client,
    schema: Option<&str>,
    filter: &Filter,
) -> Result<(i64, Option<i64>)> {
    let mut outbox = outbox(client, schema)?;
    let tx = outbox.checked_transaction().await?;
    let counted = queries::count(&tx, filter).await?;
    tx.commit().await?;
    Ok(counted)
}

/// The next batch of a bulk action: ids in seq order, and the highest seq.
pub(crate) async fn batch(
    client: &mut Client,
    schema: Option<&str>,
    filter: &Filter,
    after: i64,
    upto: i64,
    limit: i64,
) -> Result<Vec<(Uuid, i64)>> {
    let mut outbox = outbox(client, schema)?;
    let tx = outbox.checked_transaction().await?;
    let ids = queries::batch(&tx, filter, after, upto, limit).await?;
    tx.commit().await?;
    Ok(ids)
}

/// One event with (up to 50 of) the pending events of its aggregate behind it and their count.
pub(crate) async fn detail(
    client: &mut Client,
    schema: Option<&str>,
    id: Uuid,
) -> Result<Option<(Detail, Vec<Follower>, i64)>> {
    let mut outbox = outbox(client, schema)?;
    let tx = outbox.checked_transaction().await?;
    let found = match queries::detail(&tx, id).await? {
        Some(d) => {
            let (list, total) = queries::followers(
                &tx,
                &d.aggregate_type,
                &d.aggregate_id,
                d.seq,
                FOLLOWERS_LISTED,
            )
            .await?;
            Some((d, list, total))
        }
        None => None,
    };
    tx.commit().await?;
    Ok(found)
}

/// What an action does to the dead letters it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// A fresh set of attempts (`dead-letters retry`).
    Retry,
    /// Given up for good (`dead-letters discard`).
    Discard,
}

impl Action {
    pub(crate) fn parse(s: &str) -> Option<Action> {
        match s {
            "retry" => Some(Action::Retry),
            "discard" => Some(Action::Discard),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Discard => "discard",
        }
    }

    pub(crate) fn past(self) -> &'static str {
        match self {
            Action::Retry => "retried",
            Action::Discard => "discarded",
        }
    }
}

/// `action` on the named dead letters, all in one transaction (none when one of them is not a
/// dead letter any more): `dead-letters retry|discard ID...`.
pub(crate) async fn apply(
    client: &mut Client,
    schema: Option<&str>,
    action: Action,
    ids: &[Uuid],
) -> Result<u64> {
    let mut outbox = outbox(client, schema)?;
    let changed = match action {
        Action::Retry => outbox.retry_dead_letters(Some(ids)).await?,
        Action::Discard => outbox.discard_dead_letters(ids).await?,
    };
    Ok(changed.len() as u64)
}
