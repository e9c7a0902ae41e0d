//! End-to-end behaviour of the core relay against real PostgreSQL and nats-server.

use std::time::{Duration, Instant};

use futures::StreamExt;
use outbox_relay::ops::Outbox;
use outbox_relay::{enqueue, enqueue_many, migrate, NewEvent, Source};
use serde_json::json;
use testkit::outbox::{assert_unique, cli, CliRelay, Env};
use testkit::wait_until;

/// The relay's own schema check (the one `run` and `status` start with) passes on `db`.
fn assert_schema_current(db: &str) {
    let (code, _, err) = cli(db, &["status"]);
    assert_eq!(code, Some(0), "schema is current: {err}");
}

#[tokio::test]
async fn migrate_is_idempotent_and_safe_concurrently() {
    let db = testkit::shared_pg().create_database().await;
    let mut a = testkit::pg_client(&db).await;
    let mut b = testkit::pg_client(&db).await;
    let (mut oa, mut ob) = (Outbox::new(&mut a, None), Outbox::new(&mut b, None));
    let (ra, rb) = tokio::join!(oa.migrate(), ob.migrate());
    let (ra, rb) = (ra.expect("first migrate"), rb.expect("second migrate"));
    assert_eq!(
        ra.len() + rb.len(),
        migrate::MIGRATIONS.len(),
        "each version applied exactly once: {ra:?} {rb:?}"
    );
    assert!(oa.migrate().await.expect("third").is_empty());
    let versions: i64 = a
        .query_one("SELECT count(*) FROM outbox_schema_migrations", &[])
        .await
        .expect("versions")
        .get(0);
    assert_eq!(versions, migrate::MIGRATIONS.len() as i64);
    assert_schema_current(&db);
}

