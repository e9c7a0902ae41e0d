//! Transaction boundaries on every message (schema version 9): `Outbox-Transaction-Id`,
//! `-Index` and `-Events` let a consumer reassemble each database transaction, for both sources,
//! with the relay killed at random points.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use outbox_relay::Source;
use testkit::outbox::{CliRelay, Env, Stored};
use testkit::wait_until;

const TX_ID: &str = "Outbox-Transaction-Id";
const TX_INDEX: &str = "Outbox-Transaction-Index";
const TX_EVENTS: &str = "Outbox-Transaction-Events";

for_each_source!(headers_let_a_consumer_reassemble_each_transaction_across_kills);

async fn headers_let_a_consumer_reassemble_each_transaction_across_kills(source: Source) {
    reassembled_across_kills(source, &[]).await
}

/// The same with the wal source marking published rows (`--wal-marking update`).
#[tokio::test]
async fn headers_let_a_consumer_reassemble_each_transaction_across_kills_wal_marking_update() {
    reassembled_across_kills(Source::Wal, &["--wal-marking", "update"]).await
}

/// Writes `rounds` rounds of transactions of 1, 10 and 500 events (spread over five aggregates
/// each) while a relay publishes them, killed (SIGKILL) at random points: every event reaches the
/// stream, and after deduplication by event id the headers group them into exactly the
/// transactions written, each event at its place, with the transaction's count. The wal stream
/// holds 200 events at once here (batch size 100): a 500-event transaction is published over
/// several batches before its commit reaches the relay, and its count comes from the table,
/// which keeps its published rows (marked) until it is all published.
async fn reassembled_across_kills(source: Source, extra: &[&str]) {
    let env = Env::new().await;
    env.source_config(source).await;
    let source_args = env.source_args(source);
    let mut args: Vec<&str> = source_args.iter().map(String::as_str).collect();
    args.extend(["--batch-size", "100"]);
    args.extend_from_slice(extra);
    let sizes = [1_i64, 10, 500];
    let rounds = 8;
    let writer = {
        let db = env.db.clone();
        tokio::spawn(async move {
            let mut client = testkit::pg_client(&db).await;
            for k in 0..rounds * sizes.len() {
                let n = sizes[k % sizes.len()];
                let tx = client.transaction().await.expect("begin");
                tx.execute(
                    "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                     SELECT 'order', $1::int8::text || '-' || (g % 5), 'order.created',
                            jsonb_build_object('tx', $1::int8, 'i', g, 'n', $2::int8)
                     FROM generate_series(1, $2::int8) g
                     ORDER BY g",
                    &[&(k as i64), &n],
                )
                .await
                .expect("a transaction's events");
                tx.commit().await.expect("commit");
            }
        })
    };
    let total: usize = (0..rounds * sizes.len())
        .map(|k| sizes[k % sizes.len()] as usize)
        .sum();
    let seed = fastrand::u64(..);
    eprintln!("kill points seed: {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    for round in 0..4 {
        let relay = CliRelay::run(&env, &args);
        let before = env.stream_len().await;
        // Something published, or nothing left to (the writer may be done already, and the
        // relays before this one may have published everything).
        wait_until(
            &format!("round {round}: the relay publishes"),
            Duration::from_secs(30),
            || async {
                env.stream_len().await > before || env.count("processed_at IS NULL").await == 0
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(0..200))).await; // the random kill point
        relay.kill();
    }
    let relay = CliRelay::run(&env, &args);
    writer.await.expect("writer");
    wait_until(
        "every event in the stream",
        Duration::from_secs(90),
        || async { distinct_ids(&env.stored_headers().await) == total },
    )
    .await;
    if source == Source::Wal && extra.is_empty() {
        // `--wal-marking delete`: the rows kept for the counts, and the runs kept instead of
        // rows, are gone once their transactions are published.
        wait_until("the outbox emptied", Duration::from_secs(30), || async {
            env.count("true").await == 0
        })
        .await;
        let runs = testkit::simple_value(
            &env.client().await,
            "SELECT count(*) FROM outbox_transaction_runs",
        )
        .await;
        assert_eq!(runs, "0");
    }
    assert_eq!(relay.terminate(), Some(0));

    let stored = env.stored().await;
    // Every copy of an event (a redelivery after a kill) carries the same place.
    let mut first: HashMap<String, &Stored> = HashMap::new();
    for m in &stored {
        let id = m.headers["Outbox-Event-Id"].clone();
        match first.get(&id) {
            None => {
                first.insert(id, m);
            }
            Some(earlier) => {
                for h in [TX_ID, TX_INDEX] {
                    assert_eq!(earlier.headers.get(h), m.headers.get(h), "{h} of {id}");
                }
                if let (Some(a), Some(b)) =
                    (earlier.headers.get(TX_EVENTS), m.headers.get(TX_EVENTS))
                {
                    assert_eq!(a, b, "{TX_EVENTS} of {id}");
                }
            }
        }
    }
    assert_eq!(first.len(), total, "every event once after deduplication");

    // Reassemble by the headers alone, then compare with what was written (the payload).
    let mut by_tx: BTreeMap<String, Vec<&Stored>> = BTreeMap::new();
    for m in first.values() {
        let tx = m
            .headers
            .get(TX_ID)
            .unwrap_or_else(|| panic!("{TX_ID} on {m:?}"));
        by_tx.entry(tx.clone()).or_default().push(m);
    }
    assert_eq!(
        by_tx.len(),
        rounds * sizes.len(),
        "one id per transaction written"
    );
    let mut written_seen = HashSet::new();
    for (tx, mut events) in by_tx {
        events.sort_by_key(|m| index(m));
        let payload = |m: &Stored| -> serde_json::Value {
            serde_json::from_str(&m.payload).expect("json payload")
        };
        let k = payload(events[0])["tx"].as_i64().expect("tx");
        let n = payload(events[0])["n"].as_u64().expect("n");
        assert!(written_seen.insert(k), "transaction {k} under two ids");
        assert_eq!(
            events.len() as u64,
            n,
            "transaction {tx} (written as {k}) is whole"
        );
        for (at, m) in events.iter().enumerate() {
            let p = payload(m);
            assert_eq!(
                p["tx"].as_i64(),
                Some(k),
                "transaction {tx} holds only {k}'s events"
            );
            assert_eq!(index(m), at as u64 + 1, "indexes 1..={n} in {tx}");
            assert_eq!(
                p["i"].as_u64(),
                Some(index(m)),
                "the index is the order written"
            );
            let count: u64 = m
                .headers
                .get(TX_EVENTS)
                .unwrap_or_else(|| panic!("{TX_EVENTS} on {m:?}"))
                .parse()
                .expect("a count");
            assert_eq!(count, n, "the count of {tx}");
        }
    }
}

