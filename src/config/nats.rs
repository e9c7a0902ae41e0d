//! [`NatsConfig`]: the servers, credentials, TLS and the stream; credentials taken out of the
//! URLs, and the URLs with them hidden.

use std::path::PathBuf;

use crate::error::{Error, Result};

use super::{NatsUrl, Secret};

/// NATS: the servers, the credentials, TLS, and the stream the events go into.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NatsConfig {
    /// Server URLs, comma-separated.
    pub url: NatsUrl,
    /// A JWT + NKey `.creds` file, or an NKey seed file.
    pub creds: Option<PathBuf>,
    /// An NKey seed file (instead of `creds`).
    pub nkey: Option<PathBuf>,
    /// User name; alone (without `password`) it is sent as a token, as natscli does with
    /// `NATS_USER`, so it is kept as a secret too. Giving credentials both here and in `url` is
    /// refused rather than silently choosing one.
    pub user: Option<Secret>,
    /// Password of `user`.
    pub password: Option<Secret>,
    /// An extra root CA (PEM).
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// JetStream stream the events are published into; checked at start.
    pub stream: String,
    /// Create `stream` when it is missing.
    pub create_stream: bool,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: NatsUrl::from("nats://127.0.0.1:4222"),
            creds: None,
            nkey: None,
            user: None,
            password: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            stream: "OUTBOX".into(),
            create_stream: false,
        }
    }
}

impl NatsConfig {
    /// Refuses what the relay cannot connect with; errors name the flag's field.
    pub fn validate(&self) -> Result<()> {
        if self.url.expose().trim().is_empty() {
            return Err(Error::config("nats_url", "is required"));
        }
        if self.stream.is_empty()
            || self
                .stream
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
        {
            return Err(Error::config(
                "stream",
                format!("{:?} is not a valid JetStream stream name", self.stream),
            ));
        }
        self.validate_user()?;
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(Error::config(
                "nats_tls_cert",
                "a client certificate needs its key (and the other way round)",
            ));
        }
        Ok(())
    }

    /// `user`/`password` complete and not competing with credentials in `url`.
    fn validate_user(&self) -> Result<()> {
        if self.user.is_none() && self.password.is_none() {
            return Ok(());
        }
        match self.user.as_ref().map(Secret::expose) {
            None => {
                return Err(Error::config(
                    "nats_password",
                    "needs a user name (nats_user, NATS_USER)",
                ))
            }
            Some("") => return Err(Error::config("nats_user", "must not be empty")),
            Some(_) => {}
        }
        let (_, in_url) = split_credentials(self.url.expose())?;
        if in_url.is_some() {
            return Err(Error::config(
                "nats_user",
                "credentials are also given in nats_url (user:password@ or token@); give them in one place",
            ));
        }
        Ok(())
    }

    /// The server URLs without credentials, and the credentials to send (from `user`/`password`,
    /// else from the URLs).
    pub(crate) fn servers_and_credentials(&self) -> Result<(Vec<url::Url>, Option<Credentials>)> {
        let (servers, in_url) = split_credentials(self.url.expose())?;
        // `validate` refused credentials given both ways, so at most one of these is set.
        let credentials = match (&self.user, &self.password) {
            (Some(user), Some(password)) => Some(Credentials::UserPassword(
                user.expose().to_string(),
                password.expose().to_string(),
            )),
            (Some(token), None) => Some(Credentials::Token(token.expose().to_string())),
            _ => in_url,
        };
        Ok((servers, credentials))
    }
}

/// Credentials for NATS.
pub(crate) enum Credentials {
    UserPassword(String, String),
    Token(String),
}

/// Splits `nats://user:pass@host:4222,nats://host2:4222` into plain server URLs and the first
/// credentials found (`user:password`, or a lone user part, which NATS treats as a token).
pub(super) fn split_credentials(urls: &str) -> Result<(Vec<url::Url>, Option<Credentials>)> {
    let mut servers = Vec::new();
    let mut credentials = None;
    for raw in urls.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let with_scheme = if raw.contains("://") {
            raw.to_string()
        } else {
            format!("nats://{raw}")
        };
        let mut url = url::Url::parse(&with_scheme).map_err(|e| {
            Error::config(
                "nats_url",
                format!("cannot parse {}: {e}", crate::redact::redact(raw)),
            )
        })?;
        let user = percent_decode(url.username());
        let password = url.password().map(percent_decode);
        if credentials.is_none() && !user.is_empty() {
            credentials = Some(match password {
                Some(p) => Credentials::UserPassword(user, p),
                None => Credentials::Token(user),
            });
        }
        // Infallible for URLs with a host, which a parsed nats:// URL has.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        servers.push(url);
    }
    if servers.is_empty() {
        return Err(Error::config("nats_url", "no server given"));
    }
    Ok((servers, credentials))
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// NATS server URLs (comma-separated, the scheme optional as for the client) rebuilt from their
/// parsed form: a password becomes `***`, and so does a lone user part (a token). An entry that
/// does not parse is not shown.
pub(super) fn redacted_nats_url(urls: &str) -> String {
    urls.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|raw| {
            let with_scheme = if raw.contains("://") {
                raw.to_string()
            } else {
                format!("nats://{raw}")
            };
            let Ok(mut url) = url::Url::parse(&with_scheme) else {
                return "<unparseable URL>".to_string();
            };
            let hidden = if url.password().is_some() {
                url.set_password(Some(crate::db::conninfo::HIDDEN))
            } else if !url.username().is_empty() {
                url.set_username(crate::db::conninfo::HIDDEN)
            } else {
                Ok(())
            };
            match hidden {
                Ok(()) => url.to_string(),
                // A URL that cannot carry credentials never had any; still, show nothing of it.
                Err(()) => "<unparseable URL>".to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}
