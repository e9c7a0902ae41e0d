//! Clustered JetStream: a three-node nats-server cluster with a three-replica stream loses a node
//! (SIGKILL) in the middle of a 20,000-event drain. The killed node is the stream leader (moved
//! there beforehand by step-downs): either the node the relay is connected to, so the relay has to
//! reconnect to a survivor while the stream elects a new leader, or another one. The ledger must
//! still hold: every event in the stream exactly once, in `seq` order per aggregate, and, with
//! `--max-attempts 1`, nothing dead-lettered (no failure during the failover blamed on an event).

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use outbox_relay::metrics::{EventTypeLabel, FailedLabels};
use outbox_relay::{Relay, RelayConfig};
use testkit::outbox::{assert_ledger, Env, RunningRelay, Stored, STREAM};
use testkit::{wait_until_every, NatsServer};
use tokio_util::sync::CancellationToken;

const NODES: usize = 3;
const AGGREGATE_TYPES: [&str; 2] = ["order", "invoice"];
const IDS_PER_TYPE: i32 = 200;
const EVENTS_PER_AGGREGATE: i32 = 50;
const TOTAL: u64 = 20_000; // 2 types x 200 ids x 50 events
const KILL_AT: u64 = 5_000;

/// Connection name of the relay's NATS client (see `publisher::connect`).
const RELAY_CONNECTION_NAME: &str = "outbox-relay";

/// Which node is SIGKILLed in the middle of the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// The node serving the relay's connection, made the stream leader too.
    RelaysNode,
    /// The stream leader, made a node that serves neither the relay nor the JetStream meta group.
    StreamLeaderOnly,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_killed_mid_drain_loses_and_duplicates_nothing() {
    kill_mid_drain(Victim::RelaysNode, 1).await;
}

/// The stream leader dies while the relay's node and the meta leader live: until a replica takes
/// over, publishes meet "no responders" while the stream still answers lookups (the meta leader
/// knows it). That is the broker's trouble, not the events': with `max_attempts = 1` a row blamed
/// for it would be dead-lettered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_leader_killed_mid_drain_spends_no_attempts() {
    kill_mid_drain(Victim::StreamLeaderOnly, 1).await;
}

