//! `--transactions atomic`: each database transaction's events as one JetStream atomic batch
//! (nats-server 2.12+, a stream with `allow_atomic`). A reader of the stream never sees part of a
//! transaction, whatever happens to the relay; what the server or the stream cannot do is refused
//! at start.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use outbox_relay::Source;
use testkit::outbox::{CliRelay, Env, Stored, STREAM};
use testkit::wait_until;

const TX_ID: &str = "Outbox-Transaction-Id";
const TX_EVENTS: &str = "Outbox-Transaction-Events";

/// Whether the nats-server under test takes atomic batches; a test of them on an older server
/// checks the refusal instead.
pub(crate) fn atomic_server() -> bool {
    testkit::nats_version().is_some_and(|(major, minor, _)| (major, minor) >= (2, 12))
}

/// Per aggregate, the events in the order written: by transaction (one writer, so transaction
/// ids grow), then by place in it. Redeliveries (a later copy of an event) are skipped.
fn assert_aggregate_order(stored: &[Stored]) {
    let mut seen: HashSet<&String> = HashSet::new();
    let mut last: HashMap<&String, (u64, u64)> = HashMap::new();
    for m in stored {
        if !seen.insert(&m.headers["Outbox-Event-Id"]) {
            continue;
        }
        let at = (
            m.headers[TX_ID].parse::<u64>().expect("transaction id"),
            m.headers["Outbox-Transaction-Index"]
                .parse::<u64>()
                .expect("index"),
        );
        let aggregate = &m.headers["Outbox-Aggregate-Id"];
        if let Some(before) = last.insert(aggregate, at) {
            assert!(before < at, "aggregate {aggregate}: {before:?} then {at:?}");
        }
    }
}

/// Each transaction's stream sequences (`stored`: no event twice), each checked to be one block
/// of consecutive sequences.
fn transactions_in_blocks(stored: &[Stored]) -> HashMap<&String, Vec<u64>> {
    let mut blocks: HashMap<&String, Vec<u64>> = HashMap::new();
    for m in stored {
        blocks.entry(&m.headers[TX_ID]).or_default().push(m.seq);
    }
    for (tx, seqs) in &blocks {
        assert_eq!(
            seqs[seqs.len() - 1] - seqs[0] + 1,
            seqs.len() as u64,
            "transaction {tx} in one block"
        );
    }
    blocks
}

/// A fresh [`Env`] for `source` with `allow_atomic` on its stream, and the relay arguments of
/// `source` with `--transactions atomic` and `extra`; `None` on a server older than 2.12, after
/// checking that the relay refuses atomic mode there.
async fn atomic_env(source: Source, extra: &[&str]) -> Option<(Env, Vec<String>)> {
    let env = Env::new().await;
    env.source_config(source).await;
    if !atomic_server() {
        refused_by_an_old_server(&env, source).await;
        return None;
    }
    allow_atomic(&env).await;
    let mut args = env.source_args(source);
    args.extend(
        ["--transactions", "atomic"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string()),
    );
    Some((env, args))
}

/// Runs a relay with `args` until the `events` written are in the stream and marked, stops it,
/// then unmarks every row: what a kill between a batch's commit and the marking leaves (the rows
/// pending, the batch stored).
async fn published_then_unmarked(
    env: &Env,
    client: &tokio_postgres::Client,
    args: &[&str],
    events: u64,
) {
    let relay = CliRelay::run(env, args);
    env.wait_stream_len(events, Duration::from_secs(20)).await;
    wait_until("published and marked", Duration::from_secs(20), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    assert_eq!(relay.terminate(), Some(0));
    client
        .batch_execute("UPDATE outbox_events SET processed_at = NULL")
        .await
        .expect("unmark");
}

/// Switches `allow_atomic` on for the test stream (a stream update).
pub(crate) async fn allow_atomic(env: &Env) {
    let js = env.js().await;
    let mut s = js.get_stream(STREAM).await.expect("stream");
    let mut config = s.info().await.expect("info").config.clone();
    config.allow_atomic_publish = true;
    js.update_stream(config).await.expect("allow_atomic");
}

/// Writes transaction `k` of `n` events over five aggregates, the payload naming both.
async fn write_transaction(client: &mut tokio_postgres::Client, k: i64, n: i64) {
    let tx = client.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', (g % 5)::text, 'order.created',
                jsonb_build_object('tx', $1::int8, 'i', g, 'n', $2::int8)
         FROM generate_series(1, $2::int8) g
         ORDER BY g",
        &[&k, &n],
    )
    .await
    .expect("a transaction's events");
    tx.commit().await.expect("commit");
}

