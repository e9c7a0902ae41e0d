//! Scenario 3, `writers`: writer throughput without a trigger, with the classic per-row NOTIFY
//! trigger and with the migration's gated trigger, relay running.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::pg_client;

use crate::env::*;
use crate::report::*;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Trigger {
    None,
    ClassicPerRow,
    Ours,
}

/// One writer-throughput variant: the trigger on `outbox_events` and how the relay runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterVariant {
    pub(crate) label: &'static str,
    pub(crate) trigger: Trigger,
    /// Extra relay flags (none: the CLI defaults).
    pub(crate) relay_args: &'static [&'static str],
    /// Appended to the relay's database URL.
    pub(crate) url_suffix: &'static str,
    /// Not one of the three compared variants: an extra data point to explain them.
    pub(crate) diagnostic: bool,
    /// The relay streams from the WAL (`--source wal`) instead of claiming from the table.
    pub(crate) wal: bool,
}

pub(crate) const WRITER_VARIANTS: [WriterVariant; 5] = [
    WriterVariant {
        label: "(a) no trigger",
        trigger: Trigger::None,
        relay_args: &[],
        url_suffix: "",
        diagnostic: false,
        wal: false,
    },
    WriterVariant {
        label: "(b) classic per-row NOTIFY",
        trigger: Trigger::ClassicPerRow,
        relay_args: &[],
        url_suffix: "",
        diagnostic: false,
        wal: false,
    },
    WriterVariant {
        label: "(c) ours (gated, per statement)",
        trigger: Trigger::Ours,
        relay_args: &[],
        url_suffix: "",
        diagnostic: false,
        wal: false,
    },
    WriterVariant {
        label: "(d) no trigger, relay polling every 10 ms",
        trigger: Trigger::None,
        relay_args: &["--notify-mode", "poll", "--fallback-interval", "10ms"],
        url_suffix: "",
        diagnostic: true,
        wal: false,
    },
    WriterVariant {
        label: "(e) ours, relay with synchronous_commit=off",
        trigger: Trigger::Ours,
        relay_args: &[],
        url_suffix: "?options=-c%20synchronous_commit%3Doff",
        diagnostic: true,
        wal: false,
    },
];

/// Writer transactions from tokio-postgres clients at full speed for `duration`: (committed, s).
pub(crate) async fn run_writers(url: &str, clients: usize, duration: Duration) -> Res<(u64, f64)> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let client = pg_client(url).await;
        let stmt = client.prepare(WRITER_SQL).await.ctx("prepare writer")?;
        conns.push((client, stmt));
    }
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, (client, stmt))| {
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(i as u64 + 1);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let customer = rng.i32(1..=5000);
                    let amount = rng.i64(100..=100_000);
                    within(Duration::from_secs(30), "writer transaction", async {
                        client
                            .execute(&stmt, &[&customer, &amount])
                            .await
                            .ctx("writer transaction")
                    })
                    .await?;
                    n += 1;
                }
                Ok::<u64, String>(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.ctx("writer task")??;
    }
    Ok((total, started.elapsed().as_secs_f64()))
}

/// `pgbench -n -f writer.sql -c N -j min(2,N) -T secs [-R rate]`: (transactions, tps). With a
/// rate, pgbench schedules that many transactions per second across all clients (throttled).
pub(crate) async fn run_pgbench(
    pgbench: &Path,
    url: &str,
    clients: usize,
    secs: u64,
    rate: Option<u64>,
) -> Res<(u64, f64)> {
    let mut cmd = Command::new(pgbench);
    cmd.args(["-n", "-f", WRITER_SCRIPT])
        .args(["-c", &clients.to_string()])
        .args(["-j", &clients.min(2).to_string()])
        .args(["-T", &secs.to_string()]);
    if let Some(rate) = rate {
        cmd.args(["-R", &rate.to_string()]);
    }
    cmd.arg(url).stdin(Stdio::null());
    let output = within(Duration::from_secs(secs + 60), "pgbench", async move {
        tokio::task::spawn_blocking(move || cmd.output())
            .await
            .ctx("pgbench task")?
            .ctx("run pgbench")
    })
    .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "pgbench failed ({}): {}",
            output.status,
            stderr.lines().rev().take(5).collect::<Vec<_>>().join(" / ")
        ));
    }
    let tps = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no `tps = ` line in pgbench output: {stdout}"))?;
    let txns = stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("number of transactions actually processed: ")
        })
        .and_then(|rest| rest.split('/').next())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Ok((txns, tps))
}