async fn kill_mid_drain(victim_kind: Victim, max_attempts: u32) {
    let _turn = testkit::heavy().await;
    init_tracing();
    let started = Instant::now();
    let mut nodes = tokio::task::spawn_blocking(|| NatsServer::start_cluster(NODES))
        .await
        .expect("start cluster");
    let urls = nodes
        .iter()
        .map(NatsServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let client = async_nats::ConnectOptions::new()
        .name("cluster-test")
        .connect(nodes.iter().map(NatsServer::url).collect::<Vec<_>>())
        .await
        .expect("connect to the cluster");
    let js = jetstream::new(client.clone());
    create_replicated_stream(&js).await;
    eprintln!(
        "cluster up, stream {STREAM} (R{NODES}) created after {:.1?}",
        started.elapsed()
    );

    let db = testkit::shared_pg().create_migrated_database().await;
    let pg = testkit::pg_client(&db).await;

    let config = {
        let mut config = RelayConfig::new(db.clone());
        config.nats.url = urls.into();
        config.publish.timeout = Duration::from_secs(2);
        config.source.fallback_interval = Duration::from_secs(1);
        config.retry.initial = Duration::from_millis(100);
        config.retry.max = Duration::from_secs(1);
        config.batch.size = 500;
        config.retry.max_attempts = max_attempts;
        config
    };
    let relay = Relay::new(config).await.expect("valid config");
    let metrics = relay.metrics();
    // The relay connects when it runs; the table is still empty, so it waits idle.
    let token = CancellationToken::new();
    let relay = RunningRelay {
        handle: tokio::spawn(relay.run(token.clone())),
        token,
    };

    let relays_node = tokio::task::block_in_place(|| relay_node(&nodes, Duration::from_secs(10)))
        .expect("no node lists the relay's connection");
    let meta_leader = tokio::task::block_in_place(|| meta_leader(&nodes));
    let victim = match victim_kind {
        Victim::RelaysNode => relays_node,
        Victim::StreamLeaderOnly => (0..NODES)
            .find(|&i| i != relays_node && Some(name_of(&nodes[i])) != meta_leader)
            .or_else(|| (0..NODES).find(|&i| i != relays_node))
            .expect("three nodes"),
    };
    let victim_name = name_of(&nodes[victim]);
    let leader = move_stream_leader(&client, &js, &victim_name, 30).await;
    if victim_kind == Victim::StreamLeaderOnly {
        assert_eq!(leader, victim_name, "the stream leader could not be moved");
    }
    eprintln!(
        "relay connected to {}; stream leader {leader}; meta leader {}; victim {victim_name}",
        name_of(&nodes[relays_node]),
        meta_leader.as_deref().unwrap_or("?")
    );

    // One row per (step, type, id), aggregates interleaved: seq order is the step order within
    // every aggregate.
    let inserted = pg
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT t, t || '-' || a, t || '.step', jsonb_build_object('step', s, 'agg', a)
             FROM generate_series(1, $2::int) s, generate_series(1, $1::int) a,
                  unnest($3::text[]) t
             ORDER BY s, a, t",
            &[
                &IDS_PER_TYPE,
                &EVENTS_PER_AGGREGATE,
                &AGGREGATE_TYPES.to_vec(),
            ],
        )
        .await
        .expect("insert");
    assert_eq!(inserted, TOTAL);
    let drain_started = Instant::now();
    // Samples the relay's broker gauge: how long it saw JetStream unavailable (for the log).
    let outage = {
        let metrics = metrics.clone();
        let token = relay.token.clone();
        tokio::spawn(async move {
            let (mut up_once, mut down) = (false, Duration::ZERO);
            let tick = Duration::from_millis(20);
            while !token.is_cancelled() {
                // 0 before the first batch too: count only after the relay was up once.
                if metrics.broker_connected.get() == 1 {
                    up_once = true;
                } else if up_once {
                    down += tick;
                }
                tokio::time::sleep(tick).await;
            }
            down
        })
    };
    let before_kill = wait_stream_messages(&js, KILL_AT, Duration::from_secs(120)).await;
    let pid = nodes[victim].pid().expect("victim runs");
    tokio::task::block_in_place(|| nodes[victim].kill());
    let killed_at = Instant::now();
    eprintln!(
        "SIGKILLed {victim_name} (pid {pid}) with {before_kill} events in the stream, {:.1?} into the drain",
        drain_started.elapsed()
    );

    wait_drained(&pg, Duration::from_secs(120)).await;
    eprintln!(
        "all {TOTAL} rows processed {:.1?} after the kill ({:.1?} drain)",
        killed_at.elapsed(),
        drain_started.elapsed()
    );
    let row = pg
        .query_one(
            "SELECT count(*) FILTER (WHERE dead_lettered_at IS NOT NULL),
                    count(*) FILTER (WHERE attempts > 0), coalesce(max(attempts), 0)
             FROM outbox_events",
            &[],
        )
        .await
        .expect("count dead letters");
    let (dead, retried, max_attempts): (i64, i64, i32) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(dead, 0, "a lost node dead-letters nothing");
    // What the failover cost, for the log: acks beyond one per event are deduplicated
    // re-publishes; failures that spent no attempt were blamed on the broker.
    let event_types = AGGREGATE_TYPES.map(|t| format!("{t}.step"));
    let acks: u64 = event_types
        .iter()
        .map(|event_type| {
            metrics
                .published
                .get_or_create(&EventTypeLabel {
                    event_type: event_type.clone(),
                })
                .get()
        })
        .sum();
    let failed = |reason: &str| -> u64 {
        event_types
            .iter()
            .map(|event_type| {
                metrics
                    .failed
                    .get_or_create(&FailedLabels {
                        event_type: event_type.clone(),
                        reason: reason.to_string(),
                    })
                    .get()
            })
            .sum()
    };
    eprintln!(
        "{acks} acks for {TOTAL} events; failed publishes: {} timeout, {} broker, {} rejected; \
         {retried} rows spent attempts (at most {max_attempts})",
        failed("timeout"),
        failed("broker"),
        failed("rejected")
    );

    // The relay failed over to a survivor, and the stream has a new leader among them.
    let survivors: Vec<usize> = (0..NODES).filter(|&i| i != victim).collect();
    let now_on = tokio::task::block_in_place(|| relay_node(&nodes, Duration::from_secs(10)))
        .expect("the relay is connected to no surviving node");
    assert_ne!(now_on, victim);
    let new_leader = stream_leader(&js)
        .await
        .expect("the stream has a leader after the kill");
    assert_ne!(new_leader, victim_name, "the killed node still leads");
    eprintln!(
        "relay now on {}, stream leader {new_leader}",
        name_of(&nodes[now_on])
    );
    relay.stop().await;
    let outage = outage.await.expect("gauge sampler");
    eprintln!("the relay saw JetStream unavailable for about {outage:.1?}");

    // Read everything back through a surviving node and check it against the table.
    let env = Env {
        db,
        nats: nodes.remove(survivors[0]),
    };
    let stored = read_stream(&env.js().await).await;
    assert_ledger(&env.written().await, &stored);
    eprintln!("ledger holds; whole test took {:.1?}", started.elapsed());
}

