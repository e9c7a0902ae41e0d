//! Where events go and what they carry: `--subject-template` routing, `--headers cloudevents`
//! (and `both`), and the start-up checks of those flags.

use std::time::Duration;

use outbox_relay::{HeaderFormat, RelayConfig};
use testkit::outbox::{cli, CliRelay, Env, STREAM};
use testkit::wait_until;

const WAIT: Duration = Duration::from_secs(20);

async fn insert(env: &Env, aggregate_type: &str, aggregate_id: &str, event_type: &str) -> String {
    let row = env
        .client()
        .await
        .query_one(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1, $2, $3, '{\"n\": 1}') RETURNING id::text",
            &[&aggregate_type, &aggregate_id, &event_type],
        )
        .await
        .expect("insert");
    row.get(0)
}

#[tokio::test]
async fn subject_template_routes_by_fields_and_dead_letters_rows_that_make_no_subject() {
    let pg = testkit::shared_pg();
    let env = Env::without_stream(pg).await;
    let ok = insert(&env, "order", "o-1", "created").await;
    // A space cannot be in a subject: this row is refused, and its aggregate's next event waits.
    let bad = insert(&env, "order", "o 2", "created").await;
    let held = insert(&env, "order", "o 2", "shipped").await;
    // Dots in a value add tokens, as in event types.
    let dotted = insert(&env, "user", "eu.7", "renamed").await;
    let relay = CliRelay::run(
        &env,
        &[
            "--create-stream",
            "--max-attempts",
            "3",
            "--subject-template",
            "app.{aggregate_type}.{aggregate_id}.{event_type}",
        ],
    );
    // Dead-lettered by a relay that has created the stream (it checks the stream first).
    env.wait_dead_letters(1, WAIT).await;
    env.wait_stream_len(2, WAIT).await;

    let stored = env.stored().await;
    let mut routed: Vec<(String, String)> = stored
        .iter()
        .map(|m| (m.headers["Outbox-Event-Id"].clone(), m.subject.clone()))
        .collect();
    routed.sort();
    let mut expected = vec![
        (ok, "app.order.o-1.created".to_string()),
        (dotted, "app.user.eu.7.renamed".to_string()),
    ];
    expected.sort();
    assert_eq!(routed, expected);

    let client = env.client().await;
    let dead = client
        .query_one("SELECT id::text, last_error FROM outbox_dead_letters", &[])
        .await
        .expect("dead letter");
    assert_eq!(dead.get::<_, String>(0), bad);
    let why: String = dead.get(1);
    assert!(
        why.contains("aggregate_id=\"o 2\"") && why.contains("subject"),
        "last_error names the field: {why}"
    );
    // The event behind the dead head is neither published nor dead-lettered: it waits.
    let held_row = client
        .query_one(
            "SELECT processed_at IS NULL AND dead_lettered_at IS NULL FROM outbox_events WHERE id::text = $1",
            &[&held],
        )
        .await
        .expect("held row");
    assert!(held_row.get::<_, bool>(0));

    // The stream the relay created captures the template's literal prefix.
    let info = env
        .js()
        .await
        .get_stream(STREAM)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .clone();
    assert_eq!(info.config.subjects, vec!["app.>".to_string()]);
    relay.stop().await;
}

fn config_with(env: &Env, format: HeaderFormat) -> RelayConfig {
    let mut config = env.config();
    config.publish.header_format = format;
    config.publish.ce_source = "/orders-service".into();
    config
}

