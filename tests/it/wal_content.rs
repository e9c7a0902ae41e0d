//! `--source wal` publishes a streamed row from what the stream carried only when that is the row
//! as committed: a row changed in its own transaction (the version 6 trigger marks it), or by a
//! later one before the relay locked it (its `xmin`), goes out as the table holds it; an unchanged
//! row goes out byte for byte as the table would give it.

use std::collections::HashMap;
use std::time::Duration;

use testkit::outbox::{Env, Stored};
use testkit::wait_until;

use crate::wal::{drained, streaming};

/// The published messages by `Outbox-Event-Id`, once no row is pending.
async fn by_id(env: &Env, events: u64) -> HashMap<String, Stored> {
    env.wait_stream_len(events, Duration::from_secs(30)).await;
    drained(env, Duration::from_secs(30)).await;
    read_by_id(env, events).await
}

/// The published messages by `Outbox-Event-Id`, once no row matching `pending` is left.
async fn by_id_with(env: &Env, events: u64, pending: &str) -> HashMap<String, Stored> {
    env.wait_stream_len(events, Duration::from_secs(30)).await;
    let left = format!("processed_at IS NULL AND {pending}");
    wait_until("the rows published", Duration::from_secs(30), || async {
        env.count(&left).await == 0
    })
    .await;
    read_by_id(env, events).await
}

async fn read_by_id(env: &Env, events: u64) -> HashMap<String, Stored> {
    let stored = env.stored().await;
    assert_eq!(stored.len() as u64, events, "each event once");
    stored
        .into_iter()
        .map(|m| (m.headers["Outbox-Event-Id"].clone(), m))
        .collect()
}

/// An outbox whose slot exists, no relay running: what is written next is streamed when a relay
/// starts with the config returned.
async fn with_slot() -> (Env, outbox_relay::RelayConfig) {
    let env = Env::new().await;
    let config = env.wal_config().await;
    let relay = env.spawn(config.clone()).await;
    streaming(&env).await;
    relay.stop().await;
    (env, config)
}

/// The payload as JSON (PostgreSQL's text of jsonb and the message's bytes compare as values).
fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("a JSON payload")
}

#[tokio::test]
async fn a_row_changed_in_its_own_transaction_goes_out_as_committed() {
    let env = Env::new().await;
    let mut config = env.wal_config().await;
    // Batches of 20: each transaction below spans several.
    config.batch.size = 20;
    let relay = env.spawn(config).await;
    streaming(&env).await;
    let mut client = env.client().await;
    let tx = client.transaction().await.expect("begin");
    tx.batch_execute(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
         SELECT 'order', 'o-' || (g % 3), 'order.created', jsonb_build_object('v', g, 'step', 'inserted'),
                jsonb_build_object('step', 'inserted')
         FROM generate_series(1, 30) g;
         -- Changed after their insert, before the commit: the payload of one, the headers of
         -- another, the event type of a third.
         UPDATE outbox_events SET payload = payload || '{\"step\": \"updated\"}' WHERE payload->>'v' = '2';
         UPDATE outbox_events SET headers = '{\"step\": \"updated\"}' WHERE payload->>'v' = '25';
         UPDATE outbox_events SET event_type = 'order.changed' WHERE payload->>'v' = '7';
         -- Changed in a savepoint that is rolled back: the row is as inserted.
         SAVEPOINT s;
         UPDATE outbox_events SET payload = '{\"step\": \"rolled back\"}' WHERE payload->>'v' = '4';
         ROLLBACK TO SAVEPOINT s;
         -- Deleted before the commit: never published.
         DELETE FROM outbox_events WHERE payload->>'v' = '30';",
    )
    .await
    .expect("the writer's transaction");
    tx.commit().await.expect("commit");
    let tx = client.transaction().await.expect("begin");
    tx.batch_execute(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
         SELECT 'order', 'o-' || (g % 3), 'order.created', jsonb_build_object('v', g, 'step', 'inserted'),
                jsonb_build_object('step', 'inserted')
         FROM generate_series(31, 80) g;
         UPDATE outbox_events SET payload = payload || '{\"step\": \"updated\"}' WHERE payload->>'v' = '75';",
    )
    .await
    .expect("the second transaction");
    tx.commit().await.expect("commit");
    let published = by_id(&env, 79).await;
    // The rows are gone (--wal-marking delete); their ids are in the test's ledger.
    let ledger = client
        .query(
            "SELECT w.id::text FROM written_ledger w ORDER BY w.seq",
            &[],
        )
        .await
        .expect("the ledger");
    assert_eq!(ledger.len(), 80);
    let mut seen = 0;
    for row in &ledger {
        let id: String = row.get(0);
        let Some(m) = published.get(&id) else {
            continue; // the deleted row
        };
        seen += 1;
        let payload = json(&m.payload);
        let v = payload["v"].as_i64().expect("v");
        let step = if v == 2 || v == 75 {
            "updated"
        } else {
            "inserted"
        };
        assert_eq!(payload["step"], step, "payload of row {v}");
        let header_step = if v == 25 { "updated" } else { "inserted" };
        assert_eq!(m.headers["step"], header_step, "headers of row {v}");
        let event_type = if v == 7 {
            "order.changed"
        } else {
            "order.created"
        };
        assert_eq!(m.headers["Outbox-Event-Type"], event_type, "row {v}");
        assert_ne!(v, 30, "the deleted row is not published");
    }
    assert_eq!(seen, 79);
    relay.stop().await;
}

