//! The retry and dead-letter policy as pure functions: who is to blame for a failed publish,
//! whether it spends one of the row's attempts, when the row is tried again, when it is
//! dead-lettered, and whether a whole batch met a broker outage rather than bad events. The outcome of
//! each publish is defined here, next to the rules that judge it. The relay loop asks; nothing here
//! does I/O, so every rule has a unit test below.

use std::time::{Duration, SystemTime};

use backoff::backoff::Backoff;
use backoff::exponential::ExponentialBackoff;
use backoff::{ExponentialBackoffBuilder, SystemClock};

use crate::config::RetryConfig;

/// Who is to blame for a failed publish: it decides whether an attempt is spent. Only failures
/// that are the event's own spend attempts; the broker's trouble never does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// The event can never be published as it is (invalid subject, header or timestamp):
    /// dead-letter it at once.
    Invalid,
    /// The message is larger than the server's `max_payload` or the stream's maximum message size:
    /// no retry can help, dead-letter it at once.
    TooLarge,
    /// JetStream answers, but refuses this event (no stream listens on its subject): spend an
    /// attempt, retry with backoff.
    Rejected,
    /// No ack in time: the broker is slow, restarting or gone. Not the event's fault.
    Timeout,
    /// The broker cannot take messages now (connection lost, no responders while JetStream does
    /// not answer, storage full, no leader): not the event's fault.
    Broker,
}

/// What happened to one event of a batch.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Stored by JetStream (`duplicate`: it was already there, dropped by the Msg-Id dedup).
    Published {
        duplicate: bool,
        /// When the ack came, on the database's clock (see [`crate::clock`]): it is compared with
        /// the row's `created_at`.
        acked_at: SystemTime,
    },
    Failed(Failure),
    /// An earlier event of the same aggregate failed, so this one was put back.
    NotAttempted,
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
    /// The subject nobody answered on ("no responders"): whose fault that is is settled by a
    /// lookup after the batch (see `Publisher::publish`).
    pub(crate) no_responders: Option<String>,
    /// The event's send span (disabled unless traced): what is logged about this failure is logged
    /// inside it, so that the log lines and span events belong to the send.
    pub span: tracing::Span,
}

impl Failure {
    pub(crate) fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
            no_responders: None,
            span: tracing::Span::none(),
        }
    }
}

impl FailureKind {
    /// The `reason` label of `outbox_events_failed`.
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Invalid | FailureKind::TooLarge | FailureKind::Rejected => "rejected",
            FailureKind::Timeout => "timeout",
            FailureKind::Broker => "broker",
        }
    }

    /// Counts against `max_attempts` (and is recorded in the row's `attempts`): the event's own
    /// failures do, the broker's trouble never.
    pub fn spends_attempt(self) -> bool {
        matches!(
            self,
            FailureKind::Invalid | FailureKind::TooLarge | FailureKind::Rejected
        )
    }

    /// Dead-letter now, whatever the attempts.
    pub fn is_permanent(self) -> bool {
        matches!(self, FailureKind::Invalid | FailureKind::TooLarge)
    }

    /// The broker's trouble, not the event's: no attempt spent, never dead-lettered.
    pub fn is_brokers(self) -> bool {
        !self.spends_attempt() && !self.is_permanent()
    }
}

/// The retry settings of a [`RelayConfig`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    pub max_attempts: u32,
    pub initial: Duration,
    pub max: Duration,
}

/// What is recorded for one failed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The row's attempts after this failure.
    pub attempt: i32,
    pub spend_attempt: bool,
    pub dead_letter: bool,
    /// When to try the row again (meaningless for a dead letter).
    pub retry_in: Duration,
}

impl RetryPolicy {
    pub fn of(retry: &RetryConfig) -> RetryPolicy {
        RetryPolicy {
            max_attempts: retry.max_attempts,
            initial: retry.initial,
            max: retry.max,
        }
    }

