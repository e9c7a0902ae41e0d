//! The limit of this machine for the wal scenario's drain: the same messages (subject, headers,
//! payload size, a `Nats-Msg-Id` each) published by a bare async-nats JetStream client, pipelined
//! with as many acks in flight as the relay keeps by default, with no PostgreSQL at all. The wal
//! scenario runs it in the same run as the drains and reports the ratio.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream;
use async_nats::HeaderMap;

use crate::env::*;
use crate::report::Row;

/// Acks in flight: what the relay keeps by default (two batches of 1,000).
const WINDOW: usize = 2000;

/// The backlog's payload for event `g` of `aggregates` aggregates, as jsonb renders
/// `BACKLOG_SQL`'s object (keys by length, then bytes).
pub(crate) fn payload(g: u64, aggregates: u64) -> String {
    format!(
        r#"{{"note": "leave at the door", "step": {}, "status": "confirmed", "currency": "EUR", "order_id": {}, "customer_id": "cust-{:05}", "amount_cents": {}}}"#,
        g / aggregates,
        g % aggregates,
        g % 5000,
        (g * 7919) % 100_000
    )
}

/// The subject of every message of the backlog (one event type).
pub(crate) const SUBJECT: &str = "outbox.order.updated";

/// Event `g` of `aggregates` aggregates as the relay would publish it: its headers (a new id
/// each) and payload.
pub(crate) fn message(g: u64, aggregates: u64) -> (HeaderMap, String) {
    let id = uuid::Uuid::new_v4().to_string();
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", id.as_str());
    headers.insert("Outbox-Event-Id", id.as_str());
    headers.insert("Outbox-Aggregate-Type", "order");
    headers.insert(
        "Outbox-Aggregate-Id",
        format!("order-{}", g % aggregates).as_str(),
    );
    headers.insert("Outbox-Event-Type", "order.updated");
    headers.insert("Outbox-Created-At", "2026-12-05T11:44:54.123456Z");
    (headers, payload(g, aggregates))
}

pub(crate) async fn bare_publisher(
    ctx: Arc<Ctx>,
    scenario: &'static str,
    variant: String,
    backlog: Backlog,
) -> Res<Row> {
    let events = backlog.events;
    let aggregates = (events / backlog.per_aggregate.max(1)).max(1);
    let mut row = Row::new(scenario, &variant);
    reset_stream(&ctx.nats_url).await?;
    let js = jetstream::new(nats_client(&ctx.nats_url).await?);
    let cpu_before = Cpu::read(&ctx, &[]);
    let own_before = proc_cpu(std::process::id(), false);
    let started = Instant::now();
    let mut in_flight = VecDeque::with_capacity(WINDOW);
    for g in 0..events {
        let (headers, payload) = message(g, aggregates);
        let ack = js
            .publish_with_headers(SUBJECT, headers, payload.into())
            .await
            .ctx("publish")?;
        in_flight.push_back(ack);
        if in_flight.len() >= WINDOW {
            if let Some(ack) = in_flight.pop_front() {
                ack.await.ctx("ack")?;
            }
        }
    }
    for ack in in_flight {
        ack.await.ctx("ack")?;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = Cpu::read(&ctx, &[]).per_event(&cpu_before, events);
    let own = (proc_cpu(std::process::id(), false) - own_before) * 1e6 / events.max(1) as f64;
    let (in_stream, span) = stream_span(&ctx.nats_url).await?;
    row.events = Some(in_stream);
    row.seconds = Some(span);
    if span > 0.0 {
        row.events_per_s = Some(in_stream as f64 / span);
    }
    row.note(format!("wall {wall:.2}s"));
    row.note(format!("{WINDOW} acks in flight"));
    row.note(format!("{cpu}; the publisher itself {own:.1} us"));
    if in_stream != events {
        row.note(format!("STREAM HOLDS {in_stream} OF {events}"));
    }
    Ok(row)
}
