//! The delivery guarantees at the edges: rows locked by others, blocked heads, broker blips, odd
//! rows, big payloads, start order, blocked-aggregate reports, hand-over on stop, two outboxes in
//! one database. Each test checks the ledger style of the fault suite where events flow, for both
//! sources where a relay runs (the wal source with its slot in place, so that rows are streamed;
//! it deletes what it publishes, so the checks count pending and dead rows, never processed ones).

use std::time::Duration;

use outbox_relay::Source;
use testkit::outbox::{assert_ledger, assert_unique, cli, CliRelay, Env};
use testkit::{free_addr, http_get, pg_client, wait_until, PgCluster, PgOptions};
use uuid::Uuid;

async fn ids_in_seq_order(env: &Env, aggregate_id: &str) -> Vec<Uuid> {
    env.client()
        .await
        .query(
            "SELECT id FROM outbox_events WHERE aggregate_id = $1 ORDER BY seq",
            &[&aggregate_id],
        )
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn drained(env: &Env, timeout: Duration) {
    wait_until("every row processed", timeout, || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
}

/// The CLI arguments of `source` plus `extra`, for [`CliRelay`].
fn relay_args<'a>(source_args: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
    let mut args: Vec<&str> = source_args.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    args
}

for_each_source!(
    a_row_locked_by_someone_else_is_not_overtaken,
    blocked_heads_do_not_stall_other_aggregates,
    odd_created_at_values_never_panic,
    a_payload_over_max_payload_is_dead_lettered_at_once,
    broker_kill_restart_cycles_spend_no_attempts,
    relay_waits_for_a_broker_that_starts_later,
    relay_waits_for_a_database_that_starts_later,
    relay_fails_fast_on_a_missing_schema,
    header_numbers_reach_the_broker_as_the_row_wrote_them,
);

/// A header whose value is a JSON number reaches the broker with every digit the row holds (jsonb
/// keeps numbers as `numeric`): neither a 30-digit integer nor a decimal with 20 places goes
/// through a float on the way. Other values keep their form (strings as they are, anything else
/// as compact JSON).
async fn header_numbers_reach_the_broker_as_the_row_wrote_them(source: Source) {
    let env = Env::new().await;
    let config = env.source_config(source).await;
    let relay = env.spawn(config).await;
    let client = env.client().await;
    client
        .execute(
            r#"INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
               VALUES ('order', 'n-1', 'order.priced', '{}',
                       '{"big": 123456789012345678901234567890,
                         "dec": 0.12345678901234567890,
                         "neg": -42,
                         "flag": true,
                         "text": "12345678901234567890123",
                         "obj": {"a": 1, "b": [1.5, "x"]}}')"#,
            &[],
        )
        .await
        .expect("insert");
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    let h = &stored[0].headers;
    assert_eq!(h["big"], "123456789012345678901234567890");
    assert_eq!(h["dec"], "0.12345678901234567890");
    assert_eq!(h["neg"], "-42");
    assert_eq!(h["flag"], "true");
    assert_eq!(h["text"], "12345678901234567890123");
    assert_eq!(h["obj"], r#"{"a":1,"b":[1.5,"x"]}"#);
    relay.stop().await;
}

/// Item 1: a follower locked by another session must not be overtaken by the rows after it.
async fn a_row_locked_by_someone_else_is_not_overtaken(source: Source) {
    let env = Env::new().await;
    // Releasing a lock wakes nobody: the relay finds A2 free again at its next fallback poll (the
    // wal source: its next sweep of the aggregates handed to the table).
    let mut config = env.source_config(source).await;
    config.source.fallback_interval = Duration::from_secs(1);
    env.insert_sql(4, "A", "order.step").await;
    let a = ids_in_seq_order(&env, "A").await;
    let mut locker = env.client().await;
    let tx = locker.transaction().await.expect("tx");
    tx.execute(
        "SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE",
        &[&a[1]],
    )
    .await
    .expect("lock A2");
    env.insert_sql(1, "B", "order.step").await;
    let relay = env.spawn(config).await;
    // B1 was committed before the relay started, so the first claim holds it with A1; a later
    // claim holds B2. While A2 is locked, nothing of A after A1 may reach the stream.
    env.wait_stream_len(2, Duration::from_secs(10)).await;
    env.insert_sql(1, "B", "order.step").await;
    env.wait_stream_len(3, Duration::from_secs(10)).await;
    let stored: Vec<Uuid> = assert_unique(&env.stored().await);
    assert!(stored.contains(&a[0]), "A1 published");
    for (i, id) in a.iter().enumerate().skip(1) {
        assert!(
            !stored.contains(id),
            "A{} published while A2 was locked by another session",
            i + 1
        );
    }
    tx.commit().await.expect("release the lock");
    env.wait_stream_len(6, Duration::from_secs(10)).await;
    drained(&env, Duration::from_secs(10)).await;
    assert_ledger(&env.written().await, &env.stored().await);
    relay.stop().await;
}

/// Item 1: two pending rows can never share a `seq` (they would both count as their aggregate's
/// head), and a database that already holds such rows is renumbered by the migration in a
/// deterministic order: (seq, id), the later rows of each such aggregate after them. Not per
/// source: the schema's constraint and the migration, no relay.
#[tokio::test]
async fn pending_rows_never_share_a_seq() {
    let env = Env::new().await;
    env.insert_sql(1, "A", "order.step").await;
    let client = env.client().await;
    let err = client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, seq)
             OVERRIDING SYSTEM VALUE
             SELECT 'order', 'A', 'order.step', '{}', seq FROM outbox_events LIMIT 1",
            &[],
        )
        .await
        .expect_err("a second pending row with the same seq is refused");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
        "{err}"
    );

    // A database at schema version 1 with duplicates (restored by COPY, say), then migrated.
    let db = testkit::shared_pg().create_database().await;
    let mut old = pg_client(&db).await;
    old.batch_execute(outbox_relay::migrate::MIGRATIONS[0].sql)
        .await
        .expect("version 1");
    old.batch_execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload, seq)
         OVERRIDING SYSTEM VALUE VALUES
           ('00000000-0000-0000-0000-00000000000b', 'order', 'A', 'order.step', '{\"n\": 2}', 10),
           ('00000000-0000-0000-0000-00000000000a', 'order', 'A', 'order.step', '{\"n\": 1}', 10),
           ('00000000-0000-0000-0000-00000000000c', 'order', 'A', 'order.step', '{\"n\": 3}', 11),
           ('00000000-0000-0000-0000-00000000000d', 'order', 'B', 'order.step', '{\"n\": 1}', 10),
           ('00000000-0000-0000-0000-00000000000e', 'order', 'C', 'order.step', '{\"n\": 1}', 5)",
    )
    .await
    .expect("duplicates");
    outbox_relay::ops::Outbox::new(&mut old, None)
        .migrate()
        .await
        .expect("migrate renumbers duplicates");
    let order: Vec<String> = old
        .query(
            "SELECT id::text FROM outbox_events WHERE aggregate_id = 'A' ORDER BY seq",
            &[],
        )
        .await
        .expect("order")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        order,
        [
            "00000000-0000-0000-0000-00000000000a",
            "00000000-0000-0000-0000-00000000000b",
            "00000000-0000-0000-0000-00000000000c"
        ]
    );
    let distinct: i64 = old
        .query_one(
            "SELECT count(DISTINCT seq) FROM outbox_events WHERE processed_at IS NULL",
            &[],
        )
        .await
        .expect("distinct")
        .get(0);
    assert_eq!(distinct, 5);
}

