//! PostgreSQL connections: URL parsing, keepalives, redaction. Queries live in [`crate::store`],
//! [`crate::migrate`] and [`crate::ops`]; their SQL in `sql/`.

use std::time::Duration;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::tls::TlsSettings;

use crate::error::{Error, Result};

/// A connection as tokio-postgres hands it out: drive it (or read its notifications).
pub type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <MakeRustlsConnect as MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// Parses a libpq URL or key=value string (with `sslmode`/`sslrootcert` as libpq reads them); the
/// error names `field`, never the password.
pub fn parse_config(url: &str, field: &'static str) -> Result<Config> {
    parse(url, field).map(|(config, _)| config)
}

fn parse(url: &str, field: &'static str) -> Result<(Config, TlsSettings)> {
    let (rest, tls) = crate::tls::split(url, field)?;
    let mut config = rest.parse::<Config>().map_err(|e| {
        let msg = redact(&e.to_string());
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

/// [`connect_raw`], with the connection driven on a task of its own.
pub async fn connect(url: &str, application_name: &str) -> Result<Client> {
    let (client, connection) = connect_raw(url, "database_url", application_name).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "database connection closed");
        }
    });
    Ok(client)
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

/// Checks a `--schema` name: plain lowercase identifiers only, so it can go into `search_path`
/// and connection options without quoting.
pub fn validate_schema(schema: &str) -> Result<()> {
    let mut chars = schema.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && schema.len() <= 63;
    if ok {
        Ok(())
    } else {
        Err(Error::config(
            "schema",
            format!("{schema:?} is not a plain lowercase identifier (a-z, 0-9, _)"),
        ))
    }
}

/// The URL with `search_path` set to `schema`, so that every statement of every connection made
/// from it finds the outbox objects there.
pub fn with_schema(url: &str, schema: &str) -> Result<String> {
    validate_schema(schema)?;
    if url.contains("options=") {
        return Err(Error::config(
            "schema",
            "the database URL already sets `options`; put search_path there instead of --schema",
        ));
    }
    if url.contains("://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        Ok(format!("{url}{sep}options=-c%20search_path%3D{schema}"))
    } else {
        Ok(format!("{url} options='-c search_path={schema}'"))
    }
}

/// A URL or message with any password replaced by `***`, for logs and errors.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    // scheme://user:password@host
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        // A NATS URL's lone user part is a token: hide it too.
        let token_scheme = ["nats", "tls", "ws", "wss"]
            .iter()
            .any(|s| head.ends_with(&format!("{s}://")));
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), _) if token_scheme && !authority[..at].contains(':') => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon]);
                out.push_str(":***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    redact_key_values(&out)
}

/// `password=...` in key=value strings and query parameters.
fn redact_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("password=") {
        let (head, tail) = rest.split_at(pos + "password=".len());
        out.push_str(head);
        out.push_str("***");
        let end = tail
            .find(|c: char| c == '&' || c.is_whitespace())
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact("nats://tok@host:4222"), "nats://***@host:4222");
        assert_eq!(redact("nats://u:p@host:4222"), "nats://u:***@host:4222");
        assert_eq!(redact("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(
            redact("host=db user=app password=s3cret dbname=x"),
            "host=db user=app password=*** dbname=x"
        );
        assert_eq!(
            redact("postgres://a:b@h/x?password=c&x=1"),
            "postgres://a:***@h/x?password=***&x=1"
        );
    }
}
