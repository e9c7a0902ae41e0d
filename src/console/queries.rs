//! The console's own statements (`sql/queries/console`): filtered, keyset-paginated dead letters,
//! one event and its followers, the published-per-minute chart and the connected relays. Each
//! runs in a transaction the caller opened with `ops::checked_transaction_in`.

use std::sync::LazyLock;

use bytes::BytesMut;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::error::Result;
use crate::timestamp::Timestamp;

static PAGE: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letters_page.sql"
    ))
});
static PAGE_BEFORE: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letters_page_before.sql"
    ))
});
static PAGE_DEAD: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letters_page_dead.sql"
    ))
});
static PAGE_DEAD_BEFORE: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letters_page_dead_before.sql"
    ))
});
static TOTAL: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letters_total.sql"
    ))
});
static COUNT: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letters_count.sql"
    ))
});
static BATCH: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letters_batch.sql"
    ))
});
static CAUSES: LazyLock<String> = LazyLock::new(|| {
    filtered(include_str!(
        "../../sql/queries/console/dead_letter_causes.sql"
    ))
});
const FILTER: &str = include_str!("../../sql/queries/console/dead_letter_filter.sql");
const CLOCK: &str = include_str!("../../sql/queries/clock/clock.sql");
const CAUSE: &str = include_str!("../../sql/queries/console/error_cause.sql");

/// A statement with the list's filter and the cause expression spliced in (one definition of
/// each for every statement that applies them).
fn filtered(sql: &str) -> String {
    sql.replace("/* dead_letter_filter.sql */", FILTER).replace(
        "error_cause(last_error)",
        &format!("({})", CAUSE.trim_end()),
    )
}
const DETAIL: &str = include_str!("../../sql/queries/console/event_detail.sql");
const FOLLOWERS: &str = include_str!("../../sql/queries/console/followers.sql");
const PER_MINUTE: &str = include_str!("../../sql/queries/console/processed_per_minute.sql");
const RELAYS: &str = include_str!("../../sql/queries/console/relays.sql");
const RELAYS_REPORTED: &str = include_str!("../../sql/queries/console/relays_reported.sql");

/// The filter of the dead-letter list, which a bulk action applies as it is: every field `None`
/// matches every dead letter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    pub(crate) event_type: Option<String>,
    pub(crate) aggregate_type: Option<String>,
    pub(crate) aggregate_id: Option<String>,
    /// Text somewhere in `last_error`, in any case.
    pub(crate) error: Option<String>,
    /// Dead-lettered at or after (any timestamp PostgreSQL reads, in its time zone).
    pub(crate) since: Option<String>,
    /// Dead-lettered before.
    pub(crate) until: Option<String>,
    /// The cause (`error_cause.sql`: the error text without what varies), exactly.
    pub(crate) cause: Option<String>,
}

impl Filter {
    /// The form fields and query parameters, by name.
    pub(crate) const FIELDS: [&'static str; 7] = [
        "event_type",
        "aggregate_type",
        "aggregate_id",
        "error",
        "since",
        "until",
        "cause",
    ];

    /// Each field's cap, in characters: the column's own for ids and types; enough for any error
    /// text worth searching and any timestamp. A longer value is refused (a 400 naming the
    /// field) rather than searched for and echoed into pages and redirects.
    pub(crate) const CAPS: [usize; 7] = [100, 255, 255, 1_000, 100, 100, 300];

    /// The first field over its cap ([`Filter::CAPS`]), with that cap.
    pub(crate) fn over_cap(&self) -> Option<(&'static str, usize)> {
        Filter::FIELDS
            .iter()
            .zip(Filter::CAPS)
            .zip(self.values())
            .find(|((_, cap), value)| value.is_some_and(|v| v.chars().count() > *cap))
            .map(|((field, cap), _)| (*field, cap))
    }

