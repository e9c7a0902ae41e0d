//! `--source wal` over time: the relay's memory stays bounded whatever the stream holds (big
//! events, one big transaction).

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use testkit::outbox::{assert_ledger, Env};

use crate::edges::peak_rss_kb;
use crate::wal::{cli_wal, drained, streaming};

/// Big events: 400 of 900 kB (under NATS's default max_payload of 1 MB) in 40 aggregates.
const BIG_EVENTS: i32 = 400;

/// The relay's peak RSS streaming them (the batch byte budget is 32 MiB by default).
const PEAK_RSS_LIMIT_MB: f64 = 128.0;

/// Streams [`BIG_EVENTS`] written in `transactions` transactions (of equal size) through a fresh
/// relay process, checks that every event went out once in per-aggregate order, and returns the
/// relay's peak RSS in MB. `paused`: the relay is stopped (SIGSTOP) while the events are written,
/// so that the stream has them all at once when it goes on, as a backlog behind a slow broker.
/// `extra`: the relay's flags.
async fn stream_big_events(transactions: i32, paused: bool, extra: &[&str]) -> f64 {
    let env = Env::new().await;
    env.wal_config().await; // the publication
    let relay = cli_wal(&env, extra);
    // Written once the relay streams: streamed, not caught up from the table.
    streaming(&env).await;
    // Written by the server in one go (a transaction control loop), faster than the relay publishes.
    let per_transaction = BIG_EVENTS / transactions;
    let pid = Pid::from_raw(relay.pid() as i32);
    if paused {
        kill(pid, Signal::SIGSTOP).expect("pause the relay");
    }
    let started = Instant::now();
    env.client()
        .await
        .batch_execute(&format!(
            "DO $$ BEGIN FOR t IN 0..{last} LOOP
                 INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', 'big-' || (g % 40), 'order.big',
                        jsonb_build_object('n', g, 'blob', repeat(md5(g::text), 28125))
                 FROM generate_series(t * {per_transaction} + 1, (t + 1) * {per_transaction}) g;
                 COMMIT;
             END LOOP; END $$",
            last = transactions - 1
        ))
        .await
        .expect("insert");
    let written = started.elapsed();
    if paused {
        kill(pid, Signal::SIGCONT).expect("resume the relay");
    }
    env.wait_stream_len(BIG_EVENTS as u64, Duration::from_secs(240))
        .await;
    drained(&env, Duration::from_secs(60)).await;
    let took = started.elapsed();
    let peak_mb = peak_rss_kb(relay.pid()).expect("VmHWM") as f64 / 1024.0;
    assert_ledger(&env.written().await, &env.stored_headers().await);
    assert_eq!(relay.terminate(), Some(0));
    eprintln!(
        "{BIG_EVENTS} events of 900 kB in {transactions} transaction(s): written in {:.1} s, out in {:.1} s, relay peak RSS {peak_mb:.0} MB",
        written.as_secs_f64(),
        took.as_secs_f64()
    );
    peak_mb
}

/// One transaction of 400 events of 900 kB (360 MB of rows in the stream, sent at its commit):
/// the stream holds a budget's worth, not the transaction.
#[tokio::test]
async fn big_events_in_one_transaction_stream_in_bounded_memory() {
    let _turn = testkit::heavy().await;
    let peak_mb = stream_big_events(1, false, &[]).await;
    assert!(
        peak_mb < PEAK_RSS_LIMIT_MB,
        "peak RSS {peak_mb:.0} MB, limit {PEAK_RSS_LIMIT_MB:.0} MB"
    );
}

/// The same events in 400 transactions of one event each, all committed before the relay streams
/// them (written while it is paused: it would keep up with them otherwise). With `--batch-size
/// 100` the relay holds 200 changes decoded, less than the backlog: the rows read ahead of them
/// fill the replication client's channel too.
#[tokio::test]
async fn big_events_in_many_transactions_stream_in_bounded_memory() {
    let _turn = testkit::heavy().await;
    let peak_mb = stream_big_events(BIG_EVENTS, true, &["--batch-size", "100"]).await;
    assert!(
        peak_mb < PEAK_RSS_LIMIT_MB,
        "peak RSS {peak_mb:.0} MB, limit {PEAK_RSS_LIMIT_MB:.0} MB"
    );
}
