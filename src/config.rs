//! Relay configuration in sections, each a plain struct with defaults that validates itself:
//! [`PostgresConfig`], [`NatsConfig`], [`PublishConfig`], [`BatchConfig`] (and the limits derived
//! from the batch size), [`RetryConfig`], [`SourceConfig`], [`WalConfig`], [`RetentionConfig`] and
//! [`MetricsConfig`], gathered in [`RelayConfig`]. The relay hands each component only its
//! section. Secrets are kept in types whose `Debug` never shows them ([`DatabaseUrl`],
//! [`NatsUrl`], [`Secret`]), so every struct here derives `Debug`.
//!
//! Every struct is `#[non_exhaustive]`: start from `RelayConfig::new(url)` (or a section's
//! `Default`) and set fields, so that a new setting is not a breaking change.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::schema::Schema;
use crate::subject::SubjectTemplate;

/// Whether the relay keeps the events of one aggregate in `seq` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// Per (aggregate_type, aggregate_id): events reach the stream in `seq` order, with any number
    /// of relays, retries and backoff.
    #[default]
    Aggregate,
    /// No ordering: raw throughput.
    None,
}

/// How writers wake the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NotifyMode {
    /// Writers notify only while a relay is idle and waiting ("armed"); a draining relay costs the
    /// writers nothing. See docs/ARCHITECTURE.md.
    #[default]
    Gated,
    /// Every writing transaction notifies (the relay stays armed): for comparison.
    Always,
    /// No LISTEN at all: the relay polls every `fallback_interval`.
    Poll,
}

/// Where the relay finds committed events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// Claim pending rows from the table (`FOR UPDATE SKIP LOCKED`), woken by the gated NOTIFY
    /// trigger and the fallback ticker. Any number of relays share the work.
    #[default]
    Notify,
    /// Stream committed inserts from a logical replication slot (pgoutput): events in commit
    /// order, no trigger or polling in the writers' path. One relay streams; the others stand by.
    /// Needs `wal_level = logical`, a role with REPLICATION, and `migrate --wal` (the publication).
    Wal,
}

/// How `Source::Wal` records that a row was published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WalMarking {
    /// The row is deleted in the batch's transaction once JetStream acknowledged it: the stream
    /// holds it from then on. The cheapest for PostgreSQL (see docs/ARCHITECTURE.md).
    #[default]
    Delete,
    /// The row is kept and marked `processed_at` like the table source does (history in the
    /// table until `cleanup`/`--retention` deletes it).
    Update,
}

/// Which metadata headers the relay sets on each message (`Nats-Msg-Id` is always set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderFormat {
    /// `Outbox-Event-Id`, `Outbox-Aggregate-Type`, `Outbox-Aggregate-Id`, `Outbox-Event-Type`,
    /// `Outbox-Created-At` (see [`crate::wire`]).
    #[default]
    Outbox,
    /// The CloudEvents NATS binding (binary mode): `ce-specversion`, `ce-id`, `ce-type`,
    /// `ce-source`, `ce-time`, `ce-subject`, and `content-type` for the JSON payload.
    CloudEvents,
    /// Both sets, for consumers moving from one to the other.
    Both,
}

/// How a database transaction's events reach the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransactionMode {
    /// One message per event, each acked on its own (the transaction headers tell consumers the
    /// boundaries).
    #[default]
    Events,
    /// Every transaction's events as one JetStream atomic batch: a consumer sees all of them or
    /// none. Needs nats-server 2.12 or later and a stream with `allow_atomic`.
    Atomic,
}

/// How the relay publishes a batch's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PublishBatches {
    /// Each event on its own, its ack awaited (many acks in flight at once).
    #[default]
    Off,
    /// A batch's events as JetStream fast-ingest batches (nats-server 2.14+, a stream with
    /// `allow_batched`): stored as they arrive, acked every few hundred messages and at the end.
    /// An event counts as published once the server confirmed its storage, as with `Off`.
    FastIngest,
}

