//! `--source wal` checks the table before it trusts its memory or the stream's copy of a row:
//! aggregates handed to the table survive a restart (they are recorded before the slot passes
//! them), a row whose aggregate changed after its commit goes out as the table holds it and in
//! that aggregate's order, and a relay waiting on a lock stops when told to.

use std::collections::HashMap;
use std::time::Duration;

use testkit::outbox::{CliRelay, Env, RunningRelay, Stored, Written};
use testkit::wait_until;
use uuid::Uuid;

use super::wal::{cli_wal, streaming};

/// Inserts one event of `aggregate` with headers that are not a JSON object: the relay cannot
/// make a message of it and dead-letters it at once. Returns its id.
pub(crate) async fn insert_poison(env: &Env, aggregate: &str) -> Uuid {
    env.client()
        .await
        .query_one(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('order', $1, 'order.created', '{}', '[1, 2]') RETURNING id",
            &[&aggregate],
        )
        .await
        .expect("insert a poison row")
        .get(0)
}

/// The server's WAL position now (text).
async fn wal_now(env: &Env) -> String {
    env.client()
        .await
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("wal position")
        .get(0)
}

/// Waits until the slot has confirmed `lsn` or past it.
async fn confirmed_past(env: &Env, lsn: &str) {
    env.wait_true(
        "the slot confirms past the events written",
        Duration::from_secs(30),
        "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false)
         FROM pg_replication_slots WHERE slot_name = $1",
        &[&env.slot_name(), &lsn],
    )
    .await;
}

/// The ledger without `left_out` (events discarded, never to be published): each of the others
/// in the stream once, per aggregate in seq order.
fn assert_ledger_without(written: &[Written], stored: &[Stored], left_out: &[Uuid]) {
    let written: Vec<Written> = written
        .iter()
        .filter(|w| !left_out.contains(&w.id))
        .cloned()
        .collect();
    testkit::outbox::assert_ledger(&written, stored);
}

/// `dead-letters discard ID`: the dead head is given up, its aggregate released.
async fn discard(env: &Env, id: Uuid) {
    let db = env.db.clone();
    let (code, _, err) = tokio::task::spawn_blocking(move || {
        testkit::outbox::cli(&db, &["dead-letters", "discard", &id.to_string()])
    })
    .await
    .expect("the cli");
    assert_eq!(code, Some(0), "{err}");
}

async fn wait_pending(env: &Env, n: i64) {
    wait_until(
        &format!("{n} rows pending"),
        Duration::from_secs(30),
        || async { env.count("processed_at IS NULL").await == n },
    )
    .await;
}

/// Two events of `a` (handed to the table behind its head) and one of `b` are written while
/// `relay` streams; once b's is out and the slot has confirmed past all three, the relay stops.
async fn two_of_a_left_to_the_table(env: &Env, relay: RunningRelay) {
    env.insert_sql(2, "a", "order.next").await;
    env.insert_sql(1, "b", "order.created").await;
    let written_at = wal_now(env).await;
    env.wait_stream_len(1, Duration::from_secs(30)).await;
    confirmed_past(env, &written_at).await;
    relay.stop().await;
}

/// Defect: an aggregate handed to the table by the catch-up was held only in memory. Its events
/// streamed next went to the table path, the slot confirmed past them, and after a restart with
/// the dead head discarded nothing remembered the aggregate: its events stayed pending for ever.
#[tokio::test]
async fn an_aggregate_handed_over_by_the_catch_up_is_not_stranded_by_a_restart() {
    let env = Env::new().await;
    let head = insert_poison(&env, "a").await;
    let config = env.wal_config().await;
    let relay = env.spawn(config.clone()).await;
    env.wait_dead_letters(1, Duration::from_secs(30)).await;
    streaming(&env).await;
    two_of_a_left_to_the_table(&env, relay).await;
    assert_eq!(
        env.count("processed_at IS NULL").await,
        3,
        "a's head and two"
    );

    discard(&env, head).await;
    let relay = env.spawn(config).await;
    env.wait_stream_len(3, Duration::from_secs(30)).await;
    wait_pending(&env, 0).await;
    relay.stop().await;
    assert_ledger_without(&env.written().await, &env.stored().await, &[head]);
}

