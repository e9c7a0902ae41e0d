//! Relay configuration: a plain struct with defaults and [`RelayConfig::validate`]. The CLI maps its
//! flags onto it; applications embedding the relay fill it directly.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::subject::SubjectTemplate;

pub use crate::db::{validate_schema, with_schema};

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

/// `Debug` shows the URLs redacted (see [`RelayConfig::redacted`]).
#[derive(Clone)]
pub struct RelayConfig {
    /// libpq-style URL of the database holding `outbox_events`.
    pub database_url: String,
    /// A separate URL for the LISTEN connection (for example direct to PostgreSQL when
    /// `database_url` goes through PgBouncer in transaction mode). Defaults to `database_url`.
    pub listen_database_url: Option<String>,
    /// PostgreSQL schema holding the outbox objects (`None`: the connection's search_path,
    /// normally `public`).
    pub schema: Option<String>,
    /// NATS server URLs, comma-separated; credentials in the URL are taken out and sent in the options.
    pub nats_url: String,
    /// NATS credentials: a JWT + NKey `.creds` file, or an NKey seed file.
    pub nats_creds: Option<PathBuf>,
    /// An NKey seed file (instead of `nats_creds`).
    pub nats_nkey: Option<PathBuf>,
    /// NATS user name; alone (without `nats_password`) it is sent as a token, as natscli does with
    /// `NATS_USER`. Kept out of `nats_url` so that a secret never needs to be part of a URL; giving
    /// credentials both here and in `nats_url` is refused rather than silently choosing one.
    pub nats_user: Option<String>,
    /// NATS password of `nats_user`. Never printed (`Debug` and [`RelayConfig::redacted`] show `***`).
    pub nats_password: Option<String>,
    /// TLS towards NATS: extra root CA, and a client certificate and key.
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs `nats_tls_key`.
    pub nats_tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub nats_tls_key: Option<PathBuf>,
    /// JetStream stream the events are published into; checked at start.
    pub stream: String,
    /// Create `stream` when it is missing.
    pub create_stream: bool,
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
    /// Poll this often even without notifications (they can be lost during a reconnect).
    pub fallback_interval: Duration,
    /// Rows claimed per transaction.
    pub batch_size: usize,
    /// Prepare the relay's statements once per connection (fastest). Turn off behind a
    /// transaction pooler that does not keep prepared statements between transactions (PgBouncer
    /// before 1.21, or with `max_prepared_statements = 0`): statements are then sent unnamed.
    pub prepared_statements: bool,
    /// Payload bytes claimed per transaction (about: payload text plus headers). Bounds the relay's
    /// memory whatever the payloads; a single larger row is still claimed, alone.
    pub max_batch_bytes: usize,
    /// A row failing this many times is dead-lettered.
    pub max_attempts: u32,
    /// Bound on the wait for a batch's acks.
    pub publish_timeout: Duration,
    /// First retry delay of a failed row; doubles (with jitter) up to `retry_max`.
    pub retry_initial: Duration,
    /// Longest retry delay of a failed row.
    pub retry_max: Duration,
    /// Per-aggregate order or raw throughput.
    pub ordering: Ordering,
    /// How writers wake the relay.
    pub notify_mode: NotifyMode,
    /// Where events come from: the table ([`Source::Notify`]) or the WAL ([`Source::Wal`]).
    pub source: Source,
    /// The logical replication slot of `Source::Wal` (`None`: `outbox_relay`, or
    /// `outbox_relay_<schema>` with a schema). One per outbox: relays of one outbox share it.
    pub slot_name: Option<String>,
    /// How `Source::Wal` records published rows.
    pub wal_marking: WalMarking,
    /// Delete processed rows older than this, periodically. `None`: keep them.
    pub retention: Option<Duration>,
    /// Delete `processed_events` rows (consumers' idempotency records) older than this,
    /// periodically, in the same task as `retention`. `None`: keep them. Must be longer than any
    /// redelivery of an event can come, or a consumer handles that delivery as a first one.
    pub processed_events_retention: Option<Duration>,
    /// Distinct `event_type` label values per metric family; further event types are counted
    /// under `event_type="other"`, so that the series stay bounded whatever the rows hold.
    pub metrics_event_types_max: usize,
    /// Where `/metrics`, `/healthz` and `/readyz` are served. `None`: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// How often the pending/dead-letter gauges are refreshed.
    pub stats_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            database_url: String::new(),
            listen_database_url: None,
            schema: None,
            nats_url: "nats://127.0.0.1:4222".into(),
            nats_creds: None,
            nats_nkey: None,
            nats_user: None,
            nats_password: None,
            nats_tls_ca: None,
            nats_tls_cert: None,
            nats_tls_key: None,
            stream: "OUTBOX".into(),
            create_stream: false,
            subject_prefix: "outbox".into(),
            subject_template: None,
            header_format: HeaderFormat::Outbox,
            ce_source: DEFAULT_CE_SOURCE.into(),
            fallback_interval: Duration::from_secs(5),
            batch_size: 1000,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            prepared_statements: true,
            max_attempts: 10,
            publish_timeout: Duration::from_secs(5),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            ordering: Ordering::Aggregate,
            notify_mode: NotifyMode::Gated,
            source: Source::Notify,
            slot_name: None,
            wal_marking: WalMarking::Delete,
            retention: None,
            processed_events_retention: None,
            metrics_event_types_max: DEFAULT_METRICS_EVENT_TYPES_MAX,
            metrics_addr: None,
            stats_interval: Duration::from_secs(5),
        }
    }
}

