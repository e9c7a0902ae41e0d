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
//! ```text
//! cargo run --example consumer -- --database-url postgres://postgres@127.0.0.1:5432/postgres \
//!     --nats-url nats://127.0.0.1:4222 --durable example-consumer --max 20
//! ```

use std::process::ExitCode;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::AckKind;
use clap::Parser;
use futures::StreamExt;
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
}

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
         )",
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
                ack_wait: Duration::from_secs(30),
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
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    while args.max.is_none_or(|max| counts.messages < max) {
        let next = tokio::select! {
            _ = &mut shutdown => {
                println!("interrupted");
                break;
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

        match handle(&mut db, &msg, event_id).await {
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
                if db.is_closed() {
                    db = outbox_relay::connect(&args.database_url, "outbox-example-consumer")
                        .await?;
                }
            }
        }
    }

    println!(
        "done: {} messages, {} handled, {} duplicates skipped, {} failed",
        counts.messages, counts.handled, counts.duplicates, counts.failed
    );
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
        // Outbox-Aggregate-Id, or ce-subject when the relay runs with --headers cloudevents.
        let aggregate_id =
            outbox_relay::consumer::aggregate_id(msg.headers.as_ref()).map(str::to_string);
        let payload: Option<serde_json::Value> = serde_json::from_slice(&msg.payload).ok();
        tx.execute(
            "INSERT INTO example_handled (event_id, subject, aggregate_id, payload)
             VALUES ($1, $2, $3, $4)",
            &[&event_id, &msg.subject.as_str(), &aggregate_id, &payload],
        )
        .await?;
        println!(
            "{event_id}: handled {} aggregate={} payload={}",
            msg.subject,
            aggregate_id.as_deref().unwrap_or("-"),
            String::from_utf8_lossy(&msg.payload)
        );
    }
    tx.commit().await?;
    Ok(first)
}