/// A string that must not be printed as it is: `Debug` shows it through `$debug` (a redacted
/// form), `expose()` gives the value to the one place that uses it.
macro_rules! hidden_string {
    ($(#[$doc:meta])* $name:ident, $expose:literal, $debug:expr) => {
        $(#[$doc])*
        #[derive(Clone, Default, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            #[doc = $expose]
            pub fn expose(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let debug: fn(&str, &mut fmt::Formatter<'_>) -> fmt::Result = $debug;
                debug(&self.0, f)
            }
        }

        impl<S: Into<String>> From<S> for $name {
            fn from(value: S) -> Self {
                $name(value.into())
            }
        }
    };
}

hidden_string!(
    /// A libpq connection string (URL or key=value). `Debug` shows its parsed parameters with the
    /// password replaced; [`DatabaseUrl::expose`] gives the string itself, for connecting.
    DatabaseUrl,
    "The connection string as given (with its password).",
    |url, f| fmt::Debug::fmt(&crate::db::redacted_url(url), f)
);

hidden_string!(
    /// NATS server URLs, comma-separated (credentials in them are taken out and sent in the
    /// connect options). `Debug` shows them with a password or token replaced.
    NatsUrl,
    "The URLs as given (with their credentials).",
    |urls, f| fmt::Debug::fmt(&redacted_nats_url(urls), f)
);

hidden_string!(
    /// A password or token: `Debug` shows `***`, never the value.
    Secret,
    "The secret itself, for the one place that sends it.",
    |_, f| f.write_str(crate::db::conninfo::HIDDEN)
);

/// PostgreSQL: where the outbox is and how to talk to it. TLS settings are the connection
/// string's own (`sslmode`, `sslrootcert`, ...).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// The database holding `outbox_events` (`--database-url`).
    pub url: DatabaseUrl,
    /// A separate URL for the LISTEN and replication-control connection (for example direct to
    /// PostgreSQL when `url` goes through PgBouncer in transaction mode). Defaults to `url`.
    pub listen_url: Option<DatabaseUrl>,
    /// Schema holding the outbox objects (`None`: the connection's search_path, normally
    /// `public`); `validate` checks it as a [`Schema`].
    pub schema: Option<String>,
    /// Prepare the relay's statements once per connection (fastest). Turn off behind a
    /// transaction pooler that does not keep prepared statements between transactions (PgBouncer
    /// before 1.21, or with `max_prepared_statements = 0`): statements are then sent unnamed.
    pub prepared_statements: bool,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: DatabaseUrl::default(),
            listen_url: None,
            schema: None,
            prepared_statements: true,
        }
    }
}

impl PostgresConfig {
    /// Defaults with `url`.
    pub fn new(url: impl Into<DatabaseUrl>) -> Self {
        PostgresConfig {
            url: url.into(),
            ..PostgresConfig::default()
        }
    }

    /// Refuses what the relay cannot connect with; errors name the flag's field.
    pub fn validate(&self) -> Result<()> {
        if self.url.expose().trim().is_empty() {
            return Err(Error::config("database_url", "is required"));
        }
        crate::db::parse_config(self.url.expose(), "database_url")?;
        if let Some(url) = &self.listen_url {
            crate::db::parse_config(url.expose(), "listen_database_url")?;
        }
        Schema::optional(self.schema.as_deref())?;
        Ok(())
    }

    /// The LISTEN (and replication-control) connection's URL: `listen_url` or `url`, with the
    /// schema in its session. That connection is never pooled (LISTEN needs a session of its own);
    /// the worker connections apply the schema per transaction instead, so that they work through
    /// a transaction pooler, which refuses the `options` startup parameter.
    fn session_url(&self, schema: Option<&Schema>) -> Result<String> {
        let listen = self.listen_url.as_ref().unwrap_or(&self.url).expose();
        match schema {
            Some(schema) => schema.session_url_for(listen, "listen_database_url"),
            None => Ok(listen.to_string()),
        }
    }
}