#[tokio::test]
async fn a_row_changed_after_its_commit_goes_out_as_the_table_holds_it() {
    let (env, config) = with_slot().await;
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'a', 'order.created', '{\"step\": \"inserted\", \"v\": 1}'),
                    ('order', 'a', 'order.created', '{\"step\": \"inserted\", \"v\": 2}'),
                    ('order', 'b', 'order.created', '{\"step\": \"inserted\", \"v\": 3}');",
        )
        .await
        .expect("insert");
    client
        .batch_execute(
            "UPDATE outbox_events SET payload = '{\"step\": \"updated\", \"v\": 2}',
                                      headers = '{\"late\": \"yes\"}'
             WHERE payload->>'v' = '2';
             -- Locked by a later transaction without a change: its content is still the row's.
             SELECT * FROM outbox_events WHERE payload->>'v' = '3' FOR UPDATE;",
        )
        .await
        .expect("update");
    let relay = env.spawn(config).await;
    let published = by_id(&env, 3).await;
    let mut by_v: Vec<(i64, String, Option<String>)> = published
        .values()
        .map(|m| {
            let p = json(&m.payload);
            (
                p["v"].as_i64().expect("v"),
                p["step"].as_str().expect("step").to_string(),
                m.headers.get("late").cloned(),
            )
        })
        .collect();
    by_v.sort();
    assert_eq!(
        by_v,
        [
            (1, "inserted".to_string(), None),
            (2, "updated".to_string(), Some("yes".to_string())),
            (3, "inserted".to_string(), None),
        ]
    );
    relay.stop().await;
}

/// A streamed row's `seq` is not its identity: a row whose seq changed after its commit goes out
/// once, as the table holds it; a row deleted after its commit whose seq a new row took is never
/// published, and the new row goes out as itself (a claim that looked rows up by seq must keep
/// this).
#[tokio::test]
async fn a_streamed_row_whose_seq_changed_or_was_taken_goes_out_as_the_table_holds_it() {
    let (env, config) = with_slot().await;
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'a', 'order.created', jsonb_build_object('v', g, 'step', 'inserted')
             FROM generate_series(1, 5) g;",
        )
        .await
        .expect("insert");
    client
        .batch_execute(
            "UPDATE outbox_events SET seq = DEFAULT WHERE payload->>'v' = '2';
             CREATE TEMP TABLE gone (seq bigint);
             WITH d AS (DELETE FROM outbox_events WHERE payload->>'v' = '4' RETURNING seq)
               INSERT INTO gone SELECT seq FROM d;
             INSERT INTO outbox_events (seq, aggregate_type, aggregate_id, event_type, payload)
               OVERRIDING SYSTEM VALUE
               SELECT seq, 'order', 'b', 'order.created', '{\"v\": 6, \"step\": \"took a seq\"}'
               FROM gone;",
        )
        .await
        .expect("move and take seqs");
    let relay = env.spawn(config).await;
    let published = by_id(&env, 5).await;
    let mut by_v: Vec<(i64, String, String)> = published
        .values()
        .map(|m| {
            let p = json(&m.payload);
            (
                p["v"].as_i64().expect("v"),
                p["step"].as_str().expect("step").to_string(),
                m.headers["Outbox-Aggregate-Id"].clone(),
            )
        })
        .collect();
    by_v.sort();
    let want: Vec<(i64, String, String)> = [
        (1, "inserted", "a"),
        (2, "inserted", "a"),
        (3, "inserted", "a"),
        (5, "inserted", "a"),
        (6, "took a seq", "b"),
    ]
    .into_iter()
    .map(|(v, s, a)| (v, s.to_string(), a.to_string()))
    .collect();
    assert_eq!(by_v, want);
    relay.stop().await;
}

