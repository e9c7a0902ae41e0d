//! End-to-end demo: a writer that commits business rows together with outbox events, and a plain
//! NATS subscriber that shows each event as the relay publishes it, with its latency from commit to
//! receipt.
//!
//! Needs a database migrated with `outbox-relay migrate` and a running `outbox-relay run` (with
//! `--create-stream`, or an existing stream covering `outbox.>`). `scripts/demo` sets all of that up
//! on throwaway servers:
//!
//! ```text
//! cargo run --example demo -- --database-url postgres://postgres@127.0.0.1:5432/postgres \
//!     --nats-url nats://127.0.0.1:4222 --events 20 --interval-ms 200
//! ```
//!
//! Exits 0 when every event arrived within 10 s of the last commit, 1 otherwise.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use outbox_relay::wire::{HEADER_AGGREGATE_ID, HEADER_EVENT_ID};
use outbox_relay::{enqueue, NewEvent};
use uuid::Uuid;

/// How long to wait for the last events after the last commit.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Parser)]
#[command(about = "Writes orders with outbox events and shows them arriving over NATS")]
struct Args {
    /// PostgreSQL URL of the database holding outbox_events.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    #[arg(
        long,
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        hide_env_values = true
    )]
    nats_url: String,
    /// Subject to subscribe to (the relay publishes to <prefix>.<event_type>).
    #[arg(long, default_value = "outbox.>")]
    subject: String,
    /// Number of orders to write.
    #[arg(long, default_value_t = 20)]
    events: u32,
    /// Pause between two orders.
    #[arg(long, default_value_t = 200)]
    interval_ms: u64,
}

#[derive(serde::Serialize)]
struct OrderCreated<'a> {
    order_id: i64,
    customer: &'a str,
    amount_cents: i64,
}

/// Event ids written by this run, with the instant just before their commit.
type Commits = Arc<Mutex<HashMap<Uuid, Instant>>>;

struct Received {
    id: Uuid,
    latency: Duration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("demo failed: {}", outbox_relay::redact(&e.to_string()));
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    // Subscribe first, and flush so the server knows about the subscription before the first
    // event can be published.
    let nats = async_nats::connect(args.nats_url.as_str()).await?;
    let subscription = nats.subscribe(args.subject.clone()).await?;
    nats.flush().await?;

    let mut db = outbox_relay::connect(&args.database_url, "outbox-relay-demo").await?;
    outbox_relay::ops::Outbox::new(&mut db, None)
        .check()
        .await?;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS demo_orders (
             id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             customer     text        NOT NULL,
             amount_cents bigint      NOT NULL,
             created_at   timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;

    let commits: Commits = Arc::default();
    let (tx_received, mut rx_received) = tokio::sync::mpsc::unbounded_channel();
    let receiver = tokio::spawn(receive(subscription, commits.clone(), tx_received));

    println!(
        "writing {} orders, one every {} ms; subscribed to {}",
        args.events, args.interval_ms, args.subject
    );
    let customers = ["ada", "grace", "edsger", "barbara", "donald"];
    for i in 0..args.events {
        let customer = customers[i as usize % customers.len()];
        let amount_cents = 1_000 + i64::from(i) * 125;

        let tx = db.transaction().await?;
        let order_id: i64 = tx
            .query_one(
                "INSERT INTO demo_orders (customer, amount_cents) VALUES ($1, $2) RETURNING id",
                &[&customer, &amount_cents],
            )
            .await?
            .get(0);
        let payload = OrderCreated {
            order_id,
            customer,
            amount_cents,
        };
        let event = NewEvent::new("order", order_id.to_string(), "order.created", &payload)?;
        let event_id = enqueue(&tx, &event).await?;
        // The relay cannot see the row before the commit, so the instant is always recorded
        // before the event can arrive.
        commits
            .lock()
            .expect("commits lock")
            .insert(event_id, Instant::now());
        if let Err(e) = tx.commit().await {
            commits.lock().expect("commits lock").remove(&event_id);
            return Err(e.into());
        }
        println!("committed order {order_id:>4} with event {event_id}");

        if i + 1 < args.events {
            tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
        }
    }

    let expected = commits.lock().expect("commits lock").len();
    let mut latencies: HashMap<Uuid, Duration> = HashMap::new();
    let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    while latencies.len() < expected {
        match tokio::time::timeout_at(deadline, rx_received.recv()).await {
            Ok(Some(Received { id, latency })) => {
                latencies.entry(id).or_insert(latency);
            }
            Ok(None) => {
                eprintln!("the NATS subscription ended early");
                break;
            }
            Err(_) => break,
        }
    }
    receiver.abort();

    let mut sorted: Vec<Duration> = latencies.values().copied().collect();
    sorted.sort();
    println!();
    println!("received {}/{} events", latencies.len(), expected);
    if !sorted.is_empty() {
        println!(
            "commit -> receive latency: median {:.1} ms, max {:.1} ms",
            ms(median(&sorted)),
            ms(*sorted.last().expect("not empty"))
        );
    }
    if latencies.len() < expected {
        let missing: Vec<Uuid> = commits
            .lock()
            .expect("commits lock")
            .keys()
            .filter(|id| !latencies.contains_key(id))
            .copied()
            .collect();
        eprintln!(
            "{} events did not arrive within {:?} of the last commit: {missing:?}",
            missing.len(),
            DRAIN_TIMEOUT
        );
        eprintln!("is `outbox-relay run` running against the same database and NATS server?");
        return Ok(false);
    }
    Ok(true)
}

/// Prints every message on the subscription and reports the events of this run to `main`.
async fn receive(
    mut subscription: async_nats::Subscriber,
    commits: Commits,
    received: tokio::sync::mpsc::UnboundedSender<Received>,
) {
    let mut seen = std::collections::HashSet::new();
    while let Some(msg) = subscription.next().await {
        let now = Instant::now();
        let headers = msg.headers.as_ref();
        let Some(id) = outbox_relay::consumer::event_id(headers) else {
            println!(
                "received {} without an {HEADER_EVENT_ID} header",
                msg.subject
            );
            continue;
        };
        let aggregate_id = headers
            .and_then(|h| h.get(HEADER_AGGREGATE_ID))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let payload = String::from_utf8_lossy(&msg.payload);
        let committed_at = commits.lock().expect("commits lock").get(&id).copied();
        let Some(committed_at) = committed_at else {
            println!(
                "received {} {HEADER_EVENT_ID}={id} (not written by this run)",
                msg.subject
            );
            continue;
        };
        let latency = now.saturating_duration_since(committed_at);
        // At-least-once: a publish retried by the relay reaches a core subscriber again (JetStream
        // stores it once). Show it, count it once.
        let repeat = if seen.insert(id) { "" } else { " (repeat)" };
        println!(
            "received {} {HEADER_EVENT_ID}={id} aggregate={aggregate_id} payload={payload} \
             latency={:.1} ms{repeat}",
            msg.subject,
            ms(latency)
        );
        if received.send(Received { id, latency }).is_err() {
            return;
        }
    }
}

fn median(sorted: &[Duration]) -> Duration {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
