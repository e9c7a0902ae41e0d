//! Scenario 4, `sustained`: writers at full speed with the relay running.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use testkit::pg_client;

use crate::env::*;
use crate::report::*;
use crate::writers::run_writers;

pub(crate) async fn sustained(ctx: Arc<Ctx>, writers: usize, secs: u64) -> Res<Row> {
    const S: &str = "4 sustained load";
    let mut row = Row::new(S, &format!("{writers} writers, full speed, {secs} s"));
    let db = fresh_db(&ctx).await?;
    exec(&db.client, SETUP_SQL, Duration::from_secs(30)).await?;
    checkpoint(&ctx, &db.client).await?;

    // Commit -> receipt latency from the writer's wall clock carried in the payload.
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::new(Mutex::new(Vec::new()));
    let (_nc, mut sub) = subscribe_all(&ctx.nats_url).await?;
    let receiver = {
        let latencies = latencies.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let now_us = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64);
                let ts = serde_json::from_slice::<serde_json::Value>(&msg.payload)
                    .ok()
                    .and_then(|v| v.get("ts_us").and_then(serde_json::Value::as_i64));
                if let Some(ts) = ts {
                    latencies
                        .lock()
                        .expect("latency list lock")
                        .push((now_us - ts) as f64 / 1000.0);
                }
            }
        })
    };
    let _abort_receiver = AbortOnDrop(receiver);

    let notifies = NotifyCounter::start(&db.url).await?;
    let metrics_addr = testkit::free_addr();
    let mut relays = vec![spawn_relay(
        &ctx,
        "sustained",
        &db.url,
        &["--metrics-addr".to_string(), metrics_addr.to_string()],
    )?];
    if !wait_armed(&db.client, &mut relays, Duration::from_secs(15)).await? {
        row.note("relay not seen armed within 15 s");
    }

    // Pending count every 200 ms while the writers run.
    let stop_sampling = CancellationToken::new();
    let sampler = {
        let stop = stop_sampling.clone();
        let sampler_client = pg_client(&db.url).await;
        tokio::spawn(async move {
            let mut samples: Vec<i64> = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                if let Ok(n) = pending(&sampler_client).await {
                    samples.push(n);
                }
            }
            samples
        })
    };

    let notified_before = notifies.settled().await;
    let woken_before = notify_wakeups(metrics_addr).await;
    let (committed, elapsed) = run_writers(&db.url, writers, Duration::from_secs(secs)).await?;
    let pending_at_end = pending(&db.client).await?;
    let notified = notifies.settled().await - notified_before;
    let woken = notify_wakeups(metrics_addr).await;
    stop_sampling.cancel();
    let samples = within(Duration::from_secs(10), "pending sampler", async {
        sampler.await.ctx("pending sampler task")
    })
    .await?;
    let stopped = Instant::now();

    // Catch-up: pending to zero and every event received.
    let deadline = stopped + Duration::from_secs(60);
    loop {
        relays[0].check_alive()?;
        if pending(&db.client).await? == 0 {
            break;
        }
        if Instant::now() >= deadline {
            return Err("the relay did not catch up within 60 s after the writers stopped".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caught_up = stopped.elapsed().as_secs_f64();
    let recv_deadline = Instant::now() + Duration::from_secs(15);
    while (latencies.lock().expect("latency list lock").len() as u64) < committed
        && Instant::now() < recv_deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;

    let (processed, span) = processed_span(&db.client).await?;
    row.events = Some(committed);
    row.seconds = Some(elapsed);
    row.writer_tps = Some(committed as f64 / elapsed);
    if span > 0.0 {
        row.events_per_s = Some(processed as f64 / span);
    }
    let mut lat = latencies.lock().expect("latency list lock").clone();
    if (lat.len() as u64) < committed {
        row.note(format!(
            "{} of {committed} NOT RECEIVED",
            committed - lat.len() as u64
        ));
    }
    set_latency(&mut row, &mut lat);
    let max_pending = samples.iter().copied().max().unwrap_or(0);
    let half = samples.len() / 2;
    let first_half = samples[..half].iter().copied().max().unwrap_or(0);
    let second_half = samples[half..].iter().copied().max().unwrap_or(0);
    // Bounded: the backlog does not keep growing through the run, and what is left at the end is
    // at most about half a second of writes.
    let bounded = second_half <= first_half.saturating_mul(2).max(200)
        && (pending_at_end as f64) <= (committed as f64 / elapsed * 0.5).max(200.0);
    row.note(format!(
        "pending: max {max_pending} (sampled every 200 ms, {} samples; max 1st half {first_half}, 2nd half {second_half}), {pending_at_end} when writers stopped -> {}",
        samples.len(),
        if bounded { "bounded" } else { "GROWING" }
    ));
    row.note(format!("caught up {caught_up:.2}s after writers stopped"));
    row.note(notify_share(notified, committed));
    // A notification that found the relay waiting woke it (one wake-up per idle spell); the rest
    // reached a relay that was draining anyway: writers paid for nothing.
    match (woken_before, woken) {
        (Some(before), Some(after)) => {
            let busy = notified.saturating_sub(after.saturating_sub(before));
            row.note(format!(
                "while the relay was busy: {}",
                notify_share(busy, committed)
            ));
        }
        _ => row.note("relay metrics not readable: busy share unknown"),
    }
    row.note("latency = receipt wall clock - clock_timestamp() at the outbox insert (autocommit, business row + outbox row)");
    let db_url = db.url.clone();
    drop(db);
    drop_db(&ctx, &db_url).await;
    Ok(row)
}

pub(crate) async fn scenario_sustained(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "4 sustained load";
    let secs = if ctx.quick { 3 } else { 10 };
    let variant = format!("4 writers, full speed, {secs} s");
    let fut = sustained(ctx.clone(), 4, secs);
    vec![isolated(S, variant, Duration::from_secs(secs + 150), fut).await]
}