/// Defect (variant): the head waits for a retry that falls due while the relay is down. After
/// the restart a new event of the aggregate went out at once, ahead of the older ones, which
/// stayed pending.
#[tokio::test]
async fn a_retry_falling_due_while_the_relay_is_down_is_not_overtaken() {
    let env = Env::new().await;
    // Left waiting for a retry (as by a relay of the table source), long after this test.
    env.client()
        .await
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload,
                                        attempts, retry_after, last_error)
             VALUES ('order', 'a', 'order.created', '{}', 1, now() + interval '1 hour', 'broker')",
            &[],
        )
        .await
        .expect("insert a row waiting for its retry");
    let config = env.wal_config().await;
    let relay = env.spawn(config.clone()).await;
    streaming(&env).await;
    two_of_a_left_to_the_table(&env, relay).await;
    assert_eq!(env.count("processed_at IS NULL").await, 3);

    // The retry falls due while no relay runs.
    env.client()
        .await
        .execute(
            "UPDATE outbox_events SET retry_after = now() WHERE retry_after IS NOT NULL",
            &[],
        )
        .await
        .expect("the retry falls due");
    let relay = env.spawn(config).await;
    streaming(&env).await;
    env.insert_sql(1, "a", "order.last").await;
    env.wait_stream_len(5, Duration::from_secs(30)).await;
    wait_pending(&env, 0).await;
    relay.stop().await;
    testkit::outbox::assert_ledger(&env.written().await, &env.stored().await);
}

/// Waits until `marker`'s event is in the stream: everything committed before it was decided.
async fn wait_published(env: &Env, aggregate: &str) {
    wait_until(
        &format!("an event of {aggregate} published"),
        Duration::from_secs(30),
        || async {
            env.stored()
                .await
                .iter()
                .any(|m| m.headers["Outbox-Aggregate-Id"] == aggregate)
        },
    )
    .await;
}

/// The aggregate each stored event was published under, by event id.
fn published_as(stored: &[Stored]) -> HashMap<Uuid, String> {
    stored
        .iter()
        .map(|m| (m.event_id(), m.headers["Outbox-Aggregate-Id"].clone()))
        .collect()
}

/// After c's event (committed after the row `moved` to b): the row did not go out while b's head
/// `dead` is a dead letter; once that is discarded it goes out as b's, and everything else once.
async fn moved_row_waited_for_its_dead_head(
    env: &Env,
    relay: RunningRelay,
    dead: Uuid,
    moved: Uuid,
) {
    wait_published(env, "c").await;
    assert!(
        !published_as(&env.stored().await).contains_key(&moved),
        "the row moved to b went out while b's head is a dead letter"
    );
    discard(env, dead).await;
    env.wait_stream_len(2, Duration::from_secs(30)).await;
    wait_pending(env, 0).await;
    relay.stop().await;
    let stored = env.stored().await;
    assert_eq!(
        published_as(&stored).get(&moved).map(String::as_str),
        Some("b")
    );
    // The ledger kept the row as inserted; it is b's event now.
    let written: Vec<Written> = env
        .written()
        .await
        .into_iter()
        .map(|mut w| {
            if w.id == moved {
                w.aggregate = "order/b".into();
            }
            w
        })
        .collect();
    assert_ledger_without(&written, &stored, &[dead]);
}

