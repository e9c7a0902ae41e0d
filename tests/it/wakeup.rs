//! The gated NOTIFY: writers notify only while a relay is armed. No wake-up may be lost at the
//! arming boundary, and a long writer transaction must not push latency to the fallback poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use testkit::outbox::Env;
use uuid::Uuid;

type Commits = Arc<Mutex<HashMap<Uuid, Instant>>>;

async fn write_one(client: &mut tokio_postgres::Client, aggregate: &str, commits: &Commits) {
    let tx = client.transaction().await.expect("tx");
    let event =
        outbox_relay::NewEvent::new("order", aggregate, "order.created", &serde_json::json!({}))
            .expect("event");
    let id = outbox_relay::enqueue(&tx, &event).await.expect("enqueue");
    commits.lock().expect("lock").insert(id, Instant::now());
    tx.commit().await.expect("commit");
}

/// Receives `n` messages on `outbox.>` and returns each event's commit -> receive latency.
async fn latencies(mut sub: async_nats::Subscriber, n: usize, commits: Commits) -> Vec<Duration> {
    let mut received: HashMap<Uuid, Instant> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while received.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, sub.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} events arrived", received.len()))
            .expect("subscription open");
        let id = outbox_relay::consumer::event_id(msg.headers.as_ref()).expect("event id");
        received.entry(id).or_insert_with(Instant::now);
    }
    let commits = commits.lock().expect("lock");
    received
        .iter()
        .map(|(id, at)| at.saturating_duration_since(commits[id]))
        .collect()
}

#[tokio::test]
async fn no_wakeup_is_lost_at_the_arming_boundary() {
    let _turn = testkit::heavy().await;
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await; // fallback 60 s
    let nc = async_nats::connect(env.nats.url()).await.expect("nats");
    let sub = nc.subscribe("outbox.>").await.expect("subscribe");
    nc.flush().await.expect("flush");
    let commits: Commits = Arc::default();
    let seed = fastrand::u64(..);
    eprintln!("gaps seed: {seed}");
    let mut writers = Vec::new();
    for w in 0..4 {
        let (db, commits) = (env.db.clone(), commits.clone());
        writers.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed + w);
            let mut client = testkit::pg_client(&db).await;
            for i in 0..1_250 {
                write_one(&mut client, &format!("w{w}-{}", i % 20), &commits).await;
                // Random gaps of 0-20 ms: the workload under test.
                tokio::time::sleep(Duration::from_micros(rng.u64(0..20_000))).await;
            }
        }));
    }
    let mut lat = latencies(sub, 5_000, commits).await; // runs while the writers write
    for w in writers {
        w.await.expect("writer");
    }
    lat.sort();
    let max = *lat.last().expect("latencies");
    eprintln!(
        "p50 {:?} p99 {:?} max {max:?}",
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    assert!(max < Duration::from_millis(250), "max latency {max:?}");
    relay.stop().await;
}

#[tokio::test]
async fn a_long_writer_transaction_does_not_delay_other_events_to_the_fallback() {
    let _turn = testkit::heavy().await;
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await; // fallback 60 s

    // The relay is busy (disarmed) while the long transaction takes its shared lock, so arming has
    // to wait for it, and the relay must poll meanwhile.
    env.insert_sql(3_000, "backlog", "order.created").await;
    let mut long = env.client().await;
    let long_tx = long.transaction().await.expect("tx");
    long_tx
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'long', 'order.created', '{}')",
            &[],
        )
        .await
        .expect("insert in the long transaction");
    env.wait_stream_len(3_000, Duration::from_secs(30)).await;

    let nc = async_nats::connect(env.nats.url()).await.expect("nats");
    let sub = nc.subscribe("outbox.>").await.expect("subscribe");
    nc.flush().await.expect("flush");
    let commits: Commits = Arc::default();
    // Receive concurrently: the receive time is taken when the message is read.
    let collector = tokio::spawn(latencies(sub, 20, commits.clone()));
    let mut client = env.client().await;
    for i in 0..20 {
        write_one(&mut client, &format!("short-{i}"), &commits).await;
        tokio::time::sleep(Duration::from_millis(50)).await; // writer pace
    }
    let mut lat = collector.await.expect("collector");
    lat.sort();
    let max = *lat.last().expect("latencies");
    assert!(
        max < Duration::from_millis(500),
        "max latency {max:?} while arming was blocked; all {lat:?}"
    );

    long_tx.commit().await.expect("commit long");
    env.wait_stream_len(3_021, Duration::from_secs(5)).await;
    relay.stop().await;
}

