//! Command-line interface (clap derive). Every flag also reads an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox_relay::{NotifyMode, Ordering, RelayConfig};
use uuid::Uuid;

/// The library's defaults are the CLI's: written once, in `RelayConfig::default()`.
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
    /// Delete processed (and discarded) rows older than a cutoff, in small batches.
    Cleanup {
        /// For example `7d` or `12h`.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Rows deleted per statement.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        batch_size: i64,
    },
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
    Retry {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<Uuid>,
        /// Retry every dead letter.
        #[arg(long)]
        all: bool,
    },
    /// Give up on dead letters (kept and marked discarded; releases their aggregates).
    Discard {
        #[arg(required = true)]
        ids: Vec<Uuid>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OrderingArg {
    Aggregate,
    None,
}

impl From<Ordering> for OrderingArg {
    fn from(o: Ordering) -> Self {
        match o {
            Ordering::Aggregate => OrderingArg::Aggregate,
            Ordering::None => OrderingArg::None,
        }
    }
}

impl From<OrderingArg> for Ordering {
    fn from(o: OrderingArg) -> Self {
        match o {
            OrderingArg::Aggregate => Ordering::Aggregate,
            OrderingArg::None => Ordering::None,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NotifyModeArg {
    Gated,
    Always,
    Poll,
}

impl From<NotifyMode> for NotifyModeArg {
    fn from(m: NotifyMode) -> Self {
        match m {
            NotifyMode::Gated => NotifyModeArg::Gated,
            NotifyMode::Always => NotifyModeArg::Always,
            NotifyMode::Poll => NotifyModeArg::Poll,
        }
    }
}

impl From<NotifyModeArg> for NotifyMode {
    fn from(m: NotifyModeArg) -> Self {
        match m {
            NotifyModeArg::Gated => NotifyMode::Gated,
            NotifyModeArg::Always => NotifyMode::Always,
            NotifyModeArg::Poll => NotifyMode::Poll,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Separate URL for the LISTEN connection (direct to PostgreSQL when --database-url goes
    /// through PgBouncer in transaction mode).
    #[arg(long, env = "OUTBOX_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<String>,
    #[arg(
        long,
        env = "NATS_URL",
        default_value_t = defaults().nats_url,
        hide_env_values = true
    )]
    pub nats_url: String,
    /// JWT + NKey credentials file.
    #[arg(long, env = "NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// NKey seed file.
    #[arg(long, env = "NATS_NKEY")]
    pub nats_nkey: Option<PathBuf>,
    #[arg(long, env = "NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,
    #[arg(long, env = "NATS_TLS_CERT")]
    pub nats_tls_cert: Option<PathBuf>,
    #[arg(long, env = "NATS_TLS_KEY")]
    pub nats_tls_key: Option<PathBuf>,
    /// JetStream stream (checked at start).
    #[arg(long, env = "OUTBOX_STREAM", default_value_t = defaults().stream)]
    pub stream: String,
    /// Create the stream when it is missing (file storage, subjects <prefix>.>, 2m+ dedup window).
    #[arg(long, env = "OUTBOX_CREATE_STREAM")]
    pub create_stream: bool,
    /// Events go to <prefix>.<event_type>.
    #[arg(long, env = "OUTBOX_SUBJECT_PREFIX", default_value_t = defaults().subject_prefix)]
    pub subject_prefix: String,
    /// Poll this often even without notifications.
    #[arg(long, env = "OUTBOX_FALLBACK_INTERVAL", default_value_t = defaults().fallback_interval.into())]
    pub fallback_interval: humantime::Duration,
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = defaults().batch_size)]
    pub batch_size: usize,
    /// Prepare the relay's statements once per connection. `false` behind a transaction pooler
    /// that does not keep prepared statements (PgBouncer before 1.21, or without
    /// `max_prepared_statements`): statements are then sent unnamed, planned each time.
    #[arg(long, env = "OUTBOX_PREPARED_STATEMENTS", default_value_t = defaults().prepared_statements, action = clap::ArgAction::Set)]
    pub prepared_statements: bool,
    /// Payload bytes per batch (`32MiB`, `4MB`, `1000000`): bounds the relay's memory whatever the
    /// payloads; a single larger event still goes, alone.
    #[arg(long, env = "OUTBOX_MAX_BATCH_BYTES", default_value_t = ByteSize(defaults().max_batch_bytes), value_parser = parse_bytes)]
    pub max_batch_bytes: ByteSize,
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = defaults().max_attempts)]
    pub max_attempts: u32,
    #[arg(long, env = "OUTBOX_PUBLISH_TIMEOUT", default_value_t = defaults().publish_timeout.into())]
    pub publish_timeout: humantime::Duration,
    #[arg(long, env = "OUTBOX_RETRY_INITIAL", default_value_t = defaults().retry_initial.into())]
    pub retry_initial: humantime::Duration,
    #[arg(long, env = "OUTBOX_RETRY_MAX", default_value_t = defaults().retry_max.into())]
    pub retry_max: humantime::Duration,
    /// `aggregate`: per-aggregate seq order; `none`: raw throughput.
    #[arg(long, env = "OUTBOX_ORDERING", value_enum, default_value_t = defaults().ordering.into())]
    pub ordering: OrderingArg,
    /// `gated`: writers notify only while a relay waits; `always`: every writer notifies;
    /// `poll`: no LISTEN, poll every --fallback-interval.
    #[arg(long, env = "OUTBOX_NOTIFY_MODE", value_enum, default_value_t = defaults().notify_mode.into())]
    pub notify_mode: NotifyModeArg,
    /// Delete processed rows older than this, periodically (off by default).
    #[arg(long, env = "OUTBOX_RETENTION", value_parser = humantime::parse_duration)]
    pub retention: Option<Duration>,
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
        if self.0 % MIB == 0 {
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
