//! Fault injection, for both sources: each scenario checks the ledger (nothing lost, nothing
//! stored twice, per-aggregate order intact) against real PostgreSQL and nats-server.

use std::time::Duration;

use outbox_relay::{RelayConfig, Source};
use testkit::outbox::{assert_ledger, CliRelay, Env, RunningRelay};
use testkit::{wait_until, PgCluster, PgOptions};

async fn drained(env: &Env, timeout: Duration) {
    wait_until("every row processed", timeout, || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
}

/// Waits until nothing is pending, checks that the `expected` written events each arrived once and
/// in per-aggregate order, then stops the relays.
async fn all_delivered_in_order(
    env: &Env,
    expected: usize,
    relays: Vec<RunningRelay>,
    timeout: Duration,
) {
    drained(env, timeout).await;
    let written = env.written().await;
    assert_eq!(written.len(), expected);
    assert_ledger(&written, &env.stored().await);
    for r in relays {
        r.stop().await;
    }
}

for_each_source!(
    relay_sigkilled_at_random_points_ten_times,
    broker_down_for_ten_seconds_while_writers_write,
    relay_connections_terminated_repeatedly_during_a_drain,
    postgres_restarted_during_a_drain,
    three_relays_keep_per_aggregate_order,
    few_deep_aggregates_drain_in_order_with_two_relays,
    a_relay_killed_while_aggregates_wait_behind_retries,
);

async fn relay_sigkilled_at_random_points_ten_times(source: Source) {
    let env = Env::new().await;
    env.source_config(source).await;
    let args = env.source_args(source);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend(["--batch-size", "500"]);
    env.insert_interleaved(500, 40).await; // 20,000 events
    let seed = fastrand::u64(..);
    eprintln!("kill points seed: {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    for round in 0..10 {
        let relay = CliRelay::run(&env, &args);
        // Wait until it has started working, then kill it at a random point.
        let before = env.count("processed_at IS NOT NULL").await;
        wait_until(
            &format!("round {round}: relay makes progress"),
            Duration::from_secs(30),
            || async {
                env.count("processed_at IS NOT NULL").await > before
                    || env.stream_len().await > before as u64
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(0..150))).await; // the random kill point
        relay.kill();
    }
    let relay = CliRelay::run(&env, &args);
    drained(&env, Duration::from_secs(90)).await;
    assert_ledger(&env.written().await, &env.stored().await);
    assert_eq!(relay.terminate(), Some(0));
}

async fn broker_down_for_ten_seconds_while_writers_write(source: Source) {
    let mut env = Env::new().await;
    let mut config = env.source_config(source).await;
    config.source.fallback_interval = Duration::from_secs(1);
    config.retry.max_attempts = 3; // an outage must not spend attempts, or this would dead-letter
    let relay = env.spawn(config).await;
    let writer = {
        let db = env.db.clone();
        tokio::spawn(async move {
            let client = testkit::pg_client(&db).await;
            for i in 0..600 {
                client
                    .execute(
                        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'order.created', '{}')",
                        &[&format!("w-{}", i % 50)],
                    )
                    .await
                    .expect("insert");
                tokio::time::sleep(Duration::from_millis(25)).await; // writer pace: ~15 s of writes
            }
        })
    };
    wait_until("some events relayed", Duration::from_secs(10), || async {
        env.stream_len().await > 20
    })
    .await;
    env.nats.kill();
    tokio::time::sleep(Duration::from_secs(10)).await; // the outage itself
    env.nats.start_again();
    writer.await.expect("writer");
    drained(&env, Duration::from_secs(60)).await;
    assert_ledger(&env.written().await, &env.stored().await);
    assert_eq!(
        env.count("dead_lettered_at IS NOT NULL").await,
        0,
        "an outage dead-letters nothing"
    );
    relay.stop().await;
}

async fn relay_connections_terminated_repeatedly_during_a_drain(source: Source) {
    let env = Env::new().await;
    let mut config = env.source_config(source).await;
    env.insert_interleaved(400, 50).await; // 20,000 events
    config.batch.size = 500;
    config.source.fallback_interval = Duration::from_secs(1);
    let relay = env.spawn(config).await;
    let mut kills = 0;
    for _ in 0..15 {
        kills += env.terminate_backends("outbox-relay%").await;
        tokio::time::sleep(Duration::from_millis(150)).await; // spacing between fault injections
    }
    assert!(kills >= 5, "terminated only {kills} connections");
    drained(&env, Duration::from_secs(90)).await;
    assert_ledger(&env.written().await, &env.stored().await);
    relay.stop().await;
}

async fn postgres_restarted_during_a_drain(source: Source) {
    // A cluster of its own: restarting the shared one would disturb the other tests.
    let mut pg = tokio::task::spawn_blocking(|| PgCluster::start(PgOptions::default()))
        .await
        .expect("start cluster");
    let env = Env::on(&pg).await;
    let mut config: RelayConfig = env.source_config(source).await;
    env.insert_interleaved(400, 50).await;
    config.batch.size = 200;
    config.source.fallback_interval = Duration::from_secs(1);
    let relay = env.spawn(config).await;
    wait_until("drain under way", Duration::from_secs(20), || async {
        env.stream_len().await > 2_000
    })
    .await;
    let pg = tokio::task::spawn_blocking(move || {
        pg.restart();
        pg
    })
    .await
    .expect("restart");
    drained(&env, Duration::from_secs(90)).await;
    assert_ledger(&env.written().await, &env.stored().await);
    relay.stop().await;
    drop(pg);
}

