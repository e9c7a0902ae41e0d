//! Command-line interface (clap derive). Every flag also reads an environment variable; some
//! also read natscli's name for it ([`ENV_ALIASES`]). `run`'s flags are in `run`, their conversion
//! into the library's configuration in `config`.

mod config;
mod run;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use outbox_relay::migrate::ScriptFormat;
use uuid::Uuid;

pub use run::RunArgs;

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
        format: Option<ScriptFormat>,
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
