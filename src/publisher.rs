//! The NATS side: connecting, checking the stream, and publishing claimed events to JetStream.
//! The relay loop sees [`Outcome`]s, never async-nats types.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use futures::future::join_all;
use futures::StreamExt;
use tracing::Instrument;

use crate::clock::DbClock;
use crate::config::{BatchConfig, Credentials, HeaderFormat, NatsConfig, PublishConfig};
use crate::error::{Error, Result};
use crate::event::OutboxEvent;
use crate::policy::{Failure, FailureKind, Outcome};
use crate::source::atomic::{At, Plan, Unit};
use crate::subject::SubjectTemplate;
use crate::wire::{header_block_len, headers_with};

mod fast;

/// Duplicate window of streams created by `--create-stream`.
pub const MIN_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

#[derive(Clone)]
pub(crate) struct Publisher {
    client: async_nats::Client,
    js: jetstream::Context,
    subjects: SubjectTemplate,
    header_format: HeaderFormat,
    ce_source: String,
    stream: String,
    create_stream: bool,
    redelivery_gap: Duration,
    timeout: Duration,
    /// The database's clock, which acks and spans are timed on.
    clock: Arc<DbClock>,
    /// `--transactions atomic`: each transaction as one atomic batch.
    atomic: bool,
    /// `--max-batch-bytes`: what the rest of a transaction a claim takes must fit in.
    batch_bytes: usize,
    /// Atomic batches open at once (JetStream takes 50 per stream).
    batches: Arc<tokio::sync::Semaphore>,
    /// `--publish-batches fast-ingest`: a batch's events as fast-ingest batches.
    fast: bool,
    /// The stream's subjects, as `ensure_stream` found them: fast-ingest batches go to one stream,
    /// so an aggregate with an event the stream does not capture is published event by event.
    stream_subjects: Arc<std::sync::Mutex<Vec<String>>>,
}

/// The most events one atomic batch holds (nats-server's default limit).
pub const ATOMIC_BATCH_MAX: usize = 1000;

/// Atomic batches this relay keeps open at once, below the 50 a stream takes in all.
const ATOMIC_BATCHES_AT_ONCE: usize = 32;

/// Whether a nats-server of `version` takes atomic batches (2.12 and later).
pub(crate) fn takes_atomic_batches(version: &str) -> bool {
    server_at_least(version, (2, 12))
}

/// Whether a nats-server of `version` takes fast-ingest batches (2.14 and later).
pub(crate) fn takes_fast_batches(version: &str) -> bool {
    server_at_least(version, (2, 14))
}

fn server_at_least(version: &str, wanted: (u64, u64)) -> bool {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= wanted
}

/// Whether the stream subject `filter` captures `subject` (`*` one token, `>` the rest).
fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut filter = filter.split('.');
    let mut subject = subject.split('.');
    loop {
        match (filter.next(), subject.next()) {
            (Some(">"), Some(_)) => return true,
            (None, None) => return true,
            (Some(f), Some(s)) if f == "*" || f == s => {}
            _ => return false,
        }
    }
}

/// Connects to NATS with the credentials and TLS settings of `nats`. Fails fast (bounded) when the
/// server is unreachable or refuses the credentials; afterwards the client reconnects on its own,
/// telling `on_link` each time it connects (true) or loses the connection (false).
pub(crate) async fn connect(
    nats: &NatsConfig,
    on_link: impl Fn(bool) + Send + Sync + 'static,
) -> Result<async_nats::Client> {
    let on_link = std::sync::Arc::new(on_link);
    let mut options = async_nats::ConnectOptions::new()
        .name("outbox-relay")
        .event_callback(move |event| {
            let on_link = on_link.clone();
            async move {
                match event {
                    async_nats::Event::Connected => on_link(true),
                    async_nats::Event::Disconnected => on_link(false),
                    _ => {}
                }
            }
        })
        .connection_timeout(Duration::from_secs(5))
        .ping_interval(Duration::from_secs(10))
        .max_reconnects(None);
    if let Some(path) = &nats.creds {
        options = options.credentials_file(path).await.map_err(|e| {
            Error::broker_connect(format!("cannot read creds file {}", path.display())).caused_by(e)
        })?;
    }
    if let Some(path) = &nats.nkey {
        let seed = std::fs::read_to_string(path).map_err(|e| {
            Error::broker_connect(format!("cannot read nkey file {}", path.display())).caused_by(e)
        })?;
        options = options.nkey(seed.trim().to_string());
    }
    if let Some(ca) = &nats.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&nats.tls_cert, &nats.tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    // Credentials travel in the options, not the URL: the client logs server URLs at debug level.
    let (servers, credentials) = nats.servers_and_credentials()?;
    match credentials {
        Some(Credentials::UserPassword(user, password)) => {
            options = options.user_and_password(user, password);
        }
        Some(Credentials::Token(token)) => options = options.token(token),
        None => {}
    }
    options.connect(servers.as_slice()).await.map_err(|e| {
        use async_nats::ConnectErrorKind as K;
        let (what, refused) = match e.kind() {
            K::Authentication | K::AuthorizationViolation => ("authentication failed", true),
            K::TimedOut => ("timed out", false),
            K::Tls => ("TLS setup failed", true),
            // The handshake itself (the server's certificate does not verify, or the server
            // refused ours) comes as an I/O error: waiting would not heal it either.
            _ if crate::error::caused_by_rustls(&e) => ("TLS handshake failed", true),
            _ => ("cannot connect", false),
        };
        // The cause's text follows, redacted as the whole message is.
        let message = format!("{what} ({})", crate::redact::redact(nats.url.expose()));
        if refused {
            Error::refused(format!("NATS {message}")).caused_by(e)
        } else {
            Error::broker_connect(message).caused_by(e)
        }
    })
}

