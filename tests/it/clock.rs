//! One clock: every comparison with a time the database wrote uses the database's clock, whatever
//! the clock of the machine running the relay or the CLI says. The relay and the CLI run as the
//! binary with their wall clock moved by libfaketime (`testkit::faketime`; Debian's `faketime`
//! package, installed by .ci/run); PostgreSQL keeps the real time.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use testkit::outbox::{cli, cli_with_clock, CliRelay, Env};
use testkit::{free_addr, http_get, wait_until};

use crate::cli::summaries;

/// Outbox rows processed, and `processed_events` ids recorded, 30 minutes ago (`young`: after an
/// hour's cutoff) and 90 minutes ago (`old`: before it), by the database's clock.
async fn seed_around_an_hour(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, processed_at)
             SELECT 'order', 'young' || g, 'order.created', '{}'::jsonb, now() - interval '30 minutes'
             FROM generate_series(1, 5) g
             UNION ALL
             SELECT 'order', 'old' || g, 'order.created', '{}'::jsonb, now() - interval '90 minutes'
             FROM generate_series(1, 3) g;
             INSERT INTO processed_events (event_id, processed_at)
             SELECT gen_random_uuid(), now() - interval '30 minutes' FROM generate_series(1, 4)
             UNION ALL
             SELECT gen_random_uuid(), now() - interval '90 minutes' FROM generate_series(1, 2);",
        )
        .await
        .expect("seed rows around an hour old");
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// The relay's log lines carry its own clock: the first one is `expected` seconds (±60) ahead of
/// the database's, so the clock of the process did move.
async fn assert_clock_moved(client: &tokio_postgres::Client, relay: &CliRelay, expected: f64) {
    let log = relay.log();
    let first = log
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("no log line to read the relay's clock from: {log}"));
    // Without the colours of a terminal (ESC [ ... m).
    let mut stamp = String::new();
    let mut chars = first.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            stamp.push(c);
        }
    }
    let ahead: f64 = client
        .query_one(
            "SELECT EXTRACT(EPOCH FROM $1::text::timestamptz - now())::float8",
            &[&stamp],
        )
        .await
        .unwrap_or_else(|e| panic!("{stamp:?} is no time: {e}"))
        .get(0);
    assert!(
        (ahead - expected).abs() < 60.0,
        "the relay's clock is {ahead}s ahead of the database's, not {expected}s: is libfaketime \
         preloaded? ({stamp})"
    );
}

/// `cleanup` with the CLI's clock an hour ahead (or behind) of the database's: the cutoff is an
/// hour before the database's now, so the dry run counts, and the cleanup deletes, exactly the
/// rows older than that, and nothing newer.
#[tokio::test]
async fn cleanup_cuts_off_by_the_database_clock() {
    let env = Env::new().await;
    let client = env.client().await;
    seed_around_an_hour(&client).await;
    let args = [
        "cleanup",
        "--older-than",
        "1h",
        "--processed-events-older-than",
        "1h",
    ];
    for offset in ["+1h", "-1h"] {
        let mut dry = args.to_vec();
        dry.push("--dry-run");
        let (code, out, err) = cli_with_clock(&env.db, offset, &dry);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                "would delete 3 rows (dry run)",
                "would delete 2 processed_events rows (dry run)"
            ],
            "the dry run with the CLI's clock at {offset}"
        );
    }
    let (code, out, err) = cli_with_clock(&env.db, "+1h", &args);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        summaries(&out),
        ["deleted 3 rows", "deleted 2 processed_events rows"]
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM outbox_events").await,
        5,
        "the rows processed 30 minutes ago stay"
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM processed_events").await,
        4,
        "the ids recorded 30 minutes ago stay: a redelivery of them is still recognised"
    );
}

/// The relay's `--retention` and `--processed-events-retention` with its clock an hour ahead: a
/// round deletes what is older than the retention by the database's clock, nothing newer.
#[tokio::test]
async fn relay_retention_cuts_off_by_the_database_clock() {
    let env = Env::new().await;
    let client = env.client().await;
    seed_around_an_hour(&client).await;
    let relay = CliRelay::run_logged_with_clock(
        &env,
        "+1h",
        &["--retention", "1h", "--processed-events-retention", "1h"],
    );
    // The first round runs at start; both tables are done once the old ids are gone.
    wait_until(
        "the relay's first retention round",
        Duration::from_secs(30),
        || async {
            count(
                &client,
                "SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '1 hour'",
            )
            .await
                == 0
        },
    )
    .await;
    wait_until(
        "old outbox rows deleted",
        Duration::from_secs(30),
        || async { env.count("aggregate_id LIKE 'old%'").await == 0 },
    )
    .await;
    // The next round comes a minute later (a tenth of the retention, at most a minute): the rows
    // still here are those the first round left.
    assert_eq!(
        env.count("aggregate_id LIKE 'young%'").await,
        5,
        "outbox rows processed 30 minutes ago stay: {}",
        relay.log_tail()
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM processed_events").await,
        4,
        "ids recorded 30 minutes ago stay: {}",
        relay.log_tail()
    );
    assert_clock_moved(&client, &relay, 3600.0).await;
    assert_eq!(relay.stop().await, None);
}

