//! The `outbox-relay` binary: a thin layer over the library. Exit codes: 0 success, 1 runtime
//! failure, 2 usage error (the message names the flag).

mod cli;
mod console_server;
mod progress;
mod telemetry;

use std::process::ExitCode;
use std::time::Duration;

use outbox_relay::migrate::{self, Grantee};
use outbox_relay::ops::{self, Outbox};
use outbox_relay::{Error, Relay, Schema};
use tokio_util::sync::CancellationToken;

use cli::{Cli, Command, DeadLettersCommand, LogFormat, RunArgs};

/// The relay allocates for every event (headers, futures, spans): mimalloc spends less CPU on that
/// than the system allocator on the small machines an outbox relay shares with its database.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // ring for every TLS client (the build also holds aws-lc-rs, through pgwire-replication).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = cli::parse();
    if let Some(code) = generate(&cli.command) {
        return code;
    }
    let telemetry = match init_logging(cli.log_format, matches!(cli.command, Command::Run(_))) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let code = run_cli(cli);
    // After the runtime is gone (SIGTERM/SIGINT included): the exporter flushes on its own thread.
    telemetry.shutdown();
    code
}

fn run_cli(cli: Cli) -> ExitCode {
    let mut builder = match cli.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        0 => tokio::runtime::Builder::new_multi_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(execute(cli));
    // A blocking task still running (a DNS lookup that does not answer) must not hold the exit.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_usage() => {
            eprintln!("error: {}", usage_message(&e));
            ExitCode::from(2)
        }
        Err(e) if e.is_not_found() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {}", e.redacted());
            ExitCode::from(1)
        }
    }
}

/// `completions` and `man`: text generated from the CLI's definition, no runtime, no logging.
/// `None` for every other command.
fn generate(command: &Command) -> Option<ExitCode> {
    use std::io::Write;
    // Rendered into memory first: clap_complete panics on a failed write (`| head`).
    let mut text = Vec::new();
    let rendered = match command {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut cli::command(), "outbox-relay", &mut text);
            Ok(())
        }
        Command::Man {
            out_dir: Some(dir), ..
        } => std::fs::create_dir_all(dir).and_then(|()| write_man_pages(&man_command(), dir)),
        Command::Man { subcommand, .. } => {
            let root = man_command();
            let mut page = &root;
            for name in subcommand {
                match page.find_subcommand(name) {
                    Some(sub) => page = sub,
                    None => {
                        eprintln!(
                            "error: man: `{}` is no subcommand of `{}`",
                            name,
                            page.get_display_name().unwrap_or(page.get_name())
                        );
                        return Some(ExitCode::from(2));
                    }
                }
            }
            man_page(page).render(&mut text)
        }
        _ => return None,
    };
    let written = rendered.and_then(|()| {
        let mut out = std::io::stdout().lock();
        out.write_all(&text)?;
        out.flush()
    });
    Some(match written {
        Ok(()) => ExitCode::SUCCESS,
        // The reader stopped early (`outbox-relay man | head`): not a failure of ours.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    })
}

/// The page of `cmd` (a command of [`man_command`]), every page naming the program and version.
fn man_page(cmd: &clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd.clone()).source(format!("outbox-relay {}", env!("CARGO_PKG_VERSION")))
}

/// `cmd`'s page and those of its visible subcommands, as `<display name>.1` files in `dir`.
fn write_man_pages(cmd: &clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    man_page(cmd).generate_to(dir)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_man_pages(sub, dir)?;
    }
    Ok(())
}