impl Publisher {
    /// A publisher into `nats.stream` with `publish`'s subjects and headers, awaiting as many acks
    /// at once as `batch` allows. `redelivery_gap`: the longest gap between two publishes of one
    /// row, which the stream's duplicate window must cover.
    pub fn new(
        client: async_nats::Client,
        nats: &NatsConfig,
        publish: &PublishConfig,
        batch: &BatchConfig,
        redelivery_gap: Duration,
        clock: Arc<DbClock>,
    ) -> Result<Self> {
        let js = jetstream::ContextBuilder::new()
            .timeout(publish.timeout)
            .ack_timeout(publish.timeout)
            .max_ack_inflight(batch.acks_in_flight())
            .backpressure_on_inflight(true)
            .build(client.clone());
        Ok(Publisher {
            client,
            js,
            subjects: publish.subjects()?,
            header_format: publish.header_format,
            ce_source: publish.ce_source.clone(),
            stream: nats.stream.clone(),
            create_stream: nats.create_stream,
            redelivery_gap,
            timeout: publish.timeout,
            clock,
            atomic: publish.transactions == crate::config::TransactionMode::Atomic,
            batch_bytes: batch.max_bytes,
            batches: Arc::new(tokio::sync::Semaphore::new(ATOMIC_BATCHES_AT_ONCE)),
            fast: publish.batches == crate::config::PublishBatches::FastIngest,
            stream_subjects: Arc::default(),
        })
    }

    /// Checks (or creates) the stream and warns when its duplicate window is shorter than the
    /// longest gap between two publishes of one row.
    pub async fn ensure_stream(&self) -> Result<()> {
        if self.atomic {
            // A server before 2.12 drops allow_atomic from a stream's config and stores a batch's
            // messages one by one: it would not fail, it would not be atomic either.
            let version = self.client.server_info().version;
            if !takes_atomic_batches(&version) {
                return Err(Error::stream(format!(
                    "--transactions atomic needs nats-server 2.12 or later (atomic batches); this server is {version}: upgrade it, or run with --transactions events"
                )));
            }
        }
        if self.fast {
            // A server before 2.14 drops allow_batched from a stream's config and answers no
            // fast-ingest batch.
            let version = self.client.server_info().version;
            if !takes_fast_batches(&version) {
                return Err(Error::stream(format!(
                    "--publish-batches fast-ingest needs nats-server 2.14 or later (fast-ingest batches); this server is {version}: upgrade it, or run with --publish-batches off"
                )));
            }
        }
        let info = match self.js.get_stream(&self.stream).await {
            Ok(mut s) => s
                .info()
                .await
                .map_err(|e| {
                    Error::broker_unavailable(format!(
                        "cannot read the info of stream {}",
                        self.stream
                    ))
                    .caused_by(e)
                })?
                .clone(),
            Err(e) if self.create_stream && is_not_found(&e) => {
                // validate() refused create_stream for a template no stream subject can capture.
                let subject = self.subjects.stream_subject().ok_or_else(|| {
                    Error::config(
                        "subject_template",
                        "starts with a placeholder: create the stream yourself",
                    )
                })?;
                self.create_stream(subject).await?
            }
            Err(e) if is_not_found(&e) => {
                return Err(Error::stream(format!(
                    "stream {} does not exist: create it, or pass --create-stream",
                    self.stream
                )))
            }
            Err(e) => {
                // No answer from JetStream (starting, no leader yet): wait for it.
                return Err(Error::broker_unavailable(format!(
                    "cannot look up stream {}",
                    self.stream
                ))
                .caused_by(e));
            }
        };
        if self.atomic && !info.config.allow_atomic_publish {
            return Err(Error::stream(format!(
                "stream {} does not take atomic batches, which --transactions atomic needs: set allow_atomic on it (a stream update; --create-stream sets it on a stream it creates), or run with --transactions events",
                self.stream
            )));
        }
        if self.fast && !info.config.allow_batch_publish {
            return Err(Error::stream(format!(
                "stream {} does not take fast-ingest batches, which --publish-batches fast-ingest needs: set allow_batched on it (a stream update; --create-stream sets it on a stream it creates), or run with --publish-batches off",
                self.stream
            )));
        }
        if let Ok(mut subjects) = self.stream_subjects.lock() {
            subjects.clone_from(&info.config.subjects);
        }
        let gap = self.redelivery_gap;
        if info.config.duplicate_window < gap {
            tracing::warn!(
                stream = %self.stream,
                duplicate_window = ?info.config.duplicate_window,
                longest_redelivery_gap = ?gap,
                "the stream's duplicate window is shorter than the longest redelivery gap: a row retried after the window can be stored twice"
            );
        }
        Ok(())
    }

