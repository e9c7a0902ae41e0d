//! Scenario 1, `drain`: a pre-inserted backlog drained by one relay and by the classic loop; the
//! drain of every variant, also used by `relays`, with duplicates counted on the wire.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use testkit::outbox::STREAM;
use testkit::pg_client;

use crate::env::*;
use crate::report::*;

// ---------------------------------------------------------------------------------------------
// Duplicate counting on the wire
// ---------------------------------------------------------------------------------------------

/// A core NATS subscription on `outbox.>` counting every publish per `Outbox-Event-Id`.
pub(crate) struct DupCounter {
    pub(crate) received: Arc<AtomicU64>,
    pub(crate) stop: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<(HashMap<u128, u32>, u64)>,
}

pub(crate) struct DupCount {
    pub(crate) received: u64,
    pub(crate) distinct: u64,
    pub(crate) duplicates: u64,
    pub(crate) without_id: u64,
}

impl DupCounter {
    pub(crate) async fn start(nats_url: &str, expected: u64) -> Res<DupCounter> {
        let client = nats_client(nats_url).await?;
        let mut sub = client.subscribe(SUBJECTS).await.ctx("subscribe")?;
        within(Duration::from_secs(10), "flush", async {
            client.flush().await.ctx("flush")
        })
        .await?;
        let received = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let task = {
            let received = received.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let _client = client;
                let mut seen: HashMap<u128, u32> = HashMap::with_capacity(expected as usize);
                let mut without_id = 0u64;
                loop {
                    let msg = tokio::select! {
                        _ = stop.cancelled() => break,
                        m = sub.next() => match m {
                            Some(m) => m,
                            None => break,
                        },
                    };
                    let id = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Outbox-Event-Id"))
                        .and_then(|v| uuid::Uuid::parse_str(v.as_str()).ok());
                    match id {
                        Some(id) => *seen.entry(id.as_u128()).or_insert(0) += 1,
                        None => without_id += 1,
                    }
                    received.fetch_add(1, AtomicOrdering::Relaxed);
                }
                (seen, without_id)
            })
        };
        Ok(DupCounter {
            received,
            stop,
            task,
        })
    }

    /// Waits (bounded) until `expected` messages arrived, then counts.
    pub(crate) async fn finish(self, expected: u64) -> Res<DupCount> {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.received.load(AtomicOrdering::Relaxed) < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Late redeliveries, if any, arrive right behind.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.stop.cancel();
        let (seen, without_id) = within(Duration::from_secs(10), "duplicate counter", async {
            self.task.await.ctx("duplicate counter task")
        })
        .await?;
        let received: u64 = seen.values().map(|&n| u64::from(n)).sum();
        Ok(DupCount {
            received,
            distinct: seen.len() as u64,
            duplicates: seen.values().map(|&n| u64::from(n.saturating_sub(1))).sum(),
            without_id,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Drain progress over time (for the charts)
// ---------------------------------------------------------------------------------------------

/// Samples the number of messages in the stream at a fixed interval: the drain's progress over
/// time. One stream-info request per sample, which costs the servers next to nothing (a count of
/// pending rows would cost PostgreSQL a good part of a core at a 100k backlog).
pub(crate) struct StreamSampler {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Vec<(f64, u64)>>,
}

impl StreamSampler {
    pub(crate) async fn start(
        nats_url: &str,
        since: Instant,
        every: Duration,
    ) -> Res<StreamSampler> {
        let js = jetstream::new(nats_client(nats_url).await?);
        let mut stream = within(Duration::from_secs(10), "get stream", async {
            js.get_stream(STREAM).await.ctx("get stream")
        })
        .await?;
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut ticker = tokio::time::interval(every);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    // On stop, one last sample: the timeline ends where the drain did.
                    let last = tokio::select! {
                        _ = stop.cancelled() => true,
                        _ = ticker.tick() => false,
                    };
                    // A sample that fails or is late is left out; the drain goes on regardless.
                    let info =
                        tokio::time::timeout(every.max(Duration::from_secs(1)), stream.info());
                    if let Ok(Ok(info)) = info.await {
                        samples.push((since.elapsed().as_secs_f64(), info.state.messages));
                    }
                    if last {
                        return samples;
                    }
                }
            })
        };
        Ok(StreamSampler { stop, task })
    }

    pub(crate) async fn finish(mut self) -> Vec<(f64, u64)> {
        self.stop.cancel();
        let samples = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
        samples.ok().and_then(Result::ok).unwrap_or_default()
    }
}

