//! The NATS side: connecting, checking the stream, and publishing claimed events to JetStream.
//! The relay loop sees [`Outcome`]s, never async-nats types.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use futures::future::join_all;

use crate::config::RelayConfig;
use crate::error::{Error, Result};
use crate::event::OutboxEvent;
use crate::policy::FailureKind;

/// The event's id (also sent as `Nats-Msg-Id`).
pub const HEADER_EVENT_ID: &str = "Outbox-Event-Id";
/// The event's `aggregate_type`.
pub const HEADER_AGGREGATE_TYPE: &str = "Outbox-Aggregate-Type";
/// The event's `aggregate_id`.
pub const HEADER_AGGREGATE_ID: &str = "Outbox-Aggregate-Id";
/// The event's `event_type`.
pub const HEADER_EVENT_TYPE: &str = "Outbox-Event-Type";
/// When the row was written, RFC 3339.
pub const HEADER_CREATED_AT: &str = "Outbox-Created-At";

/// Duplicate window of streams created by `--create-stream`.
pub const MIN_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// What happened to one event of a batch.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Stored by JetStream (`duplicate`: it was already there, dropped by the Msg-Id dedup).
    Published {
        duplicate: bool,
        acked_at: SystemTime,
    },
    Failed(Failure),
    /// An earlier event of the same aggregate failed, so this one was held back.
    NotAttempted,
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
    /// JetStream did not answer on the subject: settled by a probe after the batch.
    no_responders: bool,
}

impl Failure {
    pub(crate) fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
            no_responders: false,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Publisher {
    client: async_nats::Client,
    js: jetstream::Context,
    prefix: String,
    stream: String,
    timeout: Duration,
}

/// Connects to NATS with the credentials and TLS settings of `config`. Fails fast (bounded) when the
/// server is unreachable or refuses the credentials; afterwards the client reconnects on its own,
/// telling `on_link` each time it connects (true) or loses the connection (false).
pub(crate) async fn connect(
    config: &RelayConfig,
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
    if let Some(path) = &config.nats_creds {
        options = options.credentials_file(path).await.map_err(|e| {
            Error::broker_connect(format!("cannot read creds file {}: {e}", path.display()))
        })?;
    }
    if let Some(path) = &config.nats_nkey {
        let seed = std::fs::read_to_string(path).map_err(|e| {
            Error::broker_connect(format!("cannot read nkey file {}: {e}", path.display()))
        })?;
        options = options.nkey(seed.trim().to_string());
    }
    if let Some(ca) = &config.nats_tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&config.nats_tls_cert, &config.nats_tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    // Credentials travel in the options, not the URL: the client logs server URLs at debug level.
    let (servers, in_url) = split_credentials(&config.nats_url)?;
    // `validate` refused credentials given both ways, so at most one of these is set.
    let credentials = match (&config.nats_user, &config.nats_password) {
        (Some(user), Some(password)) => {
            Some(Credentials::UserPassword(user.clone(), password.clone()))
        }
        (Some(token), None) => Some(Credentials::Token(token.clone())),
        _ => in_url,
    };
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
            _ => ("cannot connect", false),
        };
        let message = format!(
            "{what} ({}): {}",
            crate::db::redact(&config.nats_url),
            crate::db::redact(&e.to_string())
        );
        if refused {
            Error::refused(format!("NATS {message}"))
        } else {
            Error::broker_connect(message)
        }
    })
}

pub(crate) enum Credentials {
    UserPassword(String, String),
    Token(String),
}