#[tokio::test]
async fn cli_migrate_print_and_missing_schema_message() {
    let out = testkit::relay_command()
        .args(["migrate", "--print"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let sql = String::from_utf8_lossy(&out.stdout);
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS outbox_events"));
    assert!(sql.contains("outbox_dead_letters"));

    // The printed script applies cleanly with psql-like batch execution.
    let db = testkit::shared_pg().create_database().await;
    let client = testkit::pg_client(&db).await;
    client
        .batch_execute(&sql)
        .await
        .expect("printed SQL applies");
    assert_schema_current(&db);

    let empty = testkit::shared_pg().create_database().await;
    let out = testkit::relay_command()
        .args(["status", "--database-url", &empty])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("outbox-relay migrate"), "{err}");
}

/// `migrate --check` gates a deploy (exit 1 while migrations are pending), `--status` lists each
/// version, `--print --from N` prints only the later migrations, and bad combinations are usage
/// errors.
#[tokio::test]
async fn migrate_check_status_and_print_from() {
    let db = testkit::shared_pg().create_database().await;
    let run = |args: &[&str]| {
        let out = testkit::relay_command()
            .args(args)
            .args(["--database-url", &db])
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let versions: Vec<i32> = migrate::MIGRATIONS.iter().map(|m| m.version).collect();
    let latest = *versions.last().expect("migrations");

    let (code, out, err) = run(&["migrate", "--check"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains(&format!("pending migrations: {versions:?}")),
        "{out}"
    );
    assert!(err.contains("outbox-relay migrate"), "{err}");
    let (code, out, _) = run(&["migrate", "--status"]);
    assert_eq!(code, Some(0));
    assert_eq!(out.matches("  pending").count(), versions.len(), "{out}");

    // Everything but the latest migration, as another tool would have applied it.
    let client = testkit::pg_client(&db).await;
    let (code, first_part, _) = run(&["migrate", "--print"]);
    assert_eq!(code, Some(0));
    let cut = first_part
        .find(&format!("-- migration {latest:04}_"))
        .expect("the latest migration in the script");
    client
        .batch_execute(&format!("{}COMMIT;\n", &first_part[..cut]))
        .await
        .expect("earlier migrations apply");
    let (code, out, _) = run(&["migrate", "--check"]);
    assert_eq!(code, Some(1));
    assert!(
        out.contains(&format!("pending migrations: [{latest}]")),
        "{out}"
    );
    let (_, out, _) = run(&["migrate", "--status"]);
    assert_eq!(
        out.matches("  applied").count(),
        versions.len() - 1,
        "{out}"
    );

    let (code, rest, _) = run(&["migrate", "--print", "--from", &latest.to_string()]);
    assert_eq!(code, Some(0));
    assert!(
        rest.contains(&format!("-- migration {latest:04}_")),
        "{rest}"
    );
    assert!(!rest.contains("-- migration 0001_"), "{rest}");
    client.batch_execute(&rest).await.expect("the rest applies");
    let (code, out, _) = run(&["migrate", "--check"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("schema is up to date (version {latest})")),
        "{out}"
    );
    assert_schema_current(&db);

    for bad in [
        &["migrate", "--from", "2"][..],
        &["migrate", "--check", "--status"][..],
        &["migrate", "--print", "--check"][..],
        &["migrate", "--print", "--from", "0"][..],
    ] {
        let (code, _, err) = run(bad);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
    }
}

#[tokio::test]
async fn classic_sql_insert_is_relayed_with_all_headers() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let client = env.client().await;
    let row = client
        .query_one(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('order', 'o-1', 'order.created', '{\"total\": 42}', '{\"traceparent\": \"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}')
             RETURNING id, created_at",
            &[],
        )
        .await
        .expect("insert");
    let id: uuid::Uuid = row.get(0);
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    assert_eq!(stored.len(), 1);
    let m = &stored[0];
    assert_eq!(m.subject, "outbox.order.created");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&m.payload).expect("json"),
        json!({"total": 42})
    );
    let id_s = id.to_string();
    assert_eq!(m.headers["Nats-Msg-Id"], id_s);
    assert_eq!(m.headers["Outbox-Event-Id"], id_s);
    assert_eq!(m.headers["Outbox-Aggregate-Type"], "order");
    assert_eq!(m.headers["Outbox-Aggregate-Id"], "o-1");
    assert_eq!(m.headers["Outbox-Event-Type"], "order.created");
    assert_eq!(
        m.headers["traceparent"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    let created = humantime::parse_rfc3339(&m.headers["Outbox-Created-At"]).expect("RFC 3339");
    let created_db: std::time::SystemTime = row.get(1);
    let diff = created
        .duration_since(created_db)
        .or_else(|e| Ok::<_, ()>(e.duration()))
        .expect("diff");
    assert!(
        diff < Duration::from_millis(1),
        "created_at header {created:?} vs row {created_db:?}"
    );
    wait_until("row marked processed", Duration::from_secs(5), || async {
        env.count("processed_at IS NOT NULL").await == 1
    })
    .await;
    relay.stop().await;
}

#[tokio::test]
async fn rolled_back_enqueue_publishes_nothing() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let mut client = env.client().await;

    let tx = client.transaction().await.expect("tx");
    enqueue(
        &tx,
        &NewEvent::new("order", "1", "order.cancelled", &json!({"n": 1})).expect("event"),
    )
    .await
    .expect("enqueue");
    tx.rollback().await.expect("rollback");

    let tx = client.transaction().await.expect("tx");
    let ids = enqueue_many(
        &tx,
        &[
            NewEvent::new("order", "2", "order.created", &json!({"n": 2})).expect("event"),
            NewEvent::new("order", "2", "order.paid", &json!({"n": 3})).expect("event"),
        ],
    )
    .await
    .expect("enqueue_many");
    tx.commit().await.expect("commit");

    env.wait_stream_len(2, Duration::from_secs(10)).await;
    // Give a wrongly relayed rolled-back event the chance to show up: one more committed event
    // behind it must arrive, and still nothing else.
    env.insert_sql(1, "3", "order.shipped").await;
    env.wait_stream_len(3, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    let got = assert_unique(&stored);
    assert_eq!(got.len(), 3);
    assert_eq!(&got[..2], &ids[..], "committed events in order");
    assert!(stored.iter().all(|m| m.subject != "outbox.order.cancelled"));
    relay.stop().await;
}

#[tokio::test]
async fn invalid_events_are_refused_before_the_database() {
    let env = Env::new().await;
    let client = env.client().await;
    let bad = NewEvent::new("order", "1", "order.*", &json!({})).expect("event");
    let err = enqueue(&client, &bad)
        .await
        .expect_err("wildcard subject refused");
    assert!(err.kind() == outbox_relay::ErrorKind::InvalidEvent, "{err}");
    let good = NewEvent::new("order", "1", "ok", &json!({})).expect("event");
    let err = enqueue_many(&client, &[good, bad])
        .await
        .expect_err("one bad event refuses all");
    assert!(err.kind() == outbox_relay::ErrorKind::InvalidEvent);
    assert_eq!(env.count("true").await, 0);
}

#[tokio::test]
async fn notification_wakes_the_relay_in_milliseconds() {
    let _turn = testkit::heavy().await;
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await; // fallback 60 s
    let js = env.js().await;
    let client = env.client().await;
    // Let the relay go idle (armed) first.
    env.insert_sql(1, "warm", "warm.up").await;
    env.wait_stream_len(1, Duration::from_secs(10)).await;

    let mut latencies = Vec::new();
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(20)).await; // writers' pace, not a wait for a condition
        let start = Instant::now();
        client
            .execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'order.created', '{}')",
                &[&format!("lat-{i}")],
            )
            .await
            .expect("insert");
        let want = 2 + i as u64;
        wait_until(
            &format!("event {i} relayed (fallback is 60 s)"),
            Duration::from_secs(5).saturating_sub(start.elapsed()),
            || async {
                let mut s = js.get_stream("OUTBOX").await.expect("stream");
                s.info().await.expect("info").state.messages >= want
            },
        )
        .await;
        latencies.push(start.elapsed());
    }
    latencies.sort();
    let max = *latencies.last().expect("latencies");
    assert!(
        max < Duration::from_millis(500),
        "max commit->stream latency {max:?}; all {latencies:?}"
    );
    relay.stop().await;
}