    /// Creates the stream on `subject` (file storage, a duplicate window covering redeliveries).
    async fn create_stream(&self, subject: String) -> Result<stream::Info> {
        let window = MIN_DUPLICATE_WINDOW.max(self.redelivery_gap);
        tracing::info!(stream = %self.stream, subject = %subject, duplicate_window = ?window, "creating stream");
        let mut s = self
            .js
            .create_stream(stream::Config {
                name: self.stream.clone(),
                subjects: vec![subject],
                storage: stream::StorageType::File,
                duplicate_window: window,
                allow_atomic_publish: self.atomic,
                allow_batch_publish: self.fast,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                let message = format!("cannot create stream {}", self.stream);
                // JetStream answered and refused: for the operator. Else: not up yet.
                if matches!(
                    e.kind(),
                    jetstream::context::CreateStreamErrorKind::JetStream(_)
                ) {
                    Error::stream(message).caused_by(e)
                } else {
                    Error::broker_unavailable(message).caused_by(e)
                }
            })?;
        let info = s.info().await.map_err(|e| {
            Error::broker_unavailable(format!("cannot read the info of stream {}", self.stream))
                .caused_by(e)
        })?;
        Ok(info.clone())
    }

    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Whether JetStream knows a stream capturing `subject` (asked of the JetStream API, which the
    /// meta leader answers from the streams' assignments, also while a stream has no leader).
    async fn coverage(&self, subject: String) -> (String, Coverage) {
        use jetstream::context::GetStreamByNameErrorKind as K;
        let lookup = self.js.stream_by_subject(subject.clone());
        let coverage = match tokio::time::timeout(self.timeout, lookup).await {
            Ok(Ok(_)) => Coverage::Covered,
            Ok(Err(e)) if matches!(e.kind(), K::NotFound) => Coverage::Uncovered,
            _ => Coverage::Unknown,
        };
        (subject, coverage)
    }

    /// The coverage of each subject that met "no responders", asked [`COVERAGE_LOOKUPS_AT_ONCE`]
    /// at a time so that a batch is judged in the batch: a template with `{aggregate_id}` can fail
    /// on hundreds of subjects at once, and one left out counts as the broker's (no attempt spent,
    /// but the relay backs off as for an outage before it is asked about again). Bounded all the
    /// same: at most [`MAX_COVERAGE_LOOKUPS`] per batch, and none after the first answer that
    /// blames the broker (JetStream not answering, or a stream between leaders): the broker is in
    /// trouble then, asking it about hundreds of subjects on every round of its backoff would
    /// add to it, and a subject not asked about only waits (it counts as the broker's, spending
    /// no attempt) until a round where the broker answers. Missing from the map: not asked.
    async fn coverage_of(&self, mut subjects: Vec<&str>) -> HashMap<String, Coverage> {
        subjects.truncate(MAX_COVERAGE_LOOKUPS);
        // The futures made up front (they start only when polled): a closure inside the stream
        // would make the future not `Send` (a higher-ranked lifetime rustc cannot prove).
        let pending: Vec<_> = subjects
            .into_iter()
            .map(|s| self.coverage(s.to_string()))
            .collect();
        let mut lookups = futures::stream::iter(pending).buffer_unordered(COVERAGE_LOOKUPS_AT_ONCE);
        let mut coverage = HashMap::new();
        while let Some((subject, answer)) = lookups.next().await {
            coverage.insert(subject, answer);
            if answer.blame().is_brokers() {
                break;
            }
        }
        coverage
    }

    /// The event's subject under the template; an error (the row's) when its values make none.
    pub fn subject(&self, event: &OutboxEvent) -> Result<String> {
        self.subjects.render(event)
    }

    /// Publishes every group concurrently (pipelined on one connection); within a group, one event
    /// at a time in order, stopping at the first failure so an aggregate's order survives retries.
    /// With `--publish-batches fast-ingest`, the groups go out as fast-ingest batches instead
    /// ([`Publisher::publish_fast`]), with the same outcomes.
    pub async fn publish(&self, groups: &[Vec<OutboxEvent>]) -> Vec<Vec<Outcome>> {
        let mut outcomes = if self.fast {
            self.publish_fast(groups).await
        } else {
            join_all(groups.iter().map(|group| self.publish_group(group))).await
        };
        self.judge_no_responders(&mut outcomes).await;
        outcomes
    }

    /// Whether each transaction goes out as one atomic batch (`--transactions atomic`).
    pub fn atomic(&self) -> bool {
        self.atomic
    }

    /// A batch's byte budget (`--max-batch-bytes`).
    pub fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// `--transactions atomic`: publishes `plan`'s units, its chains side by side, each chain's
    /// units one after the other, stopping a chain at its first unit not published (the rest of
    /// its aggregates waits behind it). Outcomes in the shape of `groups`; the events the plan
    /// holds are [`Outcome::NotAttempted`].
    pub async fn publish_atomic(
        &self,
        groups: &[Vec<OutboxEvent>],
        plan: &Plan,
    ) -> Vec<Vec<Outcome>> {
        let mut outcomes: Vec<Vec<Outcome>> = groups
            .iter()
            .map(|g| g.iter().map(|_| Outcome::NotAttempted).collect())
            .collect();
        let chains = join_all(plan.chains.iter().map(|chain| async move {
            let mut out = Vec::new();
            for &u in chain {
                let Some(unit) = plan.units.get(u) else {
                    continue;
                };
                let results = self.publish_unit(groups, unit).await;
                let failed = results
                    .iter()
                    .any(|(_, o)| !matches!(o, Outcome::Published { .. }));
                out.extend(results);
                if failed {
                    break;
                }
            }
            out
        }))
        .await;
        for ((g, i), outcome) in chains.into_iter().flatten() {
            if let Some(slot) = outcomes.get_mut(g).and_then(|g| g.get_mut(i)) {
                *slot = outcome;
            }
        }
        self.judge_no_responders(&mut outcomes).await;
        outcomes
    }

    /// One unit of a plan: a lone event as usual; a transaction's events as one atomic batch
    /// (`Nats-Batch-Id`, `Nats-Batch-Sequence`, `Nats-Batch-Commit` on the last), all published or
    /// none. Every event gets the batch's outcome.
    async fn publish_unit(&self, groups: &[Vec<OutboxEvent>], unit: &Unit) -> Vec<(At, Outcome)> {
        let events: Vec<(At, &OutboxEvent)> = unit
            .events
            .iter()
            .filter_map(|&(g, i)| groups.get(g).and_then(|g| g.get(i)).map(|e| ((g, i), e)))
            .collect();
        if let [(at, event)] = events.as_slice() {
            return vec![(*at, self.publish_one(event).await)];
        }
        let txid = unit.txid.unwrap_or(0);
        let now = self.clock.now();
        let mut spans = Vec::with_capacity(events.len());
        let mut messages = Vec::with_capacity(events.len());
        for (_, event) in &events {
            let (span, message) = self.message_in_span(event, now);
            match message {
                Ok(message) => messages.push(message),
                Err(f) => {
                    // The transaction goes out whole or not at all: its other events are held
                    // with this one, and share its fate (its dead letter names them).
                    trace_failure(&span, f.kind, &f.message);
                    let culprit = event.id;
                    return events
                        .iter()
                        .map(|(at, e)| {
                            let message = if e.id == culprit {
                                format!(
                                    "{} (transaction {txid}: its {} other events are held with it)",
                                    f.message,
                                    events.len() - 1
                                )
                            } else {
                                format!(
                                    "held with event {culprit} of its transaction {txid}: {}",
                                    f.message
                                )
                            };
                            (*at, Outcome::Failed(Failure::new(f.kind, message)))
                        })
                        .collect();
                }
            }
            spans.push(span);
        }
        let Ok(_permit) = self.batches.acquire().await else {
            return fail_all(
                &events,
                Failure::new(FailureKind::Broker, "publisher closed"),
            );
        };
        let batch_id = uuid::Uuid::new_v4().simple().to_string();
        let last = messages.len();
        let mut commit = None;
        for (k, ((subject, mut headers), (_, event))) in
            messages.into_iter().zip(&events).enumerate()
        {
            headers.insert("Nats-Batch-Id", batch_id.as_str());
            headers.insert("Nats-Batch-Sequence", (k + 1).to_string().as_str());
            if k + 1 == last {
                headers.insert("Nats-Batch-Commit", "1");
                commit = Some(
                    self.js
                        .publish_with_headers(subject, headers, event.payload.clone())
                        .await,
                );
            } else if let Err(e) = self
                .client
                .publish_with_headers(subject, headers, event.payload.clone())
                .await
            {
                // The server drops the open batch after its timeout.
                return fail_all(
                    &events,
                    Failure::new(
                        FailureKind::Broker,
                        format!("transaction {txid}: cannot send its atomic batch: {e}"),
                    ),
                );
            }
        }
        let result = match commit {
            Some(Ok(ack)) => ack.await,
            Some(Err(e)) => Err(e),
            None => return Vec::new(),
        };
        match result {
            Ok(_) => {
                let acked_at = self.clock.now();
                events
                    .iter()
                    .map(|(at, _)| {
                        (
                            *at,
                            Outcome::Published {
                                duplicate: false,
                                acked_at,
                            },
                        )
                    })
                    .collect()
            }
            Err(e)
                if matches!(
                    error_code(&e),
                    Some(
                        jetstream::ErrorCode::ATOMIC_PUBLISH_CONTAINS_DUPLICATE_MESSAGE
                            | jetstream::ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH
                    )
                ) =>
            {
                if error_code(&e) == Some(jetstream::ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH) {
                    // A server whose batch limit is below ours: never stuck, event by event.
                    tracing::warn!(
                        transaction_id = txid,
                        events = events.len(),
                        error = %e,
                        "the server refused the transaction's atomic batch as too large: publishing it event by event"
                    );
                } else {
                    // Already stored, as a whole (a crash between a batch's commit and the rows'
                    // marking), or in part (published event by event before): JetStream refuses
                    // the whole batch. Sent one by one, what is stored is confirmed as a
                    // duplicate and anything missing is stored alone.
                    tracing::info!(
                        transaction_id = txid,
                        events = events.len(),
                        "transaction already in the stream: confirming its events one by one"
                    );
                }
                let mut out = Vec::with_capacity(events.len());
                let mut failed = false;
                for (at, event) in &events {
                    let outcome = if failed {
                        Outcome::NotAttempted
                    } else {
                        self.publish_one(event).await
                    };
                    failed = !matches!(outcome, Outcome::Published { .. });
                    out.push((*at, outcome));
                }
                out
            }
            Err(e) => {
                let (_, last_event) = events[events.len() - 1];
                let mut f = self.blame(last_event, &e);
                f.message = format!(
                    "transaction {txid} ({} events, one atomic batch): {}",
                    events.len(),
                    f.message
                );
                for span in &spans {
                    trace_failure(span, f.kind, &f.message);
                }
                fail_all(&events, f)
            }
        }
    }

    /// Judges the outcomes that met "no responders" (see below).
    async fn judge_no_responders(&self, outcomes: &mut [Vec<Outcome>]) {
        // "No responders" means no stream captures the subject, JetStream is not answering at
        // all, or the stream that captures it has no leader for a moment (a node died). Only the
        // first is the event's fault: a lookup per subject tells them apart.
        let mut failed_subjects: Vec<&str> = outcomes
            .iter()
            .flatten()
            .filter_map(|o| match o {
                Outcome::Failed(f) => f.no_responders.as_deref(),
                _ => None,
            })
            .collect();
        if failed_subjects.is_empty() {
            return;
        }
        failed_subjects.sort_unstable();
        failed_subjects.dedup();
        let coverage = self.coverage_of(failed_subjects).await;
        for outcome in outcomes.iter_mut().flatten() {
            if let Outcome::Failed(f) = outcome {
                if let Some(subject) = &f.no_responders {
                    f.kind = coverage
                        .get(subject)
                        .copied()
                        .unwrap_or(Coverage::Unknown)
                        .blame();
                    // The send span is still open (the failure holds it).
                    trace_failure(&f.span, f.kind, &f.message);
                }
            }
        }
    }

    /// `--publish-batches fast-ingest`: the groups' events as fast-ingest batches (see
    /// [`fast`]), each group's events in order. An event is [`Outcome::Published`] only once the
    /// server confirmed its storage (the final ack's count, or a flow ack covering it). A message
    /// the stream refuses ends the batch there (nothing after it is stored): that event fails with
    /// the stream's answer, the rest of its group is held, and the others go out in a new batch.
    /// When the batch itself fails (the broker's trouble, a timeout), each group's first event not
    /// confirmed fails with it and the rest of the group is held. A group with an event the
    /// stream does not capture (routed elsewhere) goes out event by event, as without the flag.
    async fn publish_fast(&self, groups: &[Vec<OutboxEvent>]) -> Vec<Vec<Outcome>> {
        let mut outcomes: Vec<Vec<Outcome>> = groups
            .iter()
            .map(|g| g.iter().map(|_| Outcome::NotAttempted).collect())
            .collect();
        let captured = self
            .stream_subjects
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let in_stream = |event: &OutboxEvent| match self.subject(event) {
            Ok(subject) => captured.iter().any(|f| subject_matches(f, &subject)),
            // Failed below, as the event's own.
            Err(_) => true,
        };
        let now = self.clock.now();
        let mut elsewhere = Vec::new();
        let mut queue: Vec<Pending> = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            if !group.iter().all(in_stream) {
                elsewhere.push(g);
                continue;
            }
            for (i, event) in group.iter().enumerate() {
                let (span, message) = self.message_in_span(event, now);
                match message {
                    Ok((subject, headers)) => queue.push(Pending {
                        at: (g, i),
                        message: fast::Message {
                            subject,
                            headers,
                            payload: event.payload.clone(),
                        },
                        span,
                    }),
                    Err(mut f) => {
                        trace_failure(&span, f.kind, &f.message);
                        f.span = span;
                        outcomes[g][i] = Outcome::Failed(f);
                        break;
                    }
                }
            }
        }
        let per_event = join_all(elsewhere.iter().map(|&g| self.publish_group(&groups[g])));
        let batches = self.fast_batches(groups, queue, &mut outcomes);
        let (per_event, ()) = futures::join!(per_event, batches);
        for (g, group_outcomes) in elsewhere.into_iter().zip(per_event) {
            outcomes[g] = group_outcomes;
        }
        outcomes
    }