/// Splits `nats://user:pass@host:4222,nats://host2:4222` into plain server URLs and the first
/// credentials found (`user:password`, or a lone user part, which NATS treats as a token).
pub(crate) fn split_credentials(urls: &str) -> Result<(Vec<url::Url>, Option<Credentials>)> {
    let mut servers = Vec::new();
    let mut credentials = None;
    for raw in urls.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let with_scheme = if raw.contains("://") {
            raw.to_string()
        } else {
            format!("nats://{raw}")
        };
        let mut url = url::Url::parse(&with_scheme).map_err(|e| {
            Error::config(
                "nats_url",
                format!("cannot parse {}: {e}", crate::db::redact(raw)),
            )
        })?;
        let user = percent_decode(url.username());
        let password = url.password().map(percent_decode);
        if credentials.is_none() && !user.is_empty() {
            credentials = Some(match password {
                Some(p) => Credentials::UserPassword(user, p),
                None => Credentials::Token(user),
            });
        }
        // Infallible for URLs with a host, which a parsed nats:// URL has.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        servers.push(url);
    }
    if servers.is_empty() {
        return Err(Error::config("nats_url", "no server given"));
    }
    Ok((servers, credentials))
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

impl Publisher {
    pub fn new(client: async_nats::Client, config: &RelayConfig) -> Self {
        let js = jetstream::ContextBuilder::new()
            .timeout(config.publish_timeout)
            .ack_timeout(config.publish_timeout)
            .max_ack_inflight(config.batch_size.max(256) * 2)
            .backpressure_on_inflight(true)
            .build(client.clone());
        Publisher {
            client,
            js,
            prefix: config.subject_prefix.clone(),
            stream: config.stream.clone(),
            timeout: config.publish_timeout,
        }
    }

    /// Checks (or creates) the stream and warns when its duplicate window is shorter than the
    /// longest gap between two publishes of one row.
    pub async fn ensure_stream(&self, config: &RelayConfig) -> Result<()> {
        let info = match self.js.get_stream(&self.stream).await {
            Ok(mut s) => s
                .info()
                .await
                .map_err(|e| Error::broker_unavailable(e.to_string()))?
                .clone(),
            Err(e) if config.create_stream && is_not_found(&e) => {
                let window = MIN_DUPLICATE_WINDOW.max(config.longest_redelivery_gap());
                tracing::info!(stream = %self.stream, duplicate_window = ?window, "creating stream");
                let mut s = self
                    .js
                    .create_stream(stream::Config {
                        name: self.stream.clone(),
                        subjects: vec![format!("{}.>", self.prefix)],
                        storage: stream::StorageType::File,
                        duplicate_window: window,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| {
                        let message = format!("cannot create stream {}: {e}", self.stream);
                        // JetStream answered and refused: for the operator. Else: not up yet.
                        if matches!(
                            e.kind(),
                            jetstream::context::CreateStreamErrorKind::JetStream(_)
                        ) {
                            Error::stream(message)
                        } else {
                            Error::broker_unavailable(message)
                        }
                    })?;
                s.info()
                    .await
                    .map_err(|e| Error::broker_unavailable(e.to_string()))?
                    .clone()
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
                    "cannot look up stream {}: {e}",
                    self.stream
                )));
            }
        };
        let gap = config.longest_redelivery_gap();
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

    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Is JetStream answering at all? Tells a broker outage from events the broker refuses.
    pub async fn probe(&self) -> bool {
        let lookup = self.js.get_stream(&self.stream);
        matches!(tokio::time::timeout(self.timeout, lookup).await, Ok(Ok(_)))
    }

    pub fn subject(&self, event: &OutboxEvent) -> String {
        format!("{}.{}", self.prefix, event.event_type)
    }

    /// Publishes every group concurrently (pipelined on one connection); within a group, one event
    /// at a time in order, stopping at the first failure so an aggregate's order survives retries.
    pub async fn publish(&self, groups: &[Vec<OutboxEvent>]) -> Vec<Vec<Outcome>> {
        let mut outcomes = join_all(groups.iter().map(|group| self.publish_group(group))).await;
        // "No responders" means no stream listens on the subject, or JetStream is not answering at
        // all: only the first is the event's fault. One probe tells them apart.
        let no_stream = |o: &Outcome| matches!(o, Outcome::Failed(f) if f.no_responders);
        if outcomes.iter().flatten().any(no_stream) {
            let kind = if self.probe().await {
                FailureKind::Rejected
            } else {
                FailureKind::Broker
            };
            for outcome in outcomes.iter_mut().flatten() {
                if let Outcome::Failed(f) = outcome {
                    if f.no_responders {
                        f.kind = kind;
                    }
                }
            }
        }
        outcomes
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

    async fn publish_one(&self, event: &OutboxEvent) -> Outcome {
        let headers = match event.validate().map(|()| headers(event)) {
            Ok(h) => h,
            Err(e) => return Outcome::Failed(Failure::new(FailureKind::Invalid, e.to_string())),
        };
        let sent = self
            .js
            .publish_with_headers(self.subject(event), headers, event.payload.clone())
            .await;
        let result = match sent {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match result {
            Ok(ack) => Outcome::Published {
                duplicate: ack.duplicate,
                acked_at: SystemTime::now(),
            },
            Err(e) => Outcome::Failed(self.blame(event, &e)),
        }
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
            PublishErrorKind::StreamNotFound => Failure {
                no_responders: true,
                ..Failure::new(
                    FailureKind::Broker,
                    format!(
                        "no JetStream stream listens on subject {}",
                        self.subject(event)
                    ),
                )
            },
            // Expected-* headers are refused before publishing, so these are the event's own.
            PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
                Failure::new(FailureKind::Rejected, e.to_string())
            }
            PublishErrorKind::TimedOut => Failure::new(FailureKind::Timeout, e.to_string()),
            PublishErrorKind::Other => {
                let code = std::error::Error::source(e)
                    .and_then(|s| s.downcast_ref::<jetstream::Error>())
                    .map(jetstream::Error::error_code);
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
                            self.subject(event)
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
                        | C::CLUSTER_REQUIRED,
                    )
                    | None => Failure::new(FailureKind::Broker, e.to_string()),
                    // Any other answer of JetStream's about this message: the event's, so that a
                    // message it keeps refusing is dead-lettered after --max-attempts instead of
                    // holding its aggregate for ever.
                    Some(_) => Failure::new(FailureKind::Rejected, e.to_string()),
                }
            }
            _ => Failure::new(FailureKind::Broker, e.to_string()),
        }
    }
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref js)
        if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// `Nats-Msg-Id` (JetStream dedup), the outbox metadata, then the row's own headers.