/// Defect: a row inserted for aggregate `a` and moved to `b` (blocked by a dead letter) in the
/// same transaction was published as b's event while b was blocked: the pipeline decided by the
/// aggregate the stream carried, the claim published the row as the table holds it.
#[tokio::test]
async fn a_row_moved_to_a_blocked_aggregate_in_its_own_transaction_waits_behind_its_dead_head() {
    let env = Env::new().await;
    let relay = env.spawn(env.wal_config().await).await;
    streaming(&env).await;
    let dead = insert_poison(&env, "b").await;
    env.wait_dead_letters(1, Duration::from_secs(30)).await;
    let moved: Uuid = {
        let mut client = env.client().await;
        let tx = client.transaction().await.expect("begin");
        let id: Uuid = tx
            .query_one(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', 'a', 'order.created', '{}') RETURNING id",
                &[],
            )
            .await
            .expect("insert")
            .get(0);
        tx.execute(
            "UPDATE outbox_events SET aggregate_id = 'b' WHERE id = $1",
            &[&id],
        )
        .await
        .expect("move it to b");
        tx.commit().await.expect("commit");
        id
    };
    env.insert_sql(1, "c", "order.created").await;
    moved_row_waited_for_its_dead_head(&env, relay, dead, moved).await;
}

/// The same with the row moved by a later transaction, while no relay ran: the stream carries
/// it (again) as a's insert.
#[tokio::test]
async fn a_row_moved_to_a_blocked_aggregate_after_its_commit_waits_behind_its_dead_head() {
    let env = Env::new().await;
    let config = env.wal_config().await;
    let relay = env.spawn(config.clone()).await;
    streaming(&env).await;
    let dead = insert_poison(&env, "b").await;
    env.wait_dead_letters(1, Duration::from_secs(30)).await;
    relay.stop().await;
    // Written while no relay runs, moved before one starts: the stream carries the insert as a's.
    env.insert_sql(1, "a", "order.created").await;
    let moved: Uuid = env
        .client()
        .await
        .query_one(
            "UPDATE outbox_events SET aggregate_id = 'b' WHERE aggregate_id = 'a' RETURNING id",
            &[],
        )
        .await
        .expect("move it to b")
        .get(0);
    env.insert_sql(1, "c", "order.created").await;
    let relay = env.spawn(config).await;
    moved_row_waited_for_its_dead_head(&env, relay, dead, moved).await;
}

/// Waits until a backend of the relay waits for a lock.
async fn relay_waits_for_a_lock(env: &Env) {
    env.wait_true(
        "the relay waits for the table's lock",
        Duration::from_secs(30),
        "SELECT EXISTS (SELECT FROM pg_stat_activity
                        WHERE datname = current_database()
                          AND application_name LIKE 'outbox-relay%'
                          AND wait_event_type = 'Lock')",
        &[],
    )
    .await;
}

/// Defect: with streamed rows to claim while another session held the table's lock, SIGTERM was
/// not honoured (the relay was still there 20 s later). Every database wait races shutdown.
#[tokio::test]
async fn sigterm_while_a_claim_waits_for_a_lock_stops_the_relay() {
    let env = Env::new().await;
    env.wal_config().await; // the publication and the ledger
    let relay: CliRelay = cli_wal(&env, &[]);
    streaming(&env).await;
    // A writer's transaction is open; the locker queues for the table behind it, so that when the
    // writer commits the locker has the table before the relay can claim the streamed row.
    let mut writer = env.client().await;
    let tx = writer.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'a', 'order.created', '{}')",
        &[],
    )
    .await
    .expect("insert");
    let locker = env.client().await;
    let locked = tokio::spawn(async move {
        locker
            .batch_execute("BEGIN; LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE")
            .await
            .expect("lock the table");
        locker
    });
    env.wait_true(
        "the locker queues for the table",
        Duration::from_secs(10),
        "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                        WHERE c.relname = 'outbox_events' AND l.mode = 'AccessExclusiveLock'
                          AND NOT l.granted)",
        &[],
    )
    .await;
    tx.commit().await.expect("commit");
    let locker = tokio::time::timeout(Duration::from_secs(10), locked)
        .await
        .expect("the locker has the table")
        .expect("locker task");
    relay_waits_for_a_lock(&env).await;
    let (exited, log) = relay.terminate_logged(Duration::from_secs(10));
    assert_eq!(
        exited,
        Ok(Some(0)),
        "the relay did not stop cleanly within 10 s of SIGTERM while waiting for a lock:\n{log}"
    );
    assert!(
        log.contains("waiting for"),
        "the relay does not say what it was waiting for:\n{log}"
    );
    locker.batch_execute("COMMIT").await.expect("unlock");
    // Nothing lost: the next relay publishes the row.
    let relay = cli_wal(&env, &[]);
    env.wait_stream_len(1, Duration::from_secs(30)).await;
    wait_pending(&env, 0).await;
    assert_eq!(relay.terminate(), Some(0));
    testkit::outbox::assert_ledger(&env.written().await, &env.stored().await);
}