/// Item 2: more blocked aggregates than the batch size, sorting before a deep backlog, must not
/// make claims come back empty while eligible rows exist.
async fn blocked_heads_do_not_stall_other_aggregates(source: Source) {
    let env = Env::new().await;
    let mut config = env.source_config(source).await;
    let client = env.client().await;
    // 15 aggregates whose head is dead (and one row behind each), then one deep aggregate.
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'a-' || lpad(a::text, 2, '0'), 'order.step', jsonb_build_object('s', s)
             FROM generate_series(1, 15) a, generate_series(1, 2) s ORDER BY s, a;
             UPDATE outbox_events o SET dead_lettered_at = now(), last_error = 'poison'
             WHERE NOT EXISTS (SELECT 1 FROM outbox_events p
                               WHERE p.aggregate_id = o.aggregate_id AND p.seq < o.seq);
             UPDATE outbox_events o SET retry_after = now() + interval '1 hour'
             WHERE aggregate_id IN ('a-01', 'a-02') AND dead_lettered_at IS NOT NULL;
             UPDATE outbox_events o SET dead_lettered_at = NULL
             WHERE aggregate_id IN ('a-01', 'a-02');",
        )
        .await
        .expect("blocked aggregates");
    env.insert_sql(300, "z-deep", "order.step").await;
    config.batch.size = 10;
    let relay = env.spawn(config).await;
    // The fallback poll is a minute away: the backlog must move without it.
    env.wait_stream_len(300, Duration::from_secs(20)).await;
    let stored = env.stored().await;
    assert_eq!(assert_unique(&stored).len(), 300);
    assert!(stored
        .iter()
        .all(|m| m.headers["Outbox-Aggregate-Id"] == "z-deep"));
    // The last batch is recorded a moment after its acks.
    wait_until("z-deep recorded", Duration::from_secs(10), || async {
        env.count("processed_at IS NULL").await <= 30
    })
    .await;
    assert_eq!(env.count("processed_at IS NULL").await, 30);
    relay.stop().await;
}

