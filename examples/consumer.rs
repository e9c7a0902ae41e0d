//! An idempotent JetStream consumer of the events the relay publishes.
//!
//! JetStream delivers at least once: a message whose ack does not reach the server in time is
//! delivered again, and the relay itself may publish an event twice when an ack from JetStream
//! gets lost (the stream's duplicate window usually absorbs that, but not forever). So every
//! message is handled like this, in one PostgreSQL transaction:
//!
//! 1. `process_once(&tx, event_id)` records the event id in `processed_events`; it returns `false`
//!    when the id is already there, i.e. the event was handled before;
//! 2. on the first delivery the event is handled, here by inserting it into `example_handled`;
//! 3. commit;
//! 4. only then ack the message.
//!
//! Why ack after the commit: acking first and crashing before the commit would lose the event (the
//! server never sends it again, the database never saw it). Acking after the commit only risks the
//! opposite: a crash between commit and ack redelivers the message, and `process_once` then finds
//! its id and the handler is skipped. The database, not the broker, decides what was handled.
//!
//! With `--transactions`, the events of one database transaction (an order and its lines) are
//! handled together: the consumer holds each message, unacknowledged, until its transaction is
//! whole (the `Outbox-Transaction-*` headers say which transaction and how many events; see
//! `outbox_relay::consumer::Transactions`), then handles them in one PostgreSQL transaction
//! (`process_many_once` skips the ones handled before) and acks them all after the commit. A
//! transaction still incomplete after `--transaction-wait` (an event of it dead-lettered at the
//! relay, say) is handled as far as it came, one event at a time, with a warning.
//!
//! ```text
//! cargo run --example consumer -- --database-url postgres://postgres@127.0.0.1:5432/postgres \
//!     --nats-url nats://127.0.0.1:4222 --durable example-consumer --max 20 [--transactions]
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::{AckKind, Message};
use clap::Parser;
use futures::StreamExt;
use outbox_relay::consumer::{Collected, Transactions};
use outbox_relay::wire::{CE_ID, HEADER_EVENT_ID};
use uuid::Uuid;

#[derive(Debug, Parser)]
#[command(about = "Idempotent JetStream consumer of outbox events")]
struct Args {
    /// PostgreSQL URL of the consumer's database (needs the `processed_events` table that
    /// `outbox-relay migrate` creates).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    #[arg(
        long,
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        hide_env_values = true
    )]
    nats_url: String,
    /// The relay's stream.
    #[arg(long, env = "OUTBOX_STREAM", default_value = "OUTBOX")]
    stream: String,
    /// Name of the durable pull consumer (created when missing; it remembers what was acked).
    #[arg(long, default_value = "example-consumer")]
    durable: String,
    /// Only these subjects, for example `outbox.order.>` (default: the whole stream).
    #[arg(long)]
    filter_subject: Option<String>,
    /// Stop after this many messages (default: run until Ctrl-C).
    #[arg(long)]
    max: Option<u64>,
    /// Handle each database transaction's events together, once all have arrived.
    #[arg(long)]
    transactions: bool,
    /// With --transactions: how long to wait for the rest of a transaction before handling what
    /// came of it one event at a time.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    transaction_wait: Duration,
}

/// Messages held at most with --transactions (the consumer's max_ack_pending is set above it).
const HELD_AT_MOST: usize = 10_000;