    /// Publishes `queue` as fast-ingest batches until every event is confirmed or failed (see
    /// [`Publisher::publish_fast`]), writing into `outcomes`.
    async fn fast_batches(
        &self,
        groups: &[Vec<OutboxEvent>],
        mut queue: Vec<Pending>,
        outcomes: &mut [Vec<Outcome>],
    ) {
        let flow = fast::Flow {
            timeout: self.timeout,
            ..fast::DEFAULT_FLOW
        };
        while !queue.is_empty() {
            let (meta, messages): (Vec<_>, Vec<_>) = queue
                .into_iter()
                .map(|p| ((p.at, p.span), p.message))
                .unzip();
            let report = fast::publish(&self.client, messages, flow).await;
            let acked_at = self.clock.now();
            for ((g, i), _) in &meta[..report.stored.min(meta.len())] {
                outcomes[*g][*i] = Outcome::Published {
                    duplicate: false,
                    acked_at,
                };
            }
            let Some(stop) = report.stop else {
                return;
            };
            let first = report.stored;
            let event = |(g, i): At| &groups[g][i];
            // The event the stream refused: its own failure; the rest goes out again.
            if let fast::Stop::Refused { index, error } = &stop {
                if let Some(((g, i), _)) = meta.get(*index).filter(|_| *index >= first) {
                    let (g, i) = (*g, *i);
                    let mut f = self.blame_code(
                        event((g, i)),
                        Some(error.error_code()),
                        format!("fast-ingest batch: {error}"),
                    );
                    if let Some((_, span)) = meta.get(*index) {
                        trace_failure(span, f.kind, &f.message);
                        f.span = span.clone();
                    }
                    outcomes[g][i] = Outcome::Failed(f);
                    // Everything not confirmed goes out again (a message stored without its
                    // confirmation is deduplicated by its Nats-Msg-Id), but the failed event's
                    // group stops at it. The messages are built again (rarely: a refused event).
                    queue = Vec::new();
                    let mut held = std::collections::HashSet::new();
                    for (at, span) in meta.into_iter().skip(first) {
                        if (at.0 == g && at.1 >= i) || held.contains(&at.0) {
                            continue;
                        }
                        let e = event(at);
                        match self.message(e, self.subject(e), &span) {
                            Ok((subject, headers)) => queue.push(Pending {
                                at,
                                message: fast::Message {
                                    subject,
                                    headers,
                                    payload: e.payload.clone(),
                                },
                                span,
                            }),
                            Err(f) => {
                                held.insert(at.0);
                                outcomes[at.0][at.1] = Outcome::Failed(f);
                            }
                        }
                    }
                    continue;
                }
            }
            // The batch failed: each group's first event not confirmed fails with it.
            let failure = |at: At, span: &tracing::Span| -> Failure {
                let mut f = match &stop {
                    fast::Stop::NoResponders { index }
                        if meta.get(*index).is_some_and(|(a, _)| *a == at) =>
                    {
                        let subject = self.subject_shown(event(at));
                        Failure {
                            message: format!("no JetStream stream listens on subject {subject}"),
                            no_responders: Some(subject),
                            ..Failure::new(FailureKind::Broker, "")
                        }
                    }
                    fast::Stop::TimedOut(m) => Failure::new(
                        FailureKind::Timeout,
                        format!(
                            "fast-ingest batch: {m}; {first} of its {} events confirmed",
                            meta.len()
                        ),
                    ),
                    other => Failure::new(
                        FailureKind::Broker,
                        format!(
                            "fast-ingest batch stopped ({}); {first} of its {} events confirmed",
                            describe(other),
                            meta.len()
                        ),
                    ),
                };
                if f.no_responders.is_none() {
                    trace_failure(span, f.kind, &f.message);
                }
                f.span = span.clone();
                f
            };
            let mut failed_groups = std::collections::HashSet::new();
            for (at, span) in meta.iter().skip(first) {
                if failed_groups.insert(at.0) {
                    outcomes[at.0][at.1] = Outcome::Failed(failure(*at, span));
                }
            }
            return;
        }
    }