/// Polls the stream: asks for its last sequence, reads every message up to it, and checks that
/// every transaction seen so far is whole (as many distinct events as its
/// `Outbox-Transaction-Events`), but for the one the stream ends with when its last message
/// read is not its batch's commit: nats-server (2.15.1 here) stores a committed batch's messages
/// one after the other, and a reader can see the stream's last sequence move through a batch
/// while it is stored (an uncommitted batch it never sees). That one must be whole at a later
/// poll: every transaction is checked once more after the last poll. Returns the messages read,
/// once `expected` distinct events are in.
async fn read_never_seeing_part_of_a_transaction(
    js: jetstream::Context,
    expected: usize,
) -> Vec<Stored> {
    let mut s = js.get_stream(STREAM).await.expect("stream");
    let consumer = s
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            headers_only: true,
            ..Default::default()
        })
        .await
        .expect("ordered consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let mut seen: Vec<Stored> = Vec::new();
    let mut per_tx: HashMap<String, (HashSet<String>, usize)> = HashMap::new();
    let mut ids: HashSet<String> = HashSet::new();
    let mut polls = 0;
    let mut caught_storing = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while ids.len() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {expected} events after 180 s",
            ids.len()
        );
        let last = s.info().await.expect("stream info").state.last_sequence;
        if seen.last().map_or(0, |m| m.seq) == last {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        while seen.last().map_or(0, |m| m.seq) < last {
            let msg = tokio::time::timeout(Duration::from_secs(30), messages.next())
                .await
                .expect("a message the stream holds")
                .expect("stream ended")
                .expect("message");
            let m = Stored::from_message(&msg);
            let id = m.headers["Outbox-Event-Id"].clone();
            let tx = m.headers.get(TX_ID).cloned().expect("a transaction id");
            let events: usize = m.headers[TX_EVENTS].parse().expect("a count");
            let entry = per_tx.entry(tx).or_insert_with(|| (HashSet::new(), events));
            entry.0.insert(id.clone());
            ids.insert(id);
            seen.push(m);
        }
        polls += 1;
        let storing = seen
            .last()
            .filter(|m| m.headers.contains_key("Nats-Batch-Id"))
            .filter(|m| !m.headers.contains_key("Nats-Batch-Commit"))
            .and_then(|m| m.headers.get(TX_ID));
        if storing.is_some() {
            caught_storing += 1;
        }
        for (tx, (events, count)) in &per_tx {
            if Some(tx) != storing {
                assert_eq!(
                    events.len(),
                    *count,
                    "up to stream sequence {last}: transaction {tx} seen in part"
                );
            }
        }
    }
    for (tx, (events, count)) in &per_tx {
        assert_eq!(events.len(), *count, "transaction {tx} whole in the end");
    }
    eprintln!("{polls} polls, {caught_storing} while a batch was being stored");
    assert!(polls > 1, "the reader polled the stream as it grew");
    seen
}

for_each_source!(atomic_transactions_are_never_seen_in_part_across_kills);

