//! Scenario 2, `idle-latency`: one event every 20 ms, commit -> receipt latency per notify mode.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::env::*;
use crate::report::*;

pub(crate) async fn idle_latency(
    ctx: Arc<Ctx>,
    variant: String,
    extra: Vec<String>,
    n: usize,
) -> Res<Row> {
    const S: &str = "2 idle latency";
    let mut row = Row::new(S, &variant);
    let Db {
        url,
        client: mut writer,
    } = fresh_db(&ctx).await?;
    let poll_mode = extra.iter().any(|a| a == "poll");

    // Receipt instants by event number (k in the payload); -1 is the warm-up event.
    let received: Arc<Mutex<HashMap<i64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let (_nc, mut sub) = subscribe_all(&ctx.nats_url).await?;
    let receiver = {
        let received = received.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let at = Instant::now();
                let k = serde_json::from_slice::<serde_json::Value>(&msg.payload)
                    .ok()
                    .and_then(|v| v.get("k").and_then(serde_json::Value::as_i64));
                if let Some(k) = k {
                    received.lock().expect("receipt map lock").insert(k, at);
                }
            }
        })
    };
    let _abort_receiver = AbortOnDrop(receiver);

    let notifies = NotifyCounter::start(&url).await?;
    let wal = extra.iter().any(|a| a == "wal");
    let mut extra = extra;
    if wal {
        extra.extend(wal_slot_args(&url).await?);
    }
    let mut relays = vec![spawn_relay(
        &ctx,
        &format!("idle-{}", slug(&variant)),
        &url,
        &extra,
    )?];
    if wal {
        wait_streaming(&writer, &mut relays, Duration::from_secs(30)).await?;
    } else if !poll_mode && !wait_armed(&writer, &mut relays, Duration::from_secs(15)).await? {
        row.note("relay not seen armed within 15 s");
    }

    let insert = writer
        .prepare(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'order-' || $1::int, 'order.updated',
                     jsonb_build_object('k', $1::int, 'customer_id', 'cust-00042', 'amount_cents', 4200,
                                        'currency', 'EUR', 'status', 'confirmed',
                                        'note', 'standard shipping, leave at the door'))",
        )
        .await
        .ctx("prepare insert")?;
    let has = |k: i64| received.lock().expect("receipt map lock").contains_key(&k);

    // Warm-up: one event end to end, then let the relay settle (re-arm) before measuring.
    writer
        .execute(&insert, &[&-1i32])
        .await
        .ctx("warm-up insert")?;
    let warm_deadline = Instant::now() + Duration::from_secs(15);
    while !has(-1) {
        relays[0].check_alive()?;
        if Instant::now() >= warm_deadline {
            return Err("the warm-up event was not received within 15 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut ticker = tokio::time::interval(Duration::from_millis(20));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // COMMIT sent, and COMMIT returned (the event is durable and visible from then on).
    let mut sent: Vec<Instant> = Vec::with_capacity(n);
    let mut returned: Vec<Instant> = Vec::with_capacity(n);
    let mut commit_ms: Vec<f64> = Vec::with_capacity(n);
    let notified_before = notifies.settled().await;
    let started = Instant::now();
    for k in 0..n as i32 {
        ticker.tick().await;
        let tx = writer.transaction().await.ctx("begin")?;
        tx.execute(&insert, &[&k]).await.ctx("insert")?;
        let before_commit = Instant::now();
        tx.commit().await.ctx("commit")?;
        let committed = Instant::now();
        commit_ms.push((committed - before_commit).as_secs_f64() * 1000.0);
        sent.push(before_commit);
        returned.push(committed);
    }
    row.seconds = Some(started.elapsed().as_secs_f64());

    let wait = if poll_mode { 5 } else { 10 };
    let deadline = Instant::now() + Duration::from_secs(wait);
    while (0..n as i64).any(|k| !has(k)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;

    let mut lat: Vec<f64> = Vec::with_capacity(n);
    let mut lat_sent: Vec<f64> = Vec::with_capacity(n);
    let mut slow: Vec<String> = Vec::new();
    {
        let received = received.lock().expect("receipt map lock");
        for (k, (t0, t1)) in sent.iter().zip(&returned).enumerate() {
            if let Some(at) = received.get(&(k as i64)) {
                let ms = at.saturating_duration_since(*t1).as_secs_f64() * 1000.0;
                let ms_sent = at.saturating_duration_since(*t0).as_secs_f64() * 1000.0;
                if ms_sent > 100.0 {
                    slow.push(format!(
                        "#{k} {ms_sent:.0} ms (commit {:.0} ms)",
                        commit_ms[k]
                    ));
                }
                lat.push(ms);
                lat_sent.push(ms_sent);
            }
        }
    }
    row.events = Some(lat.len() as u64);
    if lat.len() < n {
        row.note(format!("{} of {n} events NOT RECEIVED", n - lat.len()));
    }
    // Microseconds are plenty for the chart and keep results.json small.
    row.latencies_ms = Some(
        lat.iter()
            .map(|ms| (ms * 1000.0).round() / 1000.0)
            .collect(),
    );
    set_latency(&mut row, &mut lat);
    row.note(format!("{} of {n} took > 100 ms", slow.len()));
    if !slow.is_empty() && slow.len() <= 5 {
        row.note(format!("slow: {}", slow.join(", ")));
    }
    let notified = notifies.settled().await - notified_before;
    row.note(notify_share(notified, n as u64));
    if let Some(p) = percentiles(&mut commit_ms) {
        row.note(format!(
            "writer COMMIT itself: p50 {:.2} / p99 {:.2} / max {:.1} ms",
            p.p50, p.p99, p.max
        ));
    }
    if let Some(p) = percentiles(&mut lat_sent) {
        row.note(format!(
            "from COMMIT sent instead: p50 {:.2} / p99 {:.2} / max {:.1} ms",
            p.p50, p.p99, p.max
        ));
    }
    row.note("COMMIT returned -> core NATS receipt; one event every 20 ms");
    drop(writer);
    drop_db(&ctx, &url).await;
    Ok(row)
}

pub(crate) async fn scenario_idle_latency(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "2 idle latency";
    let n = if ctx.quick { 100 } else { 500 };
    let variants = [
        (
            "notify gated (default), fallback 60s",
            args(&["--notify-mode", "gated", "--fallback-interval", "60s"]),
        ),
        (
            "notify always, fallback 60s",
            args(&["--notify-mode", "always", "--fallback-interval", "60s"]),
        ),
        (
            "poll, fallback 1s",
            args(&["--notify-mode", "poll", "--fallback-interval", "1s"]),
        ),
    ];
    let mut rows = Vec::new();
    for (variant, extra) in variants {
        let limit = Duration::from_secs(n as u64 / 50 + 90);
        let fut = idle_latency(ctx.clone(), variant.into(), extra, n);
        rows.push(isolated(S, variant.into(), limit, fut).await);
    }
    rows
}