/// Runs `write` while the outbox's publication does not publish the table (dropped from it and
/// added back at once, inside the 10 s re-check): what `write` inserts is in no stream.
async fn skipped_by_the_stream(env: &Env, write: impl std::future::Future<Output = ()>) {
    let client = env.client().await;
    let publication: String = client
        .query_one("SELECT pubname::text FROM pg_publication LIMIT 1", &[])
        .await
        .expect("the publication")
        .get(0);
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION {publication} DROP TABLE outbox_events"
        ))
        .await
        .expect("drop the table from the publication");
    write.await;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION {publication} ADD TABLE outbox_events"
        ))
        .await
        .expect("add the table back");
}

/// Defect: a row the stream skipped (its insert committed while the publication left the table
/// out) stayed pending for ever while the next event of its aggregate went out and the slot
/// confirmed past both. The claim now finds the older pending row it does not carry and hands
/// the aggregate to the table, which publishes both in seq order.
#[tokio::test]
async fn a_row_the_stream_skipped_is_not_overtaken_by_its_aggregates_next_event() {
    let env = Env::new().await;
    let relay = env.spawn(env.wal_config().await).await;
    streaming(&env).await;
    env.insert_sql(1, "a", "order.created").await;
    env.wait_stream_len(1, Duration::from_secs(30)).await;
    skipped_by_the_stream(&env, env.insert_sql(1, "a", "order.skipped")).await;
    env.insert_sql(1, "a", "order.next").await;
    env.insert_sql(1, "b", "order.created").await;
    env.wait_stream_len(4, Duration::from_secs(30)).await;
    wait_pending(&env, 0).await;
    relay.stop().await;
    testkit::outbox::assert_ledger(&env.written().await, &env.stored().await);
}

/// A skipped row whose aggregate gets no later event is found by the stream's fallback: pending,
/// visible and passed by the slot, it goes to the table within two fallback intervals, with a
/// warning and a counter.
#[tokio::test]
async fn a_row_the_stream_skipped_is_found_by_the_fallback() {
    let env = Env::new().await;
    let addr = testkit::free_addr();
    let mut config = env.wal_config().await;
    config.source.fallback_interval = Duration::from_secs(1);
    config.metrics.addr = Some(addr);
    let relay = env.spawn(config).await;
    streaming(&env).await;
    skipped_by_the_stream(&env, env.insert_sql(1, "a", "order.skipped")).await;
    env.insert_sql(1, "b", "order.created").await;
    env.wait_stream_len(2, Duration::from_secs(30)).await;
    wait_pending(&env, 0).await;
    let (code, metrics) = testkit::http_get(addr, "/metrics")
        .await
        .expect("the relay's metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("outbox_wal_stranded_events_total 1"),
        "the stranded event is counted:\n{metrics}"
    );
    relay.stop().await;
    testkit::outbox::assert_ledger(&env.written().await, &env.stored().await);
}

