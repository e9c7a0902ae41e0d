//! Scenario 6, `wal`: the WAL source (`--source wal`) against the table source, in one run on the
//! same servers: a backlog drain (with CPU per event of the relay, PostgreSQL and nats-server),
//! idle latency, and 16 writers with the relay keeping up.

use std::sync::Arc;
use std::time::Duration;

use crate::drain::{drain_variant, Drainer};
use crate::env::*;
use crate::idle_latency::idle_latency;
use crate::report::*;
use crate::writers::{writer_throughput, Trigger, WriterVariant};

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
    }
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
    for variant in [TABLE_WRITERS, WAL_WRITERS, WAL_WRITERS_NO_TRIGGER] {
        let label = format!("{}, 16 clients", variant.label);
        let fut = writer_throughput(ctx.clone(), variant, 16, secs);
        let limit = Duration::from_secs(secs + 120);
        rows.push(isolated(S, label, limit, fut).await);
    }
    rows
}