    async fn publish_group(&self, group: &[OutboxEvent]) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(group.len());
        let mut failed = false;
        for event in group {
            let outcome = if failed {
                Outcome::NotAttempted
            } else {
                self.publish_one(event).await
            };
            failed = !matches!(outcome, Outcome::Published { .. });
            outcomes.push(outcome);
        }
        outcomes
    }

    /// One publish inside the event's send span (see `otel`; a disabled span without the feature
    /// or a subscriber that wants it).
    async fn publish_one(&self, event: &OutboxEvent) -> Outcome {
        let subject = self.subject(event);
        // A row whose values make no subject still gets its (failed) span, under the template.
        let shown = match &subject {
            Ok(subject) => subject.as_str(),
            Err(_) => "(invalid subject)",
        };
        let span = send_span(event, shown, self.clock.now());
        // Entering a disabled span on every poll costs without telling anyone anything.
        let outcome = if span.is_disabled() {
            self.send(event, subject, &span).await
        } else {
            self.send(event, subject, &span)
                .instrument(span.clone())
                .await
        };
        match outcome {
            Outcome::Failed(mut f) => {
                // "No responders" is judged in `publish`, which records it then: an attribute
                // recorded twice would be exported twice.
                if f.no_responders.is_none() {
                    trace_failure(&span, f.kind, &f.message);
                }
                f.span = span;
                Outcome::Failed(f)
            }
            outcome => outcome,
        }
    }

    /// The event's send span (opened at `now`, under its subject or the template's failure) and
    /// its message, for a publish that sends several events before awaiting any ack.
    fn message_in_span(
        &self,
        event: &OutboxEvent,
        now: std::time::SystemTime,
    ) -> (
        tracing::Span,
        std::result::Result<(String, async_nats::HeaderMap), Failure>,
    ) {
        let subject = self.subject(event);
        let shown = subject
            .as_deref()
            .unwrap_or("(invalid subject)")
            .to_string();
        let span = send_span(event, &shown, now);
        let message = self.message(event, subject, &span);
        (span, message)
    }

    /// The message of `event`: its subject and headers, or why the event cannot be sent.
    fn message(
        &self,
        event: &OutboxEvent,
        subject: Result<String>,
        span: &tracing::Span,
    ) -> std::result::Result<(String, async_nats::HeaderMap), Failure> {
        let subject = match event.validate().and(subject) {
            Ok(subject) => subject,
            Err(e) => return Err(Failure::new(FailureKind::Invalid, e.to_string())),
        };
        let trace = outgoing_trace_headers(span);
        let headers = headers_with(event, self.header_format, &self.ce_source, &trace);
        // Writers check the block with the Outbox-* headers; the CloudEvents ones are longer.
        let block = header_block_len(&headers);
        if block > crate::event::MAX_HEADER_BLOCK_BYTES {
            return Err(Failure::new(
                FailureKind::Invalid,
                format!(
                    "headers take {block} bytes with the relay's own ({:?} format), more than the {} JetStream stores",
                    self.header_format,
                    crate::event::MAX_HEADER_BLOCK_BYTES
                ),
            ));
        }
        Ok((subject, headers))
    }

    async fn send(
        &self,
        event: &OutboxEvent,
        subject: Result<String>,
        span: &tracing::Span,
    ) -> Outcome {
        let (subject, headers) = match self.message(event, subject, span) {
            Ok(message) => message,
            Err(f) => return Outcome::Failed(f),
        };
        let sent = self
            .js
            .publish_with_headers(subject, headers, event.payload.clone())
            .await;
        let result = match sent {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match result {
            Ok(ack) => Outcome::Published {
                duplicate: ack.duplicate,
                acked_at: self.clock.now(),
            },
            Err(e) => Outcome::Failed(self.blame(event, &e)),
        }
    }

    /// The subject for a message about a failed publish (which had a valid subject).
    fn subject_shown(&self, event: &OutboxEvent) -> String {
        self.subject(event).unwrap_or_else(|e| e.to_string())
    }

    /// Whose fault a failed publish is (see [`FailureKind`]).
    fn blame(&self, event: &OutboxEvent, e: &jetstream::context::PublishError) -> Failure {
        match e.kind() {
            PublishErrorKind::MaxPayloadExceeded => Failure::new(
                FailureKind::TooLarge,
                format!(
                    "message too large for the server's max_payload of {} bytes (payload {} bytes plus headers): {e}",
                    self.client.max_payload(),
                    event.payload.len()
                ),
            ),
            PublishErrorKind::StreamNotFound => {
                let subject = self.subject_shown(event);
                Failure {
                    message: format!("no JetStream stream listens on subject {subject}"),
                    no_responders: Some(subject),
                    ..Failure::new(FailureKind::Broker, "")
                }
            }
            // Expected-* headers are refused before publishing, so these are the event's own.
            PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
                Failure::new(FailureKind::Rejected, e.to_string())
            }
            PublishErrorKind::TimedOut => Failure::new(FailureKind::Timeout, e.to_string()),
            PublishErrorKind::Other => self.blame_code(event, error_code(e), e.to_string()),
            _ => Failure::new(FailureKind::Broker, e.to_string()),
        }
    }

    /// Whose fault JetStream's answer `code` (None: no answer) about `event` is.
    fn blame_code(
        &self,
        event: &OutboxEvent,
        code: Option<jetstream::ErrorCode>,
        e: String,
    ) -> Failure {
        use jetstream::ErrorCode as C;
        match code {
            Some(C::STREAM_MESSAGE_EXCEEDS_MAXIMUM | C::STREAM_HEADER_EXCEEDS_MAXIMUM) => {
                Failure::new(
                    FailureKind::TooLarge,
                    format!(
                        "message too large for the stream (payload {} bytes): {e}",
                        event.payload.len()
                    ),
                )
            }
            Some(C::STREAM_NOT_FOUND) => Failure::new(
                FailureKind::Rejected,
                format!(
                    "no JetStream stream listens on subject {}",
                    self.subject_shown(event)
                ),
            ),
            // Resources or storage exceeded, the store refusing a write (e.g. a full
            // stream with discard new), the cluster incomplete, without peers, inactive or
            // without a leader, or no JetStream answer at all: the broker's trouble.
            Some(
                C::ACCOUNT_RESOURCES_EXCEEDED
                | C::INSUFFICIENT_RESOURCES
                | C::MEMORY_RESOURCES_EXCEEDED
                | C::STORAGE_RESOURCES_EXCEEDED
                | C::STREAM_STORE_FAILED
                | C::CLUSTER_INCOMPLETE
                | C::CLUSTER_NO_PEERS
                | C::CLUSTER_NOT_ACTIVE
                | C::CLUSTER_NOT_ASSIGNED
                | C::CLUSTER_NOT_AVAILABLE
                | C::CLUSTER_NOT_LEADER
                | C::CLUSTER_REQUIRED
                // An atomic batch the server dropped (its timeout, a restart), too many
                // open at once, the stream's allow_atomic switched off, or a server
                // limit below ATOMIC_BATCH_MAX: the broker's, never the events'.
                | C::ATOMIC_PUBLISH_INCOMPLETE_BATCH
                | C::ATOMIC_PUBLISH_TOO_MANY_INFLIGHT
                | C::ATOMIC_PUBLISH_DISABLED
                | C::ATOMIC_PUBLISH_TOO_LARGE_BATCH
                // A fast-ingest batch the server does not take (allow_batched switched
                // off, too many at once) or forgot: the broker's as well.
                | C::BATCH_PUBLISH_DISABLED
                | C::BATCH_PUBLISH_INVALID_PATTERN
                | C::BATCH_PUBLISH_INVALID_BATCH_ID
                | C::BATCH_PUBLISH_UNKNOWN_BATCH_ID
                | C::BATCH_PUBLISH_TOO_MANY_INFLIGHT,
            )
            | None => Failure::new(FailureKind::Broker, e),
            // Any other answer of JetStream's about this message: the event's, so that a
            // message it keeps refusing is dead-lettered after --max-attempts instead of
            // holding its aggregate for ever.
            Some(_) => Failure::new(FailureKind::Rejected, e),
        }
    }
}