/// NATS: the servers, the credentials, TLS, and the stream the events go into.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NatsConfig {
    /// Server URLs, comma-separated.
    pub url: NatsUrl,
    /// A JWT + NKey `.creds` file, or an NKey seed file.
    pub creds: Option<PathBuf>,
    /// An NKey seed file (instead of `creds`).
    pub nkey: Option<PathBuf>,
    /// User name; alone (without `password`) it is sent as a token, as natscli does with
    /// `NATS_USER`, so it is kept as a secret too. Giving credentials both here and in `url` is
    /// refused rather than silently choosing one.
    pub user: Option<Secret>,
    /// Password of `user`.
    pub password: Option<Secret>,
    /// An extra root CA (PEM).
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// JetStream stream the events are published into; checked at start.
    pub stream: String,
    /// Create `stream` when it is missing.
    pub create_stream: bool,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: NatsUrl::from("nats://127.0.0.1:4222"),
            creds: None,
            nkey: None,
            user: None,
            password: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            stream: "OUTBOX".into(),
            create_stream: false,
        }
    }
}

impl NatsConfig {
    /// Refuses what the relay cannot connect with; errors name the flag's field.
    pub fn validate(&self) -> Result<()> {
        if self.url.expose().trim().is_empty() {
            return Err(Error::config("nats_url", "is required"));
        }
        if self.stream.is_empty()
            || self
                .stream
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
        {
            return Err(Error::config(
                "stream",
                format!("{:?} is not a valid JetStream stream name", self.stream),
            ));
        }
        self.validate_user()?;
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(Error::config(
                "nats_tls_cert",
                "a client certificate needs its key (and the other way round)",
            ));
        }
        Ok(())
    }

    /// `user`/`password` complete and not competing with credentials in `url`.
    fn validate_user(&self) -> Result<()> {
        if self.user.is_none() && self.password.is_none() {
            return Ok(());
        }
        match self.user.as_ref().map(Secret::expose) {
            None => {
                return Err(Error::config(
                    "nats_password",
                    "needs a user name (nats_user, NATS_USER)",
                ))
            }
            Some("") => return Err(Error::config("nats_user", "must not be empty")),
            Some(_) => {}
        }
        let (_, in_url) = split_credentials(self.url.expose())?;
        if in_url.is_some() {
            return Err(Error::config(
                "nats_user",
                "credentials are also given in nats_url (user:password@ or token@); give them in one place",
            ));
        }
        Ok(())
    }

    /// The server URLs without credentials, and the credentials to send (from `user`/`password`,
    /// else from the URLs).
    pub(crate) fn servers_and_credentials(&self) -> Result<(Vec<url::Url>, Option<Credentials>)> {
        let (servers, in_url) = split_credentials(self.url.expose())?;
        // `validate` refused credentials given both ways, so at most one of these is set.
        let credentials = match (&self.user, &self.password) {
            (Some(user), Some(password)) => Some(Credentials::UserPassword(
                user.expose().to_string(),
                password.expose().to_string(),
            )),
            (Some(token), None) => Some(Credentials::Token(token.expose().to_string())),
            _ => in_url,
        };
        Ok((servers, credentials))
    }
}

/// Credentials for NATS.
pub(crate) enum Credentials {
    UserPassword(String, String),
    Token(String),
}

