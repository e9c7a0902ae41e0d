//! Command-line interface (clap derive). Every flag also reads an environment variable; some
//! also read natscli's name for it ([`ENV_ALIASES`]).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use outbox_relay::config::{
    BatchConfig, MetricsConfig, NatsConfig, PostgresConfig, PublishConfig, RetentionConfig,
    RetryConfig, Secret, SourceConfig, WalConfig,
};
use outbox_relay::{
    HeaderFormat, NotifyMode, Ordering, PublishBatches, RelayConfig, Source, TransactionMode,
    WalMarking,
};
use uuid::Uuid;

/// The library's defaults are the CLI's: written once, in each section's `Default`.
fn defaults() -> RelayConfig {
    RelayConfig::default()
}

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Transactional outbox relay: PostgreSQL -> NATS JetStream"
)]
pub struct Cli {
    /// PostgreSQL URL of the database holding outbox_events.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// PostgreSQL schema holding the outbox objects (default: the connection's search_path,
    /// normally `public`). Writers must have it in their search_path too.
    #[arg(long, env = "OUTBOX_SCHEMA", global = true)]
    pub schema: Option<String>,
    /// Log format.
    #[arg(
        long,
        env = "OUTBOX_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
    /// Runtime threads. 1 runs the relay on a single thread: its work is I/O, and a wake-up then
    /// needs no hand-off between threads (lower latency, less CPU). 0: one per core.
    #[arg(
        long,
        env = "OUTBOX_WORKER_THREADS",
        default_value_t = 1,
        global = true
    )]
    pub worker_threads: usize,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `migrate --print --format`: how the migrations are wrapped for the tool that applies them.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PrintFormat {
    Script,
    Bare,
    Goose,
}