/// `RUST_LOG=outbox_relay=debug cargo test --test it cluster:: -- --nocapture` shows the relay's log.
fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

fn name_of(node: &NatsServer) -> String {
    node.server_name().expect("cluster node").to_string()
}

/// Creates `OUTBOX` with one replica per node. Retried (bounded) until the JetStream meta group
/// has elected a leader and the stream has one too: before that the API fails or does not answer.
async fn create_replicated_stream(js: &jetstream::Context) {
    let config = stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        storage: stream::StorageType::File,
        num_replicas: NODES,
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(5),
            js.get_or_create_stream(config.clone()),
        )
        .await;
        let last_error = match attempt {
            Ok(Ok(_)) => {
                if stream_leader(js).await.is_some() {
                    return;
                }
                "stream has no leader yet".to_string()
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 5 s".to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "could not create the R{NODES} stream within 60 s (the cluster has no JetStream meta leader?): {last_error}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `server_name` of the stream's leader, if the stream answers and has one.
async fn stream_leader(js: &jetstream::Context) -> Option<String> {
    let lookup = tokio::time::timeout(Duration::from_secs(5), js.get_stream(STREAM))
        .await
        .ok()?
        .ok()?;
    lookup.cached_info().cluster.as_ref()?.leader.clone()
}

/// Asks the stream leader to step down until `target` leads (each step-down elects another
/// replica), at most `tries` times. Returns the leader in the end, which is `target` unless the
/// elections kept missing it (then the test still kills the relay's node, which is not the leader).
async fn move_stream_leader(
    client: &async_nats::Client,
    js: &jetstream::Context,
    target: &str,
    tries: usize,
) -> String {
    let mut leader = stream_leader(js).await.expect("stream leader");
    for _ in 0..tries {
        if leader == target {
            break;
        }
        let reply = client
            .request(
                format!("$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}"),
                bytes::Bytes::new(),
            )
            .await
            .expect("stream leader step-down");
        let reply: serde_json::Value =
            serde_json::from_slice(&reply.payload).expect("step-down reply is JSON");
        assert_eq!(
            reply.get("success").and_then(|v| v.as_bool()),
            Some(true),
            "step-down refused: {reply}"
        );
        let previous = leader.clone();
        let new_leader = std::sync::Mutex::new(None);
        wait_until_every(
            "a new stream leader after a step-down",
            Duration::from_secs(15),
            Duration::from_millis(100),
            || async {
                match stream_leader(js).await {
                    Some(l) if l != previous => {
                        *new_leader.lock().unwrap() = Some(l);
                        true
                    }
                    _ => false,
                }
            },
        )
        .await;
        leader = new_leader.into_inner().unwrap().expect("new leader");
    }
    if leader != target {
        eprintln!("note: stream leader stayed off {target} after {tries} step-downs");
    }
    leader
}

/// Index of the running node that serves the relay's client connection (from its `/connz`).
fn relay_node(nodes: &[NatsServer], timeout: Duration) -> Option<usize> {
    let deadline = Instant::now() + timeout;
    loop {
        for (i, node) in nodes.iter().enumerate() {
            if node.pid().is_none() {
                continue;
            }
            let Some(connz) = node.monitor("/connz") else {
                continue;
            };
            let serves_relay = connz["connections"].as_array().is_some_and(|conns| {
                conns
                    .iter()
                    .any(|c| c["name"].as_str() == Some(RELAY_CONNECTION_NAME))
            });
            if serves_relay {
                return Some(i);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The JetStream meta leader as some running node's `/jsz` reports it (for the log).
fn meta_leader(nodes: &[NatsServer]) -> Option<String> {
    nodes
        .iter()
        .filter(|n| n.pid().is_some())
        .filter_map(|n| n.monitor("/jsz"))
        .find_map(|jsz| jsz["meta_cluster"]["leader"].as_str().map(str::to_string))
}

/// Polls the stream's message count every 100 ms until it reaches `n`; returns the count seen.
async fn wait_stream_messages(js: &jetstream::Context, n: u64, timeout: Duration) -> u64 {
    let seen = AtomicU64::new(0);
    wait_until_every(
        &format!("{n} messages in the stream"),
        timeout,
        Duration::from_millis(100),
        || async {
            let lookup = tokio::time::timeout(Duration::from_secs(5), js.get_stream(STREAM)).await;
            let Ok(Ok(s)) = lookup else {
                return false;
            };
            seen.store(s.cached_info().state.messages, AtomicOrdering::Relaxed);
            seen.load(AtomicOrdering::Relaxed) >= n
        },
    )
    .await;
    seen.into_inner()
}

/// Waits until no row is pending; fails at once when a row is dead-lettered (it would stay
/// pending, and it is a failure anyway).
async fn wait_drained(pg: &tokio_postgres::Client, timeout: Duration) {
    wait_until_every(
        "no pending row",
        timeout,
        Duration::from_millis(100),
        || async {
            let row = pg
                .query_one(
                    "SELECT count(*) FILTER (WHERE processed_at IS NULL),
                            count(*) FILTER (WHERE dead_lettered_at IS NOT NULL),
                            max(attempts)
                     FROM outbox_events",
                    &[],
                )
                .await
                .expect("count pending");
            let (pending, dead, attempts): (i64, i64, Option<i32>) =
                (row.get(0), row.get(1), row.get(2));
            assert_eq!(
                dead, 0,
                "{dead} rows dead-lettered while a node was down (max attempts {attempts:?})"
            );
            pending == 0
        },
    )
    .await;
}

/// Every message of the stream, in stream order. Like `Env::stored`, but it tolerates the cluster
/// still settling after the loss of a node: creating a consumer can time out for a while (the meta
/// leader may place it on the dead node), so a failed attempt is retried from the next sequence.
async fn read_stream(js: &jetstream::Context) -> Vec<Stored> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let total = loop {
        let lookup = tokio::time::timeout(Duration::from_secs(5), js.get_stream(STREAM)).await;
        if let Ok(Ok(s)) = lookup {
            break s.cached_info().state.messages as usize;
        }
        assert!(Instant::now() < deadline, "stream info unavailable");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mut out: Vec<Stored> = Vec::with_capacity(total);
    let mut retries = 0;
    while out.len() < total {
        assert!(
            Instant::now() < deadline,
            "read only {} of {total} messages within 120 s ({retries} retries)",
            out.len()
        );
        if retries > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        retries += 1;
        let start_sequence = out.last().map_or(1, |m| m.seq + 1);
        let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(5), js.get_stream(STREAM)).await
        else {
            continue;
        };
        let config = consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence },
            ..Default::default()
        };
        let created = match s.create_consumer(config).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("reader: creating a consumer at seq {start_sequence} failed: {e}");
                continue;
            }
        };
        let Ok(mut messages) = created.messages().await else {
            continue;
        };
        while out.len() < total {
            let msg = match tokio::time::timeout(Duration::from_secs(10), messages.next()).await {
                Ok(Some(Ok(m))) => m,
                other => {
                    eprintln!("reader: stopped at {} of {total}: {other:?}", out.len());
                    break;
                }
            };
            let stored = Stored::from_message(&msg);
            if out.last().is_some_and(|m| stored.seq <= m.seq) {
                continue; // redelivered by a recreated ordered consumer
            }
            out.push(stored);
        }
    }
    if retries > 1 {
        eprintln!("reader: needed {retries} consumers to read {total} messages");
    }
    out
}