/// Splits `nats://user:pass@host:4222,nats://host2:4222` into plain server URLs and the first
/// credentials found (`user:password`, or a lone user part, which NATS treats as a token).
fn split_credentials(urls: &str) -> Result<(Vec<url::Url>, Option<Credentials>)> {
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
                format!("cannot parse {}: {e}", crate::redact::redact(raw)),
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

/// Publishing: where each event goes, with which headers, and how long an ack may take.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PublishConfig {
    /// Events are published to `<subject_prefix>.<event_type>` (unless `subject_template` is set).
    pub subject_prefix: String,
    /// Where each event goes, with placeholders `{event_type}`, `{aggregate_type}` and
    /// `{aggregate_id}`, for example `orders.{aggregate_type}.{event_type}`. `None`:
    /// `<subject_prefix>.{event_type}`. A row whose values make an invalid subject is dead-lettered.
    pub subject_template: Option<String>,
    /// Metadata headers: the `Outbox-*` ones, CloudEvents', or both.
    pub header_format: HeaderFormat,
    /// CloudEvents `source` attribute (a URI-reference naming the producer, for example
    /// `/orders-service`), sent as `ce-source` with [`HeaderFormat::CloudEvents`] or `Both`.
    pub ce_source: String,
    /// Bound on the wait for a batch's acks.
    pub timeout: Duration,
    /// One message per event (the default) or each transaction as one atomic batch.
    pub transactions: TransactionMode,
    /// Per-message acks (the default) or fast-ingest batches. Not with
    /// [`TransactionMode::Atomic`].
    pub batches: PublishBatches,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            subject_prefix: "outbox".into(),
            subject_template: None,
            header_format: HeaderFormat::Outbox,
            ce_source: DEFAULT_CE_SOURCE.into(),
            timeout: Duration::from_secs(5),
            transactions: TransactionMode::Events,
            batches: PublishBatches::Off,
        }
    }
}

impl PublishConfig {
    /// Refuses subjects, sources and timeouts the relay cannot publish with.
    pub fn validate(&self) -> Result<()> {
        crate::event::validate_subject_prefix(&self.subject_prefix)?;
        self.subjects()?;
        // A URI-reference (RFC 3986): never empty, no whitespace or control characters, which a
        // header value could not carry anyway.
        if self.header_format != HeaderFormat::Outbox
            && (self.ce_source.is_empty() || !self.ce_source.chars().all(|c| c.is_ascii_graphic()))
        {
            return Err(Error::config(
                "ce_source",
                format!(
                    "{:?} is not a URI-reference (for example /orders-service or urn:example:orders)",
                    self.ce_source
                ),
            ));
        }
        if self.batches == PublishBatches::FastIngest
            && self.transactions == TransactionMode::Atomic
        {
            return Err(Error::config(
                "publish_batches",
                "--publish-batches fast-ingest does not combine with --transactions atomic (fast-ingest batches store each event as it arrives, an atomic batch all or none): pick one",
            ));
        }
        positive("publish_timeout", self.timeout)
    }

    /// The parsed subject template (the default one when `subject_template` is not set).
    pub(crate) fn subjects(&self) -> Result<SubjectTemplate> {
        match &self.subject_template {
            Some(template) => SubjectTemplate::parse(template),
            None => Ok(SubjectTemplate::with_prefix(&self.subject_prefix)),
        }
    }
}

/// Batching: how much one transaction claims, and in which order. The limits derived from the
/// batch size are named and computed here, nowhere else.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BatchConfig {
    /// Rows claimed per transaction.
    pub size: usize,
    /// Payload bytes claimed per transaction (about: payload text plus headers). Bounds the relay's
    /// memory whatever the payloads; a single larger row is still claimed, alone.
    pub max_bytes: usize,
    /// Per-aggregate order or raw throughput.
    pub ordering: Ordering,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            size: 1000,
            max_bytes: DEFAULT_MAX_BATCH_BYTES,
            ordering: Ordering::Aggregate,
        }
    }
}

impl BatchConfig {
    /// Refuses sizes the relay cannot run with.
    pub fn validate(&self) -> Result<()> {
        if self.size == 0 || self.size > MAX_BATCH_SIZE {
            return Err(Error::config(
                "batch_size",
                format!("must be between 1 and {MAX_BATCH_SIZE}"),
            ));
        }
        if self.max_bytes == 0 {
            return Err(Error::config("max_batch_bytes", "must be at least 1 byte"));
        }
        Ok(())
    }