impl From<PrintFormat> for outbox_relay::migrate::ScriptFormat {
    fn from(f: PrintFormat) -> Self {
        match f {
            PrintFormat::Script => Self::Script,
            PrintFormat::Bare => Self::Bare,
            PrintFormat::Goose => Self::Goose,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox schema (idempotent; safe to run concurrently).
    Migrate {
        /// Print the SQL instead of applying it (for your own migration tool).
        #[arg(long, conflicts_with_all = ["check", "status"])]
        print: bool,
        /// With --print: only the migrations from this version on.
        #[arg(long, requires = "print", value_name = "VERSION", value_parser = clap::value_parser!(i32).range(1..))]
        from: Option<i32>,
        /// With --print: `script` (one transaction, for psql), `bare` (no BEGIN/COMMIT, for tools
        /// that run each file in their own transaction: Flyway, Atlas, refinery) or `goose`.
        #[arg(long, requires = "print", value_enum, value_name = "FORMAT")]
        format: Option<PrintFormat>,
        /// Apply nothing; exit 1 when migrations are pending (a deploy gate).
        #[arg(long, conflicts_with = "status")]
        check: bool,
        /// Apply nothing; list each version as applied or pending.
        #[arg(long)]
        status: bool,
        /// Also create the publication that `run --source wal` streams from (inserts into
        /// outbox_events; needs CREATE on the database). Idempotent.
        #[arg(long, conflicts_with_all = ["print", "check", "status"])]
        wal: bool,
        /// Grant ROLE what writers need (INSERT into the outbox), after migrating.
        #[arg(long, value_name = "ROLE")]
        grant_writer: Vec<String>,
        /// Grant ROLE what the relay and the operator commands need, after migrating.
        #[arg(long, value_name = "ROLE")]
        grant_relay: Vec<String>,
    },
    /// Run the relay until SIGTERM/SIGINT.
    Run(Box<RunArgs>),
    /// Pending events, retries, dead letters and blocked aggregates (listed, with their dead head).
    Status {
        #[arg(long)]
        json: bool,
        /// Blocked aggregates listed at most.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..))]
        limit: i64,
    },
    /// Inspect, retry or discard dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
    /// Delete processed (and discarded) rows older than a cutoff, in small batches; and/or old rows
    /// of processed_events, the consumers' idempotency records.
    ///
    /// Prints one summary line on stdout per table (rows, time, rate); on a terminal, progress on
    /// stderr while it runs.
    #[command(group(
        clap::ArgGroup::new("cutoff")
            .args(["older_than", "processed_events_older_than"])
            .required(true)
            .multiple(true)
    ))]
    Cleanup {
        /// Outbox rows processed (or discarded) longer ago than this, for example `7d` or `12h`.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<Duration>,
        /// processed_events rows recorded longer ago than this (`30d`). Keep it longer than any
        /// redelivery can come, or a consumer handles that delivery as a first one.
        #[arg(long, value_parser = humantime::parse_duration)]
        processed_events_older_than: Option<Duration>,
        /// Rows deleted per statement.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        batch_size: i64,
        /// Count the rows that would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Serve the operator console (a web application: status, blocked aggregates, dead letters,
    /// retry and discard) until SIGTERM/SIGINT.
    ///
    /// Every request needs the token: from --token-file, else from OUTBOX_CONSOLE_TOKEN (at least
    /// 16 characters; never a flag, which other users could read in the process list). The
    /// database role needs what `migrate --grant-relay ROLE` grants.
    Console(ConsoleArgs),
    /// Print a shell completion script to stdout (for example
    /// `outbox-relay completions bash > /etc/bash_completion.d/outbox-relay`).
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) of outbox-relay or of one of its subcommands to stdout
    /// (`outbox-relay man run | man -l -`), or write all pages into a directory.
    Man {
        /// The subcommand whose page to print, for example `run` or `dead-letters retry`.
        #[arg(conflicts_with = "out_dir")]
        subcommand: Vec<String>,
        /// Write outbox-relay.1 and a page per subcommand (outbox-relay-run.1, ...) into DIR.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

/// `console`: where it listens, the token, read-only.
#[derive(Debug, Clone, Args)]
pub struct ConsoleArgs {
    /// Address to listen on. The default is reachable from this machine only; bound anywhere
    /// else, put TLS in front of it (a reverse proxy that keeps the Host header).
    #[arg(
        long,
        env = "OUTBOX_CONSOLE_LISTEN",
        default_value = "127.0.0.1:9465",
        value_name = "ADDR"
    )]
    pub listen: SocketAddr,
    /// File holding the token (surrounding whitespace ignored). Without it the token comes from
    /// OUTBOX_CONSOLE_TOKEN.
    #[arg(long, env = "OUTBOX_CONSOLE_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Show only: hide and refuse every action (retry, discard).
    #[arg(long, env = "OUTBOX_CONSOLE_READ_ONLY")]
    pub read_only: bool,
}

#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// List dead letters, oldest first.
    List {
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        #[arg(long)]
        event_type: Option<String>,
    },
    /// Give dead letters a fresh set of attempts.
    ///
    /// Named ids are retried in one transaction (all or none); `--all` goes in batches of
    /// `--batch-size`, each committed on its own, with progress on a terminal. Prints one summary
    /// line on stdout.
    Retry {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<Uuid>,
        /// Retry every dead letter.
        #[arg(long)]
        all: bool,
        /// With --all: dead letters retried per transaction [default: 1000].
        #[arg(long, conflicts_with = "ids", value_parser = clap::value_parser!(i64).range(1..=100_000))]
        batch_size: Option<i64>,
        /// List the dead letters that would be retried (id, aggregate, event type) and their
        /// count; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Give up on dead letters (kept and marked discarded; releases their aggregates).
    Discard {
        #[arg(required = true)]
        ids: Vec<Uuid>,
    },
}

/// A clap value enum for a library enum (the library knows nothing of clap), variant for variant,
/// with the conversions both ways. The arg's variant names are the flag values (kebab-case).
macro_rules! value_enum {
    ($arg:ident <=> $lib:ident { $($a:ident = $l:ident),+ $(,)? }) => {
        #[derive(Debug, Clone, Copy, ValueEnum)]
        pub enum $arg {
            $($a),+
        }

        impl From<$lib> for $arg {
            fn from(v: $lib) -> Self {
                match v {
                    $($lib::$l => $arg::$a),+
                }
            }
        }

        impl From<$arg> for $lib {
            fn from(v: $arg) -> Self {
                match v {
                    $($arg::$a => $lib::$l),+
                }
            }
        }
    };
}

