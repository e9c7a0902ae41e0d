//! What the overview shows besides the dead letters: the database's clock, the published and
//! dead-lettered per minute, and the relays (connected, and as they report themselves).

use tokio_postgres::GenericClient;

use crate::error::Result;
use crate::timestamp::Timestamp;

const CLOCK: &str = include_str!("../../../sql/queries/clock/clock.sql");
const PER_MINUTE: &str = include_str!("../../../sql/queries/console/processed_per_minute.sql");
const RELAYS: &str = include_str!("../../../sql/queries/console/relays.sql");
const RELAYS_REPORTED: &str = include_str!("../../../sql/queries/console/relays_reported.sql");

/// The database's clock: what the pages' ages ("3 min ago") are counted from, never this
/// machine's (which may be minutes off).
pub(crate) async fn db_now<C: GenericClient + Sync>(client: &C) -> Result<Timestamp> {
    Ok(client.query_typed_one(CLOCK, &[]).await?.try_get(0)?)
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
