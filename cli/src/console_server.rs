//! `outbox-relay console`: the library's console router on a listener of its own, until
//! SIGTERM/SIGINT.

use std::net::SocketAddr;

use outbox_relay::console::{self, ConsoleConfig, Database};
use outbox_relay::Error;

use crate::cli::ConsoleArgs;

/// The token: the file's content, else `OUTBOX_CONSOLE_TOKEN`. Never logged.
fn token(args: &ConsoleArgs) -> Result<String, Error> {
    match &args.token_file {
        Some(path) => std::fs::read_to_string(path)
            .map(|t| t.trim().to_string())
            .map_err(|e| {
                Error::config("token_file", format!("cannot read {}: {e}", path.display()))
            }),
        None => match std::env::var("OUTBOX_CONSOLE_TOKEN") {
            Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
            _ => Err(Error::config(
                "token_file",
                "is required (or set OUTBOX_CONSOLE_TOKEN): every request must present the token",
            )),
        },
    }
}

/// The console connects per request: one that cannot reach or log in to its database would listen
/// and answer every page with a 500. It refuses to start instead, with the reason.
async fn check_database(url: &str) -> Result<(), Error> {
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
    match tokio::time::timeout(WITHIN, outbox_relay::connect(url, "outbox-relay-console")).await {
        Ok(client) => client.map(drop),
        Err(_) => Err(Error::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the database did not answer within 10 s",
        ))),
    }
}

pub async fn serve(
    database_url: String,
    schema: Option<outbox_relay::Schema>,
    args: &ConsoleArgs,
) -> Result<(), Error> {
    let mut config = ConsoleConfig::new(token(args)?);
    config.schema = schema.map(|s| s.as_str().to_string());
    config.read_only = args.read_only;
    // A bad token is the flag's (or the variable's) fault: name what the operator sets.
    config.validate().map_err(|e| match e.config_field() {
        Some(("token", message)) => Error::config("token_file", message.to_string()),
        _ => e,
    })?;
    check_database(&database_url).await?;
    let app = console::router(config, Database::url(database_url))?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            listen = %addr,
            "the console listens beyond this machine: put TLS in front of it (the token and the session cookie travel in clear otherwise)"
        );
    }
    tracing::info!(listen = %addr, read_only = args.read_only, "console listening");
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        crate::wait_for_signal().await;
        tracing::info!("shutdown requested");
        on_signal.cancel();
    });
    let requests_done = stop.clone();
    let serve = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { requests_done.cancelled().await });
    // Requests in flight are answered, but one waiting for the database (a lock held by another
    // session) must not keep the console from stopping: its connection and transaction go.
    let deadline = async {
        stop.cancelled().await;
        tokio::time::sleep(crate::EXIT_DEADLINE).await;
    };
    tokio::select! {
        served = serve => served?,
        _ = deadline => tracing::warn!(
            deadline_ms = crate::EXIT_DEADLINE.as_millis() as u64,
            "requests still in flight at shutdown were dropped"
        ),
    }
    Ok(())
}