#[tokio::test]
async fn fallback_poll_delivers_when_the_trigger_is_disabled() {
    let env = Env::new().await;
    let client = env.client().await;
    client
        .batch_execute("ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_notify")
        .await
        .expect("disable trigger");
    let mut config = env.config();
    config.source.fallback_interval = Duration::from_millis(300);
    let relay = env.spawn(config).await;
    env.insert_sql(3, "fb", "order.created").await;
    env.wait_stream_len(3, Duration::from_secs(10)).await;
    // The acks come before the batch's commit: the rows are marked a moment later.
    wait_until(
        "every row marked processed",
        Duration::from_secs(5),
        || async { env.count("processed_at IS NULL").await == 0 },
    )
    .await;
    relay.stop().await;
}

async fn listener_pid(client: &tokio_postgres::Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-relay-listener' AND datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .map(|r| r.get(0))
}

#[tokio::test]
async fn killed_listener_connection_relistens() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await; // fallback 60 s: only LISTEN can deliver in time
    let client = env.client().await;
    wait_until("listener connected", Duration::from_secs(10), || async {
        listener_pid(&client).await.is_some()
    })
    .await;
    for round in 0..3 {
        let old = listener_pid(&client).await.expect("listener");
        client
            .execute("SELECT pg_terminate_backend($1)", &[&old])
            .await
            .expect("terminate");
        wait_until("listener reconnected", Duration::from_secs(10), || async {
            matches!(listener_pid(&client).await, Some(p) if p != old)
        })
        .await;
        env.insert_sql(1, &format!("r{round}"), "order.created")
            .await;
        env.wait_stream_len(round + 1, Duration::from_secs(5)).await;
    }
    relay.stop().await;
}