/// Largest batch accepted: bounds memory and the acks in flight.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// Default CloudEvents `source`: names the relay; set `ce_source` to name the producing service.
pub const DEFAULT_CE_SOURCE: &str = "/outbox-relay";

/// Default of [`RelayConfig::metrics_event_types_max`]: more than the event types of most
/// applications, and at most about 400 series for them (one published and up to three failed
/// reasons each), which any Prometheus holds with ease.
pub const DEFAULT_METRICS_EVENT_TYPES_MAX: usize = 100;

/// Default replication slot of `Source::Wal` (with a schema: `outbox_relay_<schema>`).
pub const DEFAULT_SLOT: &str = "outbox_relay";

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

impl RelayConfig {
    /// A config with defaults for everything but the database URL.
    pub fn new(database_url: impl Into<String>) -> Self {
        RelayConfig {
            database_url: database_url.into(),
            ..Default::default()
        }
    }

    /// Refuses values the relay cannot run with. The error names the field.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_relay::RelayConfig;
    ///
    /// let config = RelayConfig {
    ///     nats_url: "nats://nats:4222".into(),
    ///     fallback_interval: Duration::from_secs(5),
    ///     ..RelayConfig::new("postgres://relay@db:5432/app")
    /// };
    /// assert!(config.validate().is_ok());
    ///
    /// let broken = RelayConfig { batch_size: 0, ..config };
    /// let err = broken.validate().unwrap_err();
    /// assert!(err.is_usage());
    /// assert_eq!(err.config_field().map(|(field, _)| field), Some("batch_size"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        if self.database_url.trim().is_empty() {
            return Err(Error::config("database_url", "is required"));
        }
        crate::db::parse_config(&self.database_url, "database_url")?;
        if let Some(url) = &self.listen_database_url {
            crate::db::parse_config(url, "listen_database_url")?;
        }
        if let Some(schema) = &self.schema {
            crate::db::validate_schema(schema)?;
        }
        if self.nats_url.trim().is_empty() {
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
        self.validate_nats_user()?;
        if self.nats_tls_cert.is_some() != self.nats_tls_key.is_some() {
            return Err(Error::config(
                "nats_tls_cert",
                "a client certificate needs its key (and the other way round)",
            ));
        }
        crate::event::validate_subject_prefix(&self.subject_prefix)?;
        let subjects = self.subjects()?;
        if self.create_stream && subjects.stream_subject().is_none() {
            return Err(Error::config(
                "subject_template",
                "starts with a placeholder, so no stream subject can capture it: start it with a literal token, or create the stream yourself instead of create_stream",
            ));
        }
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
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(Error::config(
                "batch_size",
                format!("must be between 1 and {MAX_BATCH_SIZE}"),
            ));
        }
        if self.max_batch_bytes == 0 {
            return Err(Error::config("max_batch_bytes", "must be at least 1 byte"));
        }
        if self.max_attempts == 0 {
            return Err(Error::config("max_attempts", "must be at least 1"));
        }
        let positive = [
            ("fallback_interval", self.fallback_interval),
            ("publish_timeout", self.publish_timeout),
            ("retry_initial", self.retry_initial),
            ("stats_interval", self.stats_interval),
        ];
        for (field, d) in positive {
            if d.is_zero() {
                return Err(Error::config(field, "must be greater than zero"));
            }
        }
        if self.retry_max < self.retry_initial {
            return Err(Error::config(
                "retry_max",
                "must not be shorter than retry_initial",
            ));
        }
        if let Some(slot) = &self.slot_name {
            validate_slot_name(slot)?;
        }
        if matches!(self.retention, Some(d) if d.is_zero()) {
            return Err(Error::config("retention", "must be greater than zero"));
        }
        if matches!(self.processed_events_retention, Some(d) if d.is_zero()) {
            return Err(Error::config(
                "processed_events_retention",
                "must be greater than zero",
            ));
        }
        Ok(())
    }

    /// `nats_user`/`nats_password` complete and not competing with credentials in `nats_url`.
    fn validate_nats_user(&self) -> Result<()> {
        if self.nats_user.is_none() && self.nats_password.is_none() {
            return Ok(());
        }
        match self.nats_user.as_deref() {
            None => {
                return Err(Error::config(
                    "nats_password",
                    "needs a user name (nats_user, NATS_USER)",
                ))
            }
            Some("") => return Err(Error::config("nats_user", "must not be empty")),
            Some(_) => {}
        }
        let (_, in_url) = crate::publisher::split_credentials(&self.nats_url)?;
        if in_url.is_some() {
            return Err(Error::config(
                "nats_user",
                "credentials are also given in nats_url (user:password@ or token@); give them in one place",
            ));
        }
        Ok(())
    }

    /// `nats_user` for logs: shown next to a password, hidden when it is a token.
    fn shown_nats_user(&self) -> &str {
        match (&self.nats_user, &self.nats_password) {
            (None, _) => "-",
            (Some(user), Some(_)) => user,
            (Some(_), None) => crate::db::conninfo::HIDDEN,
        }
    }

    /// The effective configuration for logs. The database URLs are shown as their parsed
    /// parameters with the password replaced (in libpq key=value form), the NATS URLs with
    /// their password or token replaced.
    pub fn redacted(&self) -> String {
        format!(
            "database_url={:?} listen_database_url={} schema={} nats_url={} stream={} create_stream={} subject_prefix={} subject_template={} header_format={:?} ce_source={} \
             fallback_interval={} batch_size={} max_batch_bytes={} prepared_statements={} max_attempts={} publish_timeout={} retry_initial={} \
             retry_max={} ordering={:?} notify_mode={:?} source={:?} slot={} wal_marking={:?} retention={} processed_events_retention={} metrics_event_types_max={} \
             metrics_addr={} nats_creds={} nats_nkey={} nats_user={} nats_password={}",
            crate::db::redacted_url(&self.database_url),
            self.listen_database_url
                .as_deref()
                .map(|url| format!("{:?}", crate::db::redacted_url(url)))
                .unwrap_or_else(|| "-".into()),
            self.schema.as_deref().unwrap_or("-"),
            redacted_nats_url(&self.nats_url),
            self.stream,
            self.create_stream,
            self.subject_prefix,
            self.subject_template.as_deref().unwrap_or("-"),
            self.header_format,
            self.ce_source,
            humantime::format_duration(self.fallback_interval),
            self.batch_size,
            self.max_batch_bytes,
            self.prepared_statements,
            self.max_attempts,
            humantime::format_duration(self.publish_timeout),
            humantime::format_duration(self.retry_initial),
            humantime::format_duration(self.retry_max),
            self.ordering,
            self.notify_mode,
            self.source,
            self.slot(),
            self.wal_marking,
            self.retention.map(|d| humantime::format_duration(d).to_string()).unwrap_or_else(|| "off".into()),
            self.processed_events_retention.map(|d| humantime::format_duration(d).to_string()).unwrap_or_else(|| "off".into()),
            self.metrics_event_types_max,
            self.metrics_addr.map(|a| a.to_string()).unwrap_or_else(|| "off".into()),
            self.nats_creds.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into()),
            self.nats_nkey.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into()),
            self.shown_nats_user(),
            if self.nats_password.is_some() { crate::db::conninfo::HIDDEN } else { "-" },
        )
    }

    /// Validates once and resolves what the relay derives from the config (the user's value is
    /// left as it was given).
    pub(crate) fn resolve(self) -> Result<Settings> {
        self.validate()?;
        let listen = self
            .listen_database_url
            .as_deref()
            .unwrap_or(&self.database_url);
        // The LISTEN connection is never pooled (LISTEN needs a session of its own), so it takes
        // the schema in its session (see [`crate::db::with_schema`]). The worker connections apply
        // it per transaction instead, so that they work through a transaction pooler, which
        // refuses the `options` startup parameter.
        let listen_url = match &self.schema {
            Some(schema) => crate::db::with_schema_for(listen, schema, "listen_database_url")?,
            None => listen.to_string(),
        };
        Ok(Settings {
            subjects: self.subjects()?,
            config: self,
            listen_url,
        })
    }

    /// The parsed subject template (the default one when `subject_template` is not set).
    pub(crate) fn subjects(&self) -> Result<SubjectTemplate> {
        match &self.subject_template {
            Some(template) => SubjectTemplate::parse(template),
            None => Ok(SubjectTemplate::with_prefix(&self.subject_prefix)),
        }
    }

    /// The replication slot `Source::Wal` streams from: `slot_name`, else one named after the
    /// outbox's schema.
    pub fn slot(&self) -> String {
        match (&self.slot_name, &self.schema) {
            (Some(slot), _) => slot.clone(),
            (None, None) => DEFAULT_SLOT.to_string(),
            (None, Some(schema)) if schema == "public" => DEFAULT_SLOT.to_string(),
            (None, Some(schema)) => {
                let mut name = format!("{DEFAULT_SLOT}_{schema}");
                name.truncate(63);
                name
            }
        }
    }

    /// Longest gap between two publishes of one row: JetStream deduplicates only inside the
    /// stream's duplicate window, so a window shorter than this can let a redelivery through.
    pub fn longest_redelivery_gap(&self) -> Duration {
        self.retry_max + self.publish_timeout
    }
}