/// The writers alone: no trigger and no relay, on a fresh database. What this machine's writers
/// can do at all, the ceiling of every "writers with the relay keeping up" figure.
pub(crate) async fn writers_alone(
    ctx: Arc<Ctx>,
    scenario: &str,
    clients: usize,
    secs: u64,
) -> Res<Row> {
    let mut row = Row::new(
        scenario,
        &format!("writers alone (no trigger, no relay), {clients} clients"),
    );
    let db = fresh_db(&ctx).await?;
    exec(&db.client, SETUP_SQL, Duration::from_secs(30)).await?;
    exec(
        &db.client,
        "DROP TRIGGER outbox_events_notify ON outbox_events",
        Duration::from_secs(30),
    )
    .await?;
    checkpoint(&ctx, &db.client).await?;
    let (txns, tps) = match &ctx.pgbench {
        Some(pgbench) => run_pgbench(pgbench, &db.url, clients, secs, None).await?,
        None => {
            let (n, s) = run_writers(&db.url, clients, Duration::from_secs(secs)).await?;
            row.note("tokio-postgres writers (pgbench not found)");
            (n, n as f64 / s)
        }
    };
    row.events = Some(txns);
    row.seconds = Some(secs as f64);
    row.writer_tps = Some(tps);
    row.config = Some("writers alone (no trigger, no relay)".into());
    row.clients = Some(clients as u64);
    let db_url = db.url.clone();
    drop(db);
    drop_db(&ctx, &db_url).await;
    Ok(row)
}

pub(crate) async fn writer_throughput(
    ctx: Arc<Ctx>,
    variant: WriterVariant,
    clients: usize,
    secs: u64,
) -> Res<Row> {
    Ok(writer_run(ctx, variant, clients, secs, None).await?.0)
}

/// What one writer run left behind, to tell whether the relay kept up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterOutcome {
    pub(crate) tps: f64,
    /// Events not yet published when the writers stopped.
    pub(crate) left: i64,
}

