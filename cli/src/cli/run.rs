//! `run`'s flags, in the library's configuration sections (`config` converts each into its
//! section), and the parsers of the values that are not the library's types.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
// The sections the flags' documentation links to.
#[cfg(doc)]
use outbox_relay::config::{
    BatchConfig, MetricsConfig, NatsConfig, PostgresConfig, PublishConfig, RetentionConfig,
    RetryConfig, SourceConfig, WalConfig,
};
use outbox_relay::{
    HeaderFormat, NotifyMode, Ordering, PublishBatches, RelayConfig, Source, TransactionMode,
    WalMarking,
};

/// The library's defaults are the CLI's: written once, in each section's `Default`.
fn defaults() -> RelayConfig {
    RelayConfig::default()
}

/// `run`'s flags, in the library's configuration sections (each converts into its section).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub postgres: PostgresArgs,
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub publish: PublishArgs,
    #[command(flatten)]
    pub batch: BatchArgs,
    #[command(flatten)]
    pub retry: RetryArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub wal: WalArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// PostgreSQL ([`PostgresConfig`]; `--database-url` and `--schema` are global).
#[derive(Debug, Clone, Args)]
pub struct PostgresArgs {
    /// Separate URL for the LISTEN connection (direct to PostgreSQL when --database-url goes
    /// through PgBouncer in transaction mode).
    #[arg(long, env = "OUTBOX_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<String>,
    /// Prepare the relay's statements once per connection. `false` behind a transaction pooler
    /// that does not keep prepared statements (PgBouncer before 1.21, or without
    /// `max_prepared_statements`): statements are then sent unnamed, planned each time.
    #[arg(long, env = "OUTBOX_PREPARED_STATEMENTS", default_value_t = defaults().postgres.prepared_statements, action = clap::ArgAction::Set)]
    pub prepared_statements: bool,
}

/// NATS and the stream ([`NatsConfig`]).
#[derive(Debug, Clone, Args)]
pub struct NatsArgs {
    #[arg(
        long,
        env = "NATS_URL",
        default_value_t = defaults().nats.url.expose().to_string(),
        hide_env_values = true
    )]
    pub nats_url: String,
    /// JWT + NKey credentials file.
    #[arg(long, env = "NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// NKey seed file.
    #[arg(long, env = "NATS_NKEY")]
    pub nats_nkey: Option<PathBuf>,
    /// NATS user name (natscli's NATS_USER). Without --nats-password it is sent as a token, as
    /// natscli does. Not together with credentials in --nats-url (refused: give them in one place).
    #[arg(long, env = "NATS_USER", hide_env_values = true)]
    pub nats_user: Option<String>,
    /// Password of --nats-user (natscli's NATS_PASSWORD).
    #[arg(
        long,
        env = "NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_user"
    )]
    pub nats_password: Option<String>,
    /// Extra root CA (PEM) for TLS to NATS. Also read from natscli's NATS_CA; NATS_TLS_CA wins
    /// when both are set.
    #[arg(long, env = "NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for TLS to NATS. Also read from natscli's NATS_CERT;
    /// NATS_TLS_CERT wins when both are set.
    #[arg(long, env = "NATS_TLS_CERT")]
    pub nats_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --nats-tls-cert. Also read from natscli's NATS_KEY; NATS_TLS_KEY wins
    /// when both are set.
    #[arg(long, env = "NATS_TLS_KEY")]
    pub nats_tls_key: Option<PathBuf>,
    /// JetStream stream (checked at start).
    #[arg(long, env = "OUTBOX_STREAM", default_value_t = defaults().nats.stream)]
    pub stream: String,
    /// Create the stream when it is missing (file storage, subjects <prefix>.> or the subject
    /// template's leading literal tokens followed by `>`, 2m+ dedup window).
    #[arg(long, env = "OUTBOX_CREATE_STREAM")]
    pub create_stream: bool,
}