#[tokio::test]
async fn broker_restart_loses_nothing() {
    let mut env = Env::new().await;
    let mut config = env.config();
    config.source.fallback_interval = Duration::from_secs(1);
    let relay = env.spawn(config).await;
    env.insert_sql(100, "before", "order.created").await;
    env.wait_stream_len(100, Duration::from_secs(10)).await;

    env.nats.kill();
    env.insert_sql(200, "during", "order.created").await;
    // While the broker is down nothing is marked and no attempt is spent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(env.count("processed_at IS NULL").await, 200);
    assert_eq!(env.count("dead_lettered_at IS NOT NULL").await, 0);
    env.nats.start_again();

    env.wait_stream_len(300, Duration::from_secs(30)).await;
    wait_until("all rows processed", Duration::from_secs(10), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    assert_eq!(assert_unique(&env.stored().await).len(), 300);
    assert_eq!(env.count("dead_lettered_at IS NOT NULL").await, 0);
    relay.stop().await;
}

#[tokio::test]
async fn relay_killed_mid_drain_restarts_and_the_stream_has_each_event_once() {
    let env = Env::new().await;
    env.insert_interleaved(1_000, 20).await; // 20,000 events
    for _ in 0..3 {
        let relay = CliRelay::run(&env, &["--batch-size", "500", "--ordering", "none"]);
        let start = env.stream_len().await;
        wait_until("relay makes progress", Duration::from_secs(20), || async {
            env.stream_len().await > start + 500
        })
        .await;
        relay.kill();
    }
    let relay = CliRelay::run(&env, &["--batch-size", "500"]);
    wait_until("every row processed", Duration::from_secs(60), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    let stored = env.stored().await;
    assert_eq!(assert_unique(&stored).len(), 20_000);
    assert_eq!(relay.terminate(), Some(0));
}

#[tokio::test]
async fn two_relays_share_the_table_without_double_processing() {
    let env = Env::new().await;
    // Core NATS sees every publish, including those JetStream would drop as duplicates.
    let nc = async_nats::connect(env.nats.url()).await.expect("connect");
    let mut sub = nc.subscribe("outbox.>").await.expect("subscribe");
    nc.flush().await.expect("flush");
    env.insert_sql(2_000, "x", "order.created").await;
    let mut config = env.config();
    config.batch.size = 100;
    config.batch.ordering = outbox_relay::Ordering::None;
    let a = env.spawn(config.clone()).await;
    let b = env.spawn(config).await;
    let client = env.client().await;
    for i in 0..1_000 {
        client
            .execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'order.created', '{}')",
                &[&format!("live-{i}")],
            )
            .await
            .expect("insert");
    }
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 3_000 {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, sub.next())
            .await
            .expect("all 3000 events published within 60 s")
            .expect("subscription open");
        let id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Outbox-Event-Id"))
            .expect("id")
            .to_string();
        assert!(seen.insert(id.clone()), "event {id} published twice");
    }
    a.stop().await;
    b.stop().await;
    // Nothing more trickles in after both stopped.
    assert!(tokio::time::timeout(Duration::from_millis(300), sub.next())
        .await
        .is_err());
    assert_eq!(env.count("processed_at IS NULL").await, 0);
    assert_eq!(env.stream_len().await, 3_000);
}

#[tokio::test]
async fn sigterm_mid_drain_exits_zero_and_leaves_nothing_locked() {
    let env = Env::new().await;
    env.insert_interleaved(1_000, 30).await; // 30,000 events
    let relay = CliRelay::run(&env, &["--batch-size", "200"]);
    wait_until("relay makes progress", Duration::from_secs(20), || async {
        env.stream_len().await > 1_000
    })
    .await;
    assert_eq!(relay.terminate(), Some(0), "graceful exit code");
    let client = env.client().await;
    let pending = env.count("processed_at IS NULL").await;
    // Every pending row can be claimed at once: no lock was left behind.
    let claimable: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT id FROM outbox_events WHERE processed_at IS NULL FOR UPDATE SKIP LOCKED) s",
            &[],
        )
        .await
        .expect("claim all")
        .get(0);
    assert_eq!(claimable, pending);
    // Every row marked processed is in the stream.
    let processed = env.count("processed_at IS NOT NULL").await;
    let stored = env.stored().await;
    assert_eq!(assert_unique(&stored).len() as i64, processed);
}

/// The table source's claim walks the pending `seq` index once, and reaches each aggregate's rows
/// (older pending rows, followers, gaps) through the pending aggregate index, whatever the table
/// held when its plan was made (once per connection, often on an empty table: a relay started
/// while nothing was pending). By equality on the aggregate, a plan made on an empty table probed
/// the seq index for those lookups instead, walking every older or later pending row for each
/// candidate: a relay started on an empty outbox slowed down as a backlog built up.
#[tokio::test]
async fn the_claim_reaches_each_aggregate_through_its_index_on_a_new_table() {
    for rows in [5, 500, 0] {
        for hop in ["false", "true"] {
            let plan = crate::wal::plan_on_a_new_table(
                rows,
                include_str!("../../sql/queries/table/claim_ordered.sql"),
                &format!("1000, 1000000, {hop}"),
            )
            .await;
            assert_eq!(
                plan.matches("outbox_events_pending_seq_key").count(),
                1,
                "{rows} rows, hop {hop}: only the walk uses the seq index: {plan}"
            );
        }
    }
}