/// The command the man pages describe: built (so that subcommands are named
/// `outbox-relay-run`, ...), without clap's `help` subcommand.
fn man_command() -> clap::Command {
    let mut cmd = cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// Config errors name the library field; users know the flag.
fn usage_message(e: &Error) -> String {
    match e.config_field() {
        Some((field, message)) => {
            let flag = field.replace('_', "-");
            format!("--{flag}: {message}")
        }
        None => e.to_string(),
    }
}

/// Logs to stderr; for `run` (`traces`) with the `otel` feature, also spans over OTLP when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see `telemetry`).
fn init_logging(format: LogFormat, traces: bool) -> Result<telemetry::Telemetry, String> {
    telemetry::init(format, traces)
}

/// `--database-url` as given (required).
fn raw_database_url(cli: &Cli) -> Result<String, Error> {
    match cli.database_url.as_deref().map(str::trim) {
        Some(url) if !url.is_empty() => Ok(url.to_string()),
        _ => Err(Error::config(
            "database_url",
            "is required (or set DATABASE_URL)",
        )),
    }
}

/// `--schema`, checked. The one-shot commands apply it per transaction (`SET LOCAL search_path`),
/// not through the URL, so that they work through a transaction pooler that refuses `options`;
/// the relay applies it itself from its config.
fn schema(cli: &Cli) -> Result<Option<Schema>, Error> {
    Schema::optional(cli.schema.as_deref())
}

async fn execute(cli: Cli) -> Result<(), Error> {
    match &cli.command {
        Command::Migrate {
            print: true,
            from,
            format,
            ..
        } => {
            let schema = schema(&cli)?;
            print!(
                "{}",
                migrate::script_as(
                    schema.as_ref(),
                    from.unwrap_or(1),
                    format.unwrap_or_default()
                )
            );
            Ok(())
        }
        Command::Migrate { check, status, .. } if *check || *status => {
            let (mut client, schema) = connect(&cli).await?;
            let applied = Outbox::new(&mut client, schema).applied().await?;
            let pending = migrate::pending(&applied);
            if *status {
                for m in migrate::MIGRATIONS {
                    let state = if applied.contains(&m.version) {
                        "applied"
                    } else {
                        "pending"
                    };
                    println!("{:04}_{}  {state}", m.version, m.name);
                }
            }
            if *check {
                if pending.is_empty() {
                    println!(
                        "schema is up to date (version {})",
                        migrate::current_version()
                    );
                } else {
                    let versions: Vec<i32> = pending.iter().map(|m| m.version).collect();
                    println!("pending migrations: {versions:?}");
                }
                migrate::require_applied(&applied)?;
            }
            Ok(())
        }
        Command::Migrate {
            grant_writer,
            grant_relay,
            wal,
            ..
        } => {
            let url = raw_database_url(&cli)?;
            let schema = schema(&cli)?;
            let mut client = outbox_relay::connect(&url, "outbox-relay-migrate").await?;
            let mut outbox = Outbox::new(&mut client, schema);
            let applied = outbox.migrate().await?;
            if *wal {
                let setup = outbox.ensure_publication().await?;
                let name = &setup.name;
                match &setup.repaired {
                    Some(problem) => println!(
                        "publication {name} repaired ({problem}): the outbox's slots catch up from the table before they stream"
                    ),
                    None if setup.created => println!("publication {name} created"),
                    None => println!("publication {name} exists"),
                }
            }
            for role in grant_writer {
                outbox.grant(role, Grantee::Writer).await?;
                println!("granted writer privileges to {role}");
            }
            for role in grant_relay {
                outbox.grant(role, Grantee::Relay).await?;
                println!("granted relay privileges to {role}");
            }
            if applied.is_empty() {
                println!(
                    "schema is up to date (version {})",
                    migrate::current_version()
                );
            } else {
                println!(
                    "applied migrations {applied:?}; schema version {}",
                    migrate::current_version()
                );
            }
            Ok(())
        }
        Command::Run(args) => {
            run(
                raw_database_url(&cli)?,
                cli.schema.clone(),
                (**args).clone(),
            )
            .await
        }
        Command::Status { json, limit } => {
            let (mut client, schema) = connect(&cli).await?;
            // One transaction (one schema check) for the counts and the list.
            let overview = Outbox::new(&mut client, schema).overview(*limit).await?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&overview).unwrap_or_default()
                );
            } else {
                let (s, blocked, slots) =
                    (&overview.status, &overview.blocked, &overview.wal_slots);
                println!("pending:             {}", s.pending);
                println!("oldest pending age:  {:.1}s", s.oldest_pending_age_seconds);
                if s.future_dated == 0 {
                    println!("dated in the future: 0");
                } else {
                    println!(
                        "dated in the future: {} (up to {:.1}s ahead of the database's clock; counted at age 0)",
                        s.future_dated, s.max_future_skew_seconds
                    );
                }
                println!("waiting for retry:   {}", s.waiting_for_retry);
                println!("due for retry:       {}", s.due_for_retry);
                println!("dead letters:        {}", s.dead_letters);
                println!("blocked aggregates:  {}", s.blocked_aggregates);
                for w in slots {
                    let state = match (w.present, w.active) {
                        (false, _) => "MISSING (the relay creates it again)",
                        (true, true) => "streaming",
                        (true, false) => "inactive",
                    };
                    println!(
                        "wal slot {}:  {state}, wal_status {}, retains {}, unconfirmed {}, {} aggregates handed to the table{}",
                        w.slot_name,
                        w.wal_status.as_deref().unwrap_or("-"),
                        bytesize::ByteSize(w.retained_bytes as u64),
                        bytesize::ByteSize(w.unconfirmed_bytes as u64),
                        w.deferred_aggregates,
                        if w.caught_up { "" } else { ", catch-up from the table pending" }
                    );
                }
                for b in blocked {
                    println!(
                        "  {}/{}  dead head {} ({}, since {}, {} waiting): {}",
                        b.aggregate_type,
                        b.aggregate_id,
                        b.event_id,
                        b.event_type,
                        b.dead_lettered_at,
                        b.waiting_events,
                        b.last_error.as_deref().unwrap_or("-")
                    );
                }
                if s.blocked_aggregates > blocked.len() as i64 {
                    println!(
                        "  ... {} more (--limit)",
                        s.blocked_aggregates - blocked.len() as i64
                    );
                }
            }
            Ok(())
        }
        Command::DeadLetters(cmd) => {
            let (mut client, schema) = connect(&cli).await?;
            dead_letters(&mut Outbox::new(&mut client, schema), cmd).await
        }
        Command::Cleanup {
            older_than,
            processed_events_older_than,
            batch_size,
            dry_run,
        } => {
            let (mut client, schema) = connect(&cli).await?;
            let mut outbox = Outbox::new(&mut client, schema);
            // (table, its cutoff flag, what the lines call its rows, the spinner's message)
            let tables = [
                (ops::Retained::OutboxEvents, older_than, "rows", "deleting"),
                (
                    ops::Retained::ProcessedEvents,
                    processed_events_older_than,
                    "processed_events rows",
                    "deleting processed_events",
                ),
            ];
            for (table, older_than, what, doing) in tables {
                let Some(older_than) = *older_than else {
                    continue;
                };
                if *dry_run {
                    let n = outbox.cleanup_count(table, older_than).await?;
                    println!("would delete {n} {what} (dry run)");
                } else {
                    let mut reporter = progress::Reporter::start(doing);
                    let result = outbox
                        .cleanup_table(table, older_than, *batch_size, |p| reporter.update(p))
                        .await;
                    summarize(reporter, result, what)?;
                }
            }
            Ok(())
        }
        Command::Console(args) => {
            console_server::serve(raw_database_url(&cli)?, schema(&cli)?, args).await
        }
        Command::Completions { .. } | Command::Man { .. } => Ok(()),
    }
}