/// Item 4: timestamps outside what RFC 3339 formatters take (before 1970, infinities) never panic
/// the relay or the operator commands: dates are published as dates, the rest dead-lettered.
async fn odd_created_at_values_never_panic(source: Source) {
    let env = Env::new().await;
    env.source_config(source).await;
    let client = env.client().await;
    let insert = |aggregate: &'static str, created_at: &'static str| {
        let client = &client;
        async move {
            let id: Uuid = client
                .query_one(
                    "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
                     VALUES ('order', $1, 'order.odd', '{}', $2::text::timestamptz) RETURNING id",
                    &[&aggregate, &created_at],
                )
                .await
                .expect("insert")
                .get(0);
            id
        }
    };
    let moon = insert("moon", "1969-07-20 20:17:40.5+00").await;
    let ancient = insert("ancient", "0044-03-15 12:00:00+00").await;
    let far = insert("far", "9999-12-31 23:59:59+00").await;
    let inf = insert("inf", "infinity").await;
    let neg_inf = insert("neg-inf", "-infinity").await;
    let bc = insert("bc", "0100-01-01 00:00:00+00 BC").await;
    let relay = CliRelay::run(&env, &relay_args(&env.source_args(source), &[]));
    wait_until("odd rows settled", Duration::from_secs(20), || async {
        env.count("processed_at IS NULL AND dead_lettered_at IS NULL")
            .await
            == 0
    })
    .await;
    let stored = env.stored().await;
    let created = |id: Uuid| {
        stored
            .iter()
            .find(|m| m.event_id() == id)
            .map(|m| m.headers["Outbox-Created-At"].clone())
    };
    assert_eq!(
        created(moon).as_deref(),
        Some("1969-07-20T20:17:40.500000Z")
    );
    assert_eq!(
        created(ancient).as_deref(),
        Some("0044-03-15T12:00:00.000000Z")
    );
    assert_eq!(created(far).as_deref(), Some("9999-12-31T23:59:59.000000Z"));
    for id in [inf, neg_inf, bc] {
        assert_eq!(created(id), None, "{id} published");
        let error: Option<String> = client
            .query_one(
                "SELECT last_error FROM outbox_events WHERE id = $1 AND dead_lettered_at IS NOT NULL",
                &[&id],
            )
            .await
            .expect("dead-lettered")
            .get(0);
        let error = error.unwrap_or_default();
        assert!(error.contains("created_at"), "{error}");
    }
    // The relay is still alive and relaying.
    env.insert_sql(1, "after", "order.created").await;
    env.wait_stream_len(4, Duration::from_secs(10)).await;
    // The operator commands print such rows without panicking.
    for args in [
        vec!["dead-letters", "list"],
        vec!["dead-letters", "list", "--json"],
        vec!["status"],
        vec!["status", "--json"],
    ] {
        let (code, out, err) = cli(&env.db, &args);
        assert_eq!(code, Some(0), "{args:?}: {out}{err}");
    }
    let (_, out, _) = cli(&env.db, &["dead-letters", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&out).expect("json");
    let created: Vec<&str> = rows
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["created_at"].as_str().expect("created_at"))
        .collect();
    assert!(created.contains(&"infinity"), "{created:?}");
    assert!(created.contains(&"-infinity"), "{created:?}");
    assert_eq!(relay.terminate(), Some(0));
}