/// Subjects, headers, ack timeout ([`PublishConfig`]).
#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// Events go to <prefix>.<event_type>.
    #[arg(long, env = "OUTBOX_SUBJECT_PREFIX", default_value_t = defaults().publish.subject_prefix)]
    pub subject_prefix: String,
    /// Route events by their fields instead: placeholders {event_type}, {aggregate_type} and
    /// {aggregate_id}, for example `orders.{aggregate_type}.{event_type}` (default:
    /// `<prefix>.{event_type}`). A row whose values make an invalid subject is dead-lettered.
    #[arg(
        long,
        env = "OUTBOX_SUBJECT_TEMPLATE",
        conflicts_with = "subject_prefix",
        value_name = "TEMPLATE"
    )]
    pub subject_template: Option<String>,
    /// Metadata headers on each message: `outbox` (Outbox-*), `cloudevents` (the CloudEvents NATS
    /// binding: ce-specversion, ce-id, ce-type, ce-source, ce-time, ce-subject, content-type), or
    /// `both`. Nats-Msg-Id is always set.
    #[arg(long, env = "OUTBOX_HEADERS", value_enum, default_value_t = defaults().publish.header_format)]
    pub headers: HeaderFormat,
    /// CloudEvents `source` (a URI-reference naming the producer, e.g. /orders-service), sent as
    /// ce-source with --headers cloudevents or both.
    #[arg(long, env = "OUTBOX_CE_SOURCE", default_value_t = defaults().publish.ce_source)]
    pub ce_source: String,
    #[arg(long, env = "OUTBOX_PUBLISH_TIMEOUT", default_value_t = defaults().publish.timeout.into())]
    pub publish_timeout: humantime::Duration,
    /// `events`: one message per event, each acked on its own. `atomic`: each database
    /// transaction's events as one JetStream atomic batch, stored all together or not at all
    /// (nats-server 2.12+, a stream with allow_atomic: --create-stream sets it).
    #[arg(long, env = "OUTBOX_TRANSACTIONS", value_enum, default_value_t = defaults().publish.transactions)]
    pub transactions: TransactionMode,
    /// `off`: each event published on its own, its ack awaited (many in flight). `fast-ingest`:
    /// a batch's events as JetStream fast-ingest batches, stored as they arrive and acked every few
    /// hundred messages; an event still counts as published only once the server confirmed its
    /// storage (nats-server 2.14+, a stream with allow_batched: --create-stream sets it). Not with
    /// --transactions atomic.
    #[arg(long, env = "OUTBOX_PUBLISH_BATCHES", value_enum, default_value_t = defaults().publish.batches)]
    pub publish_batches: PublishBatches,
}

/// Batching ([`BatchConfig`]).
#[derive(Debug, Clone, Args)]
pub struct BatchArgs {
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = defaults().batch.size)]
    pub batch_size: usize,
    /// Payload bytes per batch (`32MiB`, `4MB`, `1000000`): bounds the relay's memory whatever the
    /// payloads; a single larger event still goes, alone.
    #[arg(long, env = "OUTBOX_MAX_BATCH_BYTES", default_value_t = ByteSize(defaults().batch.max_bytes), value_parser = parse_bytes)]
    pub max_batch_bytes: ByteSize,
    /// `aggregate`: per-aggregate seq order; `none`: raw throughput.
    #[arg(long, env = "OUTBOX_ORDERING", value_enum, default_value_t = defaults().batch.ordering)]
    pub ordering: Ordering,
}

/// Retries ([`RetryConfig`]).
#[derive(Debug, Clone, Args)]
pub struct RetryArgs {
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = defaults().retry.max_attempts)]
    pub max_attempts: u32,
    #[arg(long, env = "OUTBOX_RETRY_INITIAL", default_value_t = defaults().retry.initial.into())]
    pub retry_initial: humantime::Duration,
    #[arg(long, env = "OUTBOX_RETRY_MAX", default_value_t = defaults().retry.max.into())]
    pub retry_max: humantime::Duration,
}

