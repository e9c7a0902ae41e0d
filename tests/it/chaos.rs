//! The two-relay chaos run of the wal source: two relays on one slot, killed (SIGKILL) and stopped
//! (SIGTERM) at random moments, the broker paused now and then (SIGSTOP), writer transactions of
//! several events of which about 1 in 100 is poison (a subject no stream captures), and an
//! operator discarding the dead letters as they come. At the end: every event but the discarded
//! ones in the stream exactly once, per aggregate in the order written, and with
//! `--wal-marking delete` nothing left in the table but the discarded rows (kept for the audit
//! trail).
//!
//! Minutes long, so ignored in the suite: run it with
//! `cargo test --test it -- --ignored chaos:: --test-threads 1`, several times.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use outbox_relay::Source;
use testkit::outbox::{assert_ledger, cli, CliRelay, Env};
use testkit::wait_until;

/// Writer transactions, each of 1 to 12 events over the aggregates `c0`..`c19`.
const TRANSACTIONS: usize = 400;

#[tokio::test]
#[ignore = "the chaos run: about a minute and a half"]
async fn two_relays_killed_and_a_paused_broker_lose_and_reorder_nothing_wal_marking_delete() {
    chaos(&[]).await
}

#[tokio::test]
#[ignore = "the chaos run: about a minute and a half"]
async fn two_relays_killed_and_a_paused_broker_lose_and_reorder_nothing_wal_marking_update() {
    chaos(&["--wal-marking", "update"]).await
}

async fn chaos(marking: &[&str]) {
    let env = Env::new().await;
    env.source_config(Source::Wal).await;
    // Only order.* subjects are routable: a `payment.failed` event is poison.
    crate::poison::narrow_stream(&env, &["outbox.order.>"]).await;
    let mut args: Vec<String> = env.source_args(Source::Wal);
    args.extend(
        [
            "--batch-size",
            "50",
            "--max-attempts",
            "2",
            "--fallback-interval",
            "1s",
        ]
        .map(String::from),
    );
    args.extend(marking.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let seed = fastrand::u64(..);
    eprintln!("chaos seed: {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);

    let writer = {
        let db = env.db.clone();
        let seed = rng.u64(..);
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut client = testkit::pg_client(&db).await;
            let mut poison = 0;
            for t in 0..TRANSACTIONS {
                let tx = client.transaction().await.expect("begin");
                for i in 0..rng.usize(1..=12) {
                    let event_type = match rng.u8(..100) {
                        0 => {
                            poison += 1;
                            "payment.failed"
                        }
                        _ => "order.created",
                    };
                    tx.execute(
                        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                         VALUES ('order', $1, $2, jsonb_build_object('t', $3::int8, 'i', $4::int8))",
                        &[
                            &format!("c{}", rng.u8(..20)),
                            &event_type,
                            &(t as i64),
                            &(i as i64),
                        ],
                    )
                    .await
                    .expect("an event");
                }
                tx.commit().await.expect("commit");
                if t % 20 == 0 {
                    tokio::time::sleep(Duration::from_millis(rng.u64(50..250))).await;
                }
            }
            poison
        })
    };
    // The operator: discards each dead letter it finds.
    let discarder = {
        let db = env.db.clone();
        tokio::spawn(async move {
            let client = testkit::pg_client(&db).await;
            loop {
                let ids: Vec<String> = client
                    .query(
                        "SELECT id::text FROM outbox_events
                         WHERE processed_at IS NULL AND dead_lettered_at IS NOT NULL",
                        &[],
                    )
                    .await
                    .expect("dead letters")
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                if !ids.is_empty() {
                    let mut a = vec!["dead-letters", "discard"];
                    a.extend(ids.iter().map(String::as_str));
                    let db = db.clone();
                    let a: Vec<String> = a.into_iter().map(String::from).collect();
                    let (code, _, err) = tokio::task::spawn_blocking(move || {
                        let a: Vec<&str> = a.iter().map(String::as_str).collect();
                        cli(&db, &a)
                    })
                    .await
                    .expect("discard");
                    assert_eq!(code, Some(0), "discard: {err}");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    let nats_pid = Pid::from_raw(env.nats.pid().expect("nats-server runs") as i32);
    let mut relays = [
        CliRelay::run_logged(&env, &args),
        CliRelay::run_logged(&env, &args),
    ];
    let chaos_until = Instant::now() + Duration::from_secs(45);
    let (mut kills, mut stops, mut pauses) = (0, 0, 0);
    while Instant::now() < chaos_until {
        tokio::time::sleep(Duration::from_millis(rng.u64(500..3_000))).await;
        let which = rng.usize(..2);
        match rng.u8(..3) {
            0 => {
                let old = std::mem::replace(&mut relays[which], CliRelay::run_logged(&env, &args));
                old.kill();
                kills += 1;
            }
            1 => {
                let old = std::mem::replace(&mut relays[which], CliRelay::run_logged(&env, &args));
                let code = tokio::task::spawn_blocking(move || {
                    old.terminate_within(Duration::from_secs(5))
                })
                .await
                .expect("SIGTERM");
                assert_eq!(code, Some(0), "a relay stopped by SIGTERM exits 0");
                stops += 1;
            }
            _ => {
                kill(nats_pid, Signal::SIGSTOP).expect("pause nats-server");
                tokio::time::sleep(Duration::from_millis(rng.u64(300..2_000))).await;
                kill(nats_pid, Signal::SIGCONT).expect("resume nats-server");
                pauses += 1;
            }
        }
    }
    eprintln!("chaos: {kills} kills, {stops} SIGTERMs, {pauses} broker pauses");
    let poison = writer.await.expect("writer");
    eprintln!("chaos: {poison} poison events");

    wait_until(
        "every event published or discarded",
        Duration::from_secs(120),
        || async { env.count("processed_at IS NULL").await == 0 },
    )
    .await;
    let discarded: HashSet<uuid::Uuid> = env
        .client()
        .await
        .query(
            "SELECT id FROM outbox_events WHERE discarded_at IS NOT NULL",
            &[],
        )
        .await
        .expect("discarded")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        discarded.len(),
        poison,
        "the poison events, and only they, discarded"
    );
    if marking.is_empty() {
        // `--wal-marking delete`: the table empties but for the discarded rows.
        wait_until(
            "only the discarded rows left",
            Duration::from_secs(30),
            || async {
                env.count("discarded_at IS NULL").await == 0
                    && testkit::simple_value(
                        &env.client().await,
                        "SELECT count(*) FROM outbox_transaction_runs",
                    )
                    .await
                        == "0"
            },
        )
        .await;
    }
    discarder.abort();
    for relay in relays {
        assert_eq!(relay.terminate(), Some(0));
    }
    let written: Vec<_> = env
        .written()
        .await
        .into_iter()
        .filter(|w| !discarded.contains(&w.id))
        .collect();
    assert_ledger(&written, &env.stored().await);
}