/// Item 5: a payload that can never fit the server's max_payload is dead-lettered at once, with
/// the size and the limit in `last_error`, instead of being retried for an hour.
async fn a_payload_over_max_payload_is_dead_lettered_at_once(source: Source) {
    let env = Env::new().await;
    let mut config = env.source_config(source).await;
    let client = env.client().await;
    let id: Uuid = client
        .query_one(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'big', 'order.big', jsonb_build_object('x', repeat('y', 1500000)))
             RETURNING id",
            &[],
        )
        .await
        .expect("insert")
        .get(0);
    env.insert_sql(1, "big", "order.after").await;
    env.insert_sql(1, "small", "order.created").await;
    config.retry.max_attempts = 10;
    config.retry.initial = Duration::from_secs(1);
    let relay = env.spawn(config).await;
    wait_until("big row dead-lettered", Duration::from_secs(10), || async {
        env.count("dead_lettered_at IS NOT NULL").await == 1
    })
    .await;
    let row = client
        .query_one(
            "SELECT attempts, last_error FROM outbox_events WHERE id = $1",
            &[&id],
        )
        .await
        .expect("row");
    let error: String = row.get(1);
    assert!(error.contains("1048576"), "limit in {error}");
    assert!(error.contains("max_payload"), "{error}");
    assert!(
        error.contains("15000"),
        "size (about 1,500,000 bytes) in {error}"
    );
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    relay.stop().await;
}

/// The peak resident set size (`VmHWM`) of process `pid`, in kB.
pub(crate) fn peak_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Item 6: a backlog of big events drains with the relay's memory bounded by the batch byte
/// budget (default 32 MiB): peak RSS under twice the budget plus 30 MB. Table source only: the wal
/// source's big events through the stream (400, in one and in many transactions) are wal_memory.rs.
#[tokio::test]
async fn big_payloads_drain_in_bounded_memory() {
    let env = Env::new().await;
    let client = env.client().await;
    // 160 events of 900 kB (under the 1 MB max_payload), highly compressible in the table, in
    // 40 aggregates.
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'big-' || (g % 40), 'order.big',
                    jsonb_build_object('n', g, 'blob', repeat(md5(g::text), 28125))
             FROM generate_series(1, 160) g",
        )
        .await
        .expect("insert");
    let relay = CliRelay::run(&env, &[]);
    let pid = relay.pid();
    drained(&env, Duration::from_secs(120)).await;
    let peak_mb = peak_rss_kb(pid).expect("VmHWM") as f64 / 1024.0;
    assert_ledger(&env.written().await, &env.stored_headers().await);
    assert_eq!(relay.terminate(), Some(0));
    let limit = 2.0 * 32.0 * 1.048_576 + 30.0;
    assert!(
        peak_mb < limit,
        "peak RSS {peak_mb:.0} MB, limit {limit:.0} MB"
    );
}