/// Source and wake-ups ([`SourceConfig`]).
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// `notify`: claim pending rows from the table, woken by NOTIFY; `wal`: stream committed
    /// inserts from a logical replication slot, in commit order (wal_level=logical, a role with
    /// REPLICATION, `migrate --wal`; one relay streams, others stand by).
    #[arg(long, env = "OUTBOX_SOURCE", value_enum, default_value_t = defaults().source.source)]
    pub source: Source,
    /// `gated`: writers notify only while a relay waits; `always`: every writer notifies;
    /// `poll`: no LISTEN, poll every --fallback-interval.
    #[arg(long, env = "OUTBOX_NOTIFY_MODE", value_enum, default_value_t = defaults().source.notify_mode)]
    pub notify_mode: NotifyMode,
    /// Poll this often even without notifications.
    #[arg(long, env = "OUTBOX_FALLBACK_INTERVAL", default_value_t = defaults().source.fallback_interval.into())]
    pub fallback_interval: humantime::Duration,
}

/// The wal source ([`WalConfig`]).
#[derive(Debug, Clone, Args)]
pub struct WalArgs {
    /// The replication slot of --source wal (created when missing; one per outbox).
    /// Default: outbox_relay, or outbox_relay_<schema> with --schema.
    #[arg(long, env = "OUTBOX_SLOT_NAME", value_name = "NAME")]
    pub slot_name: Option<String>,
    /// How --source wal records a published row: `delete` it (the stream holds it; cheapest for
    /// PostgreSQL) or `update` it (processed_at, kept until cleanup, as the notify source does).
    #[arg(long, env = "OUTBOX_WAL_MARKING", value_enum, default_value_t = defaults().wal.marking)]
    pub wal_marking: WalMarking,
}

/// Retention ([`RetentionConfig`]).
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// Delete processed rows older than this, periodically (off by default).
    #[arg(long, env = "OUTBOX_RETENTION", value_parser = humantime::parse_duration)]
    pub retention: Option<Duration>,
    /// Delete processed_events rows (consumers' idempotency records) older than this,
    /// periodically (off by default). Keep it longer than any redelivery can come.
    #[arg(long, env = "OUTBOX_PROCESSED_EVENTS_RETENTION", value_parser = humantime::parse_duration)]
    pub processed_events_retention: Option<Duration>,
}

/// Metrics and the HTTP address ([`MetricsConfig`]).
#[derive(Debug, Clone, Args)]
pub struct MetricsArgs {
    /// Distinct event_type label values per metric; further event types are counted as
    /// event_type="other".
    #[arg(long, env = "OUTBOX_METRICS_EVENT_TYPES_MAX", default_value_t = defaults().metrics.event_types_max)]
    pub metrics_event_types_max: usize,
    /// Address for /metrics, /healthz, /readyz; `off` disables.
    #[arg(long, env = "OUTBOX_METRICS_ADDR", default_value = "127.0.0.1:9464", value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
}

/// A byte size such as `32MiB`, `64 MB` or `1048576`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub usize);

/// Whole MiB as `32MiB`, anything else in bytes (what `--help` shows as the default).
impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MIB: usize = 1024 * 1024;
        if self.0.is_multiple_of(MIB) {
            write!(f, "{}MiB", self.0 / MIB)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

fn parse_bytes(s: &str) -> Result<ByteSize, String> {
    let size: bytesize::ByteSize = s
        .trim()
        .parse()
        .map_err(|e| format!("{e} (expected a size such as 32MiB)"))?;
    usize::try_from(size.as_u64())
        .ok()
        .filter(|&n| n > 0)
        .map(ByteSize)
        .ok_or_else(|| "must be more than 0 bytes".to_string())
}

#[derive(Debug, Clone, Copy)]
pub struct MetricsAddr(pub Option<SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(MetricsAddr(None));
    }
    s.parse::<SocketAddr>()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|e| format!("{e} (expected HOST:PORT or `off`)"))
}