    /// The verdict on a row that had `attempts` before this failure of `kind`.
    pub fn verdict(&self, attempts: i32, kind: FailureKind) -> Verdict {
        let spend = kind.spends_attempt();
        // Rows written by raw SQL may hold a negative count: count from zero then.
        let attempt = attempts.max(0).saturating_add(i32::from(spend));
        let max_attempts = i32::try_from(self.max_attempts).unwrap_or(i32::MAX);
        let dead_letter = kind.is_permanent() || (spend && attempt >= max_attempts);
        // The broker's trouble: try again soon (the relay itself backs off meanwhile).
        let retry_in = if spend {
            self.retry_delay(attempt.max(1).unsigned_abs())
        } else {
            self.initial
        };
        Verdict {
            attempt,
            spend_attempt: spend,
            dead_letter,
            retry_in,
        }
    }

    /// Exponential backoff with jitter for the `attempt`-th failure of a row:
    /// about `initial * 2^(attempt-1)`, capped at `max`.
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        let mut b = backoff(self.initial, self.max, 2.0, 0.25);
        let mut delay = self.initial;
        for _ in 0..attempt.min(64) {
            delay = b.next_backoff().unwrap_or(self.max);
        }
        delay.min(self.max)
    }
}

/// Nothing of the batch went through and nothing failed for a reason of its own: the broker is
/// down, not the events. The relay then spends no attempts and puts the rows back as they were.
pub(crate) fn is_broker_outage<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> bool {
    // At least one failure: a batch whose events were all postponed (`--transactions atomic`) met no
    // broker at all.
    let mut failed = false;
    outcomes.into_iter().all(|o| match o {
        Outcome::Published { .. } => false,
        Outcome::Failed(f) => {
            failed = true;
            f.kind.is_brokers()
        }
        Outcome::NotAttempted => true,
    }) && failed
}

/// After a batch that found rows, poll again after this pause rather than arming for
/// notifications at once; the relay arms only after a poll comes back empty.
pub(crate) const LINGER: Duration = Duration::from_millis(2);

/// The first claim after a writer's notification at idle takes at most this many heads (the
/// heads-only claim, cheaper for the one event a notification usually brings); the full claim
/// follows at once.
pub(crate) const WAKE_HEADS: usize = 16;

/// Pause after a failed batch or one that met the broker's trouble: 100 ms growing 1.5x to 10 s.
pub(crate) fn trouble_backoff() -> ExponentialBackoff<SystemClock> {
    backoff(
        Duration::from_millis(100),
        Duration::from_secs(10),
        1.5,
        0.5,
    )
}

/// Pause between start-up checks of PostgreSQL and NATS: 200 ms growing 1.5x to 5 s.
pub(crate) fn start_backoff() -> ExponentialBackoff<SystemClock> {
    backoff(Duration::from_millis(200), Duration::from_secs(5), 1.5, 0.5)
}

/// Pause between reconnects of the LISTEN connection: 100 ms growing 1.5x to 10 s.
pub(crate) fn reconnect_backoff() -> ExponentialBackoff<SystemClock> {
    backoff(
        Duration::from_millis(100),
        Duration::from_secs(10),
        1.5,
        0.3,
    )
}

