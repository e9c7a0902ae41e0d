//! Metrics, health endpoints and trace propagation.

use std::collections::HashMap;
use std::time::Duration;

use outbox_relay::{enqueue, NewEvent};
use testkit::outbox::Env;
use testkit::{free_addr, http_get, wait_until};

/// Sample lines `name{labels} value` summed by metric name (labels dropped).
pub(crate) fn samples(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name_labels, value) = line.rsplit_once(' ').expect("sample line");
        let name = name_labels.split('{').next().expect("name").to_string();
        *out.entry(name).or_insert(0.0) += value.parse::<f64>().expect("value");
    }
    out
}

fn sample_with(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .map(|l| {
            l.rsplit_once(' ')
                .expect("sample")
                .1
                .parse::<f64>()
                .expect("value")
        })
        .sum()
}

#[tokio::test]
async fn metrics_match_the_database_during_and_after_a_drain() {
    let env = Env::new().await;
    env.insert_sql(5_000, "m", "order.created").await;
    let client = env.client().await;
    client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'bad', 'bad subject', '{}')",
            &[],
        )
        .await
        .expect("poison");
    let addr = free_addr();
    let mut config = env.config();
    config.metrics.addr = Some(addr);
    config.metrics.stats_interval = Duration::from_millis(100);
    config.batch.size = 100;
    let relay = env.spawn(config).await;

    // During the drain: the endpoint answers and counters only grow.
    let last = std::cell::Cell::new(0.0);
    let scrapes_during = std::cell::Cell::new(0);
    wait_until("the drain", Duration::from_secs(60), || async {
        if env
            .count("processed_at IS NULL AND dead_lettered_at IS NULL")
            .await
            == 0
        {
            return true;
        }
        if let Some((200, body)) = http_get(addr, "/metrics").await {
            let published = samples(&body)
                .get("outbox_events_published_total")
                .copied()
                .unwrap_or(0.0);
            assert!(
                published >= last.get(),
                "counter went down: {} -> {published}",
                last.get()
            );
            last.set(published);
            scrapes_during.set(scrapes_during.get() + 1);
        }
        false
    })
    .await;
    assert!(scrapes_during.get() > 0, "no scrape during the drain");

    wait_until(
        "gauges refreshed after the drain",
        Duration::from_secs(10),
        || async {
            let Some((200, body)) = http_get(addr, "/metrics").await else {
                return false;
            };
            let s = samples(&body);
            s.get("outbox_events_pending") == Some(&0.0)
                && s.get("outbox_dead_letters") == Some(&1.0)
        },
    )
    .await;
    let (_, body) = http_get(addr, "/metrics").await.expect("scrape");
    let s = samples(&body);
    let processed = env.count("processed_at IS NOT NULL").await as f64;
    assert_eq!(processed, 5_000.0);
    assert_eq!(
        s["outbox_events_published_total"], processed,
        "published == processed rows"
    );
    assert_eq!(
        sample_with(
            &body,
            "outbox_events_published_total",
            "event_type=\"order.created\""
        ),
        processed
    );
    assert_eq!(s["outbox_events_dead_lettered_total"], 1.0);
    assert_eq!(
        sample_with(&body, "outbox_events_failed_total", "reason=\"rejected\""),
        1.0
    );
    assert_eq!(s["outbox_oldest_pending_age_seconds"], 0.0);
    assert_eq!(s["outbox_listener_connected"], 1.0);
    assert_eq!(s["outbox_broker_connected"], 1.0);
    assert!(s["outbox_batch_duration_seconds_count"] >= 50.0);
    assert_eq!(s["outbox_commit_to_publish_seconds_count"], processed);
    assert!(sample_with(&body, "outbox_wakeups_total", "reason=\"backlog\"") > 0.0);
    assert!(body.contains("outbox_relay_build_info"), "build info");

    // A notification is counted as such.
    let before = sample_with(&body, "outbox_wakeups_total", "reason=\"notify\"");
    env.insert_sql(1, "n", "order.created").await;
    env.wait_stream_len(5_001, Duration::from_secs(10)).await;
    let (_, body) = http_get(addr, "/metrics").await.expect("scrape");
    assert!(sample_with(&body, "outbox_wakeups_total", "reason=\"notify\"") > before);
    relay.stop().await;
}

#[tokio::test]
async fn readyz_follows_the_broker() {
    let mut env = Env::new().await;
    let addr = free_addr();
    let mut config = env.config();
    config.metrics.addr = Some(addr);
    config.metrics.stats_interval = Duration::from_millis(100);
    let relay = env.spawn(config).await;
    wait_until("ready", Duration::from_secs(10), || async {
        matches!(http_get(addr, "/readyz").await, Some((200, _)))
    })
    .await;
    assert_eq!(http_get(addr, "/healthz").await.map(|r| r.0), Some(200));

    env.nats.kill();
    wait_until(
        "not ready while NATS is down",
        Duration::from_secs(15),
        || async {
            match http_get(addr, "/readyz").await {
                Some((503, body)) => {
                    let v: serde_json::Value = serde_json::from_str(&body).expect("json reason");
                    v["broker"] == false && v["database"] == true
                }
                _ => false,
            }
        },
    )
    .await;
    assert_eq!(
        http_get(addr, "/healthz").await.map(|r| r.0),
        Some(200),
        "alive all the same"
    );

    env.nats.start_again();
    wait_until("ready again", Duration::from_secs(30), || async {
        matches!(http_get(addr, "/readyz").await, Some((200, _)))
    })
    .await;
    relay.stop().await;
}

