//! Retention of `processed_events` (the consumers' idempotency records): `cleanup
//! --processed-events-older-than`, the relay's `--processed-events-retention`, and the index of
//! schema version 4.

use std::time::Duration;

use crate::cli::summaries;
use outbox_relay::migrate;
use testkit::outbox::{cli, Env};
use testkit::{free_addr, http_get, wait_until};

/// `old` ids recorded two days ago and `young` ones an hour from now (after any cutoff).
async fn seed_processed(client: &tokio_postgres::Client, old: i32, young: i32) {
    client
        .execute(
            "INSERT INTO processed_events (event_id, processed_at)
             SELECT gen_random_uuid(), now() - interval '2 days' FROM generate_series(1, $1::int)
             UNION ALL
             SELECT gen_random_uuid(), now() + interval '1 hour' FROM generate_series(1, $2::int)",
            &[&old, &young],
        )
        .await
        .expect("seed processed_events");
}

async fn count_processed(client: &tokio_postgres::Client, where_clause: &str) -> i64 {
    client
        .query_one(
            &format!("SELECT count(*) FROM processed_events WHERE {where_clause}"),
            &[],
        )
        .await
        .expect("count processed_events")
        .get(0)
}

/// Old outbox rows (published ten days ago) for the outbox cleanup.
async fn seed_outbox(client: &tokio_postgres::Client, old: i32) {
    client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, processed_at)
             SELECT 'order', 'c' || g, 'order.created', '{}', now() - interval '10 days'
             FROM generate_series(1, $1::int) g",
            &[&old],
        )
        .await
        .expect("seed outbox");
}

