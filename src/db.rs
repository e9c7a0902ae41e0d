//! PostgreSQL connections: URL parsing, keepalives, TLS, connection strings as logs show them. Queries live in [`crate::source::store`],
//! [`crate::migrate`] and [`crate::ops`]; their SQL in `sql/`.

pub(crate) mod conninfo;
pub(crate) mod tls;

use std::time::Duration;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};
use conninfo::ConnInfo;
use tls::TlsSettings;

/// A connection as tokio-postgres hands it out: drive it (or read its notifications).
pub type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <MakeRustlsConnect as MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// Parses a libpq URL or key=value string (with the TLS parameters and their environment variables
/// as libpq reads them, see [`tls`]); the error names `field`, never the password.
pub fn parse_config(url: &str, field: &'static str) -> Result<Config> {
    parse(url, field).map(|(config, _)| config)
}

/// [`parse_config`] with the TLS settings, which tokio-postgres does not keep (the replication
/// connection of `--source wal` takes both).
pub(crate) fn parse_with_tls(url: &str, field: &'static str) -> Result<(Config, TlsSettings)> {
    parse(url, field)
}

fn parse(url: &str, field: &'static str) -> Result<(Config, TlsSettings)> {
    let (rest, tls) = tls::split(url, field)?;
    let mut config = rest.parse::<Config>().map_err(|e| {
        let msg = crate::redact::redact(&e.to_string());
        Error::config(field, format!("cannot parse database URL: {msg}"))
    })?;
    config.ssl_mode(tls.ssl_mode());
    Ok((config, tls))
}

/// Connects with TLS as the URL asks, keepalives (a half-open connection is noticed) and a connect
/// timeout, and returns the connection for the caller to drive.
pub async fn connect_raw(
    url: &str,
    field: &'static str,
    application_name: &str,
) -> Result<(Client, Connection)> {
    let (mut config, tls) = parse(url, field)?;
    prepare(&mut config, application_name);
    let connector = MakeRustlsConnect::new(tls.client_config(field)?);
    Ok(config.connect(connector).await?)
}

/// Connects as the relay does: any libpq connection string (URI or key=value, `PG*`-style TLS
/// settings: `sslmode`, `sslrootcert`, client certificates, also from `PGSSL*` variables) over
/// rustls, with keepalives and a connect timeout; the connection is driven on a task of its own.
/// `application_name` shows in `pg_stat_activity`.
pub async fn connect(url: &str, application_name: &str) -> Result<Client> {
    let (client, connection) = connect_raw(url, "database_url", application_name).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "database connection closed");
        }
    });
    Ok(client)
}

/// Asks the server of `url` to cancel what the connection of `token` runs now (libpq's
/// `PQcancel`: a short connection of its own, with the URL's TLS settings). Best effort: the
/// server may have finished meanwhile.
pub(crate) async fn cancel(url: &str, token: &tokio_postgres::CancelToken) -> Result<()> {
    let (_, tls) = parse(url, "database_url")?;
    let connector = MakeRustlsConnect::new(tls.client_config("database_url")?);
    token.cancel_query(connector).await?;
    Ok(())
}

/// Settings every connection of the relay gets.
fn prepare(config: &mut Config, application_name: &str) {
    if config.get_application_name().is_none() {
        config.application_name(application_name);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(10));
    config.keepalives_interval(Duration::from_secs(5));
    config.keepalives_retries(3);
}

/// A database URL as logs and `Debug` show it: its parsed parameters as `key=value`, with
/// `password` (and `sslpassword`) replaced by `***`. A string that does not parse is not shown at
/// all.
pub fn redacted_url(url: &str) -> String {
    match ConnInfo::parse(url, "database_url") {
        Ok(info) => info.redacted(),
        Err(_) => "<unparseable connection string>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_urls_come_from_the_parsed_parameters() {
        for (url, shown) in [
            (
                "host=db password = s3cret dbname=x",
                "host=db password=*** dbname=x",
            ),
            (
                r"host=db password='s3cret and more' user = 'it\'s me'",
                r"host=db password=*** user='it\'s me'",
            ),
            (
                "postgresql://app:s3cret@db:5433/x?sslmode=require&password=s3cret",
                "user=app password=*** host=db port=5433 dbname=x sslmode=require",
            ),
            ("host=db 's3cret", "<unparseable connection string>"),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
    }
}