value_enum!(OrderingArg <=> Ordering { Aggregate = Aggregate, None = None });
value_enum!(HeaderFormatArg <=> HeaderFormat {
    Outbox = Outbox,
    Cloudevents = CloudEvents,
    Both = Both,
});
value_enum!(TransactionModeArg <=> TransactionMode {
    Events = Events,
    Atomic = Atomic,
});
value_enum!(PublishBatchesArg <=> PublishBatches {
    Off = Off,
    FastIngest = FastIngest,
});
value_enum!(WalMarkingArg <=> WalMarking { Delete = Delete, Update = Update });
value_enum!(SourceArg <=> Source { Notify = Notify, Wal = Wal });
value_enum!(NotifyModeArg <=> NotifyMode {
    Gated = Gated,
    Always = Always,
    Poll = Poll,
});

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
    #[arg(long, env = "OUTBOX_HEADERS", value_enum, default_value_t = defaults().publish.header_format.into())]
    pub headers: HeaderFormatArg,
    /// CloudEvents `source` (a URI-reference naming the producer, e.g. /orders-service), sent as
    /// ce-source with --headers cloudevents or both.
    #[arg(long, env = "OUTBOX_CE_SOURCE", default_value_t = defaults().publish.ce_source)]
    pub ce_source: String,
    #[arg(long, env = "OUTBOX_PUBLISH_TIMEOUT", default_value_t = defaults().publish.timeout.into())]
    pub publish_timeout: humantime::Duration,
    /// `events`: one message per event, each acked on its own. `atomic`: each database
    /// transaction's events as one JetStream atomic batch, stored all together or not at all
    /// (nats-server 2.12+, a stream with allow_atomic: --create-stream sets it).
    #[arg(long, env = "OUTBOX_TRANSACTIONS", value_enum, default_value_t = defaults().publish.transactions.into())]
    pub transactions: TransactionModeArg,
    /// `off`: each event published on its own, its ack awaited (many in flight). `fast-ingest`:
    /// a batch's events as JetStream fast-ingest batches, stored as they arrive and acked every few
    /// hundred messages; an event still counts as published only once the server confirmed its
    /// storage (nats-server 2.14+, a stream with allow_batched: --create-stream sets it). Not with
    /// --transactions atomic.
    #[arg(long, env = "OUTBOX_PUBLISH_BATCHES", value_enum, default_value_t = defaults().publish.batches.into())]
    pub publish_batches: PublishBatchesArg,
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
    #[arg(long, env = "OUTBOX_ORDERING", value_enum, default_value_t = defaults().batch.ordering.into())]
    pub ordering: OrderingArg,
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
    #[arg(long, env = "OUTBOX_SOURCE", value_enum, default_value_t = defaults().source.source.into())]
    pub source: SourceArg,
    /// `gated`: writers notify only while a relay waits; `always`: every writer notifies;
    /// `poll`: no LISTEN, poll every --fallback-interval.
    #[arg(long, env = "OUTBOX_NOTIFY_MODE", value_enum, default_value_t = defaults().source.notify_mode.into())]
    pub notify_mode: NotifyModeArg,
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
    #[arg(long, env = "OUTBOX_WAL_MARKING", value_enum, default_value_t = defaults().wal.marking.into())]
    pub wal_marking: WalMarkingArg,
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

impl RunArgs {
    /// The relay's configuration: each section from its flags.
    pub fn into_config(self, database_url: String, schema: Option<String>) -> RelayConfig {
        let mut config = RelayConfig::new(database_url);
        config.postgres = self.postgres.into_config(config.postgres, schema);
        config.nats = self.nats.into();
        config.publish = self.publish.into();
        config.batch = self.batch.into();
        config.retry = self.retry.into();
        config.source = self.source.into();
        config.wal = self.wal.into();
        config.retention = self.retention.into();
        config.metrics = self.metrics.into();
        config
    }
}