#[derive(Default)]
struct Counts {
    messages: u64,
    handled: u64,
    duplicates: u64,
    failed: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("consumer failed: {}", outbox_relay::redact(&e.to_string()));
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut db = outbox_relay::connect(&args.database_url, "outbox-example-consumer").await?;
    outbox_relay::ops::Outbox::new(&mut db, None)
        .check()
        .await?;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS example_handled (
             event_id     uuid        PRIMARY KEY,
             subject      text        NOT NULL,
             aggregate_id text,
             payload      jsonb,
             handled_at   timestamptz NOT NULL DEFAULT now()
         );
         ALTER TABLE example_handled ADD COLUMN IF NOT EXISTS transaction_id numeric",
    )
    .await?;

    let nats = async_nats::connect(args.nats_url.as_str()).await?;
    let js = async_nats::jetstream::new(nats);
    let stream = js.get_stream(&args.stream).await?;
    let consumer = stream
        .get_or_create_consumer(
            &args.durable,
            pull::Config {
                durable_name: Some(args.durable.clone()),
                ack_policy: AckPolicy::Explicit,
                deliver_policy: DeliverPolicy::All,
                // Held messages stay unacknowledged until their transaction is whole.
                ack_wait: Duration::from_secs(30) + args.transaction_wait,
                max_ack_pending: (HELD_AT_MOST + 1_000) as i64,
                filter_subject: args.filter_subject.clone().unwrap_or_default(),
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer.messages().await?;
    println!(
        "consuming stream {} as durable consumer {}{}",
        args.stream,
        args.durable,
        args.max
            .map(|n| format!(", stopping after {n} messages"))
            .unwrap_or_default()
    );

    let mut counts = Counts::default();
    let mut waiting = Waiting {
        transactions: Transactions::new(HELD_AT_MOST),
        since: HashMap::new(),
    };
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    while args.max.is_none_or(|max| counts.messages < max) {
        let next = tokio::select! {
            _ = &mut shutdown => {
                println!("interrupted");
                break;
            }
            // Wakes to give up on transactions waited for too long.
            _ = tokio::time::sleep(Duration::from_secs(1)), if waiting.transactions.held() > 0 => {
                for (txid, held) in waiting.overdue(args.transaction_wait) {
                    eprintln!(
                        "transaction {txid}: {} of its events came within {:?}; handling them one at a time",
                        held.len(),
                        args.transaction_wait
                    );
                    for (event_id, msg) in held {
                        handle_alone(&mut db, &args, &mut counts, &msg, event_id).await?;
                    }
                }
                continue;
            }
            next = messages.next() => next,
        };
        let msg = match next {
            Some(Ok(msg)) => msg,
            Some(Err(e)) => {
                use pull::MessagesErrorKind as K;
                match e.kind() {
                    K::ConsumerDeleted | K::PushBasedConsumer => return Err(e.into()),
                    // Missed heartbeats and the like: the stream recovers by itself.
                    _ => {
                        eprintln!("pull error (continuing): {e}");
                        continue;
                    }
                }
            }
            None => break,
        };
        counts.messages += 1;

        // Outbox-Event-Id, or ce-id with --headers cloudevents: either is the outbox id.
        let Some(event_id) = outbox_relay::consumer::event_id(msg.headers.as_ref()) else {
            // Not published by the relay: it cannot be deduplicated, so do not guess.
            eprintln!(
                "{}: no valid {HEADER_EVENT_ID} or {CE_ID} header, terminating the message",
                msg.subject
            );
            msg.ack_with(AckKind::Term).await?;
            counts.failed += 1;
            continue;
        };

        let position = outbox_relay::consumer::transaction(msg.headers.as_ref());
        match position.filter(|_| args.transactions) {
            Some(position) => {
                waiting
                    .since
                    .entry(position.id)
                    .or_insert_with(Instant::now);
                match waiting.transactions.add(position, (event_id, msg)) {
                    Collected::Whole(messages) => {
                        waiting.since.remove(&position.id);
                        handle_whole(&mut db, &args, &mut counts, position.id, messages).await?;
                    }
                    Collected::Held => {}
                    // The copy held already is acked once its transaction is handled.
                    Collected::Duplicate(_) => counts.duplicates += 1,
                    Collected::Refused((event_id, msg)) => {
                        handle_alone(&mut db, &args, &mut counts, &msg, event_id).await?;
                    }
                }
            }
            None => handle_alone(&mut db, &args, &mut counts, &msg, event_id).await?,
        }
    }

    println!(
        "done: {} messages, {} handled, {} duplicates skipped, {} failed",
        counts.messages, counts.handled, counts.duplicates, counts.failed
    );
    Ok(())
}

/// Transactions waiting for the rest of their events, and since when.
struct Waiting {
    transactions: Transactions<(Uuid, Message)>,
    since: HashMap<u64, Instant>,
}

impl Waiting {
    /// The transactions waited for longer than `wait`, with what came of them.
    fn overdue(&mut self, wait: Duration) -> Vec<(u64, Vec<(Uuid, Message)>)> {
        let late: Vec<u64> = self
            .since
            .iter()
            .filter(|(_, at)| at.elapsed() >= wait)
            .map(|(txid, _)| *txid)
            .collect();
        late.into_iter()
            .map(|txid| {
                self.since.remove(&txid);
                (txid, self.transactions.take(txid))
            })
            .collect()
    }
}

/// One event alone: handled in a transaction of its own, then acked (or naked after a failure).
async fn handle_alone(
    db: &mut tokio_postgres::Client,
    args: &Args,
    counts: &mut Counts,
    msg: &Message,
    event_id: Uuid,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match handle(db, msg, event_id).await {
        Ok(first) => {
            // Committed: now the ack. If it gets lost, the redelivery is a duplicate.
            if let Err(e) = msg.ack().await {
                eprintln!("{event_id}: ack failed ({e}); it will be redelivered");
            }
            if first {
                counts.handled += 1;
            } else {
                counts.duplicates += 1;
                println!("{event_id}: already handled, skipped (redelivery)");
            }
        }
        Err(e) => {
            // Rolled back: have it delivered again a little later.
            counts.failed += 1;
            eprintln!(
                "{event_id}: handling failed, will retry: {}",
                outbox_relay::redact(&e.to_string())
            );
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            reconnect_if_lost(db, args).await?;
        }
    }
    Ok(())
}

/// A whole database transaction's events: handled in one PostgreSQL transaction (the ones
/// handled before skipped), then every message acked.
async fn handle_whole(
    db: &mut tokio_postgres::Client,
    args: &Args,
    counts: &mut Counts,
    txid: u64,
    messages: Vec<(Uuid, Message)>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let handled = async {
        let tx = db.transaction().await?;
        let ids: Vec<Uuid> = messages.iter().map(|(id, _)| *id).collect();
        let first = outbox_relay::consumer::process_many_once(&tx, &ids).await?;
        for (event_id, msg) in messages.iter().filter(|(id, _)| first.contains(id)) {
            record(&tx, msg, *event_id, Some(txid)).await?;
        }
        tx.commit().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(first.len())
    }
    .await;
    match handled {
        Ok(new) => {
            println!(
                "transaction {txid}: {} events handled together ({} new)",
                messages.len(),
                new
            );
            counts.handled += new as u64;
            counts.duplicates += (messages.len() - new) as u64;
            for (event_id, msg) in &messages {
                if let Err(e) = msg.ack().await {
                    eprintln!("{event_id}: ack failed ({e}); it will be redelivered");
                }
            }
        }
        Err(e) => {
            counts.failed += messages.len() as u64;
            eprintln!(
                "transaction {txid}: handling failed, will retry: {}",
                outbox_relay::redact(&e.to_string())
            );
            for (_, msg) in &messages {
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
            }
            reconnect_if_lost(db, args).await?;
        }
    }
    Ok(())
}

async fn reconnect_if_lost(
    db: &mut tokio_postgres::Client,
    args: &Args,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if db.is_closed() {
        *db = outbox_relay::connect(&args.database_url, "outbox-example-consumer").await?;
    }
    Ok(())
}

/// One transaction: dedupe, handle, commit. Returns whether this was the first delivery.
async fn handle(
    db: &mut tokio_postgres::Client,
    msg: &async_nats::jetstream::Message,
    event_id: Uuid,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let tx = db.transaction().await?;
    let first = outbox_relay::process_once(&tx, event_id).await?;
    if first {
        record(&tx, msg, event_id, None).await?;
    }
    tx.commit().await?;
    Ok(first)
}

/// The handling itself: here, a row of `example_handled` (with the event's database transaction
/// when it was handled with the rest of it).
async fn record(
    tx: &tokio_postgres::Transaction<'_>,
    msg: &Message,
    event_id: Uuid,
    txid: Option<u64>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Outbox-Aggregate-Id, or ce-subject when the relay runs with --headers cloudevents.
    let aggregate_id =
        outbox_relay::consumer::aggregate_id(msg.headers.as_ref()).map(str::to_string);
    let payload: Option<serde_json::Value> = serde_json::from_slice(&msg.payload).ok();
    let txid = txid.map(|t| t.to_string());
    tx.execute(
        "INSERT INTO example_handled (event_id, subject, aggregate_id, payload, transaction_id)
         VALUES ($1, $2, $3, $4, $5::text::numeric)",
        &[
            &event_id,
            &msg.subject.as_str(),
            &aggregate_id,
            &payload,
            &txid,
        ],
    )
    .await?;
    println!(
        "{event_id}: handled {} aggregate={} payload={}",
        msg.subject,
        aggregate_id.as_deref().unwrap_or("-"),
        String::from_utf8_lossy(&msg.payload)
    );
    Ok(())
}