/// Item 3: nats-server killed (SIGKILL) and restarted three times during a drain: the broker's
/// trouble spends no attempt (max 1), so nothing is dead-lettered and every event arrives once,
/// in order per aggregate.
async fn broker_kill_restart_cycles_spend_no_attempts(source: Source) {
    let mut env = Env::new().await;
    let mut config = env.source_config(source).await;
    // Every attempt spent, kept: the wal source deletes the rows it publishes, with their counts.
    env.client()
        .await
        .batch_execute(
            "CREATE TABLE attempts_spent (id uuid, attempts int);
             CREATE FUNCTION attempts_spent_keep() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO attempts_spent VALUES (NEW.id, NEW.attempts);
                 RETURN NULL;
             END $$;
             CREATE TRIGGER attempts_spent_keep AFTER UPDATE OF attempts ON outbox_events
                 FOR EACH ROW WHEN (NEW.attempts > 0) EXECUTE FUNCTION attempts_spent_keep();",
        )
        .await
        .expect("the attempts ledger");
    env.insert_interleaved(2_000, 15).await; // 30,000 events
    config.retry.max_attempts = 1;
    config.source.fallback_interval = Duration::from_secs(1);
    let relay = env.spawn(config).await;
    for (round, at) in [3_000u64, 10_000, 17_000].into_iter().enumerate() {
        wait_until(
            &format!("round {round}: {at} events relayed"),
            Duration::from_secs(60),
            || async { env.stream_len().await >= at },
        )
        .await;
        env.nats.kill();
        // Back within a second, as a supervisor restarts it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        env.nats.start_again();
    }
    drained(&env, Duration::from_secs(120)).await;
    assert_eq!(
        env.count("dead_lettered_at IS NOT NULL").await,
        0,
        "the broker's restarts dead-lettered events"
    );
    assert_eq!(env.count("attempts > 0").await, 0, "attempts spent");
    let spent: i64 = env
        .client()
        .await
        .query_one("SELECT count(*) FROM attempts_spent", &[])
        .await
        .expect("attempts spent")
        .get(0);
    assert_eq!(spent, 0, "attempts spent");
    assert_ledger(&env.written().await, &env.stored().await);
    relay.stop().await;
}

/// Item 7: NATS down when the relay starts: it keeps trying (healthz 200, readyz 503 naming the
/// broker) and relays as soon as the broker is there.
async fn relay_waits_for_a_broker_that_starts_later(source: Source) {
    let mut env = Env::new().await;
    env.source_config(source).await;
    env.insert_sql(20, "A", "order.created").await;
    env.nats.kill();
    let addr = free_addr();
    let addr_arg = addr.to_string();
    let source_args = env.source_args(source);
    let mut relay = CliRelay::run_serving(
        &env,
        &relay_args(&source_args, &["--metrics-addr", &addr_arg]),
    );
    wait_until(
        "readyz 503 naming the broker",
        Duration::from_secs(20),
        || async {
            matches!(http_get(addr, "/readyz").await, Some((503, body)) if body.contains("\"broker\":false"))
        },
    )
    .await;
    assert_eq!(http_get(addr, "/healthz").await.map(|r| r.0), Some(200));
    assert!(relay.try_wait().is_none(), "relay exited while waiting");
    env.nats.start_again();
    env.wait_stream_len(20, Duration::from_secs(30)).await;
    wait_until("readyz 200", Duration::from_secs(20), || async {
        matches!(http_get(addr, "/readyz").await, Some((200, _)))
    })
    .await;
    relay.kill();
}

