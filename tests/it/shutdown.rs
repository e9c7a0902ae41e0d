//! Shutdown whatever another session holds: each table of the outbox's schema in turn is locked
//! ACCESS EXCLUSIVE by another session while the relay (the binary, `--retention` on) is idle, or
//! publishing a backlog; SIGTERM; the relay must exit within 5 s. Once every lock is released, a
//! fresh relay publishes the rest: every event written is on the stream exactly once.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outbox_relay::Source;
use testkit::outbox::{CliRelay, Env};
use testkit::wait_until;
use uuid::Uuid;

/// How soon after SIGTERM the relay must have exited.
const EXIT_LIMIT: Duration = Duration::from_secs(5);

/// Events of the backlog moment, per round.
const BACKLOG: i32 = 4_000;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Moment {
    /// Started, everything written so far published, waiting.
    Idle,
    /// Publishing a backlog.
    Backlog,
}

/// The relay's flags here: its periodic work comes every second (the fallback's look, the
/// retention of both tables), so that each moment meets the lock soon.
fn args(env: &Env, source: Source) -> Vec<String> {
    let mut args = env.source_args(source);
    args.extend(
        [
            "--fallback-interval",
            "1s",
            "--retention",
            "1s",
            "--processed-events-retention",
            "1s",
        ]
        .map(String::from),
    );
    args
}

/// The tables of the outbox's schema, from the catalog (the written ledger of the wal tests' is
/// the test's own).
async fn tables(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT relname::text FROM pg_class
             WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')
               AND relname <> 'written_ledger'
             ORDER BY relname",
            &[],
        )
        .await
        .expect("the schema's tables")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Writes `n` events (100 per transaction) and returns their ids.
async fn write(client: &tokio_postgres::Client, n: i32, tag: &str) -> Vec<Uuid> {
    let mut ids = Vec::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(100);
        let rows = client
            .query(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', $1 || '-' || (g % 20), 'order.step', jsonb_build_object('n', g)
                 FROM generate_series(1, $2::int) g RETURNING id",
                &[&tag, &k],
            )
            .await
            .expect("write events");
        ids.extend(rows.iter().map(|r| r.get::<_, Uuid>(0)));
        left -= k;
    }
    ids
}

/// Whether a backend of the relay waits for a lock on `table`.
async fn relay_waits_for(client: &tokio_postgres::Client, table: &str) -> bool {
    client
        .query_one(
            "SELECT EXISTS (
                 SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                 WHERE NOT l.granted AND l.relation = $1::text::regclass
                   AND a.application_name LIKE 'outbox-relay%')",
            &[&table],
        )
        .await
        .expect("lock waits")
        .get(0)
}

/// How long the relay may take to meet a lock on `table` in `moment`, at most: its periodic work
/// comes every second, the wal source's re-check of its setup (which reads `outbox_wal_slots`)
/// every 10 s.
fn meets_within(source: Source, table: &str) -> Duration {
    match (source, table) {
        (Source::Wal, "outbox_wal_slots") => Duration::from_secs(12),
        _ => Duration::from_secs(2),
    }
}

/// The locks the relay must be seen waiting for (else the test would not test the hang):
/// `--retention` deletes from `outbox_events` every second; the wal source re-checks its setup in
/// `outbox_wal_slots` every 10 s.
fn must_meet(source: Source, table: &str, moment: Moment) -> bool {
    table == "outbox_events"
        || (source == Source::Wal && table == "outbox_wal_slots" && moment == Moment::Idle)
}

/// ACCESS EXCLUSIVE on a table, asked for by another session and held until released. Asked
/// for, not waited for: while the relay publishes, its own transactions may hold the table, and
/// then the request waits in the queue, where every later request of the relay waits behind it.
struct Lock {
    release: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Lock {
    async fn take(env: &Env, table: &str) -> Lock {
        let client = env.client().await;
        let sql = format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE");
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let name = table.to_string();
        let task = tokio::spawn(async move {
            if let Err(e) = client.batch_execute(&sql).await {
                panic!("locking {name}: {e:?}");
            }
            let _ = released.await;
            client
                .batch_execute("ROLLBACK")
                .await
                .expect("release the lock");
        });
        // The request is in: granted, or waiting in the queue.
        let probe = env.client().await;
        wait_until("the lock asked for", Duration::from_secs(10), || async {
            probe
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                     WHERE l.relation = $1::text::regclass AND l.mode = 'AccessExclusiveLock'
                       AND a.application_name NOT LIKE 'outbox-relay%')",
                    &[&table],
                )
                .await
                .expect("the lock's state")
                .get(0)
        })
        .await;
        Lock { release, task }
    }

    /// Releases it (after it was granted: once the relay is gone, nothing holds the table).
    async fn release(self) {
        let _ = self.release.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the lock granted and released once the relay is gone")
            .expect("the lock's task");
    }
}