/// A validated [`RelayConfig`] and what the relay derives from it.
pub(crate) struct Settings {
    pub config: RelayConfig,
    /// The LISTEN connection's URL: `listen_database_url` or `database_url`, with the schema.
    pub listen_url: String,
    /// The parsed subject template.
    pub subjects: SubjectTemplate,
}

/// Written by hand so that an application logging its config never prints a password: database
/// URLs as their parsed parameters with the password replaced, NATS URLs without password or token.
impl fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let RelayConfig {
            database_url,
            listen_database_url,
            schema,
            nats_url,
            nats_creds,
            nats_nkey,
            nats_user: _,
            nats_password,
            nats_tls_ca,
            nats_tls_cert,
            nats_tls_key,
            stream,
            create_stream,
            subject_prefix,
            subject_template,
            header_format,
            ce_source,
            fallback_interval,
            batch_size,
            max_batch_bytes,
            prepared_statements,
            max_attempts,
            publish_timeout,
            retry_initial,
            retry_max,
            ordering,
            notify_mode,
            source,
            slot_name,
            wal_marking,
            retention,
            processed_events_retention,
            metrics_event_types_max,
            metrics_addr,
            stats_interval,
        } = self;
        f.debug_struct("RelayConfig")
            .field("database_url", &crate::db::redacted_url(database_url))
            .field(
                "listen_database_url",
                &listen_database_url.as_deref().map(crate::db::redacted_url),
            )
            .field("schema", schema)
            .field("nats_url", &redacted_nats_url(nats_url))
            .field("nats_creds", nats_creds)
            .field("nats_nkey", nats_nkey)
            .field("nats_user", &self.shown_nats_user())
            .field(
                "nats_password",
                &nats_password.as_ref().map(|_| crate::db::conninfo::HIDDEN),
            )
            .field("nats_tls_ca", nats_tls_ca)
            .field("nats_tls_cert", nats_tls_cert)
            .field("nats_tls_key", nats_tls_key)
            .field("stream", stream)
            .field("create_stream", create_stream)
            .field("subject_prefix", subject_prefix)
            .field("subject_template", subject_template)
            .field("header_format", header_format)
            .field("ce_source", ce_source)
            .field("fallback_interval", fallback_interval)
            .field("batch_size", batch_size)
            .field("max_batch_bytes", max_batch_bytes)
            .field("prepared_statements", prepared_statements)
            .field("max_attempts", max_attempts)
            .field("publish_timeout", publish_timeout)
            .field("retry_initial", retry_initial)
            .field("retry_max", retry_max)
            .field("ordering", ordering)
            .field("notify_mode", notify_mode)
            .field("source", source)
            .field("slot_name", slot_name)
            .field("wal_marking", wal_marking)
            .field("retention", retention)
            .field("processed_events_retention", processed_events_retention)
            .field("metrics_event_types_max", metrics_event_types_max)
            .field("metrics_addr", metrics_addr)
            .field("stats_interval", stats_interval)
            .finish()
    }
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
mod tests {
    use super::*;
    use crate::error::field_of;