fn index(m: &Stored) -> u64 {
    m.headers
        .get(TX_INDEX)
        .unwrap_or_else(|| panic!("{TX_INDEX} on {m:?}"))
        .parse()
        .expect("an index")
}

fn distinct_ids(stored: &[Stored]) -> usize {
    stored
        .iter()
        .filter_map(|m| m.headers.get("Outbox-Event-Id"))
        .collect::<HashSet<_>>()
        .len()
}

/// A row written before schema version 9 (or with its `txid` set to NULL) is published without
/// the transaction headers; rows written after carry them, one transaction per writer's
/// transaction: with `--headers cloudevents` as the extension attributes `ce-outboxtx*`.
#[tokio::test]
async fn a_row_without_a_transaction_goes_without_the_headers() {
    let env = Env::new().await;
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, txid)
             VALUES ('order', 'old', 'order.created', '{}', NULL);
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'new', 'order.created', '{}'), ('order', 'new', 'order.paid', '{}');",
        )
        .await
        .expect("rows");
    let relay = CliRelay::run(&env, &["--headers", "cloudevents"]);
    env.wait_stream_len(3, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    let of = |aggregate: &str| -> Vec<&Stored> {
        stored
            .iter()
            .filter(|m| m.headers.get("ce-subject").map(String::as_str) == Some(aggregate))
            .collect()
    };
    let old = of("old");
    assert_eq!(old.len(), 1);
    assert!(
        !old[0].headers.keys().any(|k| k.starts_with("ce-outboxtx")),
        "{:?}",
        old[0]
    );
    let new = of("new");
    assert_eq!(new.len(), 2);
    // CloudEvents extension attributes, no Outbox-* header in this format.
    assert!(new[0].headers.contains_key("ce-outboxtxid"), "{:?}", new[0]);
    assert_eq!(
        new[0].headers.get("ce-outboxtxid"),
        new[1].headers.get("ce-outboxtxid")
    );
    assert_eq!(new[0].headers["ce-outboxtxindex"], "1");
    assert_eq!(new[1].headers["ce-outboxtxindex"], "2");
    assert!(new.iter().all(|m| m.headers["ce-outboxtxevents"] == "2"));
    assert!(stored
        .iter()
        .all(|m| !m.headers.keys().any(|k| k.starts_with("Outbox-"))));
}