#[tokio::test]
async fn cleanup_deletes_old_processed_events_in_batches_and_skips_locked_ones() {
    let env = Env::new().await;
    let client = env.client().await;
    seed_processed(&client, 1000, 20).await;
    seed_outbox(&client, 5).await;

    // 50 old ids locked by a consumer's open transaction: skipped, not waited for.
    let mut holder = env.client().await;
    let tx = holder.transaction().await.expect("tx");
    tx.execute(
        "SELECT event_id FROM processed_events WHERE processed_at < now() ORDER BY event_id LIMIT 50 FOR UPDATE",
        &[],
    )
    .await
    .expect("lock");
    // A batch deletes at most 300 rows: 950 deleted means the batches went on until one was short.
    let (code, out, err) = cli(
        &env.db,
        &[
            "cleanup",
            "--processed-events-older-than",
            "1d",
            "--batch-size",
            "300",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(summaries(&out), ["deleted 950 processed_events rows"]);
    tx.rollback().await.expect("release");
    let (code, out, err) = cli(&env.db, &["cleanup", "--processed-events-older-than", "1d"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(summaries(&out), ["deleted 50 processed_events rows"]);
    assert_eq!(
        count_processed(&client, "true").await,
        20,
        "the young ones stay"
    );
    assert_eq!(env.count("true").await, 5, "the outbox is not touched");

    // The library call, as an application would schedule it.
    seed_processed(&client, 30, 0).await;
    let mut lib = env.client().await;
    let deleted = outbox_relay::ops::Outbox::new(&mut lib, None)
        .cleanup_table(
            outbox_relay::ops::Retained::ProcessedEvents,
            Duration::from_secs(3600),
            7,
            |_| {},
        )
        .await
        .expect("cleanup");
    assert_eq!(deleted, 30);
    assert_eq!(count_processed(&client, "true").await, 20);
}

#[tokio::test]
async fn cleanup_takes_either_cutoff_or_both_and_needs_one() {
    let env = Env::new().await;
    let client = env.client().await;
    seed_processed(&client, 40, 3).await;
    seed_outbox(&client, 25).await;

    let (code, out, err) = cli(&env.db, &["cleanup"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("--older-than") && err.contains("--processed-events-older-than"),
        "{err}"
    );
    let (code, _, err) = cli(
        &env.db,
        &["cleanup", "--processed-events-older-than", "soon"],
    );
    assert_eq!(code, Some(2));
    assert!(err.contains("--processed-events-older-than"), "{err}");

    // --older-than alone: the outbox only, with the output it always had.
    let (code, out, err) = cli(
        &env.db,
        &["cleanup", "--older-than", "7d", "--batch-size", "10"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(summaries(&out), ["deleted 25 rows"]);
    assert_eq!(count_processed(&client, "true").await, 43);

    // Both: each table with its own cutoff.
    seed_outbox(&client, 4).await;
    let (code, out, err) = cli(
        &env.db,
        &[
            "cleanup",
            "--older-than",
            "7d",
            "--processed-events-older-than",
            "1d",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        summaries(&out),
        ["deleted 4 rows", "deleted 40 processed_events rows"]
    );
    assert_eq!(env.count("true").await, 0);
    assert_eq!(count_processed(&client, "true").await, 3);
}

#[tokio::test]
async fn the_relay_deletes_old_processed_events_periodically() {
    let env = Env::new().await;
    let client = env.client().await;
    seed_processed(&client, 2500, 10).await;
    seed_outbox(&client, 5).await;
    let addr = free_addr();
    let mut config = env.config();
    config.metrics.addr = Some(addr);
    // Checked every second (a tenth of it, at least 1 s); the outbox retention stays off.
    config.retention.processed_events = Some(Duration::from_secs(10));
    let relay = env.spawn(config).await;

    wait_until(
        "old processed_events deleted",
        Duration::from_secs(30),
        || async { count_processed(&client, "processed_at < now()").await == 0 },
    )
    .await;
    // Ids recorded while the relay runs go at a later round.
    seed_processed(&client, 300, 0).await;
    wait_until(
        "processed_events recorded later deleted too",
        Duration::from_secs(30),
        || async { count_processed(&client, "processed_at < now()").await == 0 },
    )
    .await;
    assert_eq!(count_processed(&client, "true").await, 10, "young ids stay");
    assert_eq!(
        env.count("true").await,
        5,
        "no --retention: outbox rows stay"
    );
    wait_until("deletions counted", Duration::from_secs(10), || async {
        http_get(addr, "/metrics").await.is_some_and(|(_, body)| {
            body.contains("outbox_retention_deleted_rows_total{table=\"processed_events\"} 2800")
        })
    })
    .await;
    relay.stop().await;
}

/// A database with every migration but version 4, as `migrate --print` writes them.
async fn database_at_version_3() -> String {
    let db = testkit::shared_pg().create_database().await;
    let script = migrate::script(None);
    let cut = script
        .find("-- migration 0004_")
        .expect("version 4 in the script");
    testkit::pg_client(&db)
        .await
        .batch_execute(&format!("{}COMMIT;\n", &script[..cut]))
        .await
        .expect("versions 1-3");
    db
}

async fn has_index(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT to_regclass('processed_events_processed_at_idx') IS NOT NULL",
            &[],
        )
        .await
        .expect("index lookup")
        .get(0)
}

/// Version 4 builds the index inside the migration's transaction, or takes one built before
/// without blocking writers (`CREATE INDEX CONCURRENTLY`), but never an INVALID one. The relay and
/// the cleanup refuse a schema this old (`run outbox-relay migrate`).
#[tokio::test]
async fn migration_4_takes_an_index_built_concurrently_but_not_an_invalid_one() {
    let db = database_at_version_3().await;
    let client = testkit::pg_client(&db).await;
    seed_processed(&client, 120, 2).await;
    assert!(!has_index(&client).await);

    // Only the current schema and the one before it are run against.
    for args in [
        &["status"][..],
        &["cleanup", "--processed-events-older-than", "1d"][..],
    ] {
        let (code, _, err) = cli(&db, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("outbox-relay migrate"), "{args:?}: {err}");
    }
    let (code, out, _) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("pending migrations: [4, 5, 6, 7, 8, 9, 10]"),
        "{out}"
    );

    // A CONCURRENTLY build that failed leaves an INVALID index: migrate refuses to take it as
    // done, and says what to do.
    client
        .batch_execute(
            "INSERT INTO processed_events (event_id, processed_at)
             SELECT gen_random_uuid(), '2020-01-01' FROM generate_series(1, 2)",
        )
        .await
        .expect("duplicate timestamps");
    client
        .batch_execute(
            "CREATE UNIQUE INDEX CONCURRENTLY processed_events_processed_at_idx ON processed_events (processed_at)",
        )
        .await
        .expect_err("a unique index over duplicates fails");
    let (code, _, err) = cli(&db, &["migrate"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("INVALID"), "{err}");
    let (code, out, _) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(1), "nothing applied: {out}");

    // Dropped and built again without blocking writers, as the migration advises: migrate finds it.
    client
        .batch_execute("DROP INDEX CONCURRENTLY processed_events_processed_at_idx")
        .await
        .expect("drop");
    client
        .batch_execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS processed_events_processed_at_idx ON processed_events (processed_at)",
        )
        .await
        .expect("concurrent build");
    let (code, out, err) = cli(&db, &["migrate"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("applied migrations [4, 5, 6, 7, 8, 9, 10]"),
        "{out}"
    );
    assert!(has_index(&client).await);
    let (code, _, _) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(0));
}

/// In steady state a retention round finds few rows past the cutoff (those of one period) in a
/// large table: the cleanup statement finds them through the index instead of scanning.
#[tokio::test]
async fn the_cleanup_statement_uses_the_index() {
    let env = Env::new().await;
    let client = env.client().await;
    assert!(has_index(&client).await);
    client
        .batch_execute(
            "INSERT INTO processed_events (event_id, processed_at)
             SELECT gen_random_uuid(), now() - g * interval '1 second' FROM generate_series(1, 20000) g;
             ANALYZE processed_events",
        )
        .await
        .expect("seed");
    // 1% of the rows are older than the cutoff (its age goes in microseconds).
    let age_micros: i64 = 19_800_000_000;
    let plan = testkit::explain(
        &client,
        include_str!("../../sql/queries/ops/cleanup_processed_events.sql"),
        &[&age_micros, &1000_i64],
    )
    .await;
    assert!(plan.contains("processed_events_processed_at_idx"), "{plan}");
}

/// The relay's options read their environment variables, and bad values are usage errors naming
/// the flag (refused before anything connects).
#[test]
fn relay_options_from_the_environment_are_checked() {
    for (var, value, flag) in [
        (
            "OUTBOX_PROCESSED_EVENTS_RETENTION",
            "0s",
            "--processed-events-retention",
        ),
        (
            "OUTBOX_PROCESSED_EVENTS_RETENTION",
            "soon",
            "--processed-events-retention",
        ),
        (
            "OUTBOX_METRICS_EVENT_TYPES_MAX",
            "-1",
            "--metrics-event-types-max",
        ),
    ] {
        let out = testkit::relay_command()
            .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
            .env(var, value)
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {err}");
        assert!(err.contains(flag), "{var}={value}: {err}");
    }
}

/// A retention round that fails part-way still counts the batches it committed: here the second
/// batch of `processed_events` fails (a trigger refuses deletions after the 1,500th), so 1,000
/// rows are gone and counted, and the rest stay.
#[tokio::test]
async fn a_retention_round_failing_part_way_counts_what_it_deleted() {
    let env = Env::new().await;
    let client = env.client().await;
    seed_processed(&client, 2500, 0).await;
    client
        .batch_execute(
            "CREATE SEQUENCE deletions;
             CREATE FUNCTION refuse_after_1500() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('deletions') > 1500 THEN
                     RAISE EXCEPTION 'no more deletions';
                 END IF;
                 RETURN OLD;
             END $$;
             CREATE TRIGGER refuse_after_1500 BEFORE DELETE ON processed_events
                 FOR EACH ROW EXECUTE FUNCTION refuse_after_1500();",
        )
        .await
        .expect("trigger");
    let mut config = env.config();
    config.retention.processed_events = Some(Duration::from_secs(10));
    let relay = run_until_counted(&env, config, "processed_events", 1000).await;
    relay.stop().await;
    assert_eq!(count_processed(&client, "true").await, 1500);
}

/// `--retention`: the relay deletes outbox rows processed longer ago, in batches, counts them, and
/// leaves pending rows, young processed rows and dead letters alone.
#[tokio::test]
async fn the_relay_deletes_old_outbox_rows_periodically() {
    let env = Env::new().await;
    let client = env.client().await;
    seed_outbox(&client, 2300).await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, processed_at)
             VALUES ('order', 'young', 'order.created', '{}', now());
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, dead_lettered_at, created_at)
             VALUES ('order', 'dead', 'order.created', '{}', now() - interval '10 days', now() - interval '10 days');",
        )
        .await
        .expect("seed young and dead rows");
    let mut config = env.config();
    config.retention.processed = Some(Duration::from_secs(10));
    let relay = run_until_counted(&env, config, "outbox_events", 2300).await;
    relay.stop().await;
    assert_eq!(env.count("aggregate_id LIKE 'c%'").await, 0);
    assert_eq!(env.count("aggregate_id = 'young'").await, 1);
    assert_eq!(
        env.count("aggregate_id = 'dead'").await,
        1,
        "dead letters stay"
    );
}

/// Starts a relay with `config` and a metrics listener; returns it once
/// `outbox_retention_deleted_rows_total{table}` reads `rows`.
async fn run_until_counted(
    env: &Env,
    mut config: outbox_relay::RelayConfig,
    table: &str,
    rows: u64,
) -> testkit::outbox::RunningRelay {
    let addr = free_addr();
    config.metrics.addr = Some(addr);
    let relay = env.spawn(config).await;
    let sample = format!("outbox_retention_deleted_rows_total{{table=\"{table}\"}} {rows}");
    wait_until(
        "retention deletions counted",
        Duration::from_secs(30),
        || async {
            http_get(addr, "/metrics")
                .await
                .is_some_and(|(_, body)| body.contains(&sample))
        },
    )
    .await;
    relay
}