async fn sigterm_while_locked(source: Source, moment: Moment) {
    let env = Env::new().await;
    env.source_config(source).await;
    let args = args(&env, source);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let client = env.client().await;
    let tables = tables(&client).await;
    for expected in ["outbox_events", "outbox_relays", "outbox_wal_slots"] {
        assert!(tables.iter().any(|t| t == expected), "{tables:?}");
    }
    let mut written: Vec<Uuid> = Vec::new();
    for table in &tables {
        let relay = CliRelay::run_logged(&env, &args);
        // Idle: what was written so far (a probe at least) is on the stream.
        written.extend(write(&client, 1, "probe").await);
        let published = written.len() as u64;
        wait_until(
            &format!("{table}, {moment:?}: the relay publishes"),
            Duration::from_secs(30),
            || async { env.stream_len().await >= published },
        )
        .await;
        if moment == Moment::Backlog {
            let before = env.stream_len().await;
            written.extend(write(&client, BACKLOG, table).await);
            wait_until(
                &format!("{table}: the backlog publishing"),
                Duration::from_secs(30),
                || async { env.stream_len().await > before },
            )
            .await;
        }
        let lock = Lock::take(&env, table).await;
        // The relay meets the lock (or does not touch the table at this moment).
        let limit = Instant::now() + meets_within(source, table);
        let mut met = false;
        while !met && Instant::now() < limit {
            met = relay_waits_for(&client, table).await;
            if !met {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(
            met || !must_meet(source, table, moment),
            "the relay never waited for the lock on {table} ({moment:?}): {}",
            relay.log_tail()
        );
        let started = Instant::now();
        let (code, log) = tokio::task::spawn_blocking(move || relay.terminate_logged(EXIT_LIMIT))
            .await
            .expect("terminate");
        let took = started.elapsed();
        eprintln!("{table} locked ({moment:?}, relay waiting: {met}): exited after {took:?}");
        assert_eq!(
            code,
            Ok(Some(0)),
            "{table} locked ({moment:?}, relay waiting for it: {met}): the relay did not exit within {EXIT_LIMIT:?} of SIGTERM: {log}"
        );
        lock.release().await;
    }
    // Every lock released: a fresh relay publishes the rest, each event once (and a last probe:
    // it is running, its signal handler in place, once that is on the stream too).
    let relay = CliRelay::run_logged(&env, &args);
    written.extend(write(&client, 1, "probe").await);
    let total = written.len() as u64;
    wait_until(
        "every event written on the stream",
        Duration::from_secs(60),
        || async { env.stream_len().await >= total },
    )
    .await;
    let (code, log) = tokio::task::spawn_blocking(move || relay.terminate_logged(EXIT_LIMIT))
        .await
        .expect("terminate");
    assert_eq!(code, Ok(Some(0)), "{log}");
    let stored = env.stored_headers().await;
    let ids = testkit::outbox::assert_unique(&stored);
    let ids: HashSet<Uuid> = ids.into_iter().collect();
    let written: HashSet<Uuid> = written.into_iter().collect();
    assert_eq!(
        ids.len(),
        written.len(),
        "{} events written, {} on the stream",
        written.len(),
        ids.len()
    );
    assert!(
        ids == written,
        "the stream holds other events than those written"
    );
}

async fn sigterm_while_idle_and_a_table_locked(source: Source) {
    sigterm_while_locked(source, Moment::Idle).await
}

async fn sigterm_while_publishing_and_a_table_locked(source: Source) {
    sigterm_while_locked(source, Moment::Backlog).await
}

for_each_source!(
    sigterm_while_idle_and_a_table_locked,
    sigterm_while_publishing_and_a_table_locked
);
