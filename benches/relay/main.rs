//! End-to-end benchmarks of the relay: a throwaway PostgreSQL (fsync on) and nats-server, the relay
//! as the CLI binary in child processes.
//!
//! `cargo bench --bench relay` (full, about 20 minutes) or `OUTBOX_BENCH_QUICK=1 cargo bench --bench
//! relay` (a few minutes). Positional arguments select scenarios by name substring, for example
//! `cargo bench --bench relay -- drain`. `OUTBOX_BENCH_CHARTS_FROM=<results.json>` runs nothing and
//! draws the charts of that earlier run.
//!
//! Scenarios:
//! 1. `drain`: a pre-inserted backlog drained by one relay (batch sizes, ordering, and once without
//!    ANALYZE after the insert) and by the classic loop (claim 100, publish and await each ack,
//!    UPDATE each row) implemented here.
//! 2. `idle-latency`: one event every 20 ms; COMMIT returned -> core NATS receipt (and, in the
//!    notes, from COMMIT sent), per notify mode.
//! 3. `writers`: writer throughput (pgbench) without a trigger, with the classic per-row NOTIFY
//!    trigger and with the migration's gated trigger, relay running; in full mode also two
//!    diagnostic variants (a relay polling every 10 ms without trigger, and a relay committing with
//!    synchronous_commit=off) that separate the cost of notifications from the relay's own work.
//!    A LISTEN connection of the bench counts how many writer transactions notified.
//! 4. `sustained`: 4 writers at full speed with the relay running; commit -> receipt latency and
//!    the pending backlog over time.
//! 5. `relays`: a backlog drained by 1 relay and by 3 relays at once; duplicates seen on the wire.
//! 6. `wal`: the WAL source (`--source wal`) against the table source in one run: a backlog drain
//!    with CPU per event of the relay, PostgreSQL and nats-server, the bare JetStream publisher of
//!    the same messages (`bare.rs`: the machine's limit), idle latency, 16 writers at full
//!    speed, and the highest writer rate each relay keeps up with (throttled pgbench runs). Each
//!    round also runs both drains and the bare publisher with JetStream fast-ingest batches
//!    (`fast_ingest.rs`: `--publish-batches fast-ingest`), noted against the per-message rows.
//! 7. `drain-atomic` and `wal-atomic` (rows of scenarios 1 and 6, which `-- drain` and `-- wal`
//!    select with them; `-- atomic` runs only these): a backlog written as transactions of 1, 10
//!    and 100 events (quick mode: 10), drained with `--transactions events` and with `atomic`
//!    (`atomic.rs`).
//!
//! Every row goes into one markdown table on stdout and into `target/bench/results.json`, and the
//! charts of the scenarios that ran into `target/bench/*.svg` (`charts`). A scenario that fails is
//! reported in the table and the others still run.
//!
//! One module per scenario; `env` holds what they share (servers and the relay process come from
//! the `testkit` harness crate), `report` the rows, the table and `results.json`, `charts` the SVG
//! charts (drawn by `testkit::charts`).

mod atomic;
mod bare;
mod charts;
mod drain;
mod env;
mod fast_ingest;
mod idle_latency;
mod relays;
mod report;
mod sustained;
mod wal;
mod writers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use testkit::{NatsServer, PgCluster, PgOptions};

use env::{find_pgbench, Ctx};
use report::{markdown_table, Row};

const SCENARIOS: [&str; 8] = [
    "drain",
    "drain-atomic",
    "idle-latency",
    "writers",
    "sustained",
    "relays",
    "wal",
    "wal-atomic",
];

async fn run_scenario(name: &str, ctx: Arc<Ctx>) -> Vec<Row> {
    match name {
        "drain" => drain::scenario_drain(ctx).await,
        "idle-latency" => idle_latency::scenario_idle_latency(ctx).await,
        "writers" => writers::scenario_writers(ctx).await,
        "sustained" => sustained::scenario_sustained(ctx).await,
        "relays" => relays::scenario_relays(ctx).await,
        "wal" => wal::scenario_wal(ctx).await,
        "drain-atomic" => atomic::scenario_drain_atomic(ctx).await,
        "wal-atomic" => atomic::scenario_wal_atomic(ctx).await,
        other => vec![Row::failed(other, "-", "unknown scenario")],
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-string panic)".into())
}