impl PostgresArgs {
    fn into_config(self, mut c: PostgresConfig, schema: Option<String>) -> PostgresConfig {
        c.listen_url = self.listen_database_url.map(Into::into);
        c.schema = schema;
        c.prepared_statements = self.prepared_statements;
        c
    }
}

/// An empty flag or variable (`NATS_USER=`) counts as not given.
fn non_empty(value: Option<String>) -> Option<Secret> {
    value.filter(|v| !v.is_empty()).map(Secret::from)
}

impl From<NatsArgs> for NatsConfig {
    fn from(a: NatsArgs) -> Self {
        let mut c = NatsConfig::default();
        c.url = a.nats_url.into();
        c.creds = a.nats_creds;
        c.nkey = a.nats_nkey;
        c.user = non_empty(a.nats_user);
        c.password = non_empty(a.nats_password);
        c.tls_ca = a.nats_tls_ca;
        c.tls_cert = a.nats_tls_cert;
        c.tls_key = a.nats_tls_key;
        c.stream = a.stream;
        c.create_stream = a.create_stream;
        c
    }
}

impl From<PublishArgs> for PublishConfig {
    fn from(a: PublishArgs) -> Self {
        let mut c = PublishConfig::default();
        c.subject_prefix = a.subject_prefix;
        c.subject_template = a.subject_template;
        c.header_format = a.headers.into();
        c.ce_source = a.ce_source;
        c.timeout = a.publish_timeout.into();
        c.transactions = a.transactions.into();
        c.batches = a.publish_batches.into();
        c
    }
}

impl From<BatchArgs> for BatchConfig {
    fn from(a: BatchArgs) -> Self {
        let mut c = BatchConfig::default();
        c.size = a.batch_size;
        c.max_bytes = a.max_batch_bytes.0;
        c.ordering = a.ordering.into();
        c
    }
}

impl From<RetryArgs> for RetryConfig {
    fn from(a: RetryArgs) -> Self {
        let mut c = RetryConfig::default();
        c.max_attempts = a.max_attempts;
        c.initial = a.retry_initial.into();
        c.max = a.retry_max.into();
        c
    }
}

impl From<SourceArgs> for SourceConfig {
    fn from(a: SourceArgs) -> Self {
        let mut c = SourceConfig::default();
        c.source = a.source.into();
        c.notify_mode = a.notify_mode.into();
        c.fallback_interval = a.fallback_interval.into();
        c
    }
}

impl From<WalArgs> for WalConfig {
    fn from(a: WalArgs) -> Self {
        let mut c = WalConfig::default();
        c.slot_name = a.slot_name;
        c.marking = a.wal_marking.into();
        c
    }
}

impl From<RetentionArgs> for RetentionConfig {
    fn from(a: RetentionArgs) -> Self {
        let mut c = RetentionConfig::default();
        c.processed = a.retention;
        c.processed_events = a.processed_events_retention;
        c
    }
}

impl From<MetricsArgs> for MetricsConfig {
    fn from(a: MetricsArgs) -> Self {
        let mut c = MetricsConfig::default();
        c.event_types_max = a.metrics_event_types_max;
        c.addr = a.metrics_addr.0;
        c
    }
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

/// natscli's environment names that `run` reads too: (argument, our variable, natscli's variable).
/// Ours wins when both are set; a flag wins over both.
pub const ENV_ALIASES: &[(&str, &str, &str)] = &[
    ("nats_tls_ca", "NATS_TLS_CA", "NATS_CA"),
    ("nats_tls_cert", "NATS_TLS_CERT", "NATS_CERT"),
    ("nats_tls_key", "NATS_TLS_KEY", "NATS_KEY"),
];

/// The variable an aliased argument reads: `primary` when it is set to a value, else `alias` when
/// that is, else `primary`. (An empty variable counts as unset, as clap reads it.)
fn env_name<'a>(
    primary: &'a str,
    alias: &'a str,
    lookup: &impl Fn(&str) -> Option<OsString>,
) -> &'a str {
    let set = |name: &str| lookup(name).is_some_and(|v| !v.is_empty());
    if !set(primary) && set(alias) {
        alias
    } else {
        primary
    }
}

