//! Lead or stand by; check the setup and the slot (creating it, and catching up from the table
//! behind a new one); start the stream and hand it to the driver. Every wait here races shutdown.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::control::{Aside, Control, Recheck};
use super::stream::Stream;
use super::{Stop, WalSource};
use crate::error::{Error, Result};
use crate::source::batch::run_claim;
use crate::stop::{or_stop, pause, within_grace};

/// How often a relay standing by asks for the leadership.
const STANDBY_POLL: Duration = Duration::from_secs(1);

/// How often a streaming relay checks that its publication still publishes the outbox's inserts
/// (pgoutput says nothing when it stops) and whether its slot is to catch up again.
const RECHECK: Duration = Duration::from_secs(10);

/// While the slot's creation waits: the first word on what it waits for, then how often again.
const SLOT_WAIT_FIRST_LOG: Duration = Duration::from_secs(1);
const SLOT_WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

impl WalSource<'_> {
    /// Runs until `shutdown`: leads when no other relay does, stands by otherwise.
    pub async fn run(&mut self, shutdown: &CancellationToken) -> Result<()> {
        let mut standing_by = false;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let Some(connected) = or_stop(shutdown, Control::connect(self.url)).await else {
                return Ok(());
            };
            let stop = match connected {
                Ok(control) => match self
                    .lead_when_free(&control, &mut standing_by, shutdown)
                    .await
                {
                    Ok(()) => return Ok(()),
                    Err(stop) => stop,
                },
                Err(e) => Stop::from(e),
            };
            self.metrics.wal_streaming.set(0);
            match stop {
                Stop::Fatal(e) => return Err(e),
                Stop::Retry(e) => {
                    self.health.set_stream(false);
                    let delay = self.trouble_delay();
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "replication stopped; retrying");
                    if !pause(shutdown, delay).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn lead_when_free(
        &mut self,
        control: &Control,
        standing_by: &mut bool,
        shutdown: &CancellationToken,
    ) -> std::result::Result<(), Stop> {
        loop {
            let Some(led) = self
                .on_control(
                    control,
                    shutdown,
                    "the leadership",
                    control.try_lead(&self.slot),
                )
                .await
            else {
                return Ok(());
            };
            if led? {
                break;
            }
            if !*standing_by {
                tracing::info!(slot = %self.slot, "another relay streams from the replication slot; standing by");
                *standing_by = true;
            }
            self.health.set_stream(true);
            if !pause(shutdown, STANDBY_POLL).await {
                return Ok(());
            }
        }
        if *standing_by {
            tracing::info!(slot = %self.slot, "took over the replication slot");
            *standing_by = false;
        }
        self.lead(control, shutdown).await
    }

    /// Holds the leadership: checks the setup and the slot, catches up from the table behind a
    /// new slot, then streams until shutdown (`Ok`) or trouble.
    async fn lead(
        &mut self,
        control: &Control,
        shutdown: &CancellationToken,
    ) -> std::result::Result<(), Stop> {
        let Some(state) = self
            .on_control(
                control,
                shutdown,
                "reading the slot's state",
                control.state(&self.slot),
            )
            .await
        else {
            return Ok(());
        };
        let state = state.map_err(|e| {
            let code = e.as_db_error().and_then(|d| d.code()).map(|c| c.code());
            if matches!(code, Some("42883" | "42P01")) {
                // outbox_wal_publication() or outbox_wal_slots is missing (undefined_function,
                // undefined_table): dropped by hand since the start's schema check.
                Stop::Fatal(Error::schema_missing(
                    None,
                    crate::migrate::REQUIRED_VERSION,
                ))
            } else {
                Stop::from(e)
            }
        })?;
        self.health.set_database(true);
        // Version 6 (the `rewritten` mark) decides whether streamed rows may be published from
        // what the stream carried; a schema without it has every row read from the table.
        for store in &mut self.stores {
            store.set_rewrites_marked(state.rewrites_marked);
        }
        if state.wal_level != "logical" {
            return Err(Stop::Fatal(Error::replication(
                format!(
                    "--source wal needs wal_level = logical; the server has {} (set it in postgresql.conf and restart PostgreSQL)",
                    state.wal_level
                ),
                false,
            )));
        }
        if let Some(refusal) = state.published.refusal() {
            // What is written meanwhile is in no stream: the slot catches up once it is repaired.
            let what = "marking the slot to catch up again";
            self.on_control(control, shutdown, what, control.catch_up_again(&self.slot))
                .await;
            return Err(Stop::Fatal(refusal));
        }
        let mut created = false;
        match &state.slot {
            None => {
                if !self.create_slot(control, shutdown).await? {
                    return Ok(());
                }
                tracing::info!(slot = %self.slot, "created the replication slot; catching up from the table first");
                created = true;
            }
            Some(slot) => {
                if let Some(other) = &slot.other_database {
                    return Err(Stop::Fatal(Error::config(
                        "slot_name",
                        format!("replication slot {} belongs to database {other}: choose another --slot-name", self.slot),
                    )));
                }
                if slot.plugin.as_deref() != Some("pgoutput") {
                    return Err(Stop::Fatal(Error::config(
                        "slot_name",
                        format!(
                            "replication slot {} is not a logical slot of pgoutput (plugin {:?}): choose another --slot-name",
                            self.slot, slot.plugin
                        ),
                    )));
                }
                if !slot.caught_up {
                    tracing::info!(slot = %self.slot, "the catch-up from the table behind this slot never finished; catching up first");
                    created = true;
                }
                if slot.wal_status.as_deref() == Some("lost") {
                    tracing::error!(
                        slot = %self.slot,
                        "the replication slot was invalidated (it kept more WAL than max_slot_wal_keep_size allows); dropping it, creating it again and catching up from the table: no event is lost, those written meanwhile go out in seq order"
                    );
                    let what = "dropping the invalidated slot";
                    let Some(dropped) = self
                        .on_control(control, shutdown, what, control.drop_slot(&self.slot))
                        .await
                    else {
                        return Ok(());
                    };
                    dropped?;
                    if !self.create_slot(control, shutdown).await? {
                        return Ok(());
                    }
                    created = true;
                } else if let Some(pid) = slot.active_pid {
                    return Err(Stop::Retry(Error::replication(
                        format!("replication slot {} is in use by server process {pid} (a relay that just stopped?)", self.slot),
                        true,
                    )));
                }
            }
        }
        if created {
            if !self.catch_up(control, shutdown).await? {
                return Ok(());
            }
            let what = "recording the slot's catch-up";
            let Some(marked) = self
                .on_control(control, shutdown, what, control.caught_up(&self.slot))
                .await
            else {
                return Ok(());
            };
            marked?;
        }
        let Some(deferred) = self
            .on_control(
                control,
                shutdown,
                "reading the deferred aggregates",
                control.deferred(created),
            )
            .await
        else {
            return Ok(());
        };
        let deferred = deferred?;
        self.table
            .now(state.published.table_oid, &state.published.schema);
        let buffer = self.batch.stream_buffer();
        let start = Stream::start(
            self.url,
            state.server,
            &self.slot,
            (&state.publication, self.table.clone()),
            buffer,
            (self.batch.max_bytes, self.stores[0].publishes_streamed()),
        );
        let Some(stream) = or_stop(shutdown, start).await else {
            tracing::info!(slot = %self.slot, "stopped while the replication stream was starting");
            return Ok(());
        };
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                let what = "looking at the publication the stream did not find";
                let predating = control.drop_slot_predating(&self.slot, &state.publication, &e);
                if let Some(dropped) = self.on_control(control, shutdown, what, predating).await {
                    dropped?;
                }
                return Err(Stop::from(e));
            }
        };
        tracing::info!(slot = %self.slot, publication = %state.publication, deferred_aggregates = deferred.len(), "streaming from the replication slot");
        self.metrics.wal_streaming.set(1);
        self.health.set_stream(true);
        // The stream stops (as at shutdown) when a check of the setup calls for it.
        let watched = shutdown.child_token();
        let slot = self.slot.clone();
        let (result, (recheck, interrupted)) = tokio::join!(
            async {
                let result = self.stream(control, stream, deferred, &watched).await;
                watched.cancel();
                result
            },
            // The slot was found caught up, or was caught up and marked so, above.
            control.watch(&slot, RECHECK, true, &watched),
        );
        if interrupted {
            // The check was waiting for the database (a lock on `outbox_wal_slots`): it is
            // cancelled, so that neither the leadership nor the lock request outlives the stop.
            tracing::warn!(
                waiting_for = "checking the setup",
                "stopped while the control connection was waiting for the database (checking the setup); cancelling it"
            );
            self.cancel_control(control).await;
        }
        // A batch claimed but not published when the stream stopped (an error, a lost leadership)
        // must not keep its rows locked through the pause: its connection goes, the rows are
        // pending again for whoever streams next.
        self.stores
            .iter_mut()
            .for_each(super::store::WalStore::reset);
        match recheck {
            Some(Recheck::Refuse(refusal)) => {
                let what = "marking the slot to catch up again";
                self.on_control(control, shutdown, what, control.catch_up_again(&self.slot))
                    .await;
                return Err(Stop::Fatal(refusal));
            }
            Some(Recheck::CatchUp) => {
                return Err(Stop::Retry(Error::replication(
                    "the slot is to catch up from the table again (`migrate --wal` repaired the publication)",
                    true,
                )))
            }
            None => {}
        }
        if let Err(Stop::Retry(e)) = &result {
            let what = "looking at the publication the stream did not find";
            let predating = control.drop_slot_predating(&self.slot, &state.publication, e);
            if let Some(dropped) = self.on_control(control, shutdown, what, predating).await {
                dropped?;
            }
        }
        result
    }

    /// `work`, a statement on the control connection, unless shutdown comes first: then the
    /// statement is cancelled (it may wait for a lock) and `None` returned.
    async fn on_control<T>(
        &self,
        control: &Control,
        shutdown: &CancellationToken,
        what: &str,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        let out = or_stop(shutdown, work).await;
        if out.is_none() {
            tracing::warn!(waiting_for = what, "stopped while the control connection was waiting for the database ({what}); cancelling it");
            self.cancel_control(control).await;
        }
        out
    }

    /// Cancels what the control connection runs, from a short connection beside it (best effort).
    pub(super) async fn cancel_control(&self, control: &Control) {
        let cancelled = async { Aside::connect(self.url).await?.cancel(control.pid()).await };
        match crate::stop::last_words(cancelled).await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cancelling the control connection's statement failed")
            }
            None => tracing::warn!("cancelling the control connection's statement timed out"),
        }
    }

    /// Creates the slot. Creating a logical slot waits until every transaction holding an xid
    /// when it began has ended (a forgotten prepared transaction: for ever): meanwhile the relay
    /// says what it waits for, and a shutdown cancels the creation. `false`: shutdown.
    async fn create_slot(
        &mut self,
        control: &Control,
        shutdown: &CancellationToken,
    ) -> std::result::Result<bool, Stop> {
        let create = control.create_slot(&self.slot);
        tokio::pin!(create);
        let mut log_at = tokio::time::Instant::now() + SLOT_WAIT_FIRST_LOG;
        loop {
            tokio::select! {
                created = &mut create => {
                    created?;
                    return Ok(true);
                }
                _ = shutdown.cancelled() => {
                    tracing::info!(slot = %self.slot, "stopped while creating the replication slot (it waited for open transactions); cancelling the creation");
                    self.cancel_control(control).await;
                    return Ok(false);
                }
                _ = tokio::time::sleep_until(log_at) => {
                    log_at += SLOT_WAIT_LOG_EVERY;
                    self.log_slot_waits(control.pid()).await;
                }
            }
        }
    }

    /// Says what the slot's creation waits for (best effort: a failure is logged, not fatal).
    async fn log_slot_waits(&self, pid: i32) {
        let holders = match Aside::connect(self.url).await {
            Ok(aside) => aside.slot_waits_for(pid).await,
            Err(e) => Err(e),
        };
        match holders {
            Ok(holders) => tracing::warn!(
                slot = %self.slot,
                waiting_for = %holders.join("; "),
                "creating the replication slot waits for open transactions to end (PostgreSQL needs a consistent start)"
            ),
            Err(e) => tracing::warn!(
                slot = %self.slot,
                error = %e,
                "creating the replication slot waits for open transactions to end"
            ),
        }
    }

    /// Behind a new slot: publishes from the table what committed before it (as the table source
    /// does, in seq order), until a claim is not full. Rows committed after the slot's start come
    /// again in the stream, and the claim by id skips those published here. `false`: shutdown.
    async fn catch_up(
        &mut self,
        control: &Control,
        shutdown: &CancellationToken,
    ) -> std::result::Result<bool, Stop> {
        let mut published = 0;
        loop {
            if shutdown.is_cancelled() {
                return Ok(false);
            }
            let started = std::time::Instant::now();
            let (batch, retry) = (self.batch, self.retry);
            let (publisher, metrics) = (&self.publisher, self.metrics);
            let store = &mut self.stores[0];
            let work = async {
                match store
                    .claim_table(batch.ordering, batch.size, batch.max_bytes)
                    .await
                {
                    Ok((claim, record)) => {
                        run_claim(retry, publisher, metrics, claim, started, record).await
                    }
                    Err(e) => Err(e),
                }
            };
            let Some(result) = within_grace(shutdown, work).await else {
                self.abandon("the database to catch up from the table")
                    .await;
                return Ok(false);
            };
            let failed = match result {
                Ok(report) if report.broker_failures == 0 && !report.full => {
                    published += report.published;
                    tracing::info!(published, "caught up from the table");
                    return Ok(true);
                }
                Ok(report) => {
                    published += report.published;
                    report.broker_failures > 0
                }
                Err(e) => {
                    if control.is_closed() {
                        return Err(Stop::Retry(e));
                    }
                    self.recover(&e);
                    tracing::warn!(error = %e, "catching up from the table failed; backing off");
                    true
                }
            };
            if failed {
                let delay = self.trouble_delay();
                if !pause(shutdown, delay).await {
                    return Ok(false);
                }
            }
        }
    }
}