    /// From form or query pairs; empty values match anything.
    pub(crate) fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut f = Filter::default();
        for (k, v) in pairs {
            let v = v.trim();
            let value = (!v.is_empty()).then(|| v.to_string());
            match k {
                "event_type" => f.event_type = value,
                "aggregate_type" => f.aggregate_type = value,
                "aggregate_id" => f.aggregate_id = value,
                "error" => f.error = value,
                "since" => f.since = value,
                "until" => f.until = value,
                "cause" => f.cause = value,
                _ => {}
            }
        }
        f
    }

    /// (name, value) of the fields set, in [`Filter::FIELDS`] order.
    pub(crate) fn pairs(&self) -> Vec<(&'static str, &str)> {
        Filter::FIELDS
            .iter()
            .zip(self.values())
            .filter_map(|(k, v)| v.map(|v| (*k, v)))
            .collect()
    }

    /// Every field, set or not, in [`Filter::FIELDS`] order.
    pub(crate) fn values(&self) -> [Option<&str>; 7] {
        [
            self.event_type.as_deref(),
            self.aggregate_type.as_deref(),
            self.aggregate_id.as_deref(),
            self.error.as_deref(),
            self.since.as_deref(),
            self.until.as_deref(),
            self.cause.as_deref(),
        ]
    }

    /// The field `name` unset.
    pub(crate) fn clear(&mut self, name: &str) {
        let field = match name {
            "event_type" => &mut self.event_type,
            "aggregate_type" => &mut self.aggregate_type,
            "aggregate_id" => &mut self.aggregate_id,
            "error" => &mut self.error,
            "since" => &mut self.since,
            "until" => &mut self.until,
            "cause" => &mut self.cause,
            _ => return,
        };
        *field = None;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.values().iter().all(Option::is_none)
    }

    /// `$1`..`$8` of the filtered statements: the fields, then a word every error of the cause
    /// contains (see [`Filter::cause_word`]).
    fn params(&self) -> Vec<Option<&str>> {
        let mut params = self.values().to_vec();
        params.push(self.cause.as_deref().map(cause_word));
        params
    }
}

/// The cause of a dead letter without an error text (`error_cause.sql`).
pub(crate) const NO_ERROR_TEXT: &str = "(no error text)";

/// The longest word of `cause` outside its placeholders (`error_cause.sql`: `<id>`, `<n>`,
/// `"..."`, white space made one space): a substring of every error text of that cause, which the
/// filter searches for before it computes a row's cause. Empty when the cause has none.
pub(crate) fn cause_word(cause: &str) -> &str {
    // Rows without an error text: there is no word to look for.
    if cause == NO_ERROR_TEXT {
        return "";
    }
    let words: Vec<&str> = cause.split(['<', '>', '"', ' ']).collect();
    // A cause cut at its 300 characters may end inside a placeholder (`<i`): not a word.
    let whole = match cause.chars().count() >= 300 {
        true => &words[..words.len().saturating_sub(1)],
        false => &words[..],
    };
    whole
        .iter()
        .filter(|w| !matches!(**w, "id" | "n" | "..."))
        .max_by_key(|w| w.len())
        .copied()
        .unwrap_or("")
}

/// The order of the dead-letter list (its `sort` parameter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Sort {
    /// By seq, the order the events were written in (the default).
    #[default]
    Seq,
    /// By the time they were dead-lettered, then by seq.
    Dead,
}

impl Sort {
    /// Every order, as the list offers them.
    pub(crate) const ALL: [Sort; 2] = [Sort::Seq, Sort::Dead];

    /// From the `sort` parameter: `seq` or `dead`; empty or absent, the default.
    pub(crate) fn parse(value: Option<&str>) -> Option<Sort> {
        match value.map(str::trim).unwrap_or("") {
            "" | "seq" => Some(Sort::Seq),
            "dead" => Some(Sort::Dead),
            _ => None,
        }
    }

    /// Its value of the `sort` parameter.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Sort::Seq => "seq",
            Sort::Dead => "dead",
        }
    }

    /// `("sort", name)` for a link that keeps this order; none for the default, whose links stay
    /// as they were before there was a choice.
    pub(crate) fn pair(self) -> Option<(&'static str, &'static str)> {
        (self != Sort::Seq).then_some(("sort", self.name()))
    }
}

/// A `timestamptz` exactly as PostgreSQL stores it: microseconds from 2000-01-01 UTC, `i64::MIN`
/// and `i64::MAX` being `-infinity` and `infinity`. Read from a row and sent back unconverted, so
/// that the list's keyset by time dead compares exactly what the rows hold, whatever they hold
/// (a value written by raw SQL may be any of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored(pub(crate) i64);

impl<'a> FromSql<'a> for Stored {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 8] = raw
            .try_into()
            .map_err(|_| format!("a timestamp is 8 bytes, got {}", raw.len()))?;
        Ok(Stored(i64::from_be_bytes(bytes)))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }
}

impl ToSql for Stored {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(&self.0.to_be_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }

    to_sql_checked!();
}

/// A row's place in the list's order: its seq and, by time dead, its `dead_lettered_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) dead: Stored,
    pub(crate) seq: i64,
}

impl Key {
    /// Before every row, in either order: where the first page starts.
    pub(crate) const START: Key = Key {
        dead: Stored(i64::MIN),
        seq: i64::MIN,
    };

