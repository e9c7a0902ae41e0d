//! Scenario 6, `wal`: the WAL source (`--source wal`) against the table source, in one run on the
//! same servers: a backlog drain (with CPU per event of the relay, PostgreSQL and nats-server),
//! against the bare JetStream publisher of the same messages (the machine's limit), idle latency,
//! and 16 writers with the relay keeping up.

use std::sync::Arc;
use std::time::Duration;

use crate::bare::bare_publisher;
use crate::drain::{drain_variant, Drainer};
use crate::env::*;
use crate::idle_latency::idle_latency;
use crate::report::*;
use crate::writers::{
    writer_run, writer_throughput, writers_alone, Trigger, WriterOutcome, WriterVariant,
};

/// A writer-throughput variant of this scenario: the relay's source and the trigger.
const fn writers(label: &'static str, trigger: Trigger, wal: bool) -> WriterVariant {
    WriterVariant {
        label,
        trigger,
        relay_args: if wal { &["--source", "wal"] } else { &[] },
        url_suffix: "",
        diagnostic: false,
        wal,
    }
}

const TABLE_WRITERS: WriterVariant = writers(
    "table source (gated trigger), relay running",
    Trigger::Ours,
    false,
);
const WAL_WRITERS: WriterVariant = writers("wal source, relay running", Trigger::Ours, true);
/// The wal source needs no NOTIFY trigger; without it writers pay nothing for the outbox but the
/// row (README: "Writers pay nothing").
const WAL_WRITERS_NO_TRIGGER: WriterVariant = writers(
    "wal source, notify trigger disabled, relay running",
    Trigger::None,
    true,
);

pub(crate) async fn scenario_wal(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "6 wal source";
    let mut rows = Vec::new();
    let events = ctx.backlog();
    let backlog = Backlog::new(events);
    // The machine is noisy: in full mode both drains run three times, alternating.
    let rounds = if ctx.quick { 1 } else { 3 };
    for round in 1..=rounds {
        for (source, drainer) in [
            (
                "table source",
                Drainer::Relays {
                    count: 1,
                    args: Vec::new(),
                },
            ),
            ("wal source", Drainer::Wal { args: Vec::new() }),
        ] {
            let variant = format!("drain, {source}, round {round}");
            let limit = ctx.drain_timeout(events, false) + Duration::from_secs(60);
            let fut = drain_variant(ctx.clone(), S, variant.clone(), backlog, drainer, false);
            rows.push(isolated(S, variant, limit, fut).await);
        }
        // The machine's limit for these messages: JetStream alone.
        let variant = format!("bare JetStream publisher, same messages, round {round}");
        let limit = ctx.drain_timeout(events, false) + Duration::from_secs(60);
        let fut = bare_publisher(ctx.clone(), S, variant.clone(), backlog);
        rows.push(isolated(S, variant, limit, fut).await);
        rows.extend(crate::fast_ingest::round(&ctx, S, backlog, round).await);
    }
    crate::fast_ingest::against_per_message(&mut rows);
    let n = if ctx.quick { 100 } else { 500 };
    for (variant, extra) in [
        (
            "idle latency, table source (notify gated)",
            args(&["--notify-mode", "gated", "--fallback-interval", "60s"]),
        ),
        (
            "idle latency, wal source",
            args(&["--source", "wal", "--fallback-interval", "60s"]),
        ),
    ] {
        let limit = Duration::from_secs(n as u64 / 50 + 90);
        let fut = idle_latency(ctx.clone(), variant.into(), extra, n);
        rows.push(isolated(S, variant.into(), limit, fut).await);
    }
    let secs = if ctx.quick { 3 } else { 10 };
    // The writers' own ceiling, before and after the relayed runs (the machine drifts): no source
    // can keep up with more than the writers can write.
    let alone = |round: u32| {
        let label = format!("writers alone (no trigger, no relay), 16 clients, run {round}");
        let fut = writers_alone(ctx.clone(), S, 16, secs);
        let limit = Duration::from_secs(secs + 120);
        async move {
            let mut row = isolated(S, label.clone(), limit, fut).await;
            row.variant = label;
            row
        }
    };
    let first = rows.len();
    rows.push(alone(1).await);
    for variant in [TABLE_WRITERS, WAL_WRITERS, WAL_WRITERS_NO_TRIGGER] {
        let label = format!("{}, 16 clients", variant.label);
        let fut = writer_throughput(ctx.clone(), variant, 16, secs);
        let limit = Duration::from_secs(secs + 120);
        rows.push(isolated(S, label, limit, fut).await);
    }
    // Full speed is not "with the relay keeping up" when a relay falls behind (it then takes less
    // CPU from the writers than one that keeps up): the highest throttled rate it keeps up with.
    if ctx.pgbench.is_some() {
        for variant in [TABLE_WRITERS, WAL_WRITERS, WAL_WRITERS_NO_TRIGGER] {
            let label = format!("{}, 16 clients, highest rate kept up with", variant.label);
            let fut = writer_capacity(ctx.clone(), variant, 16, secs);
            let limit = Duration::from_secs((secs + 60) * (CAPACITY_PROBES + 1));
            rows.push(isolated(S, label, limit, fut).await);
        }
    }
    rows.push(alone(2).await);
    against_ceiling(&mut rows[first..]);
    rows
}

