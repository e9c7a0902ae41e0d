//! `--source wal` over time: the relay's memory stays bounded whatever the stream holds (big
//! events, one big transaction), and the slot keeps up with a database whose writes are all to
//! other tables.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use testkit::outbox::{assert_ledger, Env};
use testkit::{wait_until, PgCluster, PgOptions};

use crate::edges::peak_rss_kb;
use crate::wal::{all_out_in_order, cli_wal, drained, streaming};

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

/// Whether the slot has confirmed `lsn` (text).
async fn slot_confirmed(client: &tokio_postgres::Client, slot: &str, lsn: &str) -> bool {
    client
        .query_one(
            "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false)
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot, &lsn],
        )
        .await
        .expect("slot query")
        .get(0)
}

/// Waits until the slot confirms the server's current WAL position (everything written so far)
/// and returns how long that took.
async fn slot_reaches_current_lsn(env: &Env, what: &str) -> Duration {
    let client = env.client().await;
    let lsn: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("current lsn")
        .get(0);
    let slot = env.slot_name();
    let started = Instant::now();
    wait_until(
        &format!("{what}: the slot confirms {lsn}"),
        Duration::from_secs(30),
        || slot_confirmed(&client, &slot, &lsn),
    )
    .await;
    let took = started.elapsed();
    eprintln!("{what}: the slot confirmed {lsn} after {took:?}");
    took
}

/// Nothing for the relay, but a busy database: writes to another table (which the publication
/// filters out, so only keepalives come) must not leave the slot behind, or it retains the whole
/// database's WAL. The same for one transaction that writes only another table, after an event.
/// A cluster of its own, so that no other test's writes wake the walsender.
#[tokio::test]
async fn an_idle_slot_advances_while_only_other_tables_are_written() {
    let _turn = testkit::heavy().await;
    let pg = PgCluster::start(PgOptions::default());
    let env = Env::on(&pg).await;
    env.wal_config().await; // the publication
    let relay = cli_wal(&env, &[]);
    streaming(&env).await;
    let client = env.client().await;
    client
        .batch_execute("CREATE TABLE busy (id bigserial PRIMARY KEY, body text)")
        .await
        .expect("create table");
    // About 50 MB in 50 transactions (1 kB values, under the TOAST threshold: not compressed).
    for _ in 0..50 {
        client
            .execute(
                "INSERT INTO busy (body) SELECT repeat(md5(g::text), 32)
                 FROM generate_series(1, 1000) g",
                &[],
            )
            .await
            .expect("insert into busy");
    }
    slot_reaches_current_lsn(&env, "50 MB written to another table").await;

    // An event, then a transaction that writes only the other table.
    env.insert_sql(3, "a", "order.created").await;
    env.wait_stream_len(3, Duration::from_secs(30)).await;
    drained(&env, Duration::from_secs(10)).await;
    let mut writer = env.client().await;
    let tx = writer.transaction().await.expect("begin");
    for _ in 0..5 {
        tx.execute(
            "INSERT INTO busy (body) SELECT repeat(md5(g::text), 32)
             FROM generate_series(1, 1000) g",
            &[],
        )
        .await
        .expect("insert into busy");
    }
    tx.commit().await.expect("commit");
    slot_reaches_current_lsn(&env, "one transaction on another table").await;

    // The stream goes on.
    env.insert_interleaved(10, 5).await;
    all_out_in_order(&env, 53, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
}
