//! The hand-shake between the batch processor and the listener: why the processor was woken
//! ([`Wake`]) and whether the writers' trigger should be armed ([`Arming`]).
//!
//! Arming makes every writer transaction send a NOTIFY (and serialise its commit on the
//! notification queue), so the relay is armed only while it waits with nothing to do: the processor
//! asks for it when a poll comes back empty, the listener arms, and the first notification disarms
//! it again while the processor drains. Only a new request, made when the processor is idle again,
//! arms anew.

use std::sync::atomic::{AtomicU8, Ordering as AtomicOrdering};
use std::sync::Mutex;

use tokio::sync::Notify;

/// Why the processor was woken: the `reason` label of `outbox_wakeups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The listener (re)connected: anything committed before its LISTEN is found by this poll.
    Reconnect,
    /// A writer's notification.
    Notify,
    /// The listener armed: a catch-up poll for writers that skipped notifying before it.
    Armed,
    /// Arming waits for a long writer transaction: poll meanwhile.
    Poll,
    /// The fallback ticker (or a row's retry time).
    Fallback,
    /// The last batch was full or failed: go on at once (or after the backoff).
    Backlog,
}

impl Wake {
    /// Reasons that reach the processor through [`Signals::wake`], most telling first.
    const SIGNALLED: [Wake; 4] = [Wake::Reconnect, Wake::Notify, Wake::Armed, Wake::Poll];

    pub fn label(self) -> &'static str {
        match self {
            Wake::Reconnect => "reconnect",
            Wake::Notify => "notify",
            Wake::Armed => "armed",
            Wake::Poll => "poll",
            Wake::Fallback => "fallback",
            Wake::Backlog => "backlog",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// What the listener should do next about arming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArmStep {
    Arm,
    Disarm,
    Nothing,
}

/// The arming state machine, shared by the processor (which asks) and the listener (which acts).
#[derive(Debug, Default)]
pub(crate) struct Arming {
    /// `--notify-mode gated`: a notification disarms. `always`: once armed, stay armed.
    gated: bool,
    /// The processor is idle and waits for notifications.
    wanted: bool,
    /// The listener holds the arming lock.
    armed: bool,
    /// A notification came while armed: disarm.
    disarm_due: bool,
}

impl Arming {
    pub fn new(gated: bool) -> Arming {
        Arming {
            gated,
            ..Arming::default()
        }
    }

    /// The processor found nothing and waits: arm, unless armed already (that arming covers it,
    /// unless a notification is about to end it: then arm again after the disarm).
    pub fn request(&mut self) {
        self.wanted = !self.armed || self.disarm_due;
    }

    /// The processor woke up to drain: arming now would only make writers pay.
    pub fn busy(&mut self) {
        self.wanted = false;
    }

    /// A notification arrived.
    pub fn notified(&mut self) {
        self.disarm_due = self.armed && self.gated;
    }

    pub fn next(&self) -> ArmStep {
        if self.disarm_due {
            ArmStep::Disarm
        } else if self.wanted && !self.armed {
            ArmStep::Arm
        } else {
            ArmStep::Nothing
        }
    }

    /// The listener took the arming lock.
    pub fn armed(&mut self) {
        self.armed = true;
        self.wanted = false;
    }

    /// The listener released the arming lock.
    pub fn disarmed(&mut self) {
        self.armed = false;
        self.disarm_due = false;
    }

    /// The listening connection is gone, and its lock with it; its successor wakes the processor,
    /// which asks again once idle.
    pub fn lost(&mut self) {
        *self = Arming::new(self.gated);
    }
}

/// Wake-ups towards the processor and arming requests towards the listener.
#[derive(Default)]
pub(crate) struct Signals {
    /// Keeps at most one permit: a burst of notifications costs one poll.
    wake: Notify,
    reasons: AtomicU8,
    arming: Mutex<Arming>,
    /// The arming state changed: the listener looks at [`Signals::arm_step`] again.
    arming_changed: Notify,
}

impl Signals {
    pub fn new(gated: bool) -> Signals {
        Signals {
            arming: Mutex::new(Arming::new(gated)),
            ..Signals::default()
        }
    }

    /// Wakes the processor (the reason is kept until it looks).
    pub fn wake(&self, reason: Wake) {
        self.reasons.fetch_or(reason.bit(), AtomicOrdering::AcqRel);
        self.wake.notify_one();
    }

    /// A writer's notification reached the listening connection.
    pub fn notification(&self) {
        self.update_arming(Arming::notified);
        self.wake(Wake::Notify);
    }

