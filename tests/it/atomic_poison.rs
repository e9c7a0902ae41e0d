//! `--transactions atomic` keeps the promises of the default mode about events JetStream will
//! never take: a poison event (too large for the stream or the server, on a subject no stream
//! captures) dead-letters its transaction together instead of holding it as an outage, and a
//! transaction whose events route into two streams (which one atomic batch cannot span) is
//! dead-lettered whole, saying so. Both sources.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use outbox_relay::Source;
use testkit::outbox::{CliRelay, Env, Stored, STREAM};
use testkit::wait_until;

use crate::atomic::{allow_atomic, atomic_server};

/// A second stream, for the cross-stream case.
const AUDIT: &str = "AUDIT";

/// What makes the poison event of a transaction unpublishable.
#[derive(Debug, Clone, Copy)]
enum Poison {
    /// Larger than the stream's `max_msg_size` (4 KiB here).
    OverStreamMax,
    /// Larger than the server's `max_payload` (16 KiB here).
    OverMaxPayload,
    /// On a subject no stream captures (the stream takes `outbox.order.>` only).
    Uncaptured,
}

/// An environment for `source` whose server and stream make `poison` unpublishable, the stream
/// taking atomic batches, and the relay arguments (`--transactions atomic`, `--max-attempts 1`).
/// `None` on a server older than 2.12.
async fn poison_env(source: Source, poison: Poison) -> Option<(Env, Vec<String>)> {
    if !atomic_server() {
        return None;
    }
    let env = match poison {
        Poison::OverMaxPayload => {
            let env = Env {
                db: testkit::shared_pg().create_migrated_database().await,
                nats: testkit::NatsServer::start_with_config("max_payload: 16384"),
            };
            env.create_stream().await;
            env
        }
        _ => Env::new().await,
    };
    env.source_config(source).await;
    allow_atomic(&env).await;
    let js = env.js().await;
    let mut config = stream_config(&js, STREAM).await;
    match poison {
        Poison::OverStreamMax => config.max_message_size = 4096,
        Poison::Uncaptured => config.subjects = vec!["outbox.order.>".into()],
        Poison::OverMaxPayload => {}
    }
    js.update_stream(config).await.expect("update the stream");
    let mut args = env.source_args(source);
    args.extend(
        ["--transactions", "atomic", "--max-attempts", "1"]
            .iter()
            .map(|a| a.to_string()),
    );
    Some((env, args))
}

async fn stream_config(js: &jetstream::Context, name: &str) -> stream::Config {
    let mut s = js.get_stream(name).await.expect("stream");
    s.info().await.expect("info").config.clone()
}

/// Writes one transaction of `events` (aggregate id, event type, payload), in that order; returns
/// the ids.
async fn write(env: &Env, events: &[(&str, &str, String)]) -> Vec<uuid::Uuid> {
    let mut client = env.client().await;
    let tx = client.transaction().await.expect("begin");
    let mut ids = Vec::new();
    for (aggregate, event_type, payload) in events {
        let row = tx
            .query_one(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', $1, $2, $3::text::jsonb) RETURNING id",
                &[aggregate, event_type, payload],
            )
            .await
            .expect("insert");
        ids.push(row.get(0));
    }
    tx.commit().await.expect("commit");
    ids
}