    /// JetStream acks awaited at once: two batches' worth (at least 512), so that a batch's
    /// publishes never wait for room while the one before is acked.
    pub(crate) fn acks_in_flight(&self) -> usize {
        self.size.max(256) * 2
    }

    /// Decoded changes the wal source's stream holds for the relay: two batches' worth.
    pub(crate) fn stream_buffer(&self) -> usize {
        self.size.saturating_mul(2)
    }

    /// Rows and bytes one sweep of the aggregates the wal source handed to the table claims: a
    /// quarter of a batch, so that the stream never waits long behind the table's work (sweeps
    /// and the stream take turns; the table's share of the time is the same whatever the slice).
    pub(crate) fn sweep_slice(&self) -> (usize, usize) {
        ((self.size / 4).max(1), (self.max_bytes / 4).max(1))
    }

    /// Rows of each aggregate one sweep claims when `aggregates` of them may go: an even share of
    /// [`BatchConfig::sweep_slice`] (at least one).
    pub(crate) fn per_aggregate(&self, aggregates: usize) -> usize {
        (self.sweep_slice().0 / aggregates.max(1)).max(1)
    }

    /// Whether `rows` rows of `bytes` bytes fill a batch (the stream stops reading ahead then).
    pub(crate) fn is_full(&self, rows: usize, bytes: usize) -> bool {
        rows >= self.size || bytes >= self.max_bytes
    }
}

/// Retries: how often a failing row is tried and how long it waits in between.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetryConfig {
    /// A row failing this many times is dead-lettered.
    pub max_attempts: u32,
    /// First retry delay of a failed row; doubles (with jitter) up to `max`.
    pub initial: Duration,
    /// Longest retry delay of a failed row.
    pub max: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 10,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}

impl RetryConfig {
    /// Refuses attempts and delays the policy cannot work with.
    pub fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::config("max_attempts", "must be at least 1"));
        }
        positive("retry_initial", self.initial)?;
        if self.max < self.initial {
            return Err(Error::config(
                "retry_max",
                "must not be shorter than retry_initial",
            ));
        }
        Ok(())
    }
}

/// Where the relay finds committed events and how it is woken.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SourceConfig {
    /// The table ([`Source::Notify`]) or the WAL ([`Source::Wal`]).
    pub source: Source,
    /// How writers wake the table source.
    pub notify_mode: NotifyMode,
    /// Poll this often even without notifications (they can be lost during a reconnect); with
    /// the wal source, how often the aggregates handed to the table are swept at most.
    pub fallback_interval: Duration,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            source: Source::Notify,
            notify_mode: NotifyMode::Gated,
            fallback_interval: Duration::from_secs(5),
        }
    }
}

impl SourceConfig {
    /// Refuses a fallback interval of zero.
    pub fn validate(&self) -> Result<()> {
        positive("fallback_interval", self.fallback_interval)
    }
}

/// The wal source (`Source::Wal`): its slot and how it records published rows. Its stream's
/// buffer is derived from the batch ([`BatchConfig`]).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WalConfig {
    /// The logical replication slot (`None`: `outbox_relay`, or `outbox_relay_<schema>` with a
    /// schema). One per outbox: relays of one outbox share it.
    pub slot_name: Option<String>,
    /// How published rows are recorded.
    pub marking: WalMarking,
}

impl WalConfig {
    /// Refuses a slot name PostgreSQL would not take.
    pub fn validate(&self) -> Result<()> {
        match &self.slot_name {
            Some(slot) => validate_slot_name(slot),
            None => Ok(()),
        }
    }

    /// The slot to stream from: `slot_name`, else one named after the outbox's `schema`
    /// ([`Schema::slot_name`]; [`DEFAULT_SLOT`] without one).
    pub fn slot(&self, schema: Option<&Schema>) -> String {
        match (&self.slot_name, schema) {
            (Some(slot), _) => slot.clone(),
            (None, Some(schema)) => schema.slot_name(),
            (None, None) => DEFAULT_SLOT.to_string(),
        }
    }
}