    #[test]
    fn defaults_validate_once_a_url_is_set() {
        assert!(RelayConfig::default().validate().is_err());
        RelayConfig::new("postgres://localhost/db")
            .validate()
            .expect("defaults are valid");
    }

    #[test]
    fn errors_name_the_field() {
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.batch_size = 0;
        assert_eq!(field_of(c.validate()), Some("batch_size"));
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.subject_prefix = "a.*".into();
        assert_eq!(field_of(c.validate()), Some("subject_prefix"));
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.subject_template = Some("app.{nope}".into());
        assert_eq!(field_of(c.validate()), Some("subject_template"));
        // A template starting with a placeholder is fine, but no stream can be created for it.
        c.subject_template = Some("{aggregate_type}.{event_type}".into());
        c.validate().expect("valid without create_stream");
        c.create_stream = true;
        assert_eq!(field_of(c.validate()), Some("subject_template"));
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.ce_source = "has space".into();
        c.validate()
            .expect("ce_source unused with the Outbox-* headers");
        for format in [HeaderFormat::CloudEvents, HeaderFormat::Both] {
            c.header_format = format;
            assert_eq!(field_of(c.validate()), Some("ce_source"));
        }
        c.ce_source = String::new();
        assert_eq!(field_of(c.validate()), Some("ce_source"));
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.stream = "has.dot".into();
        assert_eq!(field_of(c.validate()), Some("stream"));
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.processed_events_retention = Some(Duration::ZERO);
        assert_eq!(field_of(c.validate()), Some("processed_events_retention"));
        c.processed_events_retention = Some(Duration::from_secs(86_400));
        c.metrics_event_types_max = 0; // everything counted as `other`: allowed
        c.validate().expect("valid");
    }