fn backoff(
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: f64,
) -> ExponentialBackoff<SystemClock> {
    ExponentialBackoffBuilder::new()
        .with_initial_interval(initial)
        .with_max_interval(max)
        .with_multiplier(multiplier)
        .with_randomization_factor(jitter)
        .with_max_elapsed_time(None)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [FailureKind; 5] = [
        FailureKind::Invalid,
        FailureKind::TooLarge,
        FailureKind::Rejected,
        FailureKind::Timeout,
        FailureKind::Broker,
    ];

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }

    fn within(d: Duration, low_ms: u64, high_ms: u64) -> bool {
        d >= Duration::from_millis(low_ms) && d <= Duration::from_millis(high_ms)
    }

    #[test]
    fn retry_delay_doubles_per_attempt_with_jitter_up_to_max() {
        let p = policy();
        for _ in 0..50 {
            // 1 s, 2 s, 4 s, 8 s, ... each +-25%, never past 60 s.
            assert!(within(p.retry_delay(0), 1000, 1000));
            for attempt in 1..=6u32 {
                let nominal = 1000u64 << (attempt - 1);
                let d = p.retry_delay(attempt);
                let high = (nominal * 5 / 4).min(60_000);
                assert!(within(d, nominal * 3 / 4, high), "{attempt}: {d:?}");
            }
            for attempt in [7, 10, 40, 64, u32::MAX] {
                let d = p.retry_delay(attempt);
                assert!(within(d, 45_000, 60_000), "{attempt}: {d:?}");
            }
        }
    }

    #[test]
    fn only_the_events_own_failures_spend_attempts() {
        let spends: Vec<_> = ALL.iter().map(|k| k.spends_attempt()).collect();
        assert_eq!(spends, [true, true, true, false, false]);
        let permanent: Vec<_> = ALL.iter().map(|k| k.is_permanent()).collect();
        assert_eq!(permanent, [true, true, false, false, false]);
        let brokers: Vec<_> = ALL.iter().map(|k| k.is_brokers()).collect();
        assert_eq!(brokers, [false, false, false, true, true]);
        let labels: Vec<_> = ALL.iter().map(|k| k.label()).collect();
        assert_eq!(
            labels,
            ["rejected", "rejected", "rejected", "timeout", "broker"]
        );
    }

    #[test]
    fn verdict_for_every_kind_and_attempt_count() {
        let p = policy();
        for attempts in [i32::MIN, -5, 0, 1, 2, 3, 100, i32::MAX] {
            for kind in ALL {
                let v = p.verdict(attempts, kind);
                let before = attempts.max(0);
                let expected_attempt = if kind.spends_attempt() {
                    before.saturating_add(1)
                } else {
                    before
                };
                assert_eq!(v.attempt, expected_attempt, "{attempts} {kind:?}");
                assert_eq!(v.spend_attempt, kind.spends_attempt());
                let dead = kind.is_permanent() || (kind.spends_attempt() && expected_attempt >= 3);
                assert_eq!(v.dead_letter, dead, "{attempts} {kind:?}");
                if kind.is_brokers() {
                    // The broker's trouble: soon, at the first retry delay, and never dead.
                    assert_eq!(v.retry_in, Duration::from_secs(1));
                    assert!(!v.dead_letter);
                } else {
                    assert!(v.retry_in <= Duration::from_secs(60));
                }
            }
        }
    }

    #[test]
    fn a_rejected_row_is_dead_lettered_at_max_attempts() {
        let p = policy();
        assert!(!p.verdict(0, FailureKind::Rejected).dead_letter);
        assert!(!p.verdict(1, FailureKind::Rejected).dead_letter);
        let third = p.verdict(2, FailureKind::Rejected);
        assert!(third.dead_letter && third.attempt == 3);
        // max_attempts = 1: the first failure of its own dead-letters the row.
        let once = RetryPolicy {
            max_attempts: 1,
            ..p
        };
        assert!(once.verdict(0, FailureKind::Rejected).dead_letter);
        assert!(!once.verdict(0, FailureKind::Timeout).dead_letter);
        // max_attempts beyond i32: counted up to i32::MAX, where the count saturates.
        let huge = RetryPolicy {
            max_attempts: u32::MAX,
            ..p
        };
        assert!(
            !huge
                .verdict(i32::MAX - 2, FailureKind::Rejected)
                .dead_letter
        );
        assert!(huge.verdict(i32::MAX, FailureKind::Rejected).dead_letter);
        assert!(huge.verdict(0, FailureKind::Invalid).dead_letter);
    }

    fn failed(kind: FailureKind) -> Outcome {
        Outcome::Failed(Failure::new(kind, "x"))
    }

    fn published() -> Outcome {
        Outcome::Published {
            duplicate: false,
            acked_at: SystemTime::now(),
        }
    }

    #[test]
    fn a_batch_is_a_broker_outage_only_when_nothing_went_through_for_the_brokers_reasons() {
        use FailureKind::*;
        let outage = |o: &[Outcome]| is_broker_outage(o);
        assert!(outage(&[
            failed(Timeout),
            failed(Broker),
            Outcome::NotAttempted
        ]));
        // Nothing attempted (every event postponed by an atomic plan) met no broker at all.
        assert!(!outage(&[]));
        assert!(!outage(&[Outcome::NotAttempted, Outcome::NotAttempted]));
        assert!(!outage(&[failed(Timeout), published()]));
        for own in [Invalid, TooLarge, Rejected] {
            assert!(!outage(&[failed(Broker), failed(own)]), "{own:?}");
        }
    }
}
