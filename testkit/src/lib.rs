//! Shared integration-test harness: throwaway PostgreSQL clusters, PgBouncer
//! instances in front of them, throwaway nats-server instances and small async
//! helpers.
//!
//! A dev-dependency of the main crate, used by its integration tests and
//! benches (as `testkit`).
//!
//! Every server process is forked from one dedicated, never-exiting "spawner"
//! thread with `PR_SET_PDEATHSIG = SIGKILL`, so servers die together with the
//! test process even when their owning value is never dropped (statics) or the
//! process is killed.

pub mod browser;
pub mod charts;
pub mod faketime;
mod nats;
pub mod outbox;
mod pg;
mod pgbouncer;
mod proc;
pub use proc::{file_len, read_from};
mod relay;

use std::future::Future;
use std::time::Duration;

pub use nats::{nats_bin, nats_version, NatsServer};
pub use pg::{shared_pg, PgCluster, PgOptions};
pub use pgbouncer::{PgBouncer, PgBouncerOptions};
pub use relay::{relay_bin, relay_command, RelayProcess, RELAY_BIN_ENV};

/// Polls `f` every 10 ms until it returns `true`.
///
/// Panics with `what` if that does not happen within `timeout` (this includes a
/// single call of `f` that hangs past the deadline).
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_every(what, timeout, Duration::from_millis(10), f).await;
}

/// [`wait_until`], polling every `interval` (for checks too costly to run every 10 ms).
pub async fn wait_until_every<F, Fut>(what: &str, timeout: Duration, interval: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    let deadline = start + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(remaining, f()).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => panic!(
                "timed out after {timeout:?} waiting for {what} (the last check did not finish)"
            ),
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// A turn to run alone among the heavy tests; hold it for the whole test.
///
/// The integration tests share one process and run two at a time. The heaviest (a three-node
/// nats-server cluster, thousands of rows with a relay that keeps failing) and those that bound a
/// latency take turns through this, so that no two of them load the two cores together; the light
/// tests still run beside them.
pub async fn heavy() -> tokio::sync::SemaphorePermit<'static> {
    static HEAVY: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    HEAVY
        .acquire()
        .await
        .expect("the heavy-test semaphore is never closed")
}

/// Connects to `url` without TLS (bounded to 10 s), spawns the connection
/// task on the current tokio runtime and returns the client.
pub async fn pg_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out after 10s connecting to {url}"))
    .unwrap_or_else(|e| panic!("could not connect to {url}: {e}"));
    tokio::spawn(async move {
        // Errors here are expected when tests kill/restart the server.
        let _ = connection.await;
    });
    client
}

/// `url` (a `postgres://` URL) with `search_path` set to `schema` for every connection made from it,
/// through the `options` parameter.
pub fn with_schema(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// A free 127.0.0.1 address (for `--metrics-addr`).
pub fn free_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// A minimal HTTP/1.0 GET (bounded to 5 s): (status code, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut buf))
        .await
        .ok()?
        .ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// The first column of the first row of a simple-protocol query (no prepared statement, so it
/// works through a transaction pooler); panics after 30 s or without a row.
pub async fn simple_value(client: &tokio_postgres::Client, sql: &str) -> String {
    let messages = tokio::time::timeout(Duration::from_secs(30), client.simple_query(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql} timed out"))
        .unwrap_or_else(|e| panic!("{sql} failed: {e}"));
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql} returned no row"))
}

/// The plan of `EXPLAIN (COSTS OFF) {statement}`, one line per plan line; panics if it fails.
pub async fn explain(
    client: &tokio_postgres::Client,
    statement: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> String {
    client
        .query(&format!("EXPLAIN (COSTS OFF) {statement}"), params)
        .await
        .unwrap_or_else(|e| panic!("EXPLAIN {statement} failed: {e}"))
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}