/// The clap command with each aliased argument reading the variable [`env_name`] picks. clap's
/// `env` takes one name, so the choice is made before parsing; the process environment is left
/// as it is.
fn command_with_env(lookup: impl Fn(&str) -> Option<OsString>) -> clap::Command {
    Cli::command().mut_subcommand("run", |run| {
        ENV_ALIASES.iter().fold(run, |run, &(id, primary, alias)| {
            let name = env_name(primary, alias, &lookup);
            run.mut_arg(id, |arg| arg.env(name))
        })
    })
}

/// Parses the process's arguments and environment (natscli's names included); exits with a usage
/// error (2) as clap does.
pub fn parse() -> Cli {
    let matches = command_with_env(|name| std::env::var_os(name)).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The command as defined, independent of the environment: what completions and man pages are
/// generated from.
pub fn command() -> clap::Command {
    Cli::command()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| vars.get(name).cloned()
    }

    fn env_of(cmd: &clap::Command, id: &str) -> String {
        let run = cmd.find_subcommand("run").expect("run");
        let arg = run
            .get_arguments()
            .find(|a| a.get_id() == id)
            .expect("argument");
        arg.get_env()
            .expect("reads a variable")
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn our_variable_wins_over_natscli_s() {
        assert_eq!(
            env_name("NATS_TLS_CA", "NATS_CA", &lookup(&[("NATS_CA", "a")])),
            "NATS_CA"
        );
        assert_eq!(
            env_name(
                "NATS_TLS_CA",
                "NATS_CA",
                &lookup(&[("NATS_CA", "a"), ("NATS_TLS_CA", "b")])
            ),
            "NATS_TLS_CA"
        );
        // Empty counts as unset, on either side.
        assert_eq!(
            env_name(
                "NATS_TLS_CA",
                "NATS_CA",
                &lookup(&[("NATS_CA", "a"), ("NATS_TLS_CA", "")])
            ),
            "NATS_CA"
        );
        assert_eq!(
            env_name("NATS_TLS_CA", "NATS_CA", &lookup(&[("NATS_CA", "")])),
            "NATS_TLS_CA"
        );
        assert_eq!(
            env_name("NATS_TLS_CA", "NATS_CA", &lookup(&[])),
            "NATS_TLS_CA"
        );
    }

    #[test]
    fn aliases_are_wired_to_the_run_arguments() {
        let cmd = command_with_env(lookup(&[
            ("NATS_CA", "ca.pem"),
            ("NATS_CERT", "c.pem"),
            ("NATS_KEY", "k.pem"),
            ("NATS_TLS_KEY", "mine.pem"),
        ]));
        assert_eq!(env_of(&cmd, "nats_tls_ca"), "NATS_CA");
        assert_eq!(env_of(&cmd, "nats_tls_cert"), "NATS_CERT");
        assert_eq!(env_of(&cmd, "nats_tls_key"), "NATS_TLS_KEY");
        // Without natscli's variables the definition is unchanged.
        let plain = command_with_env(lookup(&[]));
        for (id, primary, _) in ENV_ALIASES {
            assert_eq!(env_of(&plain, id), *primary);
            assert_eq!(env_of(&command(), id), *primary);
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn a_flag_wins_over_the_alias() {
        // Only natscli's name in the (fake) environment decides which variable clap reads; a flag
        // on the command line is taken before any variable.
        let cmd = command_with_env(lookup(&[("NATS_CA", "from-env.pem")]));
        let m = cmd
            .try_get_matches_from([
                "outbox-relay",
                "run",
                "--nats-tls-ca",
                "flag.pem",
                "--database-url",
                "postgres://h/d",
            ])
            .expect("parses");
        let cli = Cli::from_arg_matches(&m).expect("cli");
        let Command::Run(run) = cli.command else {
            panic!("run")
        };
        assert_eq!(run.nats.nats_tls_ca, Some(PathBuf::from("flag.pem")));
    }
}