    const SECRET: &str = "s3cret-Pa55";

    fn leaky_config() -> RelayConfig {
        let mut c = RelayConfig::new(format!(
            r"host=db user=app password = '{SECRET} and more' application_name='it\'s me'"
        ));
        c.listen_database_url = Some(format!(
            "postgres://app:{SECRET}@db:5432/x?sslmode=require&password={SECRET}"
        ));
        c.nats_url = format!("nats://relay:{SECRET}@n1:4222, tls://{SECRET}@n2:4222,n3:4222");
        c
    }

    #[test]
    fn redacted_shows_parsed_urls_without_secrets() {
        let shown = leaky_config().redacted();
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(!shown.contains("and more"), "{shown}");
        assert!(
            shown.contains(
                r#"database_url="host=db user=app password=*** application_name='it\\'s me'""#
            ),
            "{shown}"
        );
        assert!(
            shown.contains(
                r#"listen_database_url="user=app password=*** host=db port=5432 dbname=x sslmode=require""#
            ),
            "{shown}"
        );
        assert!(
            shown.contains("nats_url=nats://relay:***@n1:4222,tls://***@n2:4222,nats://n3:4222"),
            "{shown}"
        );
        let mut c = leaky_config();
        c.database_url = format!("host=db '{SECRET}");
        c.nats_url = format!("nats://[{SECRET}");
        let shown = c.redacted();
        assert!(!shown.contains(SECRET), "{shown}");
    }

