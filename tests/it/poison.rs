//! Poison rows, retries, dead letters and the operator CLI, for both sources (with the wal
//! source, published rows are deleted: the checks count pending and dead rows, never processed
//! ones).

use std::time::Duration;

use async_nats::jetstream::stream;
use outbox_relay::Source;
use serde_json::Value;
use testkit::outbox::{cli, Env, STREAM};
use testkit::wait_until;

pub(crate) async fn narrow_stream(env: &Env, subjects: &[&str]) {
    let js = env.js().await;
    js.update_stream(stream::Config {
        name: STREAM.into(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .expect("update stream");
}

async fn insert(env: &Env, aggregate_id: &str, event_type: &str) -> uuid::Uuid {
    env.client()
        .await
        .query_one(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, $2, '{}') RETURNING id",
            &[&aggregate_id, &event_type],
        )
        .await
        .expect("insert")
        .get(0)
}

for_each_source!(
    poison_is_dead_lettered_others_flow_and_the_cli_recovers_it,
    invalid_subject_is_dead_lettered_at_once,
    failed_rows_wait_for_their_retry_time,
);

async fn poison_is_dead_lettered_others_flow_and_the_cli_recovers_it(source: Source) {
    let env = Env::new().await;
    // Only order.* subjects are routable: payment.* events are poison until the stream is fixed.
    narrow_stream(&env, &["outbox.order.>"]).await;
    let mut config = env.source_config(source).await;
    config.retry.max_attempts = 3;
    config.retry.initial = Duration::from_millis(50);
    config.retry.max = Duration::from_millis(200);
    let relay = env.spawn(config).await;

    let poison_a = insert(&env, "A", "payment.failed").await; // head of aggregate A
    let after_a = insert(&env, "A", "order.updated").await; // blocked behind it
    let poison_b = insert(&env, "B", "payment.failed").await;
    let after_b = insert(&env, "B", "order.updated").await;
    for i in 0..50 {
        insert(&env, &format!("healthy-{i}"), "order.created").await;
    }

    env.wait_stream_len(50, Duration::from_secs(10)).await;
    wait_until(
        "both poison rows dead-lettered",
        Duration::from_secs(15),
        || async { env.count("dead_lettered_at IS NOT NULL").await == 2 },
    )
    .await;
    let client = env.client().await;
    let dead: Vec<(uuid::Uuid, i32, String)> = client
        .query(
            "SELECT id, attempts, last_error FROM outbox_dead_letters ORDER BY seq",
            &[],
        )
        .await
        .expect("view")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        dead.iter().map(|d| d.0).collect::<Vec<_>>(),
        vec![poison_a, poison_b]
    );
    assert!(
        dead.iter().all(|d| d.1 == 3),
        "max attempts spent: {dead:?}"
    );
    assert!(
        dead[0].2.contains("outbox.payment.failed"),
        "clear last_error: {}",
        dead[0].2
    );
    // The followers wait behind their dead head; nothing else is held up (the healthy rows'
    // batches are recorded a moment after their acks).
    wait_until(
        "only the followers pending",
        Duration::from_secs(10),
        || async {
            env.count("processed_at IS NULL AND dead_lettered_at IS NULL")
                .await
                == 2
        },
    )
    .await;
    assert_eq!(env.stream_len().await, 50);

    // Operator view.
    let (code, out, _) = cli(&env.db, &["status", "--json"]);
    assert_eq!(code, Some(0));
    let status: Value = serde_json::from_str(&out).expect("status json");
    assert_eq!(status["dead_letters"], 2);
    assert_eq!(status["blocked_aggregates"], 2);
    assert_eq!(status["pending"], 2);
    let (code, out, _) = cli(
        &env.db,
        &[
            "dead-letters",
            "list",
            "--json",
            "--event-type",
            "payment.failed",
        ],
    );
    assert_eq!(code, Some(0));
    let list: Value = serde_json::from_str(&out).expect("list json");
    assert_eq!(list.as_array().map(Vec::len), Some(2));
    assert_eq!(list[0]["id"], poison_a.to_string());

    // Unknown ids: a clear error, nothing changed.
    let unknown = uuid::Uuid::new_v4().to_string();
    let (code, _, err) = cli(
        &env.db,
        &["dead-letters", "retry", &poison_a.to_string(), &unknown],
    );
    assert_eq!(code, Some(2));
    assert!(err.contains(&unknown), "{err}");
    assert_eq!(env.count("dead_lettered_at IS NOT NULL").await, 2);
    let (code, _, err) = cli(&env.db, &["dead-letters", "retry", "not-a-uuid"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("not-a-uuid"), "{err}");

    // Fix the stream, retry A: it and the event behind it are delivered, in order.
    narrow_stream(&env, &["outbox.>"]).await;
    let (code, out, err) = cli(&env.db, &["dead-letters", "retry", &poison_a.to_string()]);
    assert_eq!(code, Some(0), "{out}{err}");
    env.wait_stream_len(52, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    let tail: Vec<uuid::Uuid> = stored[50..].iter().map(|m| m.event_id()).collect();
    assert_eq!(tail, vec![poison_a, after_a]);

    // Discard B: the audit row stays, its aggregate is released.
    let (code, _, _) = cli(&env.db, &["dead-letters", "discard", &poison_b.to_string()]);
    assert_eq!(code, Some(0));
    env.wait_stream_len(53, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    assert_eq!(stored[52].event_id(), after_b);
    assert!(
        stored.iter().all(|m| m.event_id() != poison_b),
        "a discarded event is never published"
    );
    assert_eq!(env.count("discarded_at IS NOT NULL").await, 1);
    assert_eq!(
        env.count("dead_lettered_at IS NOT NULL AND processed_at IS NULL")
            .await,
        0
    );
    relay.stop().await;
}

async fn invalid_subject_is_dead_lettered_at_once(source: Source) {
    let env = Env::new().await;
    let relay = env.spawn(env.source_config(source).await).await;
    let bad = insert(&env, "X", "has space").await;
    insert(&env, "Y", "order.created").await;
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    wait_until(
        "invalid row dead-lettered",
        Duration::from_secs(10),
        || async { env.count("dead_lettered_at IS NOT NULL").await == 1 },
    )
    .await;
    let row = env
        .client()
        .await
        .query_one(
            "SELECT attempts, last_error FROM outbox_dead_letters WHERE id = $1",
            &[&bad],
        )
        .await
        .expect("dead letter");
    let (attempts, error): (i32, String) = (row.get(0), row.get(1));
    assert_eq!(
        attempts, 1,
        "dead-lettered on its first attempt, without retries"
    );
    assert!(error.contains("event_type"), "{error}");
    relay.stop().await;
}

async fn failed_rows_wait_for_their_retry_time(source: Source) {
    let env = Env::new().await;
    narrow_stream(&env, &["outbox.order.>"]).await;
    let mut config = env.source_config(source).await;
    config.retry.initial = Duration::from_secs(30);
    config.retry.max = Duration::from_secs(60);
    let relay = env.spawn(config).await;
    let id = insert(&env, "R", "payment.failed").await;
    wait_until(
        "first attempt recorded",
        Duration::from_secs(10),
        || async { env.count("attempts = 1").await == 1 },
    )
    .await;
    let client = env.client().await;
    let wait: f64 = client
        .query_one(
            "SELECT EXTRACT(EPOCH FROM retry_after - now())::float8 FROM outbox_events WHERE id = $1",
            &[&id],
        )
        .await
        .expect("retry_after")
        .get(0);
    assert!(
        (15.0..=45.0).contains(&wait),
        "retry in {wait}s, expected ~30s with jitter"
    );
    // Further wake-ups do not retry it early.
    insert(&env, "other", "order.created").await;
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    assert_eq!(env.count("attempts = 1").await, 1);
    let (code, out, _) = cli(&env.db, &["status", "--json"]);
    assert_eq!(code, Some(0));
    let status: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(status["waiting_for_retry"], 1);
    assert_eq!(status["due_for_retry"], 0);
    relay.stop().await;
}

/// Not per source: an operator command without a relay, over rows marked processed (as the table
/// source and `--wal-marking update` leave them; the default wal marking deletes them).
#[tokio::test]
async fn cleanup_deletes_only_old_processed_rows() {
    let env = Env::new().await;
    let client = env.client().await;
    testkit::outbox::seed_cleanup_rows(&client).await;
    let (code, out, err) = cli(
        &env.db,
        &["cleanup", "--older-than", "7d", "--batch-size", "1000"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("deleted 2500"), "{out}");
    assert_eq!(env.count("true").await, 20);
    let (code, _, err) = cli(&env.db, &["cleanup", "--older-than", "soon"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--older-than"), "{err}");
}