#[tokio::test]
async fn traceparent_given_at_enqueue_arrives_as_a_header() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let mut client = env.client().await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tx = client.transaction().await.expect("tx");
    let id = enqueue(
        &tx,
        &NewEvent::new(
            "order",
            "t-1",
            "order.created",
            &serde_json::json!({"x": 1}),
        )
        .expect("event")
        .with_traceparent(tp)
        .with_header("tracestate", "vendor=abc"),
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    assert_eq!(stored[0].event_id(), id);
    assert_eq!(stored[0].headers["traceparent"], tp);
    assert_eq!(stored[0].headers["tracestate"], "vendor=abc");
    relay.stop().await;
}

/// `--metrics-event-types-max 2`: the first two event types published keep their series, the
/// other three are summed under `event_type="other"`, and nothing is lost from the totals.
#[tokio::test]
async fn event_type_label_is_capped() {
    let env = Env::new().await;
    let addr = free_addr();
    let addr_arg = addr.to_string();
    let relay = testkit::outbox::CliRelay::run_serving(
        &env,
        &[
            "--metrics-addr",
            &addr_arg,
            "--metrics-event-types-max",
            "2",
        ],
    );
    // One type after the other, so that "first seen" is known: a, then b, then the rest.
    env.insert_sql(1, "a", "order.a").await;
    env.wait_stream_len(1, Duration::from_secs(15)).await;
    env.insert_sql(2, "b", "order.b").await;
    env.wait_stream_len(3, Duration::from_secs(15)).await;
    env.insert_sql(3, "c", "order.c").await;
    env.insert_sql(4, "d", "order.d").await;
    env.insert_sql(5, "e", "order.e").await;
    env.wait_stream_len(15, Duration::from_secs(15)).await;

    let published = |body: &str| -> Vec<(String, f64)> {
        let mut series: Vec<(String, f64)> = body
            .lines()
            .filter_map(|l| l.strip_prefix("outbox_events_published_total{event_type=\""))
            .filter_map(|l| {
                let (event_type, rest) = l.split_once("\"}")?;
                Some((event_type.to_string(), rest.trim().parse().ok()?))
            })
            .collect();
        series.sort_by(|x, y| x.0.cmp(&y.0));
        series
    };
    let expected = vec![
        ("order.a".to_string(), 1.0),
        ("order.b".to_string(), 2.0),
        ("other".to_string(), 12.0),
    ];
    // The counters are incremented after the commit that the stream length does not wait for.
    wait_until("capped series scraped", Duration::from_secs(10), || async {
        http_get(addr, "/metrics")
            .await
            .is_some_and(|(_, body)| published(&body) == expected)
    })
    .await;
    assert_eq!(relay.terminate(), Some(0));
}

/// A relay's row in `outbox_relays`: (source, slot, version, pid, published_total, a publish
/// recorded), or `None` while there is none.
type Reported = (String, Option<String>, String, i32, i64, bool);

async fn reported(env: &Env) -> Vec<Reported> {
    env.client()
        .await
        .query(
            "SELECT source, slot, version, pid, published_total, last_publish_at IS NOT NULL
             FROM outbox_relays ORDER BY started_at",
            &[],
        )
        .await
        .expect("outbox_relays")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

/// Each relay reports itself in `outbox_relays` every stats interval (source, slot, version, its
/// published count and last publish, from its own metrics), and takes its row out when it stops.
#[tokio::test]
async fn relays_report_themselves_and_leave_when_they_stop() {
    let env = Env::new().await;
    let pid = i32::try_from(std::process::id()).expect("pid");
    let version = format!("outbox-relay {}", env!("CARGO_PKG_VERSION"));
    let mut config = env.config();
    config.metrics.stats_interval = Duration::from_millis(200);
    let relay = env.spawn(config).await;
    env.insert_sql(5, "r", "order.created").await;
    env.wait_stream_len(5, Duration::from_secs(30)).await;
    wait_until(
        "the table relay's report",
        Duration::from_secs(30),
        || async {
            reported(&env).await == [("table".into(), None, version.clone(), pid, 5, true)]
        },
    )
    .await;

    let mut config = env.wal_config().await;
    config.metrics.stats_interval = Duration::from_millis(200);
    let wal = env.spawn(config).await;
    let slot = env.slot_name();
    wait_until(
        "the wal relay's report",
        Duration::from_secs(30),
        || async {
            let rows = reported(&env).await;
            rows.len() == 2
                && rows[1]
                    == (
                        "wal".into(),
                        Some(slot.clone()),
                        version.clone(),
                        pid,
                        0,
                        false,
                    )
        },
    )
    .await;
    relay.stop().await;
    wal.stop().await;
    assert_eq!(reported(&env).await, [], "a clean stop takes its row");
}
