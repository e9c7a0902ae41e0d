//! Connecting to NATS: credentials, nkey and TLS from the config, bounded at start.

use std::time::Duration;

use crate::config::{Credentials, NatsConfig};
use crate::error::{Error, Result};

/// Connects to NATS with the credentials and TLS settings of `nats`. Fails fast (bounded) when the
/// server is unreachable or refuses the credentials; afterwards the client reconnects on its own,
/// telling `on_link` each time it connects (true) or loses the connection (false).
pub(crate) async fn connect(
    nats: &NatsConfig,
    on_link: impl Fn(bool) + Send + Sync + 'static,
) -> Result<async_nats::Client> {
    let on_link = std::sync::Arc::new(on_link);
    let mut options = async_nats::ConnectOptions::new()
        .name("outbox-relay")
        .event_callback(move |event| {
            let on_link = on_link.clone();
            async move {
                match event {
                    async_nats::Event::Connected => on_link(true),
                    async_nats::Event::Disconnected => on_link(false),
                    _ => {}
                }
            }
        })
        .connection_timeout(Duration::from_secs(5))
        .ping_interval(Duration::from_secs(10))
        .max_reconnects(None);
    if let Some(path) = &nats.creds {
        options = options.credentials_file(path).await.map_err(|e| {
            Error::broker_connect(format!("cannot read creds file {}", path.display())).caused_by(e)
        })?;
    }
    if let Some(path) = &nats.nkey {
        let seed = std::fs::read_to_string(path).map_err(|e| {
            Error::broker_connect(format!("cannot read nkey file {}", path.display())).caused_by(e)
        })?;
        options = options.nkey(seed.trim().to_string());
    }
    if let Some(ca) = &nats.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&nats.tls_cert, &nats.tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    // Credentials travel in the options, not the URL: the client logs server URLs at debug level.
    let (servers, credentials) = nats.servers_and_credentials()?;
    match credentials {
        Some(Credentials::UserPassword(user, password)) => {
            options = options.user_and_password(user, password);
        }
        Some(Credentials::Token(token)) => options = options.token(token),
        None => {}
    }
    options.connect(servers.as_slice()).await.map_err(|e| {
        use async_nats::ConnectErrorKind as K;
        let (what, refused) = match e.kind() {
            K::Authentication | K::AuthorizationViolation => ("authentication failed", true),
            K::TimedOut => ("timed out", false),
            K::Tls => ("TLS setup failed", true),
            // The handshake itself (the server's certificate does not verify, or the server
            // refused ours) comes as an I/O error: waiting would not heal it either.
            _ if crate::error::caused_by_rustls(&e) => ("TLS handshake failed", true),
            _ => ("cannot connect", false),
        };
        // The cause's text follows, redacted as the whole message is.
        let message = format!("{what} ({})", crate::redact::redact(nats.url.expose()));
        if refused {
            Error::refused(format!("NATS {message}")).caused_by(e)
        } else {
            Error::broker_connect(message).caused_by(e)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NatsConfig;

    /// The failure behind a connect error stays reachable through `source()`, its text still
    /// ending the message.
    #[tokio::test]
    async fn a_connect_error_keeps_what_failed_as_its_source() {
        use std::error::Error as _;
        let nkey = NatsConfig {
            nkey: Some("/nonexistent/outbox-relay-test.nk".into()),
            ..NatsConfig::default()
        };
        let e = connect(&nkey, |_| {}).await.expect_err("no nkey file");
        assert_eq!(e.kind(), crate::ErrorKind::BrokerConnect);
        assert!(e.is_retryable());
        assert!(
            e.to_string().starts_with(
                "NATS connection failed: cannot read nkey file /nonexistent/outbox-relay-test.nk: "
            ),
            "{e}"
        );
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|io| io.kind()),
            Some(std::io::ErrorKind::NotFound),
            "{e:?}"
        );

        // Nothing listens on port 1 of localhost: the connect fails at once.
        let nowhere = NatsConfig {
            url: "nats://app:s3cret@127.0.0.1:1".into(),
            ..NatsConfig::default()
        };
        let e = connect(&nowhere, |_| {})
            .await
            .expect_err("nothing listens there");
        assert_eq!(e.kind(), crate::ErrorKind::BrokerConnect);
        let shown = e.to_string();
        assert!(
            shown.starts_with(
                "NATS connection failed: cannot connect (nats://app:***@127.0.0.1:1): "
            ),
            "{shown}"
        );
        assert!(
            !shown.contains("s3cret") && !e.redacted().contains("s3cret"),
            "{shown}"
        );
        let nats = e
            .source()
            .and_then(|s| s.downcast_ref::<async_nats::ConnectError>());
        let nats = nats.expect("the async-nats error as the source");
        assert!(shown.ends_with(&nats.to_string()), "{shown}");
        // The chain holds no credentials either: they travel in the connect options.
        let mut source = e.source();
        while let Some(s) = source {
            assert!(!s.to_string().contains("s3cret"), "{s}");
            source = s.source();
        }
    }
}