/// Notes each relayed writer row's rate as a share of the writers' own ceiling (the mean of the
/// writers-alone runs).
fn against_ceiling(rows: &mut [Row]) {
    let alone: Vec<f64> = rows
        .iter()
        .filter(|r| r.variant.starts_with("writers alone"))
        .filter_map(|r| r.writer_tps)
        .collect();
    if alone.is_empty() {
        return;
    }
    let ceiling = alone.iter().sum::<f64>() / alone.len() as f64;
    for row in rows.iter_mut() {
        if row.variant.starts_with("writers alone") || row.is_failure() {
            continue;
        }
        if let Some(tps) = row.writer_tps {
            row.note(format!(
                "{:.2}x of the writers alone ({ceiling:.0} tps, mean of {} runs)",
                tps / ceiling,
                alone.len()
            ));
        }
    }
}

/// Throttled runs after the full-speed one, each halving the interval the capacity lies in.
const CAPACITY_PROBES: u64 = 4;

/// Whether the relay kept up with writers asked for `rate` per second (`None`: full speed): the
/// writers got at least 95% of it, and what was left unpublished when they stopped is at most
/// half a second of writes.
fn kept_up(outcome: WriterOutcome, rate: Option<u64>) -> bool {
    let asked = rate.map_or(outcome.tps, |r| r as f64);
    outcome.tps >= 0.95 * asked && (outcome.left as f64) <= (asked * 0.5).max(200.0)
}

/// The highest writer throughput the variant's relay keeps up with: a full-speed run, then
/// bisection over throttled rates (pgbench `-R`) between half and all of the full-speed rate.
async fn writer_capacity(
    ctx: Arc<Ctx>,
    variant: WriterVariant,
    clients: usize,
    secs: u64,
) -> Res<Row> {
    let (mut row, full) = writer_run(ctx.clone(), variant, clients, secs, None).await?;
    row.variant = format!("{}, highest rate kept up with", row.variant);
    row.notes.clear();
    let mut probes = vec![format!(
        "full speed: {:.0} tps, {} left{}",
        full.tps,
        full.left,
        if kept_up(full, None) {
            " (kept up)"
        } else {
            ""
        }
    )];
    let capacity = if kept_up(full, None) {
        full.tps
    } else {
        // lo: assumed kept up with until a probe shows one; hi: not kept up with.
        let (mut lo, mut hi) = (full.tps * 0.5, full.tps);
        let mut lo_seen = false;
        for _ in 0..CAPACITY_PROBES {
            let rate = ((lo + hi) / 2.0).round() as u64;
            let (_, out) = writer_run(ctx.clone(), variant, clients, secs, Some(rate)).await?;
            let ok = kept_up(out, Some(rate));
            probes.push(format!(
                "-R {rate}: {:.0} tps, {} left{}",
                out.tps,
                out.left,
                if ok { " (kept up)" } else { "" }
            ));
            if ok {
                lo = rate as f64;
                lo_seen = true;
            } else {
                hi = rate as f64;
            }
        }
        if !lo_seen {
            row.note(format!("not kept up with any probed rate: below {hi:.0}"));
        }
        lo
    };
    row.writer_tps = Some(capacity);
    row.events = None;
    row.note(format!(
        "kept up = writers got >= 95% of the rate and <= 0.5 s of writes left unpublished when they stopped; {}",
        probes.join(", ")
    ));
    Ok(row)
}