    /// As a link's `after` or `before` in the order `sort`: the seq by seq; by time dead, the
    /// time as stored and the seq, `MICROSECONDS_SEQ` (exact, whatever the time).
    pub(crate) fn param(self, sort: Sort) -> String {
        match sort {
            Sort::Seq => self.seq.to_string(),
            Sort::Dead => format!("{}_{}", self.dead.0, self.seq),
        }
    }

    /// From a link's `after` or `before` ([`Key::param`]).
    pub(crate) fn parse(value: &str, sort: Sort) -> Option<Key> {
        match sort {
            Sort::Seq => value.parse().ok().map(|seq| Key {
                dead: Stored(i64::MIN),
                seq,
            }),
            Sort::Dead => {
                let (dead, seq) = value.split_once('_')?;
                Some(Key {
                    dead: Stored(dead.parse().ok()?),
                    seq: seq.parse().ok()?,
                })
            }
        }
    }
}

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
            let sql = if before { &*PAGE_BEFORE } else { &*PAGE };
            let rest: [(&(dyn ToSql + Sync), Type); 2] =
                [(&key.seq, Type::INT8), (&limit, Type::INT8)];
            client.query_typed(sql, &typed(&values, &rest)).await?
        }
        Sort::Dead => {
            let sql = if before {
                &*PAGE_DEAD_BEFORE
            } else {
                &*PAGE_DEAD
            };
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
        .query_typed_one(&TOTAL, &typed(&values, &rest))
        .await?;
    Ok(row.try_get("total")?)
}

/// How many dead letters match `filter`, and the highest seq among them.
pub(crate) async fn count<C: GenericClient + Sync>(
    client: &C,
    filter: &Filter,
) -> Result<(i64, Option<i64>)> {
    let values = filter.params();
    let row = client.query_typed_one(&COUNT, &typed(&values, &[])).await?;
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
    let rows = client.query_typed(&BATCH, &typed(&values, &rest)).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("seq")?)))
        .collect()
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
    let rows = client.query_typed(&CAUSES, &typed(&values, &rest)).await?;
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

/// The database's clock: what the pages' ages ("3 min ago") are counted from, never this
/// machine's (which may be minutes off).
pub(crate) async fn db_now<C: GenericClient + Sync>(client: &C) -> Result<Timestamp> {
    Ok(client.query_typed_one(CLOCK, &[]).await?.try_get(0)?)
}

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

/// Events published in each of the last 60 minutes, oldest minute first.
pub(crate) async fn per_minute<C: GenericClient + Sync>(client: &C) -> Result<PerMinute> {
    let mut minutes = PerMinute::default();
    for r in client.query_typed(PER_MINUTE, &[]).await? {
        let ago: i32 = r.try_get("minutes_ago")?;
        if let Some(slot) = usize::try_from(ago).ok().filter(|a| *a < 60) {
            minutes.published[59 - slot] = r.try_get("published")?;
            minutes.dead_lettered[59 - slot] = r.try_get("dead_lettered")?;
        }
    }
    Ok(minutes)
}

/// Events published and dead-lettered in each of the last 60 minutes, oldest first (the last:
/// the current minute, still going).
#[derive(Debug, Clone)]
pub(crate) struct PerMinute {
    pub(crate) published: [i64; 60],
    pub(crate) dead_lettered: [i64; 60],
}

impl Default for PerMinute {
    fn default() -> Self {
        PerMinute {
            published: [0; 60],
            dead_lettered: [0; 60],
        }
    }
}

/// Relay connections, per application name and client address.
#[derive(Debug, Clone)]
pub(crate) struct RelayConnection {
    pub(crate) application_name: String,
    pub(crate) client_addr: Option<String>,
    pub(crate) connections: i64,
    pub(crate) since: Option<Timestamp>,
}

/// The relays connected to the database (from `pg_stat_activity`).
pub(crate) async fn relays<C: GenericClient + Sync>(client: &C) -> Result<Vec<RelayConnection>> {
    client
        .query_typed(RELAYS, &[])
        .await?
        .iter()
        .map(|r| {
            Ok(RelayConnection {
                application_name: r.try_get("application_name")?,
                client_addr: r.try_get("client_addr")?,
                connections: r.try_get("connections")?,
                since: r.try_get("since")?,
            })
        })
        .collect()
}

/// A relay as it reported itself in `outbox_relays`.
#[derive(Debug, Clone)]
pub(crate) struct ReportedRelay {
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) version: String,
    pub(crate) source: String,
    pub(crate) slot: Option<String>,
    /// How often it reports, in seconds.
    pub(crate) interval_seconds: f64,
    pub(crate) started_at: Timestamp,
    pub(crate) last_publish_at: Option<Timestamp>,
    pub(crate) published_last_minute: i64,
    pub(crate) oldest_pending_seconds: Option<f64>,
    pub(crate) slot_lag_bytes: Option<f64>,
    /// Since its last report, by the database's clock.
    pub(crate) seen_seconds_ago: f64,
}