#[tokio::test]
async fn a_streamed_row_goes_out_exactly_as_the_table_gives_it() {
    let (env, config) = with_slot().await;
    let client = env.client().await;
    // Values whose text forms are easy to get wrong: dates with offsets and fractions, infinity,
    // numbers with more digits than a float keeps, text beyond ASCII, escapes.
    client
        .batch_execute(
            "SET TIME ZONE 'Asia/Kolkata';
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers,
                                        created_at, attempts)
             VALUES ('order', 'x', 'order.created', '{\"n\": 123456789012345678901234567890, \"d\": 0.12345678901234567890}',
                     '{\"big\": 123456789012345678901234567890, \"dec\": 1.12345678901234567890, \"obj\": {\"a\": [1, 2]}, \"s\": \"t\\u00e9\"}',
                     '1999-12-31 23:59:59.999999+05:30', 0),
                    ('order', 'x', 'order.created', '{\"text\": \"\\u2603 \\\" snow\"}', NULL,
                     '2026-06-01 00:00:00.5-03', 3),
                    ('order', 'y', 'order.created', '[1, \"two\", null, true]', '{}', '2026-12-05 11:44:54.000001+00', 0),
                    -- Dead-lettered, as the table source does (no RFC 3339 form), by itself.
                    ('order', 'z', 'order.created', '{}', NULL, 'infinity', 0),
                    ('order', 'y', 'order.created', '{}', NULL, '0001-01-01 00:00:00+00', 0);",
        )
        .await
        .expect("insert");
    // What the table gives (read before the relay deletes them).
    let expected: HashMap<String, String> = client
        .query(
            "SELECT id::text, payload::text FROM outbox_events WHERE aggregate_id <> 'z'",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let relay = env.spawn(config).await;
    env.wait_dead_letters(1, Duration::from_secs(30)).await;
    let published = by_id_with(&env, 4, "dead_lettered_at IS NULL").await;
    for (id, payload) in &expected {
        let m = &published[id];
        assert_eq!(&m.payload, payload, "payload of {id}, byte for byte");
    }
    let created: Vec<Option<String>> = {
        let mut v: Vec<_> = published
            .values()
            .map(|m| m.headers.get("Outbox-Created-At").cloned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        created,
        [
            Some("0001-01-01T00:00:00.000000Z".to_string()),
            Some("1999-12-31T18:29:59.999999Z".to_string()),
            Some("2026-06-01T03:00:00.500000Z".to_string()),
            Some("2026-12-05T11:44:54.000001Z".to_string()),
        ]
    );
    let with_big = published
        .values()
        .find(|m| m.headers.contains_key("big"))
        .expect("the row with headers");
    assert_eq!(with_big.headers["big"], "123456789012345678901234567890");
    assert_eq!(with_big.headers["dec"], "1.12345678901234567890");
    assert_eq!(with_big.headers["obj"], r#"{"a":[1,2]}"#);
    assert_eq!(with_big.headers["s"], "t\u{e9}");
    relay.stop().await;
}

/// With the `rewritten` mark switched off (its trigger disabled by hand), a streamed row's content
/// may be stale: the relay streams as before, reading every row from the table.
#[tokio::test]
async fn a_disabled_rewritten_mark_has_every_row_read_from_the_table() {
    let env = Env::new().await;
    env.client()
        .await
        .batch_execute("ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_rewritten")
        .await
        .expect("the mark switched off");
    let relay = env.spawn(env.wal_config().await).await;
    streaming(&env).await;
    env.insert_interleaved(10, 5).await;
    let published = by_id(&env, 50).await;
    assert_eq!(published.len(), 50);
    relay.stop().await;
}
