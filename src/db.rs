//! PostgreSQL connections: URL parsing, keepalives, redaction. Queries live in [`crate::source::table::store`],
//! [`crate::migrate`] and [`crate::ops`]; their SQL in `sql/`.

pub(crate) mod conninfo;

use std::time::Duration;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};
use crate::tls::TlsSettings;
use conninfo::ConnInfo;

/// A connection as tokio-postgres hands it out: drive it (or read its notifications).
pub type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <MakeRustlsConnect as MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// Parses a libpq URL or key=value string (with the TLS parameters and their environment variables
/// as libpq reads them, see [`crate::tls`]); the error names `field`, never the password.
pub fn parse_config(url: &str, field: &'static str) -> Result<Config> {
    parse(url, field).map(|(config, _)| config)
}

/// [`parse_config`] with the TLS settings, which tokio-postgres does not keep (the replication
/// connection of `--source wal` takes both).
pub(crate) fn parse_with_tls(url: &str, field: &'static str) -> Result<(Config, TlsSettings)> {
    parse(url, field)
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

/// A URL or message with any password replaced by `***`, for logs and errors.
///
/// ```
/// let shown = outbox_relay::redact("connecting to postgres://app:s3cret@db:5432/app failed");
/// assert_eq!(shown, "connecting to postgres://app:***@db:5432/app failed");
/// ```
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

/// `password=...` in key=value strings (spaces around `=` and quoted values included) and query
/// parameters. Free text: only for messages that are not parsed connection strings.
fn redact_key_values(text: &str) -> String {
    const KEY: &str = "password";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find(KEY) {
        let (head, tail) = rest.split_at(pos + KEY.len());
        out.push_str(head);
        let Some(after_eq) = tail.trim_start().strip_prefix('=') else {
            rest = tail;
            continue;
        };
        let value = after_eq.trim_start();
        out.push_str(&tail[..tail.len() - value.len()]);
        out.push_str("***");
        rest = &value[value_len(value)..];
    }
    out.push_str(rest);
    out
}

/// Length of the value at the start of `text`: a single-quoted string (backslash escapes, to the
/// end if unterminated), or a run up to whitespace or to a `&` that starts another `key=`.
fn value_len(text: &str) -> usize {
    let mut chars = text.char_indices();
    let quoted = text.starts_with('\'');
    if quoted {
        chars.next();
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '\'' if quoted => return i + 1,
            c if !quoted && c.is_whitespace() => return i,
            '&' if !quoted && starts_parameter(&text[i + 1..]) => return i,
            _ => {}
        }
    }
    text.len()
}

fn starts_parameter(text: &str) -> bool {
    let key_len = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    key_len > 0 && text[key_len..].starts_with('=')
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

    #[test]
    fn free_text_redaction_knows_spaces_and_quotes() {
        assert_eq!(
            redact("host=db password = s3cret dbname=x"),
            "host=db password = *** dbname=x"
        );
        assert_eq!(
            redact(r"host=db password='a b\' c' dbname=x"),
            "host=db password=*** dbname=x"
        );
        assert_eq!(redact("password='unterminated s3cret"), "password=***");
        assert_eq!(redact(r"password=a\ b&c x=1"), "password=*** x=1");
        assert_eq!(
            redact("password authentication failed for user \"app\""),
            "password authentication failed for user \"app\""
        );
    }

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