/// The relays reporting themselves (none: the console lists connections, [`relays`]).
pub(crate) async fn reported_relays<C: GenericClient + Sync>(
    client: &C,
) -> Result<Vec<ReportedRelay>> {
    let rows = client.query_typed(RELAYS_REPORTED, &[]).await?;
    rows.iter()
        .map(|r| {
            Ok(ReportedRelay {
                host: r.try_get("host")?,
                pid: r.try_get("pid")?,
                version: r.try_get("version")?,
                source: r.try_get("source")?,
                slot: r.try_get("slot")?,
                interval_seconds: r.try_get("interval_seconds")?,
                started_at: r.try_get("started_at")?,
                last_publish_at: r.try_get("last_publish_at")?,
                published_last_minute: r.try_get("published_last_minute")?,
                oldest_pending_seconds: r.try_get("oldest_pending_seconds")?,
                slot_lag_bytes: r.try_get("slot_lag_bytes")?,
                seen_seconds_ago: r.try_get("seen_seconds_ago")?,
            })
        })
        .collect::<Result<Vec<_>>>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_word_searched_for_is_the_causes_longest_outside_its_placeholders() {
        use super::cause_word;
        let cause = r#"message <id> of <n> bytes is over the server's max_payload (<n>) for "...""#;
        assert_eq!(cause_word(cause), "max_payload");
        assert_eq!(cause_word("<n> <id>"), "");
        assert_eq!(cause_word(""), "");
        assert_eq!(cause_word(super::NO_ERROR_TEXT), "");
        assert_eq!(cause_word("utf<n>: bad byte"), "byte");
        let cut = format!("{} <i", "a".repeat(296));
        assert_eq!(cause_word(&cut), "a".repeat(296));
        let cut = format!("{} <i", "ab ".repeat(99));
        assert_eq!(cause_word(&cut), "ab", "not the cut placeholder");
    }

    use super::*;

    #[test]
    fn empty_fields_match_anything() {
        let f = Filter::from_pairs([("event_type", " order.created "), ("error", ""), ("x", "y")]);
        assert_eq!(f.event_type.as_deref(), Some("order.created"));
        assert_eq!(f.error, None);
        assert_eq!(f.pairs(), vec![("event_type", "order.created")]);
        assert!(!f.is_empty());
        assert!(Filter::from_pairs([("since", "  ")]).is_empty());
    }

    #[test]
    fn sorts_and_places_read_back_what_links_write() {
        assert_eq!(Sort::parse(None), Some(Sort::Seq));
        assert_eq!(Sort::parse(Some("")), Some(Sort::Seq));
        assert_eq!(Sort::parse(Some("seq")), Some(Sort::Seq));
        assert_eq!(Sort::parse(Some("dead")), Some(Sort::Dead));
        assert_eq!(Sort::parse(Some("Dead")), None);
        assert_eq!(Sort::parse(Some("newest")), None);
        for sort in Sort::ALL {
            assert_eq!(Sort::parse(Some(sort.name())), Some(sort));
        }
        assert_eq!(
            Sort::Seq.pair(),
            None,
            "the default's links stay as they were"
        );
        assert_eq!(Sort::Dead.pair(), Some(("sort", "dead")));

        let key = Key {
            dead: Stored(851_234_567_890_123),
            seq: 42,
        };
        assert_eq!(key.param(Sort::Seq), "42");
        assert_eq!(key.param(Sort::Dead), "851234567890123_42");
        assert_eq!(Key::parse("851234567890123_42", Sort::Dead), Some(key));
        assert_eq!(Key::parse("42", Sort::Seq).map(|k| k.seq), Some(42));
        for key in [
            Key::START,
            Key {
                dead: Stored(i64::MAX),
                seq: 7,
            },
            Key {
                dead: Stored(-5),
                seq: 1,
            },
        ] {
            assert_eq!(Key::parse(&key.param(Sort::Dead), Sort::Dead), Some(key));
        }
        assert_eq!(
            Key::parse(&Key::START.param(Sort::Seq), Sort::Seq),
            Some(Key::START)
        );
        for bad in ["", "42", "_42", "1_", "x_1", "1_2_3"] {
            assert_eq!(Key::parse(bad, Sort::Dead), None, "{bad:?}");
        }
        assert_eq!(Key::parse("1_2", Sort::Seq), None);
    }
}