#[tokio::test]
async fn cloudevents_headers_replace_or_join_the_outbox_ones() {
    let env = Env::new().await;
    let client = env.client().await;
    let mut published = 0;
    for format in [HeaderFormat::CloudEvents, HeaderFormat::Both] {
        let relay = env.spawn(config_with(&env, format)).await;
        let row = client
            .query_one(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers) \
                 VALUES ('order', 'o-9', 'order.created', '{\"total\": 1}', '{\"X-Tenant\": \"t1\"}') \
                 RETURNING id, created_at",
                &[],
            )
            .await
            .expect("insert");
        published += 1;
        env.wait_stream_len(published, WAIT).await;
        relay.stop().await;

        let id: uuid::Uuid = row.get(0);
        let created: std::time::SystemTime = row.get(1);
        let stored = env.stored().await;
        let m = stored.last().expect("a message");
        let h = &m.headers;
        assert_eq!(m.subject, "outbox.order.created", "{format:?}");
        assert_eq!(h["Nats-Msg-Id"], id.to_string(), "{format:?}");
        assert_eq!(h["ce-specversion"], "1.0");
        assert_eq!(h["ce-id"], id.to_string());
        assert_eq!(h["ce-type"], "order.created");
        assert_eq!(h["ce-source"], "/orders-service");
        assert_eq!(h["ce-subject"], "o-9");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["X-Tenant"], "t1");
        let time = humantime::parse_rfc3339(&h["ce-time"]).expect("ce-time is RFC 3339");
        let diff = time
            .duration_since(created)
            .or_else(|e| Ok::<_, ()>(e.duration()))
            .expect("diff");
        assert!(diff < Duration::from_millis(1), "{time:?} vs {created:?}");
        let outbox_headers = h.keys().filter(|k| k.starts_with("Outbox-")).count();
        match format {
            HeaderFormat::CloudEvents => assert_eq!(outbox_headers, 0, "{h:?}"),
            _ => {
                // Five of the event, three of its transaction (schema version 9).
                assert_eq!(outbox_headers, 8, "{h:?}");
                assert_eq!(h["Outbox-Transaction-Index"], "1");
                assert_eq!(h["Outbox-Event-Id"], id.to_string());
            }
        }
    }
    wait_until("rows marked processed", WAIT, || async {
        env.count("processed_at IS NOT NULL").await == 2
    })
    .await;
}

/// A consumer reads the id, aggregate and type the same way whatever the relay's header format.
#[tokio::test]
async fn consumer_helpers_read_either_format() {
    use futures::StreamExt;
    let env = Env::new().await;
    let js = env.js().await;
    let consumer = js
        .get_stream(STREAM)
        .await
        .expect("stream")
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .expect("consumer");
    let mut messages = consumer.messages().await.expect("messages");
    for format in [HeaderFormat::Outbox, HeaderFormat::CloudEvents] {
        let relay = env.spawn(config_with(&env, format)).await;
        let id = insert(&env, "order", "o-5", "order.paid").await;
        let msg = tokio::time::timeout(WAIT, messages.next())
            .await
            .expect("a message in time")
            .expect("stream open")
            .expect("message");
        relay.stop().await;
        let h = msg.headers.as_ref();
        use outbox_relay::consumer;
        assert_eq!(
            consumer::event_id(h).map(|u| u.to_string()),
            Some(id),
            "{format:?}"
        );
        assert_eq!(consumer::aggregate_id(h), Some("o-5"), "{format:?}");
        assert_eq!(consumer::event_type(h), Some("order.paid"), "{format:?}");
    }
}

#[tokio::test]
async fn routing_flags_are_checked_at_start() {
    let db = testkit::shared_pg().create_migrated_database().await;
    let cases: &[(&[&str], &str)] = &[
        (&["--subject-template", "app.{nope}"], "--subject-template"),
        (
            &["--subject-template", "app..{event_type}"],
            "--subject-template",
        ),
        (
            &[
                "--subject-template",
                "app.{event_type}",
                "--subject-prefix",
                "x",
            ],
            "--subject-prefix",
        ),
        (
            &[
                "--create-stream",
                "--subject-template",
                "{aggregate_type}.x",
            ],
            "--subject-template",
        ),
        (
            &["--headers", "cloudevents", "--ce-source", "has space"],
            "--ce-source",
        ),
        (&["--headers", "xml"], "--headers"),
    ];
    for (args, flag) in cases {
        let mut all = vec!["run", "--metrics-addr", "off", "--nats-url", "127.0.0.1:1"];
        all.extend_from_slice(args);
        let (code, _, stderr) = cli(&db, &all);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?} names {flag}: {stderr}");
    }
}