/// Transactions of 1, 10 and 500 events written while relays publish them in atomic mode, with
/// `--batch-size 100` (a 500-event transaction is completed from the table by the claim), killed
/// (SIGKILL) at random points; with the table source two relays run side by side. A reader polling
/// the stream never sees part of a transaction, and in the end every event is there, once after
/// deduplication by event id.
async fn atomic_transactions_are_never_seen_in_part_across_kills(source: Source) {
    let Some((env, args)) = atomic_env(source, &["--batch-size", "100"]).await else {
        return;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let sizes = [1_i64, 10, 500];
    let rounds = 12;
    let total: usize = (0..rounds * sizes.len())
        .map(|k| sizes[k % sizes.len()] as usize)
        .sum();
    let reader = tokio::spawn(read_never_seeing_part_of_a_transaction(
        env.js().await,
        total,
    ));
    let writer = {
        let db = env.db.clone();
        tokio::spawn(async move {
            let mut client = testkit::pg_client(&db).await;
            // Paced, so that the kills fall while transactions are still coming.
            for k in 0..rounds * sizes.len() {
                write_transaction(&mut client, k as i64, sizes[k % sizes.len()]).await;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    let seed = fastrand::u64(..);
    eprintln!("kill points seed: {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    for round in 0..4 {
        let relays: Vec<CliRelay> = match source {
            Source::Notify => vec![CliRelay::run(&env, &args), CliRelay::run(&env, &args)],
            Source::Wal => vec![CliRelay::run(&env, &args)],
        };
        let before = env.stream_len().await;
        // Something published, or nothing left to (the writer may be done already).
        wait_until(
            &format!("round {round}: the relays publish"),
            Duration::from_secs(30),
            || async {
                env.stream_len().await > before || env.count("processed_at IS NULL").await == 0
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(0..300))).await; // the random kill point
        for relay in relays {
            relay.kill();
        }
    }
    let last = match source {
        Source::Notify => 2,
        Source::Wal => 1,
    };
    let relays: Vec<(CliRelay, std::net::SocketAddr)> = (0..last)
        .map(|_| {
            let addr = testkit::free_addr();
            let addr_arg = addr.to_string();
            let mut with_addr = args.clone();
            with_addr.extend(["--metrics-addr", addr_arg.as_str()]);
            (CliRelay::run_logged(&env, &with_addr), addr)
        })
        .collect();
    writer.await.expect("writer");
    let seen = tokio::time::timeout(Duration::from_secs(150), reader)
        .await
        .expect("the reader saw every event")
        .expect("the reader");
    for (relay, addr) in relays {
        // Up (SIGTERM before its handler is in would kill it), then stopped cleanly.
        wait_until("the relay ready", Duration::from_secs(20), || async {
            matches!(testkit::http_get(addr, "/readyz").await, Some((200, _)))
        })
        .await;
        let (code, log) = relay.terminate_logged(Duration::from_secs(20));
        assert_eq!(code, Ok(Some(0)), "{log}");
    }
    let distinct: HashSet<&String> = seen.iter().map(|m| &m.headers["Outbox-Event-Id"]).collect();
    // A transaction sent again after a kill (within the duplicate window) is refused whole by
    // JetStream and confirmed event by event: nothing is stored twice.
    assert_eq!(seen.len(), distinct.len(), "no event stored twice");
    assert_aggregate_order(&seen);
    assert_eq!(distinct.len(), total, "every event");
    // Each transaction of several events went out as atomic batches, each its own block of
    // consecutive stream sequences.
    let mut batches: HashMap<&str, Vec<u64>> = HashMap::new();
    for m in &seen {
        if let Some(batch) = m.headers.get("Nats-Batch-Id") {
            batches.entry(batch).or_default().push(m.seq);
        }
    }
    assert!(!batches.is_empty(), "atomic batches in the stream");
    for (batch, seqs) in &batches {
        let (lo, hi) = (seqs[0], seqs[seqs.len() - 1]);
        assert_eq!(hi - lo + 1, seqs.len() as u64, "batch {batch} is one block");
    }
    // Each batch ends with its commit: nothing of an uncommitted batch (a relay killed while
    // sending one) was stored.
    for m in &seen {
        if let Some(batch) = m.headers.get("Nats-Batch-Id") {
            let n: u64 = m.headers["Nats-Batch-Sequence"]
                .parse()
                .expect("batch sequence");
            let size = batches[batch.as_str()].len() as u64;
            assert_eq!(
                m.headers.contains_key("Nats-Batch-Commit"),
                n == size,
                "{m:?}"
            );
        }
    }
}

/// On a server older than 2.12 the relay refuses atomic mode at start, naming the version.
async fn refused_by_an_old_server(env: &Env, source: Source) {
    let source_args = env.source_args(source);
    let url = env.nats.url();
    let mut args: Vec<&str> = vec!["run", "--nats-url", &url, "--transactions", "atomic"];
    args.extend(source_args.iter().map(String::as_str));
    let (code, _, stderr) = testkit::outbox::cli(&env.db, &args);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("2.12"), "{stderr}");
}

/// Against a stream without `allow_atomic` the relay refuses to start, naming the fix; with
/// `--create-stream` it creates the stream with it, and relays.
#[tokio::test]
async fn atomic_mode_needs_a_stream_that_takes_atomic_batches() {
    let env = Env::new().await;
    if !atomic_server() {
        return refused_by_an_old_server(&env, Source::Notify).await;
    }
    let url = env.nats.url();
    let (code, _, stderr) = testkit::outbox::cli(
        &env.db,
        &["run", "--nats-url", &url, "--transactions", "atomic"],
    );
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("allow_atomic"), "{stderr}");
    let js = env.js().await;
    js.delete_stream(STREAM).await.expect("delete stream");
    let relay = CliRelay::run(&env, &["--transactions", "atomic", "--create-stream"]);
    wait_until(
        "the relay created the stream",
        Duration::from_secs(20),
        || async { js.get_stream(STREAM).await.is_ok() },
    )
    .await;
    let mut client = env.client().await;
    write_transaction(&mut client, 1, 3).await;
    env.wait_stream_len(3, Duration::from_secs(20)).await;
    let mut s = js.get_stream(STREAM).await.expect("stream");
    assert!(s.info().await.expect("info").config.allow_atomic_publish);
    assert_eq!(relay.terminate(), Some(0));
}

/// A crash between a batch's commit and the rows' marking: the transaction is published again,
/// JetStream refuses the batch whole (its ids are stored, err_code 10201), and the relay confirms
/// the events one by one as duplicates: stored once, marked, the relay not stuck.
#[tokio::test]
async fn a_transaction_already_in_the_stream_is_not_stored_twice() {
    let Some((env, _)) = atomic_env(Source::Notify, &[]).await else {
        return;
    };
    let mut client = env.client().await;
    write_transaction(&mut client, 1, 4).await;
    let args = ["--transactions", "atomic"];
    published_then_unmarked(&env, &client, &args, 4).await;
    write_transaction(&mut client, 2, 3).await;
    let relay = CliRelay::run(&env, &args);
    wait_until("both marked", Duration::from_secs(20), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    env.wait_stream_len(7, Duration::from_secs(20)).await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    assert_eq!(stored.len(), 7, "the first transaction stored once");
    testkit::outbox::assert_unique(&stored);
}

/// An event the relay cannot publish (its headers are too large for JetStream) inside a
/// transaction: its siblings are held with it and dead-lettered with it, each naming the
/// transaction, and nothing of it reaches the stream; other transactions go on.
#[tokio::test]
async fn a_poison_event_holds_its_transaction() {
    let Some((env, _)) = atomic_env(Source::Notify, &[]).await else {
        return;
    };
    let mut client = env.client().await;
    let tx = client.transaction().await.expect("begin");
    tx.batch_execute(
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'p1', 'order.created', '{}'), ('order', 'p2', 'order.created', '{}');
         INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('order', 'p3', 'order.created', '{}',
                 jsonb_build_object('x-big', repeat('x', 70000)));",
    )
    .await
    .expect("poisoned transaction");
    tx.commit().await.expect("commit");
    write_transaction(&mut client, 9, 3).await;
    let relay = CliRelay::run(&env, &["--transactions", "atomic", "--max-attempts", "1"]);
    env.wait_dead_letters(3, Duration::from_secs(30)).await;
    env.wait_stream_len(3, Duration::from_secs(20)).await;
    assert_eq!(relay.terminate(), Some(0));
    let errors: Vec<String> = client
        .query(
            "SELECT last_error FROM outbox_events WHERE dead_lettered_at IS NOT NULL ORDER BY seq",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(errors.len(), 3);
    for e in &errors[..2] {
        assert!(
            e.contains("held with event") && e.contains("transaction"),
            "{e}"
        );
    }
    assert!(
        errors[2].contains("other events are held with it"),
        "{}",
        errors[2]
    );
    let stored = env.stored().await;
    assert!(
        stored
            .iter()
            .all(|m| m.payload.contains("\"tx\": 9") || m.payload.contains("\"tx\":9")),
        "{stored:?}"
    );
    // The operator fixes the poison and retries it alone: its whole transaction goes, as one
    // batch.
    let poison: uuid::Uuid = client
        .query_one(
            "UPDATE outbox_events SET headers = '{}' WHERE aggregate_id = 'p3' RETURNING id",
            &[],
        )
        .await
        .expect("fix the poison")
        .get(0);
    let (code, out, err) =
        testkit::outbox::cli(&env.db, &["dead-letters", "retry", &poison.to_string()]);
    assert_eq!(code, Some(0), "{out}{err}");
    let relay = CliRelay::run(&env, &["--transactions", "atomic", "--max-attempts", "1"]);
    env.wait_stream_len(6, Duration::from_secs(20)).await;
    wait_until("no dead letter left", Duration::from_secs(20), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    let revived: Vec<&Stored> = stored.iter().filter(|m| m.seq > 3).collect();
    assert_eq!(revived.len(), 3);
    let batch = revived[0].headers.get("Nats-Batch-Id").expect("one batch");
    assert!(revived
        .iter()
        .all(|m| m.headers.get("Nats-Batch-Id") == Some(batch)));
}

/// A transaction larger than one atomic batch (1,000 events) goes out in parts, each part atomic,
/// in write order: never stuck.
#[tokio::test]
async fn a_transaction_over_the_atomic_limit_goes_in_parts() {
    let Some((env, _)) = atomic_env(Source::Notify, &[]).await else {
        return;
    };
    let mut client = env.client().await;
    write_transaction(&mut client, 1, 1500).await;
    let relay = CliRelay::run(&env, &["--transactions", "atomic", "--batch-size", "1000"]);
    env.wait_stream_len(1500, Duration::from_secs(60)).await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored_headers().await;
    testkit::outbox::assert_unique(&stored);
    let batches: HashSet<&String> = stored
        .iter()
        .filter_map(|m| m.headers.get("Nats-Batch-Id"))
        .collect();
    assert!(
        batches.len() >= 2,
        "published in parts: {} batches",
        batches.len()
    );
    // Per aggregate, the write order.
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in &stored {
        let index: u64 = m.headers["Outbox-Transaction-Index"]
            .parse()
            .expect("index");
        let aggregate = m.headers["Outbox-Aggregate-Id"].clone();
        if let Some(before) = last.insert(aggregate, index) {
            assert!(before < index, "aggregate order");
        }
    }
}

for_each_source!(the_broker_killed_mid_batch_leaves_no_transaction_in_part);

/// nats-server killed (and started again) while the relay publishes transactions of 50 events as
/// atomic batches: batches in flight are lost or refused, never stored in part; every event ends
/// up in the stream once, every transaction whole and in one block, no event dead-lettered.
async fn the_broker_killed_mid_batch_leaves_no_transaction_in_part(source: Source) {
    let Some((mut env, args)) = atomic_env(
        source,
        &["--fallback-interval", "1s", "--max-attempts", "3"],
    )
    .await
    else {
        return;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let relay = CliRelay::run_logged(&env, &args);
    let (transactions, size) = (60_i64, 50_i64);
    let writer = {
        let db = env.db.clone();
        tokio::spawn(async move {
            let mut client = testkit::pg_client(&db).await;
            for k in 0..transactions {
                write_transaction(&mut client, k, size).await;
                tokio::time::sleep(Duration::from_millis(50)).await; // ~3 s of writes
            }
        })
    };
    wait_until(
        "some transactions relayed",
        Duration::from_secs(20),
        || async { env.stream_len().await >= 2 * size as u64 },
    )
    .await;
    env.nats.kill();
    tokio::time::sleep(Duration::from_secs(2)).await; // the outage itself
    env.nats.start_again();
    writer.await.expect("writer");
    let total = (transactions * size) as usize;
    wait_until("every row published", Duration::from_secs(60), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    assert_eq!(env.count("dead_lettered_at IS NOT NULL").await, 0);
    let (code, log) = relay.terminate_logged(Duration::from_secs(20));
    assert_eq!(code, Ok(Some(0)), "{log}");
    let stored = env.stored().await;
    let ids: HashSet<&String> = stored
        .iter()
        .map(|m| &m.headers["Outbox-Event-Id"])
        .collect();
    assert_eq!(ids.len(), total, "every event");
    assert_eq!(stored.len(), total, "no event stored twice");
    assert_aggregate_order(&stored);
    // Each transaction: one batch, one block of the stream, whole.
    let blocks = transactions_in_blocks(&stored);
    assert_eq!(blocks.len(), transactions as usize);
    for (tx, seqs) in &blocks {
        assert_eq!(seqs.len(), size as usize, "transaction {tx} whole");
    }
}

/// A row of a transaction locked by another session (an operator's `SELECT ... FOR UPDATE`): the
/// transaction's other events are held while the lock is, later transactions go on, and once the
/// lock is gone the transaction goes out whole.
#[tokio::test]
async fn a_transaction_with_a_row_locked_elsewhere_waits_whole() {
    let Some((env, _)) = atomic_env(Source::Notify, &[]).await else {
        return;
    };
    let client = env.client().await;
    let insert = |aggregates: &'static [&'static str]| {
        let values: Vec<String> = aggregates
            .iter()
            .map(|a| format!("('order', '{a}', 'order.created', '{{}}')"))
            .collect();
        format!(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
            values.join(", ")
        )
    };
    client
        .batch_execute(&insert(&["a1", "a2", "a3"]))
        .await
        .expect("held transaction");
    let mut holder = env.client().await;
    let lock = holder.transaction().await.expect("begin");
    lock.execute(
        "SELECT 1 FROM outbox_events WHERE aggregate_id = 'a2' FOR UPDATE",
        &[],
    )
    .await
    .expect("lock a2");
    client
        .batch_execute(&insert(&["b1", "b2"]))
        .await
        .expect("later transaction");
    let relay = CliRelay::run(&env, &["--transactions", "atomic"]);
    env.wait_stream_len(2, Duration::from_secs(20)).await;
    let stored = env.stored().await;
    assert!(
        stored
            .iter()
            .all(|m| m.headers["Outbox-Aggregate-Id"].starts_with('b')),
        "only the later transaction while a2 is locked: {stored:?}"
    );
    assert_eq!(env.count("processed_at IS NULL").await, 3);
    lock.rollback().await.expect("release");
    env.wait_stream_len(5, Duration::from_secs(20)).await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    assert_eq!(stored.len(), 5);
    let held: Vec<u64> = stored
        .iter()
        .filter(|m| m.headers["Outbox-Aggregate-Id"].starts_with('a'))
        .map(|m| m.seq)
        .collect();
    assert_eq!(
        held,
        vec![3, 4, 5],
        "the held transaction whole, in one block"
    );
}

/// A server whose atomic batches take fewer events than the relay's limit (here 5) refuses a
/// larger transaction's batch (err_code 10199): the relay sends that transaction event by event
/// instead of retrying it for ever.
#[tokio::test]
async fn a_server_with_a_lower_batch_limit_gets_the_transaction_event_by_event() {
    if !atomic_server() {
        return;
    }
    let nats = testkit::NatsServer::start_with_jetstream_config(
        "  limits {\n    batch {\n      max_msgs: 5\n    }\n  }",
        "",
    );
    let env = Env {
        db: testkit::shared_pg().create_migrated_database().await,
        nats,
    };
    env.create_stream().await;
    allow_atomic(&env).await;
    let mut client = env.client().await;
    write_transaction(&mut client, 1, 4).await;
    write_transaction(&mut client, 2, 8).await;
    let relay = CliRelay::run_logged(&env, &["--transactions", "atomic"]);
    env.wait_stream_len(12, Duration::from_secs(20)).await;
    wait_until("all marked", Duration::from_secs(20), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    let (code, log) = relay.terminate_logged(Duration::from_secs(20));
    assert_eq!(code, Ok(Some(0)), "{log}");
    assert!(
        log.contains("too large: publishing it event by event"),
        "{log}"
    );
    let stored = env.stored().await;
    assert_eq!(stored.len(), 12);
    assert_aggregate_order(&stored);
    let batched = stored
        .iter()
        .filter(|m| m.headers.contains_key("Nats-Batch-Id"))
        .count();
    assert_eq!(
        batched, 4,
        "the 4-event transaction as one batch, the other event by event"
    );
}

for_each_source!(a_large_transaction_committed_before_an_older_writer_of_its_aggregate);

/// A transaction larger than the wal stream holds at once (12 events, `--batch-size 5`) commits
/// while an older transaction that wrote one of its aggregates first is still open, then that one
/// commits: both go out, each whole, nothing stuck, with either source.
async fn a_large_transaction_committed_before_an_older_writer_of_its_aggregate(source: Source) {
    let Some((env, args)) = atomic_env(source, &["--batch-size", "5"]).await else {
        return;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let relay = CliRelay::run_logged(&env, &args);
    let mut older = env.client().await;
    let older_tx = older.transaction().await.expect("begin");
    older_tx
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', '0', 'order.created', '{\"tx\": 0, \"i\": 1}')",
            &[],
        )
        .await
        .expect("older row");
    let mut client = env.client().await;
    write_transaction(&mut client, 1, 12).await;
    older_tx.commit().await.expect("commit the older");
    wait_until("both published", Duration::from_secs(30), || async {
        env.count("processed_at IS NULL").await == 0 && env.stream_len().await >= 13
    })
    .await;
    let (code, log) = relay.terminate_logged(Duration::from_secs(20));
    assert_eq!(code, Ok(Some(0)), "{log}");
    let stored = env.stored().await;
    assert_eq!(stored.len(), 13, "each event once");
    transactions_in_blocks(&stored);
}

/// Past the stream's duplicate window, a transaction sent again (its rows unmarked by a crash
/// between the commit and the marking) is stored again, whole, as one batch: JetStream no longer
/// knows its ids. Nothing stalls; consumers deduplicate by event id (README).
#[tokio::test]
async fn past_the_duplicate_window_a_transaction_sent_again_is_stored_again_whole() {
    let env = Env::new().await;
    if !atomic_server() {
        return refused_by_an_old_server(&env, Source::Notify).await;
    }
    let js = env.js().await;
    let mut s = js.get_stream(STREAM).await.expect("stream");
    let mut config = s.info().await.expect("info").config.clone();
    config.allow_atomic_publish = true;
    config.duplicate_window = Duration::from_millis(500);
    js.update_stream(config)
        .await
        .expect("a short duplicate window");
    let mut client = env.client().await;
    write_transaction(&mut client, 1, 3).await;
    let args = ["--transactions", "atomic"];
    published_then_unmarked(&env, &client, &args, 3).await;
    // Past the window (JetStream drops the ids it remembers after it).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let relay = CliRelay::run(&env, &args);
    env.wait_stream_len(6, Duration::from_secs(20)).await;
    wait_until("marked again", Duration::from_secs(20), || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    assert_eq!(relay.terminate(), Some(0));
    let stored = env.stored().await;
    assert_eq!(stored.len(), 6);
    let second: HashSet<&String> = stored[3..]
        .iter()
        .map(|m| &m.headers["Nats-Batch-Id"])
        .collect();
    assert_eq!(second.len(), 1, "stored again as one batch");
}

/// A transaction whose payloads outgrow the batch's byte budget (`--max-batch-bytes`) is not
/// gathered whole into one claim (memory stays within the budget whatever the payloads): it goes
/// in parts, each atomic, in write order, with a warning.
#[tokio::test]
async fn a_transaction_over_the_byte_budget_goes_in_parts() {
    let Some((env, _)) = atomic_env(Source::Notify, &[]).await else {
        return;
    };
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'big', 'order.created',
                    jsonb_build_object('i', g, 'pad',
                        (SELECT string_agg(md5(random()::text || g || k), '')
                         FROM generate_series(1, 2500) k))
             FROM generate_series(1, 5) g",
        )
        .await
        .expect("a transaction of 400 KB");
    let relay = CliRelay::run_logged(
        &env,
        &["--transactions", "atomic", "--max-batch-bytes", "200000"],
    );
    env.wait_stream_len(5, Duration::from_secs(20)).await;
    let (code, log) = relay.terminate_logged(Duration::from_secs(20));
    assert_eq!(code, Ok(Some(0)), "{log}");
    assert!(log.contains("published in parts"), "{log}");
    let stored = env.stored_headers().await;
    assert_eq!(stored.len(), 5);
    assert_aggregate_order(&stored);
    // About 80 KB an event: two fit in the budget, so the parts are two atomic batches of two
    // and a lone event.
    let batches: HashSet<Option<&String>> = stored
        .iter()
        .map(|m| m.headers.get("Nats-Batch-Id"))
        .collect();
    assert!(
        batches.iter().flatten().count() >= 2,
        "in parts, atomic where more than one: {batches:?}"
    );
}