/// `status` with a pending event dated an hour in the future (a writer's clock ahead, or a value
/// set by SQL): its age counts as 0, never negative, and the skew is named.
#[tokio::test]
async fn status_counts_future_dated_events_at_age_zero_and_names_the_skew() {
    let env = Env::new().await;
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ('order', 'ahead', 'order.created', '{}', now() + interval '1 hour'),
                    ('order', 'ahead2', 'order.created', '{}', now() + interval '10 minutes')",
        )
        .await
        .expect("future-dated rows");

    let (code, out, err) = cli(&env.db, &["status", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let s: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(s["pending"], 2);
    assert_eq!(s["oldest_pending_age_seconds"], 0.0, "{out}");
    assert_eq!(s["future_dated"], 2, "{out}");
    let skew = s["max_future_skew_seconds"].as_f64().expect("a number");
    assert!((3590.0..=3600.0).contains(&skew), "{out}");

    let (code, out, err) = cli(&env.db, &["status"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("oldest pending age:  0.0s\n"), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("dated in the future:"))
        .unwrap_or_else(|| panic!("no line about future-dated events: {out}"));
    let ahead: f64 = line
        .split_once("up to ")
        .and_then(|(_, rest)| rest.split_once("s ahead of the database's clock"))
        .and_then(|(secs, _)| secs.parse().ok())
        .unwrap_or_else(|| panic!("no skew in {line:?}"));
    assert!(line.starts_with("dated in the future: 2 "), "{line}");
    assert!((3590.0..=3600.0).contains(&ahead), "{line}");

    // An event dated in the past beside them gives the age.
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ('order', 'late', 'order.created', '{}', now() - interval '100 seconds')",
        )
        .await
        .expect("a past row");
    let (_, out, _) = cli(&env.db, &["status", "--json"]);
    let s: Value = serde_json::from_str(&out).expect("json");
    let age = s["oldest_pending_age_seconds"].as_f64().expect("a number");
    assert!((100.0..110.0).contains(&age), "{out}");
    assert_eq!(s["future_dated"], 2, "{out}");

    // Nothing in the future: the line says so.
    client
        .batch_execute("UPDATE outbox_events SET created_at = now() - interval '1 second'")
        .await
        .expect("dates in the past");
    let (_, out, _) = cli(&env.db, &["status"]);
    assert!(out.contains("dated in the future: 0\n"), "{out}");
    let (_, out, _) = cli(&env.db, &["status", "--json"]);
    let s: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(s["future_dated"], 0, "{out}");
    assert_eq!(s["max_future_skew_seconds"], 0.0, "{out}");
}

use crate::observability::samples;

async fn scrape(addr: std::net::SocketAddr) -> Option<HashMap<String, f64>> {
    match http_get(addr, "/metrics").await {
        Some((200, body)) => Some(samples(&body)),
        _ => None,
    }
}

/// A stuck event dated an hour in the future (blocked behind a dead letter of its aggregate):
/// `outbox_oldest_pending_age_seconds` is never negative, and counts it from when the relay first
/// saw it, so `OutboxEventsStuck` (> 60 s) fires for it a minute later as for any other event.
#[tokio::test]
async fn a_stuck_future_dated_event_ages_from_when_the_relay_first_saw_it() {
    let env = Env::new().await;
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, dead_lettered_at, attempts)
             VALUES ('order', 'blocked', 'order.created', '{}', now(), 5);
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ('order', 'blocked', 'order.paid', '{}', now() + interval '1 hour');",
        )
        .await
        .expect("a dead head and a future-dated follower");
    let addr = free_addr();
    let mut config = env.config();
    config.metrics.addr = Some(addr);
    config.metrics.stats_interval = Duration::from_millis(100);
    let relay = env.spawn(config).await;
    let started = std::time::Instant::now();

    let seen = std::cell::Cell::new(f64::NAN);
    wait_until(
        "the stuck event's age grows past 2 s",
        Duration::from_secs(20),
        || async {
            let Some(s) = scrape(addr).await else {
                return false;
            };
            let (Some(&pending), Some(&age)) = (
                s.get("outbox_events_pending"),
                s.get("outbox_oldest_pending_age_seconds"),
            ) else {
                return false;
            };
            seen.set(age);
            assert!(age >= 0.0, "a negative age: {age}");
            assert!(
                age <= started.elapsed().as_secs_f64() + 0.5,
                "older than the relay has seen it: {age}"
            );
            pending == 1.0 && age >= 2.0
        },
    )
    .await;

    // Published once its aggregate is free: the age is 0 again.
    let dead: uuid::Uuid = client
        .query_one("SELECT id FROM outbox_dead_letters", &[])
        .await
        .expect("the dead head")
        .get(0);
    let (code, _, err) = cli(&env.db, &["dead-letters", "discard", &dead.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    wait_until("the age back at 0", Duration::from_secs(10), || async {
        scrape(addr)
            .await
            .is_some_and(|s| s.get("outbox_oldest_pending_age_seconds") == Some(&0.0))
    })
    .await;
    relay.stop().await;
}

/// Retries keep their backoff with the relay's clock ten minutes off in either direction: the
/// failed row's retry time is its backoff after the failure by the database's clock, it is not
/// retried before, and it is retried when due (not ten minutes early or late).
#[tokio::test]
async fn retries_keep_their_backoff_with_the_relay_clock_off() {
    for (offset, ahead) in [("+10m", 600.0), ("-10m", -600.0)] {
        let env = Env::new().await;
        // Only order.* subjects are stored: a payment.* event is refused (an attempt spent).
        let js = env.js().await;
        js.update_stream(async_nats::jetstream::stream::Config {
            name: testkit::outbox::STREAM.into(),
            subjects: vec!["outbox.order.>".into()],
            storage: async_nats::jetstream::stream::StorageType::File,
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("narrow the stream");
        let client = env.client().await;
        let relay = CliRelay::run_logged_with_clock(
            &env,
            offset,
            &["--retry-initial", "4s", "--retry-max", "4s"],
        );
        client
            .batch_execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', 'r', 'payment.failed', '{}')",
            )
            .await
            .expect("insert");
        wait_until(
            "the first attempt recorded",
            Duration::from_secs(20),
            || async { env.count("attempts = 1").await == 1 },
        )
        .await;
        let wait: f64 = client
            .query_one(
                "SELECT EXTRACT(EPOCH FROM retry_after - now())::float8 FROM outbox_events",
                &[],
            )
            .await
            .expect("retry_after")
            .get(0);
        assert!(
            (2.0..=5.0).contains(&wait),
            "clock {offset}: retry in {wait}s by the database's clock, expected ~4s"
        );
        // Not retried before its time, whatever wakes the relay meanwhile.
        client
            .batch_execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', 'other', 'order.created', '{}')",
            )
            .await
            .expect("insert");
        env.wait_stream_len(1, Duration::from_secs(10)).await;
        assert_eq!(
            env.count("attempts = 1").await,
            1,
            "clock {offset}: retried early"
        );
        // Retried when due, by the relay's own timer (no other wake-up comes: the fallback is a
        // minute), not ten minutes early or late.
        wait_until("the second attempt", Duration::from_secs(20), || async {
            env.count("attempts = 2").await == 1
        })
        .await;
        assert_clock_moved(&client, &relay, ahead).await;
        assert_eq!(relay.stop().await, None);
    }
}

/// `outbox_commit_to_publish_seconds` with the relay's clock ten minutes off either way: the lag
/// is measured on the database's clock, so it is observed, and small (not ten minutes, and not
/// dropped as negative).
#[tokio::test]
async fn commit_to_publish_lag_is_measured_on_the_database_clock() {
    for (offset, ahead) in [("+10m", 600.0), ("-10m", -600.0)] {
        let env = Env::new().await;
        let addr = free_addr().to_string();
        let relay = CliRelay::run_logged_with_clock(&env, offset, &["--metrics-addr", &addr]);
        let addr: std::net::SocketAddr = addr.parse().expect("address");
        wait_until(
            "the relay serves metrics",
            Duration::from_secs(20),
            || async { scrape(addr).await.is_some() },
        )
        .await;
        env.insert_sql(3, "lag", "order.created").await;
        env.wait_stream_len(3, Duration::from_secs(20)).await;
        // The relay observes each lag when it reads the ack, a moment after the stream holds the
        // message (and the three may come in two batches: the head first).
        wait_until("three lags observed", Duration::from_secs(20), || async {
            scrape(addr)
                .await
                .and_then(|s| s.get("outbox_commit_to_publish_seconds_count").copied())
                == Some(3.0)
        })
        .await;
        let s = scrape(addr).await.expect("metrics");
        assert_eq!(
            s.get("outbox_commit_to_publish_seconds_count"),
            Some(&3.0),
            "clock {offset}: {s:?}"
        );
        let sum = s["outbox_commit_to_publish_seconds_sum"];
        assert!(
            (0.0..30.0).contains(&sum),
            "clock {offset}: 3 events took {sum}s from commit to ack"
        );
        let client = env.client().await;
        assert_clock_moved(&client, &relay, ahead).await;
        assert_eq!(relay.stop().await, None);
    }
}