async fn three_relays_keep_per_aggregate_order(source: Source) {
    let env = Env::new().await;
    let mut config = env.source_config(source).await;
    // Batches wider than the 200 interleaved aggregates put several events of one aggregate into
    // the batches of different relays at once: the case ordering must handle.
    config.batch.size = 300;
    config.source.fallback_interval = Duration::from_secs(1);
    // 200 aggregates x 25 events, written by 8 concurrent writers; each aggregate has one writer, so
    // its commit order is its seq order. Half is a backlog, half arrives while the relays drain.
    let mut writers = Vec::new();
    for w in 0..8 {
        let db = env.db.clone();
        writers.push(tokio::spawn(async move {
            let mut client = testkit::pg_client(&db).await;
            for step in 0..25 {
                for a in (w..200).step_by(8) {
                    let tx = client.transaction().await.expect("tx");
                    outbox_relay::enqueue(
                        &tx,
                        &outbox_relay::NewEvent::new(
                            "order",
                            format!("agg-{a}"),
                            "order.step",
                            &serde_json::json!({"step": step}),
                        )
                        .expect("event"),
                    )
                    .await
                    .expect("enqueue");
                    tx.commit().await.expect("commit");
                }
            }
        }));
    }
    wait_until(
        "a backlog of 2,500 events",
        Duration::from_secs(60),
        || async { env.count("true").await >= 2_500 },
    )
    .await;
    let relays = vec![
        env.spawn(config.clone()).await,
        env.spawn(config.clone()).await,
        env.spawn(config).await,
    ];
    for w in writers {
        w.await.expect("writer");
    }
    all_delivered_in_order(&env, 5_000, relays, Duration::from_secs(60)).await;
}

/// Few aggregates, each with a deep backlog: the relays find heads by hopping between aggregates
/// (the seq walk would visit every pending row per claim). Two relays side by side, batches wider
/// than the number of aggregates: order per aggregate holds and every event arrives once.
async fn few_deep_aggregates_drain_in_order_with_two_relays(source: Source) {
    let env = Env::new().await;
    let mut config = env.source_config(source).await;
    env.insert_interleaved(4, 1_500).await; // 6,000 events
    config.batch.size = 500;
    let relays = vec![env.spawn(config.clone()).await, env.spawn(config).await];
    all_delivered_in_order(&env, 6_000, relays, Duration::from_secs(90)).await;
}

/// Inserts `n` events of each of the aggregates `r0`..`r19` in one transaction.
async fn insert_behind_retries(env: &Env, n: i32) {
    env.client()
        .await
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'r' || a, 'order.next', jsonb_build_object('n', n)
             FROM generate_series(0, 19) a, generate_series(1, $1::int) n",
            &[&n],
        )
        .await
        .expect("events behind the retries");
}

/// `run` with a fallback interval of one second: the table source finds a retry that fell due while
/// no relay ran (or one left by another relay) at its next fallback claim.
fn relay_polling_every_second(env: &Env, args: &[&str]) -> CliRelay {
    let mut cmd = testkit::relay_command();
    cmd.args(["run", "--metrics-addr", "off", "--fallback-interval", "1s"])
        .args(args)
        .env("DATABASE_URL", &env.db)
        .env("NATS_URL", env.nats.url())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    CliRelay::from_command(cmd)
}

/// Twenty aggregates wait behind a head whose retry falls due a few seconds in (the wal source
/// hands them to the table), their events written before and while the relay runs; the relay is
/// killed (SIGKILL) while they wait, and the next one must remember them: every event once, in
/// order, none stranded.
async fn a_relay_killed_while_aggregates_wait_behind_retries(source: Source) {
    let env = Env::new().await;
    env.source_config(source).await;
    let args = env.source_args(source);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Heads left waiting for a retry (as by an earlier relay), due in 4 s.
    env.client()
        .await
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload,
                                        attempts, retry_after, last_error)
             SELECT 'order', 'r' || a, 'order.created', '{}', 1, now() + interval '4 s', 'broker'
             FROM generate_series(0, 19) a",
            &[],
        )
        .await
        .expect("heads waiting for a retry");
    insert_behind_retries(&env, 5).await;
    env.insert_interleaved(100, 10).await;
    let relay = relay_polling_every_second(&env, &args);
    env.wait_stream_len(500, Duration::from_secs(30)).await;
    insert_behind_retries(&env, 5).await;
    env.insert_interleaved(100, 5).await;
    env.wait_stream_len(1_200, Duration::from_secs(30)).await;
    assert!(
        env.count("aggregate_id LIKE 'r%' AND processed_at IS NULL")
            .await
            > 0,
        "the retries fell due before the kill: nothing was tested"
    );
    relay.kill();
    let relay = relay_polling_every_second(&env, &args);
    env.wait_stream_len(1_720, Duration::from_secs(60)).await;
    drained(&env, Duration::from_secs(30)).await;
    assert_ledger(&env.written().await, &env.stored().await);
    assert_eq!(relay.terminate(), Some(0));
}