/// The older-row check of the claims by id is one backward probe of the pending aggregate index
/// per claimed row, whatever the table held when the plan was made (never a walk of the pending
/// `seq` index).
#[tokio::test]
async fn the_claims_older_row_check_probes_the_aggregate_index_once_per_row_on_a_new_table() {
    for rows in [0, 5, 500] {
        for (name, sql, args) in [
            (
                "lock_ids",
                include_str!("../../sql/queries/wal/lock_ids.sql"),
                "ARRAY[gen_random_uuid()]",
            ),
            (
                "lock_streamed",
                include_str!("../../sql/queries/wal/lock_streamed.sql"),
                "ARRAY[1::int8], ARRAY[gen_random_uuid()]",
            ),
            (
                "claim_ids",
                include_str!("../../sql/queries/wal/claim_ids.sql"),
                "ARRAY[gen_random_uuid()]",
            ),
        ] {
            let plan = super::wal::plan_on_a_new_table(rows, sql, args).await;
            let subplan = &plan[plan.find("SubPlan").expect(&plan)..];
            assert!(
                subplan.contains("Index Scan Backward using outbox_events_pending_aggregate_idx"),
                "{name}, {rows} rows: {plan}"
            );
            assert!(
                !subplan.contains("Seq Scan") && !subplan.contains("Sort"),
                "{name}, {rows} rows: {plan}"
            );
        }
    }
}

/// The stream's fallback looks at the pending aggregates through the pending aggregate index, one
/// probe each (a skip scan), whatever the table held when the plan was made.
#[tokio::test]
async fn the_fallbacks_look_skips_from_aggregate_to_aggregate_on_a_new_table() {
    for rows in [0, 5, 500] {
        let plan = super::wal::plan_on_a_new_table(
            rows,
            include_str!("../../sql/queries/wal/stranded_scan.sql"),
            "5000, '', ''",
        )
        .await;
        assert!(plan.contains("Recursive Union"), "{rows} rows: {plan}");
        assert!(
            plan.contains("outbox_events_pending_aggregate_idx"),
            "{rows} rows: {plan}"
        );
        for bad in ["Seq Scan on outbox_events", "pending_seq_key", "Sort"] {
            assert!(!plan.contains(bad), "{rows} rows, {bad}: {plan}");
        }
    }
}

/// Writes 20 events of `aggregate` every 20 ms (about 1,000 a second) for `time`.
fn hot_writer(db: String, aggregate: &'static str, time: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = testkit::pg_client(&db).await;
        let until = tokio::time::Instant::now() + time;
        let mut interval = tokio::time::interval(Duration::from_millis(20));
        while tokio::time::Instant::now() < until {
            interval.tick().await;
            client
                .execute(
                    "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                     SELECT 'order', $1, 'order.hot', '{}' FROM generate_series(1, 20)",
                    &[&aggregate],
                )
                .await
                .expect("hot rows");
        }
    })
}

/// `n` events of the aggregate `probe`, one every 200 ms, each timed from its commit to its
/// message on `probes`: (median, max).
async fn probe_latencies(
    client: &tokio_postgres::Client,
    probes: &mut async_nats::Subscriber,
    n: i32,
) -> (Duration, Duration) {
    let mut latencies = Vec::new();
    for i in 0..n {
        let started = std::time::Instant::now();
        client
            .execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', 'probe', 'probe.tick', jsonb_build_object('i', $1::int))",
                &[&i],
            )
            .await
            .expect("probe");
        let got = tokio::time::timeout(Duration::from_secs(30), futures::StreamExt::next(probes))
            .await
            .unwrap_or_else(|_| {
                panic!("probe {i} not published within 30 s (after {latencies:?})")
            });
        assert!(got.is_some(), "the subscription ended");
        latencies.push(started.elapsed());
        // The load's pace, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    latencies.sort();
    (
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    )
}