    /// The processor waits for a wake-up; returns the most telling reason gathered meanwhile.
    pub async fn woken(&self) -> Wake {
        self.wake.notified().await;
        let bits = self.reasons.swap(0, AtomicOrdering::AcqRel);
        Wake::SIGNALLED
            .into_iter()
            .find(|w| bits & w.bit() != 0)
            .unwrap_or(Wake::Notify)
    }

    pub fn update_arming(&self, change: impl FnOnce(&mut Arming)) {
        let mut arming = self.arming.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut arming);
        drop(arming);
        self.arming_changed.notify_one();
    }

    pub fn arm_step(&self) -> ArmStep {
        self.arming.lock().unwrap_or_else(|p| p.into_inner()).next()
    }

    /// Resolves when the arming state changed since the listener last looked.
    pub async fn arming_changed(&self) {
        self.arming_changed.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next step after `steps` from a fresh state.
    fn after(gated: bool, steps: &[fn(&mut Arming)]) -> ArmStep {
        let mut a = Arming::new(gated);
        steps.iter().for_each(|step| step(&mut a));
        a.next()
    }

    use ArmStep::{Arm, Disarm, Nothing};
    type A = Arming;

    #[test]
    fn arms_when_idle_and_disarms_on_the_first_notification() {
        assert_eq!(after(true, &[]), Nothing);
        assert_eq!(after(true, &[A::request]), Arm);
        assert_eq!(after(true, &[A::request, A::armed]), Nothing);
        assert_eq!(after(true, &[A::request, A::armed, A::notified]), Disarm);
        let disarmed = [A::request, A::armed, A::notified, A::disarmed];
        assert_eq!(after(true, &disarmed), Nothing);
    }

    /// The defect this machine fixes: a request made while already armed (the catch-up poll came
    /// back empty) must not linger and re-arm right after the next disarm, while the processor
    /// drains what the notification announced.
    #[test]
    fn a_request_while_armed_does_not_rearm_after_the_disarm() {
        // Armed, woken for the catch-up poll, found nothing: idle again, still armed.
        let idle = [A::request, A::armed, A::busy, A::request];
        assert_eq!(after(true, &idle), Nothing);
        let drained = [&idle[..], &[A::notified, A::disarmed]].concat();
        assert_eq!(after(true, &drained), Nothing, "re-armed while draining");
        // Drained: idle again.
        let again = [&drained[..], &[A::busy, A::request]].concat();
        assert_eq!(after(true, &again), Arm);
    }

    /// The processor may drain and go idle again before the listener has carried out the disarm
    /// that a notification called for: that request must survive the disarm, or nobody arms and
    /// the relay sleeps until the fallback poll.
    #[test]
    fn a_request_before_a_pending_disarm_arms_after_it() {
        let steps = [
            A::request,
            A::armed,
            A::notified,
            A::busy,
            A::request,
            A::disarmed,
        ];
        assert_eq!(after(true, &steps), Arm);
    }

    #[test]
    fn notifications_while_not_armed_do_not_disarm_a_later_arming() {
        // Another relay's writers, before we armed.
        assert_eq!(after(true, &[A::notified, A::request, A::armed]), Nothing);
    }

    #[test]
    fn waking_up_withdraws_a_pending_request() {
        assert_eq!(after(true, &[A::request, A::busy]), Nothing);
    }

    #[test]
    fn always_mode_stays_armed() {
        assert_eq!(after(false, &[A::request, A::armed, A::notified]), Nothing);
        let again = [A::request, A::armed, A::notified, A::request];
        assert_eq!(after(false, &again), Nothing);
    }

    #[test]
    fn a_lost_connection_forgets_the_lock() {
        let lost = [A::request, A::armed, A::notified, A::lost];
        assert_eq!(after(true, &lost), Nothing);
        assert_eq!(after(true, &[&lost[..], &[A::request]].concat()), Arm);
    }

    #[tokio::test]
    async fn the_most_telling_reason_wins() {
        let s = Signals::new(true);
        s.wake(Wake::Poll);
        s.wake(Wake::Notify);
        assert_eq!(s.woken().await, Wake::Notify);
        s.wake(Wake::Armed);
        s.wake(Wake::Reconnect);
        assert_eq!(s.woken().await, Wake::Reconnect);
        s.wake(Wake::Poll);
        assert_eq!(s.woken().await, Wake::Poll);
    }
}