/// A drain that fails before `finish` must not leave the sampler running for the rest of the bench.
impl Drop for StreamSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Backlog drains (scenarios 1 and 5)
// ---------------------------------------------------------------------------------------------

pub(crate) enum Drainer {
    /// `count` relay processes at once with these extra flags.
    Relays { count: usize, args: Vec<String> },
    /// One relay of `--source wal` with these extra flags. Its slot is created (by a relay started
    /// and stopped) before the backlog is written, so the backlog is streamed, not caught up from
    /// the table.
    Wal { args: Vec<String> },
    /// The classic loop implemented below, in this process.
    Classic,
}

pub(crate) async fn drain_variant(
    ctx: Arc<Ctx>,
    scenario: &'static str,
    variant: String,
    backlog: Backlog,
    drainer: Drainer,
    count_dups: bool,
) -> Res<Row> {
    let events = backlog.events;
    let mut row = Row::new(scenario, &variant);
    let db = fresh_db(&ctx).await?;
    crate::atomic::prepare_stream(&ctx.nats_url, backlog).await?;
    let mut wal_relay_args = Vec::new();
    if let Drainer::Wal { args } = &drainer {
        wal_relay_args = crate::env::args(&["--source", "wal"]);
        wal_relay_args.extend(wal_slot_args(&db.url).await?);
        wal_relay_args.extend(args.iter().cloned());
        let name = format!("{scenario}-{}-slot", slug(&variant));
        let mut first = vec![spawn_relay(&ctx, &name, &db.url, &wal_relay_args)?];
        wait_streaming(&db.client, &mut first, Duration::from_secs(30)).await?;
        stop_all(first, &mut row).await;
    }
    let payload_bytes = insert_backlog(&ctx, &db.client, backlog).await?;
    let dups = if count_dups {
        Some(DupCounter::start(&ctx.nats_url, events).await?)
    } else {
        None
    };

    let cpu_before = Cpu::read(&ctx, &[]);
    let started = Instant::now();
    let sample_every = Duration::from_millis(if ctx.quick { 100 } else { 250 });
    let sampler = StreamSampler::start(&ctx.nats_url, started, sample_every).await?;
    let mut relays = Vec::new();
    let mut classic = None;
    match &drainer {
        Drainer::Relays { count, args } => {
            for i in 0..*count {
                let name = format!("{scenario}-{}-{i}", slug(&variant));
                relays.push(spawn_relay(&ctx, &name, &db.url, args)?);
            }
        }
        Drainer::Wal { .. } => {
            let name = format!("{scenario}-{}", slug(&variant));
            relays.push(spawn_relay(&ctx, &name, &db.url, &wal_relay_args)?);
        }
        Drainer::Classic => {
            classic = Some(tokio::spawn(classic_loop(
                db.url.clone(),
                ctx.nats_url.clone(),
            )));
        }
    }

    // Atomic batches of small transactions drain at the classic loop's pace (atomic.rs).
    let slow = classic.is_some() || backlog.per_transaction > 0;
    let limit = ctx.drain_timeout(events, slow);
    let deadline = started + limit;
    loop {
        let any: bool = within(Duration::from_secs(30), ANY_PENDING_SQL, async {
            Ok(db
                .client
                .query_one(ANY_PENDING_SQL, &[])
                .await
                .ctx(ANY_PENDING_SQL)?
                .get(0))
        })
        .await?;
        if !any && pending(&db.client).await? == 0 {
            break;
        }
        for r in relays.iter_mut() {
            r.check_alive()?;
        }
        if let Some(h) = &classic {
            if h.is_finished() {
                let result = classic.take().expect("classic handle was just checked");
                result.await.ctx("classic loop task")??;
                let left = pending(&db.client).await?;
                return Err(format!(
                    "the classic loop stopped with {left} events pending"
                ));
            }
        }
        if Instant::now() >= deadline {
            let left = pending(&db.client).await?;
            return Err(format!("{left} events still pending after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = Cpu::read(&ctx, &relays).per_event(&cpu_before, events);
    row.timeline = Some(sampler.finish().await);
    row.peak_rss_mb = max_rss(&relays);
    stop_all(relays, &mut row).await;
    if let Some(h) = classic {
        within(Duration::from_secs(30), "classic loop end", async {
            h.await.ctx("classic loop task")?
        })
        .await?;
    }

    let (processed, span) = processed_span(&db.client).await?;
    let (in_stream, stream_secs) = stream_span(&ctx.nats_url).await?;
    // Rows deleted as they are published (`--wal-marking delete`) leave no processed_at: the
    // stream's own timestamps give the span then.
    let (processed, span) = if processed == 0 {
        (in_stream as i64, stream_secs)
    } else {
        (processed, span)
    };
    row.events = Some(processed as u64);
    row.seconds = Some(span);
    if span > 0.0 {
        row.events_per_s = Some(processed as f64 / span);
    }
    if stream_secs > 0.0 {
        row.note(format!(
            "stream-stamped rate {:.0}/s",
            in_stream as f64 / stream_secs
        ));
    }
    row.note(format!("wall incl. startup {wall:.2}s"));
    let stored = stream_len(&ctx.nats_url).await?;
    if stored != events {
        row.note(format!("STREAM HOLDS {stored} OF {events}"));
    }
    if let Some(counter) = dups {
        let c = counter.finish(events).await?;
        row.duplicates = Some(c.duplicates);
        row.note(format!(
            "wire: {} msgs, {} distinct ids",
            c.received, c.distinct
        ));
        if c.distinct < events {
            row.note(format!(
                "{} events never seen on the wire",
                events - c.distinct
            ));
        }
        if c.without_id > 0 {
            row.note(format!("{} msgs without Outbox-Event-Id", c.without_id));
        }
    }
    row.note(format!("payload ~{payload_bytes:.0} B"));
    row.note(cpu);
    row.note(backlog.describe());
    drop(db.client);
    drop_db(&ctx, &db.url).await;
    Ok(row)
}

/// The classic relay loop, for reference: one connection; per transaction claim 100 rows
/// `FOR UPDATE SKIP LOCKED`, publish each and await its ack, `UPDATE` each; commit; repeat until a
/// claim comes back empty. Returns the number of rows published.
pub(crate) async fn classic_loop(db_url: String, nats_url: String) -> Res<u64> {
    let mut client = pg_client(&db_url).await;
    let js = jetstream::new(nats_client(&nats_url).await?);
    let claim = client
        .prepare(
            "SELECT id, event_type, payload::text FROM outbox_events
             WHERE processed_at IS NULL ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED",
        )
        .await
        .ctx("prepare claim")?;
    let mark = client
        .prepare("UPDATE outbox_events SET processed_at = now() WHERE id = $1")
        .await
        .ctx("prepare update")?;
    let mut published = 0u64;
    loop {
        let tx = client.transaction().await.ctx("begin")?;
        let rows = tx.query(&claim, &[]).await.ctx("claim")?;
        if rows.is_empty() {
            tx.commit().await.ctx("commit")?;
            return Ok(published);
        }
        for row in &rows {
            let id: uuid::Uuid = row.get(0);
            let event_type: String = row.get(1);
            let payload: String = row.get(2);
            let id_text = id.to_string();
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id_text.as_str());
            headers.insert("Outbox-Event-Id", id_text.as_str());
            let ack = js
                .publish_with_headers(format!("outbox.{event_type}"), headers, payload.into())
                .await
                .ctx("publish")?;
            within(Duration::from_secs(10), "publish ack", async {
                ack.await.ctx("publish ack")
            })
            .await?;
            tx.execute(&mark, &[&id]).await.ctx("update")?;
            published += 1;
        }
        tx.commit().await.ctx("commit")?;
    }
}

pub(crate) async fn scenario_drain(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "1 backlog drain";
    let events = ctx.backlog();
    let run_with = |ctx: &Arc<Ctx>, variant: String, drainer: Drainer, backlog: Backlog| {
        let limit = ctx.drain_timeout(events, matches!(drainer, Drainer::Classic))
            + Duration::from_secs(120);
        let fut = drain_variant(ctx.clone(), S, variant.clone(), backlog, drainer, false);
        isolated(S, variant, limit, fut)
    };
    let run = |ctx: &Arc<Ctx>, variant: String, drainer: Drainer| {
        run_with(ctx, variant, drainer, Backlog::new(events))
    };
    let relay = |batch: usize, ordering: &str| Drainer::Relays {
        count: 1,
        args: args(&["--batch-size", &batch.to_string(), "--ordering", ordering]),
    };
    let mut rows = Vec::new();
    let default_row = run(
        &ctx,
        "batch 1000 (default), ordering aggregate".into(),
        relay(1000, "aggregate"),
    )
    .await;
    let mut best: Option<(usize, f64)> = default_row.events_per_s.map(|r| (1000, r));
    rows.push(default_row);
    let fast = crate::fast_ingest::drain_args();
    rows.push(
        run(
            &ctx,
            "batch 1000 (default), ordering aggregate, fast-ingest batches".into(),
            Drainer::Relays {
                count: 1,
                args: fast,
            },
        )
        .await,
    );
    crate::fast_ingest::against_per_message(&mut rows);
    let tuned: &[usize] = if ctx.quick { &[2000] } else { &[200, 2000] };
    for &batch in tuned {
        let row = run(
            &ctx,
            format!("batch {batch}, ordering aggregate"),
            relay(batch, "aggregate"),
        )
        .await;
        if let Some(rate) = row.events_per_s {
            if best.is_none_or(|(_, r)| rate > r) {
                best = Some((batch, rate));
            }
        }
        rows.push(row);
    }
    let best_batch = best.map_or(1000, |(b, _)| b);
    rows.push(
        run(
            &ctx,
            format!("batch {best_batch}, ordering none"),
            relay(best_batch, "none"),
        )
        .await,
    );
    if !ctx.quick && best_batch != 1000 {
        rows.push(
            run(
                &ctx,
                "batch 1000 (default), ordering none".into(),
                relay(1000, "none"),
            )
            .await,
        );
    }
    let mut stale = run_with(
        &ctx,
        "batch 1000, ordering aggregate, backlog NOT analyzed".into(),
        relay(1000, "aggregate"),
        Backlog {
            analyze: false,
            ..Backlog::new(events)
        },
    )
    .await;
    stale.note("no VACUUM ANALYZE after the insert (a fresh burst)");
    rows.push(stale);
    let mut deep = run_with(
        &ctx,
        "batch 1000, ordering aggregate, 100 deep aggregates".into(),
        relay(1000, "aggregate"),
        Backlog {
            per_aggregate: events / 100,
            ..Backlog::new(events)
        },
    )
    .await;
    deep.note("few aggregates with deep backlogs: heads are found by hopping between aggregates");
    rows.push(deep);
    let mut classic = run(
        &ctx,
        "classic loop (100/tx, ack + UPDATE per row)".into(),
        Drainer::Classic,
    )
    .await;
    classic.note("reference implemented in the bench (in-process, no RSS)");
    let classic_rate = classic.events_per_s;
    rows.push(classic);
    for row in rows.iter_mut() {
        if let (Some(ours), Some(base)) = (row.events_per_s, classic_rate) {
            if !row.variant.starts_with("classic") && base > 0.0 {
                row.note(format!("{:.1}x classic", ours / base));
            }
        }
    }
    rows
}