/// The heads-only claim (the first after a writer's notification) walks the pending `seq` index
/// once and probes each head's older rows backward through the pending aggregate index, whatever
/// the table held when its plan was made.
#[tokio::test]
async fn the_heads_claim_walks_once_and_probes_back_on_a_new_table() {
    for rows in [5, 500, 0] {
        let plan = crate::wal::plan_on_a_new_table(
            rows,
            include_str!("../../sql/queries/table/claim_heads.sql"),
            "16, 1000000",
        )
        .await;
        assert_eq!(
            plan.matches("outbox_events_pending_seq_key").count(),
            1,
            "{rows} rows: only the walk uses the seq index: {plan}"
        );
        assert!(
            plan.contains("Backward using outbox_events_pending_aggregate_idx"),
            "{rows} rows: {plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{rows} rows: {plan}");
    }
}

/// A notification at idle claims heads first: a transaction's events that follow a head of their
/// aggregate, and rows held back by the byte budget, go out at once behind them (the full claim
/// follows), in order, each once; nothing waits for the fallback poll (60 s here).
#[tokio::test]
async fn after_a_wake_up_followers_and_rows_over_the_budget_follow_at_once() {
    let env = Env::new().await;
    let mut config = env.config();
    config.batch.max_bytes = 2_000;
    let relay = env.spawn(config).await;
    // Idle and armed: one event goes out, then the transaction.
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', 'warm', 'order.created', '{}')",
        )
        .await
        .expect("insert");
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    client
        .batch_execute(
            "BEGIN; \
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', 'a', 'order.line', jsonb_build_object('n', n) \
             FROM generate_series(1, 3) n; \
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', 'big-' || n, 'order.created', \
                    jsonb_build_object('n', n, 'pad', repeat('x', 900)) \
             FROM generate_series(1, 4) n; \
             COMMIT",
        )
        .await
        .expect("transaction");
    env.wait_stream_len(8, Duration::from_secs(10)).await;
    relay.stop().await;
    let stored = env.stored().await;
    assert_eq!(assert_unique(&stored).len(), 8);
    let lines: Vec<String> = stored
        .iter()
        .filter(|m| m.headers["Outbox-Aggregate-Id"] == "a")
        .map(|m| m.payload.clone())
        .collect();
    assert_eq!(
        lines,
        ["{\"n\": 1}", "{\"n\": 2}", "{\"n\": 3}"],
        "aggregate a in order"
    );
    assert_eq!(env.count("processed_at IS NULL").await, 0);
}