/// Defect: with many aggregates handed to the table, one of them hot (about 1,000 rows/s written
/// to it after its dead head was discarded), an unrelated aggregate's events were not published
/// for seconds: the sweep ran back to back while it published, the stream was not read while a
/// sweep was due, and each round took a hundredth of a batch of the hot aggregate (8.9 s at
/// most). Now the stream keeps about its usual latency (measured first under the same load with
/// nothing handed over; the bounds leave room for a loaded machine: on a quiet one the medians
/// are equal and the maximum 150 ms), and the hot aggregate catches up and returns to the stream.
#[tokio::test]
async fn aggregates_handed_to_the_table_do_not_starve_the_stream() {
    let _turn = testkit::heavy().await;
    let env = Env::new().await;
    let relay = env.spawn(env.wal_config().await).await;
    streaming(&env).await;
    let client = env.client().await;
    let nats = async_nats::connect(env.nats.url()).await.expect("nats");
    let mut probes = nats.subscribe("outbox.probe.>").await.expect("subscribe");
    nats.flush().await.expect("flush");
    // The same load with nothing handed over.
    let writing = hot_writer(env.db.clone(), "w", Duration::from_secs(3));
    let (base_p50, base_max) = probe_latencies(&client, &mut probes, 12).await;
    writing.await.expect("writer");

    // 100 aggregates with a dead head and an event behind it: handed to the table.
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
             SELECT 'order', 'h' || n, 'order.created', '{}', '[1, 2]' FROM generate_series(0, 99) n;
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'h' || n, 'order.next', '{}' FROM generate_series(0, 99) n;",
        )
        .await
        .expect("heads and followers");
    env.wait_dead_letters(100, Duration::from_secs(30)).await;
    env.wait_true(
        "100 aggregates handed to the table",
        Duration::from_secs(30),
        "SELECT count(*) = 100 FROM outbox_wal_deferred",
        &[],
    )
    .await;
    let hot_head: Uuid = client
        .query_one(
            "SELECT id FROM outbox_events WHERE aggregate_id = 'h0' AND dead_lettered_at IS NOT NULL",
            &[],
        )
        .await
        .expect("h0's head")
        .get(0);
    // h0's events pile up in the table behind its dead head; then the head is discarded, and the
    // table publishes h0's backlog while it is written to.
    let writing = hot_writer(env.db.clone(), "h0", Duration::from_secs(10));
    wait_until(
        "a backlog of h0 in the table",
        Duration::from_secs(30),
        || async {
            env.count("aggregate_id = 'h0' AND processed_at IS NULL")
                .await
                >= 1500
        },
    )
    .await;
    discard(&env, hot_head).await;
    let (p50, max) = probe_latencies(&client, &mut probes, 35).await;
    writing.await.expect("writer");
    eprintln!(
        "probe latency under a hot writer: nothing handed over p50 {base_p50:?} max {base_max:?}; \
         100 aggregates handed to the table, the hot one among them p50 {p50:?} max {max:?}"
    );
    assert!(
        p50 <= base_p50 * 2 + Duration::from_millis(100) && max < Duration::from_secs(2),
        "an unrelated aggregate waited behind the table's work: p50 {p50:?} max {max:?} \
         (nothing handed over: p50 {base_p50:?} max {base_max:?})"
    );
    // The hot aggregate catches up: nothing of it left pending, back with the stream.
    env.wait_true(
        "the hot aggregate caught up and back with the stream",
        Duration::from_secs(60),
        "SELECT (SELECT count(*) FROM outbox_events
                 WHERE aggregate_id = 'h0' AND processed_at IS NULL)
              + (SELECT count(*) FROM outbox_wal_deferred WHERE aggregate_id = 'h0') = 0",
        &[],
    )
    .await;
    relay.stop().await;
    // Per aggregate in seq order, each event once (the 99 blocked ones stay pending, unpublished).
    let blocked: Vec<Uuid> = client
        .query(
            "SELECT id FROM outbox_events WHERE processed_at IS NULL OR id = $1",
            &[&hot_head],
        )
        .await
        .expect("blocked")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_ledger_without(&env.written().await, &env.stored().await, &blocked);
}
