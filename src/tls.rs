//! TLS towards PostgreSQL with rustls, honouring libpq's `sslmode` (`disable`, `prefer`, `require`,
//! `verify-ca`, `verify-full`) and `sslrootcert`, which tokio-postgres does not parse itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{ring, verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode;

use crate::error::{Error, Result};

/// The TLS part of a database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: Mode,
    pub root_cert: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl TlsSettings {
    /// What tokio-postgres should do with TLS.
    pub fn ssl_mode(&self) -> SslMode {
        match self.mode {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }

    /// The rustls client configuration: certificates verified as the mode says. Like libpq,
    /// `require` with an `sslrootcert` verifies the chain (as `verify-ca`).
    pub fn client_config(&self, field: &'static str) -> Result<ClientConfig> {
        let provider = Arc::new(ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::config(field, format!("TLS setup: {e}")))?;
        let verify_chain = matches!(self.mode, Mode::VerifyCa | Mode::VerifyFull)
            || (self.mode == Mode::Require && self.root_cert.is_some());
        if !verify_chain {
            return Ok(builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
                .with_no_client_auth());
        }
        let roots = Arc::new(self.roots(field)?);
        if self.mode == Mode::VerifyFull {
            return Ok(builder.with_root_certificates(roots).with_no_client_auth());
        }
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| Error::config(field, format!("TLS setup: {e}")))?;
        Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
            .with_no_client_auth())
    }

    fn roots(&self, field: &'static str) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            Some(path) => {
                for cert in read_certs(path, field)? {
                    roots.add(cert).map_err(|e| {
                        Error::config(field, format!("sslrootcert {}: {e}", path.display()))
                    })?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err(Error::config(
                field,
                "sslmode verify-ca/verify-full needs sslrootcert (no system certificates found)",
            ));
        }
        Ok(roots)
    }
}

fn read_certs(path: &Path, field: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: std::result::Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| Error::config(field, format!("sslrootcert {}: {e}", path.display())))?
        .collect();
    certs.map_err(|e| Error::config(field, format!("sslrootcert {}: {e}", path.display())))
}

/// Splits `sslmode` and `sslrootcert` out of a URL or key=value string, returning what remains for
/// tokio-postgres to parse.
pub fn split(url: &str, field: &'static str) -> Result<(String, TlsSettings)> {
    let mut settings = TlsSettings {
        mode: Mode::Prefer,
        root_cert: None,
    };
    let mut apply = |key: &str, value: &str| -> Result<bool> {
        match key {
            "sslmode" => {
                settings.mode = match value {
                    "disable" => Mode::Disable,
                    "allow" | "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(Error::config(
                            field,
                            format!("unknown sslmode {other:?} (disable, prefer, require, verify-ca, verify-full)"),
                        ))
                    }
                };
                Ok(true)
            }
            "sslrootcert" => {
                settings.root_cert = Some(PathBuf::from(value));
                Ok(true)
            }
            _ => Ok(false),
        }
    };
    let rest = if let Some((base, query)) = url.split_once('?').filter(|_| url.contains("://")) {
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
            if !apply(k, &v)? {
                kept.push(pair);
            }
        }
        if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else if url.contains("://") {
        url.to_string()
    } else {
        let mut kept = Vec::new();
        for token in url.split_whitespace() {
            match token.split_once('=') {
                Some((k, v)) if apply(k, v.trim_matches('\''))? => {}
                _ => kept.push(token),
            }
        }
        kept.join(" ")
    };
    Ok((rest, settings))
}

/// `sslmode=require`/`prefer` without a root certificate: encrypted, not authenticated (as libpq).
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tls_parameters_from_urls() {
        let (rest, s) = split(
            "postgres://u:p@h:5432/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x",
            "database_url",
        )
        .expect("split");
        assert_eq!(rest, "postgres://u:p@h:5432/db?application_name=x");
        assert_eq!(s.mode, Mode::VerifyFull);
        assert_eq!(s.root_cert.as_deref(), Some(Path::new("/tmp/ca.pem")));
        let (rest, s) = split("host=h sslmode=require dbname=x", "database_url").expect("split");
        assert_eq!(rest, "host=h dbname=x");
        assert_eq!(s.mode, Mode::Require);
        let (_, s) = split("postgres://h/db", "database_url").expect("split");
        assert_eq!(s.mode, Mode::Prefer);
        assert!(split("postgres://h/db?sslmode=maybe", "database_url").is_err());
    }
}
