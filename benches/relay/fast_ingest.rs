//! Fast-ingest batches (ADR-50, nats-server 2.14+, a stream with `allow_batched`) against today's
//! per-message acks: the bare publisher of `bare.rs` with the same messages sent through
//! fast-ingest batches (the relay's own protocol code, `src/publisher/fast.rs`, compiled here as it
//! is), and the drains of both sources with `--publish-batches fast-ingest`. The wal scenario runs
//! them beside its rows, in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::bare;
use crate::drain::{drain_variant, Drainer};
use crate::env::*;
use crate::report::*;

#[allow(dead_code)]
#[path = "../../src/publisher/fast.rs"]
mod fast;

/// Events per fast-ingest batch and batches at once: what the relay does by default (a claim of
/// 1,000, two claims in flight).
const BATCH: u64 = 1000;
const BATCHES_AT_ONCE: usize = 2;

/// The bare publisher's messages (`bare.rs`) through fast-ingest batches of `BATCH`, with
/// `BATCHES_AT_ONCE` batches in flight; a batch counts only once its final ack confirmed it stored.
pub(crate) async fn bare_fast_ingest(
    ctx: Arc<Ctx>,
    scenario: &'static str,
    variant: String,
    backlog: Backlog,
) -> Res<Row> {
    let events = backlog.events;
    let aggregates = (events / backlog.per_aggregate.max(1)).max(1);
    let mut row = Row::new(scenario, &variant);
    reset_stream(&ctx.nats_url).await?;
    let client = nats_client(&ctx.nats_url).await?;
    let cpu_before = Cpu::read(&ctx, &[]);
    let own_before = proc_cpu(std::process::id(), false);
    let started = Instant::now();
    let message = |g: u64| {
        let (headers, payload) = bare::message(g, aggregates);
        fast::Message {
            subject: bare::SUBJECT.into(),
            headers,
            payload: payload.into(),
        }
    };
    let flow = fast::Flow {
        every: fast::DEFAULT_FLOW.every,
        outstanding: fast::DEFAULT_FLOW.outstanding,
        timeout: Duration::from_secs(10),
    };
    let batches = (0..events.div_ceil(BATCH)).map(|b| {
        let messages: Vec<_> = (b * BATCH..((b + 1) * BATCH).min(events))
            .map(message)
            .collect();
        let client = client.clone();
        async move {
            let n = messages.len();
            let report = fast::publish(&client, messages, flow).await;
            (n, report)
        }
    });
    let mut reports = futures::stream::iter(batches).buffer_unordered(BATCHES_AT_ONCE);
    let mut confirmed = 0;
    while let Some((n, report)) = reports.next().await {
        confirmed += report.stored;
        if let Some(stop) = report.stop {
            return Err(format!(
                "fast-ingest batch stopped after {} of {n}: {stop:?}",
                report.stored
            ));
        }
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
    row.note(format!(
        "batches of {BATCH}, {BATCHES_AT_ONCE} at once, ack every {} messages, {} acks outstanding",
        flow.every, flow.outstanding
    ));
    row.note(format!("{cpu}; the publisher itself {own:.1} us"));
    if in_stream != events || confirmed as u64 != events {
        row.note(format!(
            "STREAM HOLDS {in_stream} OF {events}, {confirmed} CONFIRMED"
        ));
    }
    Ok(row)
}

/// The fast-ingest rows of a round of the wal scenario: the bare publisher, the table source and
/// the wal source drains with `--publish-batches fast-ingest`.
pub(crate) async fn round(
    ctx: &Arc<Ctx>,
    scenario: &'static str,
    backlog: Backlog,
    round: u32,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let events = backlog.events;
    let flag = || args(&["--publish-batches", "fast-ingest"]);
    for (source, drainer) in [
        (
            "table source",
            Drainer::Relays {
                count: 1,
                args: flag(),
            },
        ),
        ("wal source", Drainer::Wal { args: flag() }),
    ] {
        let variant = format!("drain, {source}, fast-ingest batches, round {round}");
        let limit = ctx.drain_timeout(events, false) + Duration::from_secs(60);
        let fut = drain_variant(
            ctx.clone(),
            scenario,
            variant.clone(),
            backlog,
            drainer,
            false,
        );
        rows.push(isolated(scenario, variant, limit, fut).await);
    }
    let variant =
        format!("bare JetStream publisher, same messages, fast-ingest batches, round {round}");
    let limit = ctx.drain_timeout(events, false) + Duration::from_secs(60);
    let fut = bare_fast_ingest(ctx.clone(), scenario, variant.clone(), backlog);
    rows.push(isolated(scenario, variant, limit, fut).await);
    rows
}

/// The drain scenario's row: the default relay with `--publish-batches fast-ingest`.
pub(crate) fn drain_args() -> Vec<String> {
    args(&[
        "--batch-size",
        "1000",
        "--ordering",
        "aggregate",
        "--publish-batches",
        "fast-ingest",
    ])
}

/// Notes each fast-ingest row's rate against its per-message counterpart of the same round.
pub(crate) fn against_per_message(rows: &mut [Row]) {
    let rates: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| !r.variant.contains("fast-ingest"))
        .filter_map(|r| r.events_per_s.map(|e| (r.variant.clone(), e)))
        .collect();
    for row in rows.iter_mut() {
        if !row.variant.contains("fast-ingest batches") {
            continue;
        }
        let base = row.variant.replace(", fast-ingest batches", "");
        let (Some(rate), Some((_, before))) =
            (row.events_per_s, rates.iter().find(|(v, _)| *v == base))
        else {
            continue;
        };
        row.note(format!(
            "{:.2}x of per-message acks ({before:.0} events/s)",
            rate / before
        ));
    }
}
