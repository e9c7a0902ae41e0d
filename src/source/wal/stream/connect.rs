//! The replication connection: which of the URL's hosts it goes to, its settings and TLS from
//! the relay's connection string, its errors as the relay's.

use std::time::Duration;

use pgwire_replication::{PgWireError, ReplicationConfig, SslMode, TlsConfig};
use tokio_postgres::config::Host;

use crate::db::tls::{Mode, RootCert, TlsSettings};
use crate::error::{Error, Result};
use crate::source::wal::control::ServerAddr;

/// The flag whose URL the stream connects with.
pub(super) const URL_FIELD: &str = "listen_database_url";

/// Which of the URL's hosts the stream connects to: the one that is `server`, where the control
/// connection is. A multi-host URL's hosts are tried in order (with `target_session_attrs`), so
/// the control connection may have reached a later one: the leadership and the slot live there,
/// and the first host may be down or a standby. One host, or none found to be that server (a
/// proxy or NAT between): the first.
pub(super) async fn stream_host(config: &tokio_postgres::Config, server: ServerAddr) -> Target {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    // libpq: one port applies to every host; otherwise one each.
    let port_of = |i: usize| match ports {
        [one] => *one,
        _ => ports.get(i).copied().unwrap_or(5432),
    };
    // libpq: `hostaddr` is where to connect (no name lookup); `host` then only names the server
    // for TLS.
    let target = |i: usize| {
        let name = match hosts.get(i) {
            Some(Host::Tcp(host)) => Some(host.clone()),
            #[cfg(unix)]
            Some(Host::Unix(path)) => Some(path.to_string_lossy().into_owned()),
            None => None,
        };
        match addrs.get(i) {
            Some(addr) => Target {
                addr: addr.to_string(),
                port: port_of(i),
                tls_name: name,
            },
            None => Target {
                addr: name.unwrap_or_else(|| "localhost".to_string()),
                port: port_of(i),
                tls_name: None,
            },
        }
    };
    let count = hosts.len().max(addrs.len());
    if count < 2 {
        return target(0);
    }
    for i in 0..count.min(MAX_HOSTS) {
        let port = port_of(i);
        if server.port.is_some_and(|p| p != port) {
            continue;
        }
        let reached = match (hosts.get(i), server.ip) {
            #[cfg(unix)]
            (Some(Host::Unix(_)), ip) => ip.is_none(),
            (_, None) => false,
            (host, Some(ip)) => match (addrs.get(i), host) {
                (Some(addr), _) => addr.to_canonical() == ip.to_canonical(),
                (None, Some(Host::Tcp(name))) => resolves_to(name, port, ip).await,
                _ => false,
            },
        };
        if reached {
            return target(i);
        }
    }
    tracing::warn!(
        server_addr = ?server.ip,
        server_port = ?server.port,
        "none of the URL's hosts is the server the control connection reached; streaming from the first"
    );
    target(0)
}

/// Where the stream connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    /// A host name, a socket directory, or the address `hostaddr` gave.
    addr: String,
    port: u16,
    /// With `hostaddr`: the host's name, which TLS checks instead of the address.
    tls_name: Option<String>,
}

/// Hosts of a URL looked at (each may take a name lookup).
const MAX_HOSTS: usize = 16;

/// Whether `name` resolves to `ip` (bounded: a lookup that hangs counts as no).
async fn resolves_to(name: &str, port: u16, ip: std::net::IpAddr) -> bool {
    let lookup = tokio::net::lookup_host((name, port));
    match tokio::time::timeout(Duration::from_secs(5), lookup).await {
        Ok(Ok(mut found)) => found.any(|a| a.ip().to_canonical() == ip.to_canonical()),
        _ => false,
    }
}

/// The replication connection's settings from the relay's parsed connection string, to `target`.
pub(super) fn replication_config(
    config: &tokio_postgres::Config,
    tls: &TlsSettings,
    target: Target,
    (slot, publication): (&str, &str),
    raw_events: usize,
) -> Result<ReplicationConfig> {
    let field = URL_FIELD;
    let user = config
        .get_user()
        .ok_or_else(|| Error::config(field, "names no user"))?
        .to_string();
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or(&user).to_string();
    let mut tls = tls_config(tls);
    if let Some(name) = target.tls_name {
        tls = tls.with_sni_hostname(name);
    }
    let mut replication =
        ReplicationConfig::new(target.addr, user, password, database, slot, publication)
            .with_port(target.port)
            .with_tls(tls)
            .with_application_name("outbox-relay-wal")
            // The confirmed position reaches the server within a second (the lag gauge, and the WAL
            // it can recycle); idle, a keepalive at least every 10 s.
            .with_status_interval(Duration::from_secs(1))
            .with_wakeup_interval(Duration::from_secs(10))
            .with_buffer_size(raw_events);
    if let Some(options) = config.get_options() {
        replication = replication.with_options(options);
    }
    Ok(replication)
}