/// Draws the charts of an earlier run's `results.json` again (after a change to the charts), without
/// running anything: `OUTBOX_BENCH_CHARTS_FROM=target/bench/results.json cargo bench --bench relay`.
fn redraw(results: &std::path::Path, out_dir: &std::path::Path) -> i32 {
    let rows: Vec<Row> = match std::fs::read_to_string(results)
        .map_err(|e| e.to_string())
        .and_then(|json| serde_json::from_str(&json).map_err(|e| e.to_string()))
    {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("[bench] cannot read {}: {e}", results.display());
            return 1;
        }
    };
    if let Err(e) = std::fs::create_dir_all(out_dir) {
        eprintln!("[bench] cannot create {}: {e}", out_dir.display());
        return 1;
    }
    for chart in charts::write_charts(&rows, out_dir) {
        println!("chart: {}", chart.display());
    }
    0
}

fn main() {
    let quick = std::env::var("OUTBOX_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    // cargo passes `--bench`; other arguments select scenarios by name.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected: Vec<&str> = SCENARIOS
        .into_iter()
        .filter(|name| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    let out_dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench"));
    if let Some(path) = std::env::var_os("OUTBOX_BENCH_CHARTS_FROM") {
        std::process::exit(redraw(&PathBuf::from(path), &out_dir));
    }
    let log_dir = out_dir.join("logs");
    if let Err(e) = std::fs::create_dir_all(&log_dir) {
        eprintln!("[bench] cannot create {}: {e}", log_dir.display());
    }
    let started = Instant::now();

    let servers = std::panic::catch_unwind(|| {
        let pg = PgCluster::start(PgOptions {
            fsync: true,
            ..Default::default()
        });
        let nats = NatsServer::start();
        (pg, nats)
    });
    let mut rows: Vec<Row> = Vec::new();
    let mut nats_keep = None;
    match servers {
        Err(payload) => {
            let msg = panic_text(&*payload);
            for name in &selected {
                rows.push(Row::failed(
                    name,
                    "-",
                    &format!("servers did not start: {msg}"),
                ));
            }
        }
        Ok((pg, nats)) => {
            let ctx = Arc::new(Ctx {
                pg,
                nats_url: nats.url(),
                nats_pid: nats.pid(),
                quick,
                pgbench: find_pgbench(),
                log_dir,
            });
            nats_keep = Some(nats);
            eprintln!(
                "[bench] servers up in {:.1}s; mode {}, postgres on port {} (fsync on), {}, pgbench: {}",
                started.elapsed().as_secs_f64(),
                if quick { "quick" } else { "full" },
                ctx.pg.port(),
                ctx.nats_url,
                ctx.pgbench
                    .as_deref()
                    .map_or("not found".into(), |p| p.display().to_string())
            );
            match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    for name in &selected {
                        rows.extend(rt.block_on(run_scenario(name, ctx.clone())));
                    }
                    drop(rt);
                }
                Err(e) => rows.push(Row::failed("-", "-", &format!("tokio runtime: {e}"))),
            }
            drop(ctx);
        }
    }
    drop(nats_keep);

    let failures = rows.iter().filter(|r| r.is_failure()).count();
    println!();
    println!(
        "## outbox-relay benchmarks ({} mode, {:.0} s, {} cores, PostgreSQL fsync on)",
        if quick { "quick" } else { "full" },
        started.elapsed().as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!();
    print!("{}", markdown_table(&rows));
    let json_path = out_dir.join("results.json");
    match serde_json::to_string_pretty(&rows) {
        Ok(json) => match std::fs::write(&json_path, json + "\n") {
            Ok(()) => println!("\nresults: {}", json_path.display()),
            Err(e) => eprintln!("[bench] cannot write {}: {e}", json_path.display()),
        },
        Err(e) => eprintln!("[bench] cannot serialize results: {e}"),
    }
    for chart in charts::write_charts(&rows, &out_dir) {
        println!("chart: {}", chart.display());
    }
    if failures > 0 {
        eprintln!("[bench] {failures} row(s) FAILED");
        std::process::exit(1);
    }
}