/// Two transactions, `a` and `b`, write 30 events each alternately (their seqs interleave; `a`
/// takes the lower one of each pair), over three aggregates each, or the same three for both
/// (`shared`), then commit: `a` first, or `b` first (`b_first`). Each payload names its
/// transaction (`tx`) and its place in it (`i`).
async fn write_side_by_side(env: &Env, shared: bool, b_first: bool) {
    let mut a = testkit::pg_client(&env.db).await;
    let mut b = testkit::pg_client(&env.db).await;
    let (ta, tb) = (
        a.transaction().await.expect("begin a"),
        b.transaction().await.expect("begin b"),
    );
    let insert = "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                  VALUES ('order', $1, 'order.created', jsonb_build_object('tx', $2::text, 'i', $3::int8))";
    let aggregate = |tx: &str, i: i64| match shared {
        true => format!("x{}", i % 3),
        false => format!("{tx}{}", i % 3),
    };
    for i in 1..=30_i64 {
        ta.execute(insert, &[&aggregate("a", i), &"a", &i])
            .await
            .expect("a");
        tb.execute(insert, &[&aggregate("b", i), &"b", &i])
            .await
            .expect("b");
    }
    if b_first {
        tb.commit().await.expect("commit b");
        ta.commit().await.expect("commit a");
    } else {
        ta.commit().await.expect("commit a");
        tb.commit().await.expect("commit b");
    }
}

for_each_source!(transactions_written_side_by_side_are_numbered_in_the_order_written);