/// Public for tests of the mapping; call it only for an event that passed [`OutboxEvent::validate`].
pub fn headers(event: &OutboxEvent) -> async_nats::HeaderMap {
    let id = event.id.to_string();
    let mut h = async_nats::HeaderMap::new();
    for (name, value) in &event.headers {
        h.insert(name.as_str(), value.as_str());
    }
    h.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    h.insert(HEADER_EVENT_ID, id.as_str());
    h.insert(HEADER_AGGREGATE_TYPE, event.aggregate_type.as_str());
    h.insert(HEADER_AGGREGATE_ID, event.aggregate_id.as_str());
    h.insert(HEADER_EVENT_TYPE, event.event_type.as_str());
    // RFC 3339 for every event that passed validation.
    h.insert(HEADER_CREATED_AT, event.created_at.to_string().as_str());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_move_out_of_the_url() {
        let (servers, creds) =
            split_credentials("nats://u:p%40ss@a:4222, nats://b:4223").expect("parse");
        assert_eq!(servers[0].as_str(), "nats://a:4222");
        assert_eq!(servers[1].as_str(), "nats://b:4223");
        assert!(matches!(creds, Some(Credentials::UserPassword(u, p)) if u == "u" && p == "p@ss"));
        let (_, creds) = split_credentials("tok3n@localhost:4222").expect("parse");
        assert!(matches!(creds, Some(Credentials::Token(t)) if t == "tok3n"));
        let (_, creds) = split_credentials("nats://127.0.0.1:4222").expect("parse");
        assert!(creds.is_none());
        assert!(split_credentials(" , ").is_err());
    }
}