/// Item 7: PostgreSQL down when the relay starts (with --create-stream and no stream yet): it
/// waits, then creates the stream and relays.
async fn relay_waits_for_a_database_that_starts_later(source: Source) {
    let mut pg = tokio::task::spawn_blocking(|| PgCluster::start(PgOptions::default()))
        .await
        .expect("cluster");
    let env = Env::without_stream(&pg).await;
    env.source_config(source).await;
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'A', 'order.created', '{}' FROM generate_series(1, 10)",
        )
        .await
        .expect("insert");
    drop(client);
    let mut pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        pg
    })
    .await
    .expect("stop");
    let addr = free_addr();
    let addr_arg = addr.to_string();
    let source_args = env.source_args(source);
    let mut relay = CliRelay::run_serving(
        &env,
        &relay_args(
            &source_args,
            &["--create-stream", "--metrics-addr", &addr_arg],
        ),
    );
    wait_until(
        "readyz 503 naming the database",
        Duration::from_secs(20),
        || async {
            matches!(http_get(addr, "/readyz").await, Some((503, body)) if body.contains("\"database\":false"))
        },
    )
    .await;
    assert_eq!(http_get(addr, "/healthz").await.map(|r| r.0), Some(200));
    assert!(relay.try_wait().is_none(), "relay exited");
    let pg = tokio::task::spawn_blocking(move || {
        pg.start_again();
        pg
    })
    .await
    .expect("start");
    let js = env.js().await;
    wait_until(
        "the relay created the stream",
        Duration::from_secs(30),
        || async { js.get_stream(testkit::outbox::STREAM).await.is_ok() },
    )
    .await;
    env.wait_stream_len(10, Duration::from_secs(30)).await;
    relay.kill();
    drop(pg);
}