/// The shape a drain needs, at 100,000 pending rows (ten per aggregate, interleaved, as the
/// benches' backlog), with the plan made on an empty table (a relay started before the backlog)
/// and on the full one: one walk of the pending `seq` index that stops at the batch, and for each
/// head one backward probe of the pending aggregate index that starts at the nearest older entry
/// and stops at the first one that is not the aggregate's. A forward probe started at the
/// aggregate's first entry and walked its later rows too (with the aggregate as a range, `seq`
/// does not end the scan), which cost the drain.
#[tokio::test]
async fn the_claim_at_100k_pending_rows_walks_once_and_probes_each_head_back() {
    let env = Env::new().await;
    let client = env.client().await;
    let claim = include_str!("../../sql/queries/table/claim_ordered.sql");
    let begin = include_str!("../../sql/queries/table/begin_claim.sql");
    client
        .batch_execute(&format!("PREPARE on_empty AS {claim}"))
        .await
        .expect("prepare");
    // The generic plan is made at the first execution: here, on the empty table.
    client.batch_execute(begin).await.expect("begin");
    testkit::explain(&client, "EXECUTE on_empty(1000, 100000000, false)", &[]).await;
    client.batch_execute("ROLLBACK").await.expect("rollback");
    client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', 'order-' || (g % 10000), 'created', jsonb_build_object('n', g) \
             FROM generate_series(0, 99999) g",
            &[],
        )
        .await
        .expect("backlog");
    client
        .batch_execute(&format!("PREPARE on_full AS {claim}"))
        .await
        .expect("prepare");
    // Half the backlog published, as in the middle of a drain: each head then has older index
    // entries of its aggregate that are no longer pending.
    client
        .batch_execute("UPDATE outbox_events SET processed_at = now() WHERE seq <= 50000")
        .await
        .expect("publish half");
    for statement in ["on_empty", "on_full"] {
        client.batch_execute(begin).await.expect("begin");
        let plan = client
            .query(
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) \
                     EXECUTE {statement}(1000, 100000000, false)"
                ),
                &[],
            )
            .await
            .expect("explain")
            .iter()
            // PostgreSQL 18 prints row counts with two decimals (`rows=1000.00`).
            .map(|r| r.get::<_, String>(0).replace(".00 ", " "))
            .collect::<Vec<_>>();
        client.batch_execute("ROLLBACK").await.expect("rollback");
        let text = plan.join("\n");
        assert!(plan[0].contains("actual rows=1000 "), "{statement}: {text}");
        // The byte budget's sort runs only over the budget (a one-time filter): never here.
        for node in plan.iter().filter(|l| l.contains("->")) {
            let costly = ["Seq Scan", "Sort", "Hash"]
                .iter()
                .any(|n| node.contains(n));
            assert!(
                !costly || node.contains("(never executed)"),
                "{statement}: {node}: {text}"
            );
        }
        let walk = plan
            .iter()
            .position(|l| l.contains("using outbox_events_pending_seq_key"))
            .unwrap_or_else(|| panic!("{statement}: no walk: {text}"));
        assert!(
            plan[walk].contains("actual rows=1000 loops=1)"),
            "{statement}: the walk stops at the batch: {text}"
        );
        // The older-row probe: backward, once per head, a few index pages each (its descent and
        // the nearest entries), not a walk over the aggregate's rows.
        let probe = plan
            .iter()
            .position(|l| l.contains("Backward using outbox_events_pending_aggregate_idx"))
            .unwrap_or_else(|| panic!("{statement}: no backward probe: {text}"));
        assert!(plan[probe].contains("loops=1000)"), "{statement}: {text}");
        let buffers: u64 = plan[probe + 1..]
            .iter()
            .find_map(|l| l.trim().strip_prefix("Buffers: shared "))
            .map(|counts| {
                counts
                    .split_whitespace()
                    .filter_map(|c| c.strip_prefix("hit=").or_else(|| c.strip_prefix("read=")))
                    .filter_map(|n| n.parse::<u64>().ok())
                    .sum()
            })
            .unwrap_or_else(|| panic!("{statement}: no buffer count: {text}"));
        // Its descent (3 pages at this size) and one heap page for each older entry of a row
        // published since the last vacuum (5 here, the first time they are visited).
        assert!(buffers <= 10 * 1000, "{statement}: {buffers} pages: {text}");
    }
}

/// A database with the migrations before `version` only, as `migrate --print` writes them.
async fn database_before(version: i32) -> String {
    let db = testkit::shared_pg().create_database().await;
    let script = migrate::script(None);
    let cut = script
        .find(&format!("-- migration {version:04}_"))
        .unwrap_or(script.len());
    testkit::pg_client(&db)
        .await
        .batch_execute(&format!("{}COMMIT;\n", &script[..cut]))
        .await
        .unwrap_or_else(|e| panic!("the migrations before {version}: {e}"));
    db
}

/// The relay runs against the current schema version and the one before it (relays are upgraded
/// before the schema, one release at a time), both sources; anything older is refused at start,
/// naming `migrate`, by `run` and by the operator commands.
#[tokio::test]
async fn the_relay_runs_on_the_schema_before_the_current_one_and_refuses_older_ones() {
    let previous = migrate::current_version() - 1;
    assert_eq!(migrate::REQUIRED_VERSION, previous.max(1));
    for source in [Source::Notify, Source::Wal] {
        let env = Env {
            db: database_before(previous + 1).await,
            nats: testkit::NatsServer::start(),
        };
        env.create_stream().await;
        env.source_config(source).await;
        let args = env.source_args(source);
        let relay = CliRelay::run(&env, &args.iter().map(String::as_str).collect::<Vec<_>>());
        env.insert_sql(3, "prev", "order.created").await;
        env.wait_stream_len(3, Duration::from_secs(30)).await;
        assert_eq!(relay.terminate(), Some(0), "{source:?}");
    }

    let db = database_before(migrate::REQUIRED_VERSION).await;
    for args in [
        &["run", "--metrics-addr", "off"][..],
        &["status"][..],
        &["dead-letters", "list"][..],
    ] {
        let (code, _, err) = cli(&db, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("outbox-relay migrate"), "{args:?}: {err}");
    }
}