/// Two transactions write 30 events each, alternately (their seqs interleave), then commit; a
/// relay with batches of 5 publishes each over several batches (the wal stream holds 10): every
/// event's place is the order its transaction wrote it, with its transaction's count.
async fn transactions_written_side_by_side_are_numbered_in_the_order_written(source: Source) {
    let env = Env::new().await;
    env.source_config(source).await;
    let source_args = env.source_args(source);
    let mut args: Vec<&str> = source_args.iter().map(String::as_str).collect();
    args.extend(["--batch-size", "5"]);
    // Each transaction its own aggregates (one aggregate written by both, the later committing
    // first, is the next test's).
    write_side_by_side(&env, false, false).await;
    let relay = CliRelay::run(&env, &args);
    env.wait_stream_len(60, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    assert_eq!(stored.len(), 60);
    let mut ids = HashSet::new();
    for m in &stored {
        let p: serde_json::Value = serde_json::from_str(&m.payload).expect("json");
        ids.insert((
            p["tx"].as_str().map(str::to_string),
            m.headers[TX_ID].clone(),
        ));
        assert_eq!(p["i"].as_u64(), Some(index(m)), "{m:?}");
        assert_eq!(m.headers[TX_EVENTS], "30", "{m:?}");
    }
    assert_eq!(ids.len(), 2, "one id per transaction: {ids:?}");
}

/// The consumer side: messages read back from the stream (twice, as a redelivery would bring them
/// again) are collected with `consumer::Transactions` until each transaction is whole, then
/// handled in one database transaction with `process_many_once`: each transaction is handled
/// once, whole, and the second delivery finds every event handled.
#[tokio::test]
async fn a_consumer_handles_each_transaction_whole_and_once() {
    use outbox_relay::consumer::{self, Collected, Transactions};
    let env = Env::new().await;
    let mut client = env.client().await;
    for n in [1_i64, 4, 7] {
        client
            .execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', 'o' || (g % 2), 'order.created', jsonb_build_object('n', $1::int8)
                 FROM generate_series(1, $1::int8) g",
                &[&n],
            )
            .await
            .expect("a transaction");
    }
    let relay = CliRelay::run(&env, &[]);
    env.wait_stream_len(12, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
    client
        .batch_execute("CREATE TABLE handled (txid numeric PRIMARY KEY, events int NOT NULL)")
        .await
        .expect("table");
    let stored = env.stored().await;
    let mut handled_events = Vec::new();
    for delivery in 0..2 {
        let mut transactions = Transactions::new(100);
        // Delivered in reverse: a transaction's last event first.
        for m in stored.iter().rev() {
            let mut headers = async_nats::HeaderMap::new();
            for (name, value) in &m.headers {
                headers.insert(name.as_str(), value.as_str());
            }
            let position = consumer::transaction(Some(&headers)).expect("a transaction");
            let id = consumer::event_id(Some(&headers)).expect("an id");
            match transactions.add(position, id) {
                Collected::Whole(ids) => {
                    let tx = client.transaction().await.expect("begin");
                    let first = consumer::process_many_once(&tx, &ids)
                        .await
                        .expect("record");
                    if !first.is_empty() {
                        assert_eq!(first.len(), ids.len(), "all new or none");
                        tx.execute(
                            "INSERT INTO handled VALUES ($1::text::numeric, $2)",
                            &[&position.id.to_string(), &(ids.len() as i32)],
                        )
                        .await
                        .expect("handled");
                    }
                    tx.commit().await.expect("commit");
                    handled_events.push((delivery, first.len()));
                }
                Collected::Held => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(transactions.held(), 0, "nothing left waiting");
    }
    let rows = client
        .query("SELECT events FROM handled ORDER BY events", &[])
        .await
        .expect("handled");
    let counts: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(counts, [1, 4, 7], "each transaction handled once, whole");
    let mut first: Vec<usize> = handled_events
        .iter()
        .filter(|(d, _)| *d == 0)
        .map(|(_, n)| *n)
        .collect();
    first.sort_unstable();
    assert_eq!(first, [1, 4, 7]);
    assert!(
        handled_events
            .iter()
            .filter(|(d, _)| *d == 1)
            .all(|(_, n)| *n == 0),
        "the second delivery handles nothing: {handled_events:?}"
    );
}

for_each_source!(transactions_side_by_side_on_the_same_aggregates_the_later_committing_first);

/// Two transactions write 30 events each alternately on the same three aggregates, and the one
/// with the higher seqs commits first, holding more events than the wal stream reads ahead
/// (`--batch-size 5`: 10). The wal source used to wait for the other's older rows for ever (its
/// read-ahead full of rows waiting for them, re-claimed every millisecond); now each event goes
/// out once, and each transaction's events of an aggregate in the order written.
async fn transactions_side_by_side_on_the_same_aggregates_the_later_committing_first(
    source: Source,
) {
    let env = Env::new().await;
    env.source_config(source).await;
    let source_args = env.source_args(source);
    let mut args: Vec<&str> = source_args.iter().map(String::as_str).collect();
    args.extend(["--batch-size", "5"]);
    let relay = CliRelay::run(&env, &args);
    write_side_by_side(&env, true, true).await;
    env.wait_stream_len(60, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    assert_eq!(stored.len(), 60, "each event once");
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    for m in &stored {
        let p: serde_json::Value = serde_json::from_str(&m.payload).expect("json");
        let tx = p["tx"].as_str().expect("tx").to_string();
        let i = p["i"].as_u64().expect("i");
        let aggregate = m.headers["Outbox-Aggregate-Id"].clone();
        if let Some(before) = last.insert((tx.clone(), aggregate.clone()), i) {
            assert!(before < i, "{tx} on {aggregate}: {before} then {i}");
        }
    }
}

/// How the transaction of [`discarded`] is written.
#[derive(Clone, Copy, PartialEq)]
enum Written {
    /// Three INSERTs with another transaction's row between the first two: its seqs are not
    /// consecutive, so the rows published are marked and kept for the count.
    Spread,
    /// One bulk INSERT, published one event a batch: its seqs are consecutive, so the rows
    /// published are deleted and its count kept in `outbox_transaction_runs`.
    Run,
}

/// `--wal-marking delete`, a transaction of three events a, b and c (aggregates A, B, C) where b
/// is poison (no stream captures its subject) and dead-lettered at once: a and c go out, b
/// stays. Once the operator discards b, the transaction is complete: what was kept of it for
/// its count goes, without any batch holding it again, and only the discarded row (the audit
/// trail) stays. A consumer saw a and c at places 1 and 3 of 3 events written.
///
/// `version_9`: the schema without `outbox_kept_transactions` (a relay upgraded before the
/// schema): the relay works as before, and the marked rows stay until `cleanup`.
async fn discarded(written: Written, version_9: bool) {
    let env = Env::new().await;
    if version_9 {
        env.client()
            .await
            .batch_execute(
                "DROP TABLE outbox_kept_transactions;
                 DELETE FROM outbox_schema_migrations WHERE version = 10;",
            )
            .await
            .expect("back to version 9");
    }
    crate::poison::narrow_stream(&env, &["outbox.order.>"]).await;
    let mut config = env.source_config(Source::Wal).await;
    config.retry.max_attempts = 1;
    if written == Written::Run {
        // One event a batch: the transaction is published over several (its run is kept).
        config.batch.size = 1;
    }
    let relay = env.spawn(config).await;
    let mut client = testkit::pg_client(&env.db).await;
    let tx = client.transaction().await.expect("begin");
    match written {
        Written::Spread => {
            let insert =
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                          VALUES ('order', $1, $2, jsonb_build_object('i', $3::int8))";
            tx.execute(insert, &[&"A", &"order.created", &1_i64])
                .await
                .expect("a");
            // Another transaction's row between a and b.
            env.insert_sql(1, "other", "order.created").await;
            tx.execute(insert, &[&"B", &"payment.failed", &2_i64])
                .await
                .expect("b");
            tx.execute(insert, &[&"C", &"order.created", &3_i64])
                .await
                .expect("c");
        }
        Written::Run => {
            tx.execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', (ARRAY['A', 'B', 'C'])[g],
                        (ARRAY['order.created', 'payment.failed', 'order.created'])[g],
                        jsonb_build_object('i', g)
                 FROM generate_series(1, 3) g
                 ORDER BY g",
                &[],
            )
            .await
            .expect("a, b and c");
        }
    }
    tx.commit().await.expect("commit");
    let others = match written {
        Written::Spread => 1,
        Written::Run => 0,
    };
    env.wait_stream_len(2 + others, Duration::from_secs(30))
        .await;
    env.wait_dead_letters(1, Duration::from_secs(30)).await;
    let runs = || async {
        testkit::simple_value(
            &env.client().await,
            "SELECT count(*) FROM outbox_transaction_runs",
        )
        .await
    };
    // What is kept of the transaction for its count while b is pending.
    match written {
        Written::Spread => {
            wait_until("a and c kept, marked", Duration::from_secs(10), || async {
                env.count("processed_at IS NOT NULL").await == 2
            })
            .await
        }
        Written::Run => {
            wait_until("the run kept", Duration::from_secs(10), || async {
                runs().await == "1" && env.count("true").await == 1
            })
            .await
        }
    }
    let b: uuid::Uuid = env
        .client()
        .await
        .query_one(
            "SELECT id FROM outbox_events WHERE dead_lettered_at IS NOT NULL",
            &[],
        )
        .await
        .expect("the dead letter")
        .get(0);
    let (code, out, err) =
        testkit::outbox::cli(&env.db, &["dead-letters", "discard", &b.to_string()]);
    assert_eq!(code, Some(0), "{out}{err}");
    if version_9 {
        // Nothing failed: a later event goes out; a and c stay marked.
        env.insert_sql(1, "later", "order.created").await;
        env.wait_stream_len(3 + others, Duration::from_secs(30))
            .await;
        assert_eq!(
            env.count("processed_at IS NOT NULL AND discarded_at IS NULL")
                .await,
            2
        );
        relay.stop().await;
        return;
    }
    wait_until(
        "only the discarded row left",
        Duration::from_secs(15),
        || async {
            env.count("true").await == 1 && env.count("discarded_at IS NOT NULL").await == 1
        },
    )
    .await;
    wait_until("no run kept", Duration::from_secs(10), || async {
        runs().await == "0"
    })
    .await;
    relay.stop().await;

    let stored: Vec<Stored> = env
        .stored_headers()
        .await
        .into_iter()
        .filter(|m| m.headers.get(TX_EVENTS).map(String::as_str) == Some("3"))
        .collect();
    assert_eq!(
        stored.len(),
        2,
        "a and c, with the count written: {stored:?}"
    );
    assert_eq!(stored[0].headers[TX_ID], stored[1].headers[TX_ID]);
    let mut places: Vec<u64> = stored.iter().map(index).collect();
    places.sort_unstable();
    assert_eq!(places, vec![1, 3], "their places among the three written");
    assert!(stored.iter().all(|m| m.event_id() != b));
}

/// [`discarded`], the transaction's rows not consecutive: its marked rows go.
#[tokio::test]
async fn a_transaction_whose_dead_letter_is_discarded_leaves_the_outbox_marked_rows() {
    discarded(Written::Spread, false).await
}

/// [`discarded`], the transaction a run of consecutive seqs: its run goes.
#[tokio::test]
async fn a_transaction_whose_dead_letter_is_discarded_leaves_the_outbox_run() {
    discarded(Written::Run, false).await
}

/// [`discarded`] on schema version 9: as before.
#[tokio::test]
async fn a_transaction_whose_dead_letter_is_discarded_keeps_its_marked_rows_on_version_9() {
    discarded(Written::Spread, true).await
}

/// The heads claim (the first after a writer's notification at idle) says which rows their
/// transaction wrote alone, so that such an event is placed (1 of 1) without a statement of its
/// own before the publish; a row of a larger transaction, one whose transaction has published rows
/// kept as a run (`outbox_transaction_runs`), and a row without a transaction are not alone.
#[tokio::test]
async fn the_heads_claim_knows_the_events_their_transaction_wrote_alone() {
    let env = Env::new().await;
    let client = env.client().await;
    // One statement each: a simple query of several statements is one transaction.
    for sql in [
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'single', 'order.created', '{}')",
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'pair-' || n, 'order.created', '{}' FROM generate_series(1, 2) n",
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, txid) \
         VALUES ('order', 'none', 'order.created', '{}', NULL)",
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'run', 'order.created', '{}')",
        "INSERT INTO outbox_transaction_runs (txid, first_seq, events) \
         SELECT txid, seq - 1, 2 FROM outbox_events WHERE aggregate_id = 'run'",
    ] {
        client.batch_execute(sql).await.expect("rows");
    }
    client
        .batch_execute(include_str!("../../sql/queries/table/begin_claim.sql"))
        .await
        .expect("begin");
    let rows = client
        .query(
            include_str!("../../sql/queries/table/claim_heads.sql"),
            &[&16_i64, &1_000_000_i64],
        )
        .await
        .expect("claim");
    client.batch_execute("ROLLBACK").await.expect("rollback");
    let mut alone: Vec<(i64, String, bool)> = rows
        .iter()
        .map(|r| (r.get("seq"), r.get("aggregate_id"), r.get("alone")))
        .collect();
    alone.sort();
    let alone: Vec<(String, bool)> = alone.into_iter().map(|(_, a, b)| (a, b)).collect();
    assert_eq!(
        alone,
        [
            ("single".to_string(), true),
            ("pair-1".to_string(), false),
            ("pair-2".to_string(), false),
            ("none".to_string(), false),
            ("run".to_string(), false),
        ]
    );
}