/// Item 7: what waiting cannot heal still fails fast: a missing schema.
async fn relay_fails_fast_on_a_missing_schema(source: Source) {
    let db = testkit::shared_pg().create_database().await;
    let nats = testkit::NatsServer::start();
    let source_args: &[&str] = match source {
        Source::Notify => &[],
        Source::Wal => &["--source", "wal", "--slot-name", "no_schema"],
    };
    let started = std::time::Instant::now();
    let out = testkit::relay_command()
        .args(["run", "--metrics-addr", "off"])
        .args(source_args)
        .env("DATABASE_URL", &db)
        .env("NATS_URL", nats.url())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("outbox-relay migrate"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

/// Item 8: `status` names the blocked aggregates, their dead head and its error. Not per source: an
/// operator command over rows made by hand, no relay.
#[tokio::test]
async fn status_lists_blocked_aggregates() {
    let env = Env::new().await;
    env.insert_sql(3, "stuck-1", "order.step").await;
    env.insert_sql(2, "stuck-2", "order.step").await;
    env.insert_sql(1, "fine", "order.step").await;
    let client = env.client().await;
    let heads: Vec<Uuid> = client
        .query(
            "UPDATE outbox_events o SET dead_lettered_at = now(), last_error = 'boom ' || aggregate_id
             WHERE aggregate_id LIKE 'stuck-%' AND NOT EXISTS (
                SELECT 1 FROM outbox_events p WHERE p.aggregate_id = o.aggregate_id AND p.seq < o.seq)
             RETURNING id",
            &[],
        )
        .await
        .expect("dead heads")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(heads.len(), 2);
    let (code, out, err) = cli(&env.db, &["status"]);
    assert_eq!(code, Some(0), "{err}");
    for head in &heads {
        assert!(out.contains(&head.to_string()), "{out}");
    }
    assert!(
        out.contains("order/stuck-1") && out.contains("boom stuck-1"),
        "{out}"
    );
    assert!(!out.contains("order/fine"), "{out}");
    let (code, out, err) = cli(&env.db, &["status", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let s: serde_json::Value = serde_json::from_str(&out).expect("json");
    let blocked = s["blocked"].as_array().expect("blocked list");
    assert_eq!(blocked.len(), 2, "{s}");
    let first = &blocked[0];
    assert_eq!(first["aggregate_type"], "order");
    assert_eq!(first["aggregate_id"], "stuck-1");
    assert_eq!(first["event_id"], heads[0].to_string());
    assert_eq!(first["last_error"], "boom stuck-1");
    assert_eq!(first["waiting_events"], 2);
    let (_, out, _) = cli(&env.db, &["status", "--json", "--limit", "1"]);
    let s: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(s["blocked"].as_array().expect("list").len(), 1);
    assert_eq!(s["blocked_aggregates"], 2);
}

/// Item 9: a relay that stops while draining wakes the others, so a rolling restart never waits
/// for a fallback poll. Table source only: NOTIFY arming and wake-ups (a wal relay standing by
/// takes over by itself, wal.rs).
#[tokio::test]
async fn a_stopping_relay_hands_over_to_the_others() {
    let env = Env::new().await;
    // The idle relay first: nothing to do, it arms and sleeps (its fallback poll is a minute
    // away).
    let idle = CliRelay::run(&env, &[]);
    let admin = env.client().await;
    wait_until("the idle relay armed", Duration::from_secs(20), || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_locks
                 WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .expect("locks")
            .get::<_, i64>(0)
            == 1
    })
    .await;
    // A backlog it does not hear of (written with the trigger off), then the draining relay:
    // its catch-up poll finds the backlog. Small batches keep it busy for a while.
    admin
        .batch_execute("ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_notify")
        .await
        .expect("trigger off");
    env.insert_sql(20_000, "only", "order.step").await;
    admin
        .batch_execute("ALTER TABLE outbox_events ENABLE TRIGGER outbox_events_notify")
        .await
        .expect("trigger on");
    let draining = CliRelay::run(&env, &["--batch-size", "20"]);
    wait_until("draining", Duration::from_secs(20), || async {
        env.stream_len().await >= 200
    })
    .await;
    assert_eq!(draining.terminate(), Some(0));
    assert!(
        env.count("processed_at IS NULL").await > 1_000,
        "backlog left for the hand-over"
    );
    drained(&env, Duration::from_secs(30)).await;
    assert_ledger(&env.written().await, &env.stored().await);
    assert_eq!(idle.terminate(), Some(0));
}

/// Item 10: two outboxes in one database (`--schema a`, `--schema b`) arm on keys of their own,
/// so an idle relay of one never counts as the other's. Table source only: NOTIFY arming (the wal
/// source's two outboxes, with a slot each, are wal.rs).
#[tokio::test]
async fn two_outboxes_in_one_database_arm_separately() {
    let env = Env::new().await;
    for schema in ["a", "b"] {
        let (code, out, err) = cli(&env.db, &["migrate", "--schema", schema]);
        assert_eq!(code, Some(0), "{out}{err}");
    }
    let mut config = env.config();
    config.postgres.schema = Some("a".into());
    let relay_a = env.spawn(config.clone()).await;
    config.postgres.schema = Some("b".into());
    let relay_b = env.spawn(config).await;
    let admin = env.client().await;
    // Both idle: each holds its own arming key.
    wait_until(
        "both relays armed on keys of their own",
        Duration::from_secs(20),
        || async {
            admin
                .query_one(
                    "SELECT count(DISTINCT (classid, objid)) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                     WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock'
                       AND a.application_name = 'outbox-relay-listener' AND a.datname = current_database()",
                    &[],
                )
                .await
                .expect("locks")
                .get::<_, i64>(0)
                == 2
        },
    )
    .await;
    // Writes to each outbox wake its own relay (fallback polls are a minute away).
    for (i, schema) in ["a", "b", "a", "b"].iter().enumerate() {
        admin
            .execute(
                &format!(
                    "INSERT INTO {schema}.outbox_events (aggregate_type, aggregate_id, event_type, payload)
                     VALUES ('order', '{schema}', 'order.created', '{{}}')"
                ),
                &[],
            )
            .await
            .expect("insert");
        env.wait_stream_len(i as u64 + 1, Duration::from_secs(10))
            .await;
    }
    relay_a.stop().await;
    relay_b.stop().await;
}