/// One writer run on a fresh database with the variant's trigger and relay: at full speed, or
/// throttled to `rate` transactions per second (pgbench only).
pub(crate) async fn writer_run(
    ctx: Arc<Ctx>,
    variant: WriterVariant,
    clients: usize,
    secs: u64,
    rate: Option<u64>,
) -> Res<(Row, WriterOutcome)> {
    const S: &str = "3 writer throughput";
    let mut row = Row::new(S, &format!("{}, {clients} clients", variant.label));
    let db = fresh_db(&ctx).await?;
    exec(&db.client, SETUP_SQL, Duration::from_secs(30)).await?;
    match variant.trigger {
        Trigger::None => {
            exec(
                &db.client,
                "DROP TRIGGER outbox_events_notify ON outbox_events",
                Duration::from_secs(30),
            )
            .await?
        }
        Trigger::ClassicPerRow => {
            exec(&db.client, CLASSIC_TRIGGER_SQL, Duration::from_secs(30)).await?
        }
        Trigger::Ours => {}
    }
    checkpoint(&ctx, &db.client).await?;
    let notifies = NotifyCounter::start(&db.url).await?;

    let relay_url = format!("{}{}", db.url, variant.url_suffix);
    let mut relay_args = args(variant.relay_args);
    if variant.wal {
        relay_args.extend(wal_slot_args(&db.url).await?);
    }
    let mut relays = vec![spawn_relay(
        &ctx,
        &format!("writers-{}-{clients}", slug(variant.label)),
        &relay_url,
        &relay_args,
    )?];
    let polling = variant.relay_args.contains(&"poll");
    if variant.wal {
        wait_streaming(&db.client, &mut relays, Duration::from_secs(30)).await?;
    } else if polling {
        // A polling relay never arms: give it the time to connect.
        tokio::time::sleep(Duration::from_millis(500)).await;
        relays[0].check_alive()?;
    } else if !wait_armed(&db.client, &mut relays, Duration::from_secs(15)).await? {
        row.note("relay not seen armed within 15 s");
    }

    let (txns, tps) = match &ctx.pgbench {
        Some(pgbench) => run_pgbench(pgbench, &db.url, clients, secs, rate).await?,
        None if rate.is_some() => return Err("throttled writers need pgbench".into()),
        None => {
            let (n, s) = run_writers(&db.url, clients, Duration::from_secs(secs)).await?;
            row.note("tokio-postgres writers (pgbench not found)");
            (n, n as f64 / s)
        }
    };
    relays[0].check_alive()?;
    let left = pending(&db.client).await?;
    let notified = notifies.settled().await;
    // Every relay batch stamps its rows with its transaction's now(): distinct values = batches.
    let batches = query_i64(
        &db.client,
        "SELECT count(DISTINCT processed_at) FROM outbox_events WHERE processed_at IS NOT NULL",
    )
    .await?;
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;
    row.events = Some(txns);
    row.seconds = Some(secs as f64);
    row.writer_tps = Some(tps);
    row.config = Some(variant.label.into());
    row.clients = Some(clients as u64);
    row.note(notify_share(notified, txns));
    if variant.wal {
        // Published rows are deleted (`--wal-marking delete`): no processed_at to count.
        row.note(format!("pending when writers stopped: {left}"));
    } else {
        row.note(format!(
            "relay committed {batches} batches during the run; pending when writers stopped: {left}"
        ));
    }
    let db_url = db.url.clone();
    drop(db);
    drop_db(&ctx, &db_url).await;
    Ok((row, WriterOutcome { tps, left }))
}

pub(crate) async fn scenario_writers(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "3 writer throughput";
    let secs = if ctx.quick { 2 } else { 10 };
    // Quick mode: only the contended case, where a commit-time NOTIFY lock shows.
    let client_counts: &[usize] = if ctx.quick { &[16] } else { &[1, 4, 16] };
    let mut rows: Vec<(WriterVariant, usize, Row)> = Vec::new();
    // Interleaved: all variants back to back for each client count (a fresh database each).
    for &clients in client_counts {
        for variant in WRITER_VARIANTS {
            if variant.diagnostic && ctx.quick {
                continue;
            }
            let name = format!("{}, {clients} clients", variant.label);
            let fut = writer_throughput(ctx.clone(), variant, clients, secs);
            let row = isolated(S, name, Duration::from_secs(secs + 120), fut).await;
            rows.push((variant, clients, row));
        }
    }
    let baseline: HashMap<usize, f64> = rows
        .iter()
        .filter(|(v, _, _)| v.trigger == Trigger::None && !v.diagnostic)
        .filter_map(|(_, c, r)| r.writer_tps.map(|tps| (*c, tps)))
        .collect();
    let tool = if ctx.pgbench.is_some() {
        format!("pgbench -c N -j min(2,N) -T {secs}")
    } else {
        format!("tokio-postgres writers, {secs} s")
    };
    rows.into_iter()
        .map(|(variant, clients, mut row)| {
            if let (Some(tps), Some(base)) = (row.writer_tps, baseline.get(&clients)) {
                if (variant.trigger != Trigger::None || variant.diagnostic) && *base > 0.0 {
                    row.note(format!("{:.2}x of (a)", tps / base));
                }
            }
            if !row.is_failure() {
                row.note(if variant.diagnostic {
                    format!("{tool}; diagnostic variant (not CLI defaults)")
                } else {
                    format!("{tool}; relay running, CLI defaults")
                });
            }
            row
        })
        .collect()
}