#[cfg(feature = "otel")]
use crate::otel::{
    outgoing_headers as outgoing_trace_headers, record_failure as trace_failure, send_span,
};

/// Without the `otel` feature: no span, the row's headers go out as they are.
#[cfg(not(feature = "otel"))]
fn send_span(_: &OutboxEvent, _: &str, _: std::time::SystemTime) -> tracing::Span {
    tracing::Span::none()
}

#[cfg(not(feature = "otel"))]
fn outgoing_trace_headers(_: &tracing::Span) -> Vec<(String, String)> {
    Vec::new()
}

#[cfg(not(feature = "otel"))]
fn trace_failure(_: &tracing::Span, _: FailureKind, _: &str) {}

/// At most this many subjects that met "no responders" are looked up per batch.
const MAX_COVERAGE_LOOKUPS: usize = 1024;

/// Lookups of subjects' coverage in flight at once.
const COVERAGE_LOOKUPS_AT_ONCE: usize = 16;

/// What JetStream said about a subject that met "no responders".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coverage {
    /// A stream captures it: that stream is between leaders (the broker's trouble).
    Covered,
    /// JetStream answered and no stream captures it: the event is routed where nothing listens.
    Uncovered,
    /// JetStream did not answer: an outage.
    Unknown,
}

impl Coverage {
    fn blame(self) -> FailureKind {
        match self {
            Coverage::Uncovered => FailureKind::Rejected,
            Coverage::Covered | Coverage::Unknown => FailureKind::Broker,
        }
    }
}