/// Is this outbox's arming key held (by any relay of this database)?
async fn armed(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l, outbox_wakeup() w
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND l.classid::bigint = (w.lock_key >> 32) & 4294967295
                   AND l.objid::bigint = w.lock_key & 4294967295)",
            &[],
        )
        .await
        .expect("arming state")
        .get(0)
}

/// The first notification disarms the trigger until the relay is idle again: while it drains
/// (here: held up publishing to a paused broker), writers do not notify. Before the arming state
/// machine, the processor's arm request left over from its catch-up poll re-armed the listener
/// right after the disarm, so the next writer notified again while the relay was busy.
#[tokio::test]
async fn writers_do_not_notify_while_the_relay_drains() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let env = Env::new().await;
    let mut config = env.config(); // fallback 60 s
    config.publish.timeout = Duration::from_secs(60);
    let relay = env.spawn(config).await;
    let observer = env.client().await;
    testkit::wait_until("the idle relay armed", Duration::from_secs(15), || async {
        armed(&observer).await
    })
    .await;

    // Count what writers send on this outbox's channel, with a marker of our own at the end:
    // notifications arrive in commit order, so once the marker is here every earlier one is too.
    let (listener, mut connection) = tokio_postgres::connect(&env.db, tokio_postgres::NoTls)
        .await
        .expect("listener");
    let (tx, mut notifications) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    let channel: String = listener
        .query_one("SELECT channel FROM outbox_wakeup()", &[])
        .await
        .expect("channel")
        .get(0);
    listener
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .expect("listen");

    let nats_pid = Pid::from_raw(env.nats.pid().expect("nats pid") as i32);
    kill(nats_pid, Signal::SIGSTOP).expect("pause nats-server");
    let commits: Commits = Arc::default();
    let mut writer = env.client().await;
    write_one(&mut writer, "first", &commits).await;
    // The relay woke and holds the first event: its batch transaction stays open while the
    // publish waits for the paused broker. (Probing the row with a lock of our own could make the
    // relay's SKIP LOCKED claim miss it.)
    testkit::wait_until(
        "the first event claimed",
        Duration::from_secs(10),
        || async {
            let open: i64 = observer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'outbox-relay'
                   AND state = 'idle in transaction'",
                    &[],
                )
                .await
                .expect("probe")
                .get(0);
            open > 0
        },
    )
    .await;
    for i in 0..10 {
        write_one(&mut writer, &format!("busy-{i}"), &commits).await;
    }
    observer
        .batch_execute(&format!("NOTIFY \"{channel}\", 'marker'"))
        .await
        .expect("marker");
    let mut from_writers = 0;
    loop {
        let payload = tokio::time::timeout(Duration::from_secs(10), notifications.recv())
            .await
            .expect("the marker arrives")
            .expect("listener open");
        if payload == "marker" {
            break;
        }
        from_writers += 1;
    }
    kill(nats_pid, Signal::SIGCONT).expect("resume nats-server");
    assert_eq!(
        from_writers, 1,
        "only the first writer (relay idle and armed) notifies; the ten that commit while it drains do not"
    );
    env.wait_stream_len(11, Duration::from_secs(90)).await;
    relay.stop().await;
}
