//! `--publish-batches fast-ingest`: a batch's events as JetStream fast-ingest batches (nats-server
//! 2.14+, a stream with `allow_batched`), for both sources. Every event reaches the stream once,
//! in order per aggregate, and its row is marked; an event the stream refuses is dead-lettered
//! while the others go on; what the server or the stream cannot do is refused at start.

use std::collections::HashMap;
use std::time::Duration;

use outbox_relay::Source;
use testkit::outbox::{CliRelay, Env, STREAM};
use testkit::wait_until;

/// Whether the nats-server under test takes fast-ingest batches; a test of them on an older
/// server checks the refusal instead.
fn fast_server() -> bool {
    testkit::nats_version().is_some_and(|(major, minor, _)| (major, minor) >= (2, 14))
}

/// Switches `allow_batched` on for the test stream (a stream update), with `max_msg_size` when
/// given.
async fn allow_batched(env: &Env, max_msg_size: Option<i32>) {
    let js = env.js().await;
    let mut s = js.get_stream(STREAM).await.expect("stream");
    let mut config = s.info().await.expect("info").config.clone();
    config.allow_batch_publish = true;
    if let Some(size) = max_msg_size {
        config.max_message_size = size;
    }
    js.update_stream(config).await.expect("allow_batched");
}

/// On a server older than 2.14 the relay refuses fast-ingest batches at start, naming the version.
async fn refused_by_an_old_server(env: &Env, source: Source) {
    let source_args = env.source_args(source);
    let url = env.nats.url();
    let mut args: Vec<&str> = vec![
        "run",
        "--nats-url",
        &url,
        "--publish-batches",
        "fast-ingest",
    ];
    args.extend(source_args.iter().map(String::as_str));
    let (code, _, stderr) = testkit::outbox::cli(&env.db, &args);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("2.14"), "{stderr}");
}

for_each_source!(a_backlog_drains_through_fast_ingest_batches);

/// 2,000 events over 50 aggregates, drained in batches of 500 through fast-ingest batches: each
/// event is in the stream once, each aggregate's in the order written, and every row is marked.
async fn a_backlog_drains_through_fast_ingest_batches(source: Source) {
    let env = Env::new().await;
    env.source_config(source).await;
    if !fast_server() {
        return refused_by_an_old_server(&env, source).await;
    }
    allow_batched(&env, None).await;
    let source_args = env.source_args(source);
    let mut args: Vec<&str> = source_args.iter().map(String::as_str).collect();
    args.extend(["--batch-size", "500", "--publish-batches", "fast-ingest"]);
    let relay = CliRelay::run(&env, &args);
    // The wal source streams what is written after its slot exists: the relay runs first.
    wait_until("the relay is up", Duration::from_secs(30), || async {
        source == Source::Notify || env.count("true").await == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.insert_interleaved(50, 40).await;
    env.wait_stream_len(2000, Duration::from_secs(60)).await;
    wait_until("every row marked", Duration::from_secs(30), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    assert_eq!(stored.len(), 2000);
    testkit::outbox::assert_unique(&stored);
    let mut last: HashMap<i64, i64> = HashMap::new();
    for m in &stored {
        let payload: serde_json::Value = serde_json::from_str(&m.payload).expect("json");
        let (agg, step) = (payload["agg"].as_i64(), payload["step"].as_i64());
        let (Some(agg), Some(step)) = (agg, step) else {
            panic!("payload {payload}");
        };
        let before = last.insert(agg, step).unwrap_or(0);
        assert_eq!(step, before + 1, "aggregate {agg} out of order");
    }
}

/// An event the stream refuses (larger than its max_msg_size) ends its fast-ingest batch there:
/// it is dead-lettered after its attempts, its aggregate's followers wait behind it (as without
/// the flag), and every other event is stored once and marked.
#[tokio::test]
async fn an_event_the_stream_refuses_is_dead_lettered_and_the_others_go_on() {
    let env = Env::new().await;
    if !fast_server() {
        return refused_by_an_old_server(&env, Source::Notify).await;
    }
    allow_batched(&env, Some(4096)).await;
    let client = env.client().await;
    client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'agg-' || (g % 10), 'order.step',
                    CASE WHEN g = 55 THEN jsonb_build_object('g', g, 'pad', repeat('x', 8000))
                         ELSE jsonb_build_object('g', g) END
             FROM generate_series(1, 300) g ORDER BY g",
            &[],
        )
        .await
        .expect("insert");
    let relay = CliRelay::run(
        &env,
        &[
            "--publish-batches",
            "fast-ingest",
            "--max-attempts",
            "2",
            "--retry-initial",
            "100ms",
        ],
    );
    env.wait_dead_letters(1, Duration::from_secs(60)).await;
    // agg-5's events after event 55 (65, 75, ..., 295: 24) wait behind it, as without the flag.
    env.wait_stream_len(275, Duration::from_secs(60)).await;
    wait_until(
        "only the followers pending",
        Duration::from_secs(30),
        || async {
            env.count("processed_at IS NULL AND dead_lettered_at IS NULL")
                .await
                == 24
        },
    )
    .await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    assert_eq!(stored.len(), 275);
    testkit::outbox::assert_unique(&stored);
}

/// Against a stream without `allow_batched` the relay refuses to start, naming the fix; with
/// `--create-stream` it creates the stream with it, and relays.
#[tokio::test]
async fn fast_ingest_needs_a_stream_that_takes_batches() {
    let env = Env::new().await;
    if !fast_server() {
        return refused_by_an_old_server(&env, Source::Notify).await;
    }
    let url = env.nats.url();
    let (code, _, stderr) = testkit::outbox::cli(
        &env.db,
        &[
            "run",
            "--nats-url",
            &url,
            "--publish-batches",
            "fast-ingest",
        ],
    );
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("allow_batched"), "{stderr}");
    let js = env.js().await;
    js.delete_stream(STREAM).await.expect("delete stream");
    let relay = CliRelay::run(
        &env,
        &["--publish-batches", "fast-ingest", "--create-stream"],
    );
    wait_until(
        "the relay created the stream",
        Duration::from_secs(20),
        || async { js.get_stream(STREAM).await.is_ok() },
    )
    .await;
    env.insert_sql(3, "agg-1", "order.created").await;
    env.wait_stream_len(3, Duration::from_secs(20)).await;
    let mut s = js.get_stream(STREAM).await.expect("stream");
    assert!(s.info().await.expect("info").config.allow_batch_publish);
    assert_eq!(relay.terminate(), Some(0));
}

/// Fast-ingest batches store each event as it comes, an atomic batch all or none: the two flags
/// do not combine, a usage error naming both.
#[test]
fn fast_ingest_does_not_combine_with_atomic_transactions() {
    let (code, _, stderr) = testkit::outbox::cli(
        "postgres://localhost:1/none",
        &[
            "run",
            "--publish-batches",
            "fast-ingest",
            "--transactions",
            "atomic",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--publish-batches"), "{stderr}");
    assert!(stderr.contains("--transactions atomic"), "{stderr}");
}