/// Each dead letter's id and `last_error`, in write order.
async fn dead_letters(env: &Env) -> Vec<(uuid::Uuid, String)> {
    env.client()
        .await
        .query(
            "SELECT id, last_error FROM outbox_events WHERE dead_lettered_at IS NOT NULL ORDER BY seq",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn event_ids(stored: &[Stored]) -> Vec<String> {
    stored
        .iter()
        .map(|m| m.headers["Outbox-Event-Id"].clone())
        .collect()
}

for_each_source!(
    a_poison_over_the_streams_max_msg_size_dead_letters_its_transaction,
    a_poison_over_the_servers_max_payload_dead_letters_its_transaction,
    a_poison_on_a_subject_no_stream_captures_dead_letters_its_transaction,
);

async fn a_poison_over_the_streams_max_msg_size_dead_letters_its_transaction(source: Source) {
    poisoned_transaction(source, Poison::OverStreamMax).await;
}

async fn a_poison_over_the_servers_max_payload_dead_letters_its_transaction(source: Source) {
    poisoned_transaction(source, Poison::OverMaxPayload).await;
}

async fn a_poison_on_a_subject_no_stream_captures_dead_letters_its_transaction(source: Source) {
    poisoned_transaction(source, Poison::Uncaptured).await;
}

/// A transaction of three events whose middle one JetStream will never take (`poison`), followed by a healthy transaction: the poisoned transaction is dead-lettered whole
/// within seconds (the default mode dead-letters such an event at once, or after its attempts),
/// the poison's `last_error` saying why and naming its transaction, its siblings' naming the
/// poison; nothing of it reaches the stream, and the healthy transaction goes out. Retrying the
/// fixed poison retries the transaction whole, as one batch.
async fn poisoned_transaction(source: Source, poison: Poison) {
    {
        let Some((env, args)) = poison_env(source, poison).await else {
            return;
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (event_type, payload, why) = match poison {
            Poison::OverStreamMax => (
                "order.created",
                format!("{{\"pad\": \"{}\"}}", "x".repeat(6000)),
                "too large for the stream",
            ),
            Poison::OverMaxPayload => (
                "order.created",
                format!("{{\"pad\": \"{}\"}}", "x".repeat(20000)),
                "max_payload",
            ),
            Poison::Uncaptured => (
                "payment.failed",
                "{}".to_string(),
                "no JetStream stream listens on subject outbox.payment.failed",
            ),
        };
        let poisoned = write(
            &env,
            &[
                ("p1", "order.created", "{}".into()),
                ("p2", event_type, payload),
                ("p3", "order.created", "{}".into()),
            ],
        )
        .await;
        let healthy = write(
            &env,
            &[
                ("h1", "order.created", "{}".into()),
                ("h2", "order.created", "{}".into()),
            ],
        )
        .await;
        let relay = CliRelay::run_logged(&env, &args);
        env.wait_dead_letters(3, Duration::from_secs(20)).await;
        env.wait_stream_len(2, Duration::from_secs(20)).await;
        wait_until(
            "the healthy one marked",
            Duration::from_secs(20),
            || async {
                env.count("processed_at IS NULL AND dead_lettered_at IS NULL")
                    .await
                    == 0
            },
        )
        .await;
        let (code, log) = relay.terminate_logged(Duration::from_secs(20));
        assert_eq!(code, Ok(Some(0)), "{poison:?}: {log}");
        let dead = dead_letters(&env).await;
        assert_eq!(
            dead.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            poisoned,
            "{poison:?}: the poisoned transaction dead-lettered whole"
        );
        let poison_id = poisoned[1].to_string();
        let (_, own) = &dead[1];
        assert!(
            own.contains(why) && own.contains("transaction"),
            "{poison:?}: {own}"
        );
        for (_, held) in [&dead[0], &dead[2]] {
            assert!(
                held.contains(&poison_id) && held.contains("transaction"),
                "{poison:?}: {held}"
            );
        }
        let stored = env.stored().await;
        let ids: Vec<String> = healthy.iter().map(uuid::Uuid::to_string).collect();
        assert_eq!(event_ids(&stored), ids, "{poison:?}: only the healthy one");

        if let Poison::OverStreamMax = poison {
            // Fixed and retried: the whole transaction goes, as one batch.
            env.client()
                .await
                .execute(
                    "UPDATE outbox_events SET payload = '{}' WHERE id = $1",
                    &[&poisoned[1]],
                )
                .await
                .expect("fix the poison");
            let (code, out, err) =
                testkit::outbox::cli(&env.db, &["dead-letters", "retry", &poison_id]);
            assert_eq!(code, Some(0), "{out}{err}");
            let relay = CliRelay::run(&env, &args);
            env.wait_stream_len(5, Duration::from_secs(20)).await;
            assert_eq!(relay.terminate(), Some(0));
            let stored = env.stored().await;
            let revived = &stored[2..];
            let ids: Vec<String> = poisoned.iter().map(uuid::Uuid::to_string).collect();
            assert_eq!(event_ids(revived), ids);
            let batch = revived[0].headers.get("Nats-Batch-Id").expect("a batch");
            assert!(revived
                .iter()
                .all(|m| m.headers.get("Nats-Batch-Id") == Some(batch)));
        }
    }
}

for_each_source!(a_transaction_across_two_streams_is_dead_lettered_whole);

/// Streams OUTBOX (`outbox.order.>`) and AUDIT (`outbox.audit.>`), both taking atomic batches. A
/// transaction with events in both cannot be one atomic batch (the server answers that the batch
/// is incomplete): it is dead-lettered whole at once, each `last_error` saying that its events
/// route to more than one stream, and nothing of it is stored in either. A transaction wholly in
/// AUDIT and one wholly in OUTBOX go out, each one batch in its stream.
async fn a_transaction_across_two_streams_is_dead_lettered_whole(source: Source) {
    if !atomic_server() {
        return;
    }
    let env = Env::new().await;
    env.source_config(source).await;
    let js = env.js().await;
    let mut config = stream_config(&js, STREAM).await;
    config.subjects = vec!["outbox.order.>".into()];
    config.allow_atomic_publish = true;
    js.update_stream(config).await.expect("narrow the stream");
    js.create_stream(stream::Config {
        name: AUDIT.into(),
        subjects: vec!["outbox.audit.>".into()],
        allow_atomic_publish: true,
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .expect("the audit stream");
    let across = write(
        &env,
        &[
            ("a", "order.created", "{}".into()),
            ("a", "audit.logged", "{}".into()),
            ("b", "order.created", "{}".into()),
        ],
    )
    .await;
    let audit = write(
        &env,
        &[
            ("c", "audit.logged", "{}".into()),
            ("d", "audit.logged", "{}".into()),
        ],
    )
    .await;
    let orders = write(
        &env,
        &[
            ("e", "order.created", "{}".into()),
            ("f", "order.created", "{}".into()),
        ],
    )
    .await;
    let mut args = env.source_args(source);
    args.extend(["--transactions".to_string(), "atomic".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let relay = CliRelay::run_logged(&env, &args);
    // The default --max-attempts (10): dead-lettered at once all the same.
    env.wait_dead_letters(3, Duration::from_secs(20)).await;
    wait_until("the others marked", Duration::from_secs(20), || async {
        env.count("processed_at IS NULL AND dead_lettered_at IS NULL")
            .await
            == 0
    })
    .await;
    let (code, log) = relay.terminate_logged(Duration::from_secs(20));
    assert_eq!(code, Ok(Some(0)), "{log}");
    let dead = dead_letters(&env).await;
    assert_eq!(
        dead.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        across,
        "the cross-stream transaction dead-lettered whole"
    );
    for (_, error) in &dead {
        assert!(
            error.contains("more than one stream")
                && error.contains(STREAM)
                && error.contains(AUDIT),
            "{error}"
        );
    }
    let ids = |v: &[uuid::Uuid]| v.iter().map(uuid::Uuid::to_string).collect::<Vec<_>>();
    for (name, expected) in [(STREAM, &orders), (AUDIT, &audit)] {
        let stored = testkit::outbox::read_stream(&js, name).await;
        assert_eq!(event_ids(&stored), ids(expected), "{name}");
        let batch = stored[0].headers.get("Nats-Batch-Id").expect("a batch");
        assert!(stored
            .iter()
            .all(|m| m.headers.get("Nats-Batch-Id") == Some(batch)));
    }
}