/// A template that routes into two streams and, for one event, where no stream listens: JetStream
/// answers "no responders" for that one and a lookup by subject finds no stream, so it is the
/// event's fault (dead-lettered after --max-attempts, its aggregate only); the others go to the
/// stream that captures each. (The other "no responders", a stream between leaders, is the
/// broker's: see `cluster::stream_leader_killed_mid_drain_spends_no_attempts`.)
#[tokio::test]
async fn events_routed_where_no_stream_listens_are_dead_lettered() {
    let env = Env::new().await; // stream OUTBOX on outbox.>
    env.js()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: "BILLING".into(),
            subjects: vec!["billing.>".into()],
            ..Default::default()
        })
        .await
        .expect("second stream");
    let covered = insert(&env, "outbox", "o-1", "created").await;
    let billed = insert(&env, "billing", "b-1", "created").await;
    let stray = insert(&env, "audit", "a-1", "created").await;
    let relay = env
        .spawn({
            let mut config = env.config();
            config.publish.subject_template = Some("{aggregate_type}.{event_type}".into());
            config.retry.max_attempts = 2;
            config
        })
        .await;
    env.wait_dead_letters(1, WAIT).await;
    env.wait_stream_len(1, WAIT).await;
    relay.stop().await;

    let stored = env.stored().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].headers["Outbox-Event-Id"], covered);
    assert_eq!(stored[0].subject, "outbox.created");
    let billing = testkit::outbox::read_stream(&env.js().await, "BILLING").await;
    assert_eq!(billing.len(), 1);
    assert_eq!(billing[0].headers["Outbox-Event-Id"], billed);
    assert_eq!(billing[0].subject, "billing.created");
    let dead = env
        .client()
        .await
        .query_one(
            "SELECT id::text, attempts, last_error FROM outbox_dead_letters",
            &[],
        )
        .await
        .expect("dead letter");
    assert_eq!(dead.get::<_, String>(0), stray);
    assert_eq!(dead.get::<_, i32>(1), 2, "both attempts spent");
    let why: String = dead.get(2);
    assert!(
        why.contains("audit.created"),
        "last_error names the subject: {why}"
    );
}

/// A batch with hundreds of stray subjects is judged in that batch: every subject that met "no
/// responders" is looked up (16 at a time), so none is left to count as the broker's and wait a
/// retry (here a minute) while the relay backs off as for an outage.
#[tokio::test]
async fn hundreds_of_stray_subjects_are_judged_in_the_batch_they_failed_in() {
    let env = Env::new().await;
    let mut strays = Vec::new();
    for n in 0..200 {
        strays.push(insert(&env, "stray", &format!("s-{n}"), "created").await);
    }
    let covered = insert(&env, "outbox", "o-1", "created").await;
    let relay = env
        .spawn({
            let mut config = env.config();
            config.publish.subject_template = Some("{aggregate_type}.{aggregate_id}".into());
            config.batch.size = 500;
            config.retry.max_attempts = 1;
            // A stray left out of the lookups would wait this long for its next attempt.
            config.retry.initial = Duration::from_secs(60);
            config.retry.max = Duration::from_secs(60);
            config
        })
        .await;
    env.wait_dead_letters(200, WAIT).await;
    relay.stop().await;
    assert_only_strays_dead(&env, strays, &covered).await;
}

/// More stray subjects in one batch than the relay looks up per batch (1,024): the ones left out
/// count as the broker's for that batch and are judged when they fail again, so every one of them
/// is dead-lettered in the end, after exactly the attempts allowed.
#[tokio::test]
async fn many_stray_subjects_in_one_batch_are_all_judged() {
    let env = Env::new().await;
    let strays: Vec<String> = env
        .client()
        .await
        .query(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'stray' || n, 's-1', 'created', '{\"n\": 1}' FROM generate_series(1, 1030) n \
             RETURNING id::text",
            &[],
        )
        .await
        .expect("insert strays")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let covered = insert(&env, "outbox", "o-1", "created").await;
    let relay = env
        .spawn({
            let mut config = env.config();
            config.publish.subject_template = Some("{aggregate_type}.{event_type}".into());
            config.batch.size = 2000;
            config.retry.max_attempts = 1;
            config
        })
        .await;
    env.wait_dead_letters(1030, WAIT).await;
    relay.stop().await;
    assert_only_strays_dead(&env, strays, &covered).await;
}

/// Only the covered event is stored, and the strays are the dead letters, each after exactly one
/// attempt: no stray was blamed twice or dead-lettered as the broker's.
async fn assert_only_strays_dead(env: &Env, mut strays: Vec<String>, covered: &str) {
    let stored = env.stored().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].headers["Outbox-Event-Id"], covered);
    assert_eq!(
        env.count("dead_lettered_at IS NOT NULL AND attempts = 1")
            .await,
        strays.len() as i64,
        "one attempt each"
    );
    let mut dead: Vec<String> = env
        .client()
        .await
        .query("SELECT id::text FROM outbox_dead_letters", &[])
        .await
        .expect("dead letters")
        .iter()
        .map(|r| r.get(0))
        .collect();
    dead.sort();
    strays.sort();
    assert_eq!(dead, strays);
}