/// The one summary line of a batched deletion (`deleted N <what> in ...`), or on an error how
/// many rows were deleted before it.
fn summarize(
    reporter: progress::Reporter,
    result: Result<u64, Error>,
    what: &str,
) -> Result<(), Error> {
    match result {
        Ok(n) => {
            println!("{}", reporter.finish(&format!("deleted {n} {what}")));
            Ok(())
        }
        Err(e) => {
            let done = reporter.abandon();
            eprintln!("cleanup: {done} {what} were deleted before the error");
            Err(e)
        }
    }
}

/// The connection of an operator command and its `--schema`. Each command checks the schema
/// version in its own transaction (`ops::Outbox`).
async fn connect(cli: &Cli) -> Result<(tokio_postgres::Client, Option<Schema>), Error> {
    let url = raw_database_url(cli)?;
    let schema = schema(cli)?;
    Ok((
        outbox_relay::connect(&url, "outbox-relay-cli").await?,
        schema,
    ))
}

async fn dead_letters(outbox: &mut Outbox<'_>, cmd: &DeadLettersCommand) -> Result<(), Error> {
    match cmd {
        DeadLettersCommand::List {
            json,
            limit,
            event_type,
        } => {
            let rows = outbox.dead_letters(*limit, event_type.as_deref()).await?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else if rows.is_empty() {
                println!("no dead letters");
            } else {
                for r in rows {
                    println!(
                        "{}  {}/{}  {}  attempts={}  dead since {}  error: {}",
                        r.id,
                        r.aggregate_type,
                        r.aggregate_id,
                        r.event_type,
                        r.attempts,
                        r.dead_lettered_at,
                        r.last_error.unwrap_or_default()
                    );
                }
            }
            Ok(())
        }
        DeadLettersCommand::Retry {
            ids,
            all,
            dry_run: true,
            ..
        } => {
            let which = if *all { None } else { Some(ids.as_slice()) };
            let candidates = outbox.retry_preview(which).await?;
            for c in &candidates {
                println!(
                    "{}  {}/{}  {}",
                    c.id, c.aggregate_type, c.aggregate_id, c.event_type
                );
            }
            println!("would retry {} dead letters (dry run)", candidates.len());
            Ok(())
        }
        DeadLettersCommand::Retry {
            all: true,
            batch_size,
            ..
        } => {
            let mut reporter = progress::Reporter::start("retrying");
            // Also the default shown in --help.
            let batch_size = batch_size.unwrap_or(1000);
            let result = outbox
                .retry_all_dead_letters(batch_size, |p| reporter.update(p))
                .await;
            match result {
                Ok(n) => {
                    let done = format!("{n} dead letters queued for retry");
                    println!("{}", reporter.finish(&done));
                    Ok(())
                }
                Err(e) => {
                    let done = reporter.abandon();
                    eprintln!(
                        "dead-letters retry: {done} dead letters were queued before the error"
                    );
                    Err(e)
                }
            }
        }
        DeadLettersCommand::Retry { ids, .. } => {
            let reporter = progress::Reporter::start("retrying");
            let done = outbox.retry_dead_letters(Some(ids)).await?;
            let done = format!("{} dead letters queued for retry", done.len());
            println!("{}", reporter.finish(&done));
            Ok(())
        }
        DeadLettersCommand::Discard { ids } => {
            let done = outbox.discard_dead_letters(ids).await?;
            println!("{} dead letters discarded", done.len());
            Ok(())
        }
    }
}

async fn run(database_url: String, schema: Option<String>, args: RunArgs) -> Result<(), Error> {
    let config = args.into_config(database_url, schema);
    // Validated once, by the relay.
    let relay = Relay::new(config).await?;
    tracing::info!(config = ?relay.config(), "starting relay");
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        on_signal.cancel();
    });
    // Every wait of the relay races the stop (the work in hand gets a grace of 3 s); should one
    // not, the process still exits in time: dropping the relay drops its connections, whose
    // transactions roll back, and what was published but not recorded goes out again (JetStream
    // drops the duplicates).
    let backstop = async {
        shutdown.cancelled().await;
        tokio::time::sleep(EXIT_DEADLINE).await;
    };
    tokio::select! {
        result = relay.run(shutdown.clone()) => result,
        _ = backstop => {
            tracing::error!(
                deadline_ms = EXIT_DEADLINE.as_millis() as u64,
                "the relay had not stopped this long after the shutdown request; exiting without it"
            );
            Ok(())
        }
    }
}

/// How long after SIGTERM or SIGINT the process exits at the latest.
const EXIT_DEADLINE: Duration = Duration::from_millis(4_500);

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