/// Retention: what the relay deletes periodically.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RetentionConfig {
    /// Delete processed rows older than this. `None`: keep them.
    pub processed: Option<Duration>,
    /// Delete `processed_events` rows (consumers' idempotency records) older than this, in the
    /// same task. `None`: keep them. Must be longer than any redelivery of an event can come, or
    /// a consumer handles that delivery as a first one.
    pub processed_events: Option<Duration>,
}

impl RetentionConfig {
    /// Refuses ages of zero.
    pub fn validate(&self) -> Result<()> {
        if matches!(self.processed, Some(d) if d.is_zero()) {
            return Err(Error::config("retention", "must be greater than zero"));
        }
        if matches!(self.processed_events, Some(d) if d.is_zero()) {
            return Err(Error::config(
                "processed_events_retention",
                "must be greater than zero",
            ));
        }
        Ok(())
    }

    /// Whether anything is deleted periodically.
    pub fn is_on(&self) -> bool {
        self.processed.is_some() || self.processed_events.is_some()
    }
}

/// Metrics and the HTTP address.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` are served. `None`: not served.
    pub addr: Option<SocketAddr>,
    /// Distinct `event_type` label values per metric family; further event types are counted
    /// under `event_type="other"`, so that the series stay bounded whatever the rows hold.
    pub event_types_max: usize,
    /// How often the pending/dead-letter gauges are refreshed.
    pub stats_interval: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            addr: None,
            event_types_max: DEFAULT_METRICS_EVENT_TYPES_MAX,
            stats_interval: Duration::from_secs(5),
        }
    }
}

impl MetricsConfig {
    /// Refuses a stats interval of zero.
    pub fn validate(&self) -> Result<()> {
        positive("stats_interval", self.stats_interval)
    }
}

/// The relay's configuration: one section per part. `Debug` never shows a secret.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RelayConfig {
    /// PostgreSQL.
    pub postgres: PostgresConfig,
    /// NATS and the stream.
    pub nats: NatsConfig,
    /// Subjects, headers, the ack timeout.
    pub publish: PublishConfig,
    /// Batch size, byte budget, ordering.
    pub batch: BatchConfig,
    /// Attempts and backoff.
    pub retry: RetryConfig,
    /// Table or wal source, and wake-ups.
    pub source: SourceConfig,
    /// The wal source's slot and marking.
    pub wal: WalConfig,
    /// Periodic deletes.
    pub retention: RetentionConfig,
    /// Metrics and the HTTP address.
    pub metrics: MetricsConfig,
}

/// Largest batch accepted: bounds memory and the acks in flight.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// Default CloudEvents `source`: names the relay; set `ce_source` to name the producing service.
pub const DEFAULT_CE_SOURCE: &str = "/outbox-relay";

/// Default of [`MetricsConfig::event_types_max`]: more than the event types of most applications,
/// and at most about 400 series for them (one published and up to three failed reasons each),
/// which any Prometheus holds with ease.
pub const DEFAULT_METRICS_EVENT_TYPES_MAX: usize = 100;

pub use crate::schema::DEFAULT_SLOT;

/// A replication slot name as PostgreSQL takes it: 1 to 63 lowercase letters, digits and
/// underscores.
fn validate_slot_name(slot: &str) -> Result<()> {
    if slot.is_empty()
        || slot.len() > 63
        || !slot
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(Error::config(
            "slot_name",
            format!("{slot:?} is not a replication slot name (1 to 63 lowercase letters, digits and underscores)"),
        ));
    }
    Ok(())
}

/// Default byte budget of a batch: 32 MiB.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;

/// A duration that must not be zero; the error names `field`.
fn positive(field: &'static str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::config(field, "must be greater than zero"));
    }
    Ok(())
}