/// The relay's TLS settings (sslmode, sslrootcert, sslcert, sslkey, and their variables) for the
/// replication connection.
fn tls_config(tls: &TlsSettings) -> TlsConfig {
    let root = match &tls.root_cert {
        Some(RootCert::File(path)) => Some(path.clone()),
        _ => None,
    };
    let mut config = match tls.mode {
        Mode::Disable => TlsConfig::disabled(),
        Mode::Prefer => TlsConfig {
            mode: SslMode::Prefer,
            ..TlsConfig::default()
        },
        // libpq: `require` with a root certificate verifies the chain.
        Mode::Require if root.is_some() => TlsConfig::verify_ca(root),
        Mode::Require => TlsConfig::require(),
        Mode::VerifyCa => TlsConfig::verify_ca(root),
        Mode::VerifyFull => TlsConfig::verify_full(root),
    };
    if let Some(cert) = &tls.client_cert {
        config = config.with_client_cert(cert.cert.clone(), cert.key.clone());
    }
    config
}

/// The replication client's errors as the relay's: I/O (the connection) heals by reconnecting;
/// credentials, TLS and the server's refusals (no slot, no privilege) are reported as they are,
/// and the relay checks the slot again before it retries.
pub(super) fn replication_error(e: PgWireError) -> Error {
    let retryable = e.is_transient() || matches!(e, PgWireError::Server(_));
    let text = e.to_string();
    // Privileges and pg_hba.conf: 42501 insufficient_privilege, 28000 invalid_authorization.
    let refused = ["SQLSTATE 42501", "SQLSTATE 28000", "SQLSTATE 28P01"]
        .iter()
        .any(|code| text.contains(code));
    let fatal = e.is_auth() || e.is_tls() || refused;
    Error::replication("replication connection", retryable && !fatal).caused_by(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn target_for(url: &str, ip: Option<&str>, port: Option<u16>) -> Target {
        let config: tokio_postgres::Config = url.parse().expect("a connection string");
        let server = ServerAddr {
            ip: ip.map(|a| a.parse().expect("an address")),
            port,
        };
        stream_host(&config, server).await
    }

    #[tokio::test]
    async fn the_stream_goes_to_the_host_the_control_connection_reached() {
        // (URL, the server's address and port as the control connection saw them; expected
        // address to connect to, port, and the name TLS checks when it differs).
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<u16>,
            (&'static str, u16, Option<&'static str>),
        );
        let cases: &[Case] = &[
            // The second host, by address and port.
            (
                "host=127.0.0.2,127.0.0.1 port=6001,6002 user=u",
                Some("127.0.0.1"),
                Some(6002),
                ("127.0.0.1", 6002, None),
            ),
            // One port for every host; the address may come back IPv4-mapped.
            (
                "host=127.0.0.2,127.0.0.1 port=5432 user=u",
                Some("::ffff:127.0.0.1"),
                Some(5432),
                ("127.0.0.1", 5432, None),
            ),
            // hostaddr is where to connect (no lookup of the name); the name is what TLS checks.
            (
                "host=a.invalid,b.invalid hostaddr=10.1.1.1,127.0.0.1 port=5432 user=u",
                Some("127.0.0.1"),
                Some(5432),
                ("127.0.0.1", 5432, Some("b.invalid")),
            ),
            // A Unix socket: no address.
            (
                "host=127.0.0.2,/run/postgresql port=5432 user=u",
                None,
                None,
                ("/run/postgresql", 5432, None),
            ),
            // None of the hosts is the server (a proxy between): the first.
            (
                "host=127.0.0.2,127.0.0.3 port=5432 user=u",
                Some("10.9.9.9"),
                Some(5432),
                ("127.0.0.2", 5432, None),
            ),
            // One host: as written, whatever the server says.
            (
                "postgres://u@db.example:6000/x",
                Some("10.9.9.9"),
                Some(5432),
                ("db.example", 6000, None),
            ),
            (
                "hostaddr=127.0.0.5 port=5433 user=u",
                None,
                None,
                ("127.0.0.5", 5433, None),
            ),
            (
                "host=db.invalid hostaddr=127.0.0.5 port=5433 user=u",
                None,
                None,
                ("127.0.0.5", 5433, Some("db.invalid")),
            ),
        ];
        for (url, ip, port, (addr, expected_port, tls_name)) in cases {
            let expected = Target {
                addr: addr.to_string(),
                port: *expected_port,
                tls_name: tls_name.map(str::to_string),
            };
            assert_eq!(target_for(url, *ip, *port).await, expected, "{url}");
        }
    }
}
