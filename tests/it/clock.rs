//! One clock: every comparison with a time the database wrote uses the database's clock, whatever
//! the clock of the machine running the relay or the CLI says. The relay and the CLI run as the
//! binary with their wall clock moved by libfaketime (`testkit::faketime`; Debian's `faketime`
//! package, installed by .ci/run); PostgreSQL keeps the real time.

use std::time::Duration;

use testkit::outbox::{cli_with_clock, CliRelay, Env};
use testkit::wait_until;

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
    let log = relay.log_text();
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