impl RelayConfig {
    /// A config with defaults for everything but the database URL.
    pub fn new(database_url: impl Into<DatabaseUrl>) -> Self {
        RelayConfig {
            postgres: PostgresConfig::new(database_url),
            ..Default::default()
        }
    }

    /// Refuses values the relay cannot run with: each section's, then what crosses sections.
    /// The error names the field (as the flag is named).
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_relay::RelayConfig;
    ///
    /// let mut config = RelayConfig::new("postgres://relay@db:5432/app");
    /// config.nats.url = "nats://nats:4222".into();
    /// config.source.fallback_interval = Duration::from_secs(5);
    /// assert!(config.validate().is_ok());
    ///
    /// config.batch.size = 0;
    /// let err = config.validate().unwrap_err();
    /// assert!(err.is_usage());
    /// assert_eq!(err.config_field().map(|(field, _)| field), Some("batch_size"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        self.postgres.validate()?;
        self.nats.validate()?;
        self.publish.validate()?;
        if self.nats.create_stream && self.publish.subjects()?.stream_subject().is_none() {
            return Err(Error::config(
                "subject_template",
                "starts with a placeholder, so no stream subject can capture it: start it with a literal token, or create the stream yourself instead of create_stream",
            ));
        }
        self.batch.validate()?;
        self.retry.validate()?;
        self.source.validate()?;
        self.wal.validate()?;
        self.retention.validate()?;
        self.metrics.validate()
    }

    /// Validates once and resolves what the relay derives from the config (the user's value is
    /// left as it was given).
    pub(crate) fn resolve(self) -> Result<Settings> {
        self.validate()?;
        let schema = Schema::optional(self.postgres.schema.as_deref())?;
        Ok(Settings {
            listen_url: self.postgres.session_url(schema.as_ref())?,
            slot: self.wal.slot(schema.as_ref()),
            schema,
            config: self,
        })
    }

    /// The replication slot `Source::Wal` streams from (see [`WalConfig::slot`]). Fails as
    /// [`PostgresConfig::validate`] does when the schema is not a plain lowercase identifier.
    pub fn slot(&self) -> Result<String> {
        let schema = Schema::optional(self.postgres.schema.as_deref())?;
        Ok(self.wal.slot(schema.as_ref()))
    }

    /// Longest gap between two publishes of one row: JetStream deduplicates only inside the
    /// stream's duplicate window, so a window shorter than this can let a redelivery through.
    pub fn longest_redelivery_gap(&self) -> Duration {
        self.retry.max + self.publish.timeout
    }
}

/// A validated [`RelayConfig`] and what the relay derives from it.
pub(crate) struct Settings {
    pub config: RelayConfig,
    /// `config.postgres.schema`, validated.
    pub schema: Option<Schema>,
    /// The LISTEN connection's URL: `listen_url` or `url`, with the schema.
    pub listen_url: String,
    /// The wal source's slot.
    pub slot: String,
}

/// NATS server URLs (comma-separated, the scheme optional as for the client) rebuilt from their
/// parsed form: a password becomes `***`, and so does a lone user part (a token). An entry that
/// does not parse is not shown.
fn redacted_nats_url(urls: &str) -> String {
    urls.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|raw| {
            let with_scheme = if raw.contains("://") {
                raw.to_string()
            } else {
                format!("nats://{raw}")
            };
            let Ok(mut url) = url::Url::parse(&with_scheme) else {
                return "<unparseable URL>".to_string();
            };
            let hidden = if url.password().is_some() {
                url.set_password(Some(crate::db::conninfo::HIDDEN))
            } else if !url.username().is_empty() {
                url.set_username(crate::db::conninfo::HIDDEN)
            } else {
                Ok(())
            };
            match hidden {
                Ok(()) => url.to_string(),
                // A URL that cannot carry credentials never had any; still, show nothing of it.
                Err(()) => "<unparseable URL>".to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