/// JetStream's error code in a failed publish's answer, if it answered.
fn error_code(e: &jetstream::context::PublishError) -> Option<jetstream::ErrorCode> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code)
}

/// An event waiting in a fast-ingest batch: where it is in the groups, its message and send span.
struct Pending {
    at: At,
    message: fast::Message,
    span: tracing::Span,
}

/// A batch's stop, for a failure's message.
fn describe(stop: &fast::Stop) -> String {
    match stop {
        fast::Stop::Refused { index, error } => format!("message {} refused: {error}", index + 1),
        fast::Stop::NoResponders { index } => format!("no responders for message {}", index + 1),
        fast::Stop::Broker(m) | fast::Stop::TimedOut(m) => m.clone(),
    }
}

/// Every event of a unit with the same failure.
fn fail_all(events: &[(At, &OutboxEvent)], f: Failure) -> Vec<(At, Outcome)> {
    events
        .iter()
        .map(|(at, _)| (*at, Outcome::Failed(f.clone())))
        .collect()
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref js)
        if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The failure behind a connect error stays reachable through `source()`, its text still
    /// ending the message.
    #[tokio::test]
    async fn a_connect_error_keeps_what_failed_as_its_source() {
        use std::error::Error as _;
        let nkey = NatsConfig {
            nkey: Some("/nonexistent/outbox-relay-test.nk".into()),
            ..NatsConfig::default()
        };
        let e = connect(&nkey, |_| {}).await.expect_err("no nkey file");
        assert_eq!(e.kind(), crate::ErrorKind::BrokerConnect);
        assert!(e.is_retryable());
        assert!(
            e.to_string().starts_with(
                "NATS connection failed: cannot read nkey file /nonexistent/outbox-relay-test.nk: "
            ),
            "{e}"
        );
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|io| io.kind()),
            Some(std::io::ErrorKind::NotFound),
            "{e:?}"
        );

        // Nothing listens on port 1 of localhost: the connect fails at once.
        let nowhere = NatsConfig {
            url: "nats://app:s3cret@127.0.0.1:1".into(),
            ..NatsConfig::default()
        };
        let e = connect(&nowhere, |_| {})
            .await
            .expect_err("nothing listens there");
        assert_eq!(e.kind(), crate::ErrorKind::BrokerConnect);
        let shown = e.to_string();
        assert!(
            shown.starts_with(
                "NATS connection failed: cannot connect (nats://app:***@127.0.0.1:1): "
            ),
            "{shown}"
        );
        assert!(
            !shown.contains("s3cret") && !e.redacted().contains("s3cret"),
            "{shown}"
        );
        let nats = e
            .source()
            .and_then(|s| s.downcast_ref::<async_nats::ConnectError>());
        let nats = nats.expect("the async-nats error as the source");
        assert!(shown.ends_with(&nats.to_string()), "{shown}");
        // The chain holds no credentials either: they travel in the connect options.
        let mut source = e.source();
        while let Some(s) = source {
            assert!(!s.to_string().contains("s3cret"), "{s}");
            source = s.source();
        }
    }

    #[test]
    fn atomic_batches_need_nats_server_2_12() {
        for (version, takes) in [
            ("2.9.10", false),
            ("2.11.4", false),
            ("2.12.0", true),
            ("2.12.0-RC.1", true),
            ("2.15.1", true),
            ("3.0.0", true),
            ("", false),
            ("garbage", false),
        ] {
            assert_eq!(takes_atomic_batches(version), takes, "{version}");
        }
    }

    #[test]
    fn fast_ingest_batches_need_nats_server_2_14() {
        for (version, takes) in [
            ("2.9.10", false),
            ("2.12.3", false),
            ("2.14.0", true),
            ("2.14.0-RC.1", true),
            ("2.15.1", true),
            ("3.0.0", true),
            ("", false),
        ] {
            assert_eq!(takes_fast_batches(version), takes, "{version}");
        }
    }

    #[test]
    fn stream_subjects_capture_as_nats_does() {
        for (filter, subject, captures) in [
            ("outbox.>", "outbox.order.created", true),
            ("outbox.>", "outbox", false),
            ("outbox.*", "outbox.created", true),
            ("outbox.*", "outbox.order.created", false),
            ("outbox.*.created", "outbox.order.created", true),
            ("outbox.order", "outbox.order", true),
            ("outbox.order", "outbox.orders", false),
            ("other.>", "outbox.order.created", false),
        ] {
            assert_eq!(
                subject_matches(filter, subject),
                captures,
                "{filter} {subject}"
            );
        }
    }

    #[test]
    fn no_responders_blame_the_event_only_where_no_stream_listens() {
        assert_eq!(Coverage::Uncovered.blame(), FailureKind::Rejected);
        assert_eq!(Coverage::Covered.blame(), FailureKind::Broker);
        assert_eq!(Coverage::Unknown.blame(), FailureKind::Broker);
    }
}
