//! One clock: the relay compares the times PostgreSQL wrote (`created_at`, `processed_at`,
//! `retry_after`) only with PostgreSQL's own clock. Cutoffs, retry times, ages and eligibility are
//! computed in SQL from `now()`; the relay's clock only measures durations (monotonic). Where a
//! moment the relay saw (a JetStream ack) meets a time the database wrote (the commit-to-publish
//! lag, the outbox wait of a span), [`DbClock`] puts that moment on the database's clock first:
//! the machine's wall clock may be minutes off (a container host that drifted).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio_postgres::GenericClient;

use crate::error::Result;

const CLOCK: &str = include_str!("../sql/queries/clock/clock.sql");

/// The database's clock as read from this process: how far it is ahead of (or behind) this
/// machine's wall clock, measured over a connection and refreshed by the relay's stats task.
#[derive(Debug, Default)]
pub(crate) struct DbClock {
    /// The database's clock minus this machine's, in microseconds (0 until measured).
    offset_micros: AtomicI64,
}

impl DbClock {
    /// Reads the database's clock over `client`: the offset is the server's time minus this
    /// machine's at the middle of the round trip (so off by at most half of it).
    pub async fn measure<C: GenericClient + Sync>(&self, client: &C) -> Result<()> {
        let local = SystemTime::now();
        let started = Instant::now();
        let server: SystemTime = client.query_typed_one(CLOCK, &[]).await?.try_get(0)?;
        let middle = local.checked_add(started.elapsed() / 2).unwrap_or(local);
        self.offset_micros
            .store(offset_micros(server, middle), Ordering::Relaxed);
        Ok(())
    }

    /// The database's clock minus this machine's (0 until measured): (ahead, by how much).
    fn offset(&self) -> (bool, Duration) {
        let micros = self.offset_micros.load(Ordering::Relaxed);
        (micros >= 0, Duration::from_micros(micros.unsigned_abs()))
    }

    /// `local`, a moment read from this machine's wall clock, on the database's clock.
    pub fn on_db_clock(&self, local: SystemTime) -> SystemTime {
        let (ahead, by) = self.offset();
        let moved = if ahead {
            local.checked_add(by)
        } else {
            local.checked_sub(by)
        };
        moved.unwrap_or(local)
    }

    /// Now, on the database's clock.
    pub fn now(&self) -> SystemTime {
        self.on_db_clock(SystemTime::now())
    }
}

/// `server - local` in microseconds, saturating.
fn offset_micros(server: SystemTime, local: SystemTime) -> i64 {
    match server.duration_since(local) {
        Ok(ahead) => i64::try_from(ahead.as_micros()).unwrap_or(i64::MAX),
        Err(behind) => i64::try_from(behind.duration().as_micros())
            .map(|m| -m)
            .unwrap_or(i64::MIN + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_moment_moves_by_the_offset_either_way() {
        let local = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = DbClock::default();
        assert_eq!(clock.on_db_clock(local), local, "not measured: as is");
        for (server, expected) in [
            (
                local + Duration::from_secs(600),
                local + Duration::from_secs(600),
            ),
            (
                local - Duration::from_secs(600),
                local - Duration::from_secs(600),
            ),
        ] {
            clock
                .offset_micros
                .store(offset_micros(server, local), Ordering::Relaxed);
            assert_eq!(clock.on_db_clock(local), expected);
        }
        assert_eq!(offset_micros(local, local), 0);
        // Beyond what a SystemTime holds: the moment stays as it was, never a panic.
        clock.offset_micros.store(i64::MIN + 1, Ordering::Relaxed);
        let _ = clock.on_db_clock(SystemTime::UNIX_EPOCH);
        clock.offset_micros.store(i64::MAX, Ordering::Relaxed);
        let _ = clock.on_db_clock(local);
    }
}
