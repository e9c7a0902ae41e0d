//! Shutdown by construction: every wait of the relay's long-lived tasks (a statement, a
//! connection, a pause) goes through one of these, so that no lock another session holds and no
//! server that stops answering keeps the process from stopping.
//!
//! Two kinds of wait. Idle and side work (a pause, a wait for a wake-up, the stats, the retention,
//! the listener, the wal source's setup checks) ends the moment the stop comes: [`or_stop`]. The
//! work in hand (a batch claimed or published, a sweep, a catch-up claim) may finish what it
//! started, but for [`GRACE`] at most: [`within_grace`]. Dropping a database future mid-statement
//! is safe: its connection is dropped (or its statement cancelled) with it, the transaction rolls
//! back and its rows stay pending; what was published but not recorded goes out again, and
//! JetStream drops it as a duplicate (`Nats-Msg-Id`). Then what a stop says on its way out (waking
//! the other relays, leaving `outbox_relays`, cancelling what was abandoned) and the side tasks'
//! end are each bounded by [`LAST_WORDS`], so that a relay stops within a few tenths of a second
//! past [`GRACE`] whatever it waits for (the binary exits 4.5 s after SIGTERM at the latest).

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// After the stop, how long the work in hand may go on before it is abandoned.
pub(crate) const GRACE: Duration = Duration::from_secs(3);

/// After the stop, how long a farewell statement, or the side tasks' end, may take.
pub(crate) const LAST_WORDS: Duration = Duration::from_millis(500);

/// `work` unless `stop` comes first: then `None`, and the work is dropped.
pub(crate) async fn or_stop<F: Future>(stop: &CancellationToken, work: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = work => Some(out),
        _ = stop.cancelled() => None,
    }
}

/// The work in hand, raced with `stop`: after the stop it has [`GRACE`] to finish. `None`: it did
/// not (it is dropped; the caller says what it waited for and lets go of its connections).
pub(crate) async fn within_grace<F: Future>(
    stop: &CancellationToken,
    work: F,
) -> Option<F::Output> {
    Grace::new(stop).within(work).await
}

/// One grace shared by several pieces of the work in hand (a step, then the record of what it
/// published): measured once, from when the first of them saw the stop, so that together they
/// never take longer than [`GRACE`].
pub(crate) struct Grace<'a> {
    stop: &'a CancellationToken,
    end: std::sync::OnceLock<tokio::time::Instant>,
}

impl<'a> Grace<'a> {
    pub(crate) fn new(stop: &'a CancellationToken) -> Grace<'a> {
        Grace {
            stop,
            end: std::sync::OnceLock::new(),
        }
    }

    /// `work`, finished within what is left of the grace once the stop came (see
    /// [`within_grace`]).
    pub(crate) async fn within<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::pin!(work);
        if let Some(out) = or_stop(self.stop, &mut work).await {
            return Some(out);
        }
        let end = *self.end.get_or_init(|| tokio::time::Instant::now() + GRACE);
        tokio::time::timeout_at(end, work).await.ok()
    }
}

/// Sleeps `delay` unless `stop` comes first (then `false`).
pub(crate) async fn pause(stop: &CancellationToken, delay: Duration) -> bool {
    or_stop(stop, tokio::time::sleep(delay)).await.is_some()
}

/// A farewell after the stop, bounded by [`LAST_WORDS`]. `None`: it took longer (dropped).
pub(crate) async fn last_words<F: Future>(work: F) -> Option<F::Output> {
    tokio::time::timeout(LAST_WORDS, work).await.ok()
}

/// Waits for the side tasks (told to stop already) for [`LAST_WORDS`] in all; those still running
/// then are aborted. Returns how many were.
pub(crate) async fn join(handles: Vec<JoinHandle<()>>) -> usize {
    let deadline = tokio::time::Instant::now() + LAST_WORDS;
    let mut aborted = 0;
    for mut handle in handles {
        if tokio::time::timeout_at(deadline, &mut handle)
            .await
            .is_err()
        {
            handle.abort();
            aborted += 1;
        }
    }
    aborted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_waits_end_at_the_stop_and_the_work_in_hand_gets_the_grace() {
        let stop = CancellationToken::new();
        let forever = std::future::pending::<()>;
        // Before the stop: the work's own outcome.
        assert_eq!(or_stop(&stop, async { 7 }).await, Some(7));
        assert_eq!(within_grace(&stop, async { 7 }).await, Some(7));
        stop.cancel();
        let start = tokio::time::Instant::now();
        assert_eq!(or_stop(&stop, forever()).await, None);
        assert!(!pause(&stop, Duration::from_secs(60)).await);
        assert_eq!(start.elapsed(), Duration::ZERO, "at once");
        // Work that finishes within the grace is kept; work that does not is dropped at its end.
        let quick = within_grace(&stop, async {
            tokio::time::sleep(GRACE / 2).await;
            1
        });
        assert_eq!(quick.await, Some(1));
        let start = tokio::time::Instant::now();
        assert_eq!(within_grace(&stop, forever()).await, None);
        assert_eq!(start.elapsed(), GRACE);
        assert_eq!(last_words(forever()).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn pieces_of_the_work_in_hand_share_one_grace() {
        let stop = CancellationToken::new();
        let grace = Grace::new(&stop);
        stop.cancel();
        let start = tokio::time::Instant::now();
        let step = grace.within(async {
            tokio::time::sleep(GRACE * 2 / 3).await;
            1
        });
        assert_eq!(step.await, Some(1));
        // The record after it has what is left, not a grace of its own.
        assert_eq!(grace.within(std::future::pending::<()>()).await, None);
        assert_eq!(start.elapsed(), GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn the_side_tasks_are_joined_within_last_words_and_the_rest_aborted() {
        let done = tokio::spawn(async {});
        let slow = tokio::spawn(async { tokio::time::sleep(LAST_WORDS / 2).await });
        let stuck = tokio::spawn(std::future::pending::<()>());
        let start = tokio::time::Instant::now();
        assert_eq!(join(vec![done, slow, stuck]).await, 1);
        assert_eq!(start.elapsed(), LAST_WORDS);
    }
}