    #[test]
    fn debug_never_prints_passwords() {
        let c = leaky_config();
        for shown in [format!("{c:?}"), format!("{c:#?}")] {
            assert!(!shown.contains(SECRET), "{shown}");
            assert!(!shown.contains("and more"), "{shown}");
            assert!(shown.contains("password=***"), "{shown}");
            assert!(shown.contains("nats://relay:***@n1:4222"), "{shown}");
            assert!(shown.contains("batch_size: 1000"), "{shown}");
        }
    }

    #[test]
    fn nats_user_and_password_are_complete_and_in_one_place() {
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.nats_user = Some("relay".into());
        c.nats_password = Some(SECRET.into());
        c.validate().expect("user and password");
        c.nats_password = None;
        c.validate().expect("a user alone is a token");
        c.nats_user = None;
        c.nats_password = Some(SECRET.into());
        assert_eq!(field_of(c.validate()), Some("nats_password"));
        c.nats_user = Some(String::new());
        assert_eq!(field_of(c.validate()), Some("nats_user"));
        // Credentials in the URL as well: refused, whichever form.
        for url in ["nats://u:p@a:4222", "nats://a:4222,tok3n@b:4222"] {
            c.nats_user = Some("relay".into());
            c.nats_url = url.into();
            let err = c.validate().expect_err(url);
            assert_eq!(err.config_field().map(|(f, _)| f), Some("nats_user"));
            assert!(!err.to_string().contains(SECRET), "{err}");
        }
    }

    #[test]
    fn nats_password_and_token_are_never_shown() {
        let mut c = RelayConfig::new("postgres://localhost/db");
        c.nats_user = Some("relay".into());
        c.nats_password = Some(SECRET.into());
        for shown in [c.redacted(), format!("{c:?}")] {
            assert!(!shown.contains(SECRET), "{shown}");
            assert!(shown.contains("relay"), "{shown}");
        }
        assert!(c.redacted().contains("nats_user=relay nats_password=***"));
        // A user without password is a token: hidden too.
        c.nats_user = Some(SECRET.into());
        c.nats_password = None;
        for shown in [c.redacted(), format!("{c:?}")] {
            assert!(!shown.contains(SECRET), "{shown}");
        }
    }

    #[test]
    fn tls_parameters_are_checked_with_the_field_named() {
        let mut c = RelayConfig::new("host=db sslmode = verify-everything");
        assert_eq!(field_of(c.validate()), Some("database_url"));
        c.database_url = "host=db".into();
        c.listen_database_url = Some("host=db sslrootcert=system sslmode=require".into());
        assert_eq!(field_of(c.validate()), Some("listen_database_url"));
    }
}
