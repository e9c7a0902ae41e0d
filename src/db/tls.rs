//! TLS towards PostgreSQL with rustls, honouring libpq's `sslmode` (`disable`, `allow`, `prefer`,
//! `require`, `verify-ca`, `verify-full`), `sslrootcert` (a file, or `system`), and `sslcert` /
//! `sslkey` (a client certificate), which tokio-postgres does not parse itself. Each is read from the
//! connection string, else from libpq's environment variable (`PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGSSLCERT`, `PGSSLKEY`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{ring, verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode;

use super::conninfo::ConnInfo;
use crate::error::{Error, Result};

/// The TLS part of a database URL (with libpq's environment variables applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: Mode,
    pub root_cert: Option<RootCert>,
    /// A client certificate (`sslcert`) and its private key (`sslkey`), for servers that ask for
    /// one.
    pub client_cert: Option<ClientCert>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Where trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of CA certificates.
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's trusted roots (implies `verify-full`).
    System,
}

/// PEM files of a client certificate (chain) and its private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
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

    /// The rustls client configuration: certificates verified as the mode says, the client
    /// certificate presented when one is set. Like libpq, `require` with a root certificate file
    /// verifies the chain (as `verify-ca`).
    pub fn client_config(&self, field: &'static str) -> Result<ClientConfig> {
        let provider = Arc::new(ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::config(field, format!("TLS setup: {e}")))?;
        let verify_chain = matches!(self.mode, Mode::VerifyCa | Mode::VerifyFull)
            || (self.mode == Mode::Require && self.root_cert.is_some());
        let builder = if !verify_chain {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        } else {
            let roots = Arc::new(self.roots(field)?);
            if self.mode == Mode::VerifyFull {
                builder.with_root_certificates(roots)
            } else {
                let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| Error::config(field, format!("TLS setup: {e}")))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
            }
        };
        match &self.client_cert {
            // Without TLS there is nothing to present: the files are not even read (as libpq).
            Some(client) if self.mode != Mode::Disable => {
                let certs = read_certs(&client.cert, "sslcert", field)?;
                let key = PrivateKeyDer::from_pem_file(&client.key).map_err(|e| {
                    Error::config(field, format!("sslkey {}: {e}", client.key.display()))
                })?;
                builder.with_client_auth_cert(certs, key).map_err(|e| {
                    Error::config(
                        field,
                        format!(
                            "sslcert {} with sslkey {}: {e}",
                            client.cert.display(),
                            client.key.display()
                        ),
                    )
                })
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }

    fn roots(&self, field: &'static str) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            Some(RootCert::File(path)) => {
                for cert in read_certs(path, "sslrootcert", field)? {
                    roots.add(cert).map_err(|e| {
                        Error::config(field, format!("sslrootcert {}: {e}", path.display()))
                    })?;
                }
            }
            Some(RootCert::System) | None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            let message = match self.root_cert {
                Some(RootCert::File(_)) => "sslrootcert: the file holds no certificate",
                Some(RootCert::System) => "sslrootcert=system: no system CA certificates found",
                None => {
                    "sslmode verify-ca/verify-full needs sslrootcert (no system certificates found)"
                }
            };
            return Err(Error::config(field, message));
        }
        Ok(roots)
    }
}

fn read_certs(path: &Path, key: &str, field: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: std::result::Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| Error::config(field, format!("{key} {}: {e}", path.display())))?
        .collect();
    let certs =
        certs.map_err(|e| Error::config(field, format!("{key} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::config(
            field,
            format!("{key} {}: no PEM certificate in the file", path.display()),
        ));
    }
    Ok(certs)
}

/// Makes ring the process's rustls provider unless one is installed already. Clients that build
/// their TLS config from the process default (async-nats) need one when the build holds two
/// providers: `pgwire-replication` brings tokio-rustls with its default aws-lc-rs next to our
/// ring, and rustls then refuses to guess.
pub(crate) fn install_default_provider() {
    let _ = ring::default_provider().install_default();
}

/// Splits the TLS parameters out of a URL or key=value string, returning what remains (as a
/// key=value string, every value quoted) for tokio-postgres to parse. Parameters the string does
/// not set are taken from libpq's environment variables.
pub fn split(url: &str, field: &'static str) -> Result<(String, TlsSettings)> {
    split_with_env(url, field, &|name| std::env::var(name).ok())
}

/// [`split`] with the environment given (tests).
pub(crate) fn split_with_env(
    url: &str,
    field: &'static str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, TlsSettings)> {
    let mut info = ConnInfo::parse(url, field)?;
    let settings = take_settings(&mut info, field, env)?;
    Ok((info.to_conninfo(), settings))
}

/// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of `info`, each falling back to its
/// environment variable (an empty value counts as unset).
fn take_settings(
    info: &mut ConnInfo,
    field: &'static str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TlsSettings> {
    // An empty value counts as unset, in the string too: `sslmode=''` leaves PGSSLMODE in force
    // rather than quietly meaning `prefer`.
    let mut setting = |key: &'static str, var: &'static str| -> Option<(String, &'static str)> {
        let given = info.take(key).filter(|v| !v.is_empty()).map(|v| (v, key));
        given.or_else(|| env(var).filter(|v| !v.is_empty()).map(|v| (v, var)))
    };
    let mode = setting("sslmode", "PGSSLMODE");
    let root = setting("sslrootcert", "PGSSLROOTCERT");
    let cert = setting("sslcert", "PGSSLCERT");
    let key = setting("sslkey", "PGSSLKEY");

    let root_cert = root.map(|(v, _)| match v.as_str() {
        "system" => RootCert::System,
        _ => RootCert::File(PathBuf::from(v)),
    });
    let mode = match mode {
        Some((value, source)) => {
            let mode = match value.as_str() {
                "disable" => Mode::Disable,
                "allow" | "prefer" => Mode::Prefer,
                "require" => Mode::Require,
                "verify-ca" => Mode::VerifyCa,
                "verify-full" => Mode::VerifyFull,
                other => {
                    return Err(Error::config(
                        field,
                        format!(
                            "{source}: unknown sslmode {other:?} (disable, allow, prefer, require, verify-ca, verify-full)"
                        ),
                    ))
                }
            };
            // As libpq: the system's roots are only worth trusting together with the host name.
            if root_cert == Some(RootCert::System) && mode != Mode::VerifyFull {
                return Err(Error::config(
                    field,
                    format!(
                        "{source}: sslmode {value} is too weak for sslrootcert=system (use verify-full, or leave sslmode unset)"
                    ),
                ));
            }
            mode
        }
        None if root_cert == Some(RootCert::System) => Mode::VerifyFull,
        None => Mode::Prefer,
    };
    let client_cert = match (cert, key) {
        (Some((cert, _)), Some((key, _))) => Some(ClientCert {
            cert: PathBuf::from(cert),
            key: PathBuf::from(key),
        }),
        (None, None) => None,
        (Some((_, source)), None) => {
            return Err(Error::config(
                field,
                format!(
                    "{source} needs sslkey (or PGSSLKEY): the client certificate's private key"
                ),
            ))
        }
        (None, Some((_, source))) => {
            return Err(Error::config(
                field,
                format!("{source} needs sslcert (or PGSSLCERT): the client certificate"),
            ))
        }
    };
    Ok(TlsSettings {
        mode,
        root_cert,
        client_cert,
    })
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
    use std::collections::HashMap;

    use super::*;

    fn split_env(url: &str, env: &[(&str, &str)]) -> Result<(String, TlsSettings)> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        split_with_env(url, "database_url", &|name| env.get(name).cloned())
    }

    fn settings(url: &str, env: &[(&str, &str)]) -> TlsSettings {
        split_env(url, env)
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .1
    }

    #[test]
    fn splits_tls_parameters_from_urls() {
        let (rest, s) = split_env(
            "postgres://u:p@h:5432/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x",
            &[],
        )
        .expect("split");
        assert_eq!(
            rest,
            "user='u' password='p' host='h' port='5432' dbname='db' application_name='x'"
        );
        assert_eq!(s.mode, Mode::VerifyFull);
        assert_eq!(s.root_cert, Some(RootCert::File("/tmp/ca.pem".into())));
        let (rest, s) = split_env("host=h sslmode=require dbname=x", &[]).expect("split");
        assert_eq!(rest, "host='h' dbname='x'");
        assert_eq!(s.mode, Mode::Require);
        assert_eq!(settings("postgres://h/db", &[]).mode, Mode::Prefer);
        assert!(split_env("postgres://h/db?sslmode=maybe", &[]).is_err());
    }

    #[test]
    fn key_value_forms_are_not_downgraded() {
        for url in [
            "host=h sslmode = require dbname=x",
            "host=h sslmode= require",
            "host=h sslmode ='require'",
            "host=h\tsslmode\t=\trequire",
            "postgres://h/db?ssl=true",
        ] {
            assert_eq!(settings(url, &[]).mode, Mode::Require, "{url}");
        }
        let s = settings(
            r"host=h sslmode = verify-full sslrootcert = '/etc/my certs/it\'s.pem' password='a b'",
            &[],
        );
        assert_eq!(s.mode, Mode::VerifyFull);
        assert_eq!(
            s.root_cert,
            Some(RootCert::File("/etc/my certs/it's.pem".into()))
        );
    }

    #[test]
    fn other_parameters_pass_through_exactly() {
        let (rest, _) = split_env(
            r"host=h password = 'a \'b\\c' sslmode=require application_name='x y' options='-c a=b'",
            &[],
        )
        .expect("split");
        let config: tokio_postgres::Config = rest.parse().expect("tokio-postgres parses it");
        assert_eq!(config.get_password(), Some(&b"a 'b\\c"[..]));
        assert_eq!(config.get_application_name(), Some("x y"));
        assert_eq!(config.get_options(), Some("-c a=b"));
    }

    #[test]
    fn environment_variables_fill_in_what_the_string_leaves_unset() {
        let env = [
            ("PGSSLMODE", "verify-ca"),
            ("PGSSLROOTCERT", "/env/ca.pem"),
            ("PGSSLCERT", "/env/client.crt"),
            ("PGSSLKEY", "/env/client.key"),
        ];
        let s = settings("host=h", &env);
        assert_eq!(s.mode, Mode::VerifyCa);
        assert_eq!(s.root_cert, Some(RootCert::File("/env/ca.pem".into())));
        assert_eq!(
            s.client_cert,
            Some(ClientCert {
                cert: "/env/client.crt".into(),
                key: "/env/client.key".into()
            })
        );
        // The string wins.
        let s = settings(
            "postgres://h/db?sslmode=require&sslrootcert=/url/ca.pem&sslkey=/url/k",
            &env,
        );
        assert_eq!(s.mode, Mode::Require);
        assert_eq!(s.root_cert, Some(RootCert::File("/url/ca.pem".into())));
        assert_eq!(
            s.client_cert,
            Some(ClientCert {
                cert: "/env/client.crt".into(),
                key: "/url/k".into()
            })
        );
        // Empty counts as unset, in the string too.
        assert_eq!(settings("host=h", &[("PGSSLMODE", "")]).mode, Mode::Prefer);
        assert_eq!(
            settings("host=h sslmode=''", &[("PGSSLMODE", "require")]).mode,
            Mode::Require
        );
        let err = split_env("host=h", &[("PGSSLMODE", "sometimes")])
            .expect_err("bad PGSSLMODE")
            .to_string();
        assert!(
            err.contains("PGSSLMODE") && err.contains("database_url"),
            "{err}"
        );
    }

    #[test]
    fn system_roots_imply_verify_full_and_refuse_weaker_modes() {
        let s = settings("host=h sslrootcert=system", &[]);
        assert_eq!(s.mode, Mode::VerifyFull);
        assert_eq!(s.root_cert, Some(RootCert::System));
        assert_eq!(
            settings("host=h", &[("PGSSLROOTCERT", "system")]).mode,
            Mode::VerifyFull
        );
        assert_eq!(
            settings("host=h sslrootcert=system sslmode=verify-full", &[]).mode,
            Mode::VerifyFull
        );
        for (url, env) in [
            ("host=h sslrootcert=system sslmode=require", &[][..]),
            ("host=h sslrootcert=system sslmode=verify-ca", &[][..]),
            ("host=h sslrootcert=system sslmode=disable", &[][..]),
            ("host=h sslrootcert=system", &[("PGSSLMODE", "prefer")][..]),
        ] {
            let err = split_env(url, env).expect_err(url).to_string();
            assert!(
                err.contains("database_url") && err.contains("sslrootcert=system"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let err = split_env("host=h sslcert=/c.crt", &[])
            .expect_err("cert without key")
            .to_string();
        assert!(err.contains("sslcert") && err.contains("sslkey"), "{err}");
        let err = split_env("host=h", &[("PGSSLKEY", "/k")])
            .expect_err("key without cert")
            .to_string();
        assert!(err.contains("PGSSLKEY"), "{err}");
    }

    #[test]
    fn unreadable_files_name_the_field_and_the_parameter() {
        let s = settings(
            "host=h sslmode=require sslcert=/nonexistent/c.crt sslkey=/nonexistent/c.key",
            &[],
        );
        let err = s
            .client_config("listen_database_url")
            .expect_err("missing files");
        assert!(
            matches!(err.config_field(), Some(("listen_database_url", message)) if message.contains("sslcert")),
            "{err}"
        );
        // Without TLS the files are not needed.
        let s = settings(
            "host=h sslmode=disable sslcert=/nonexistent/c.crt sslkey=/nonexistent/c.key",
            &[],
        );
        s.client_config("database_url")
            .expect("disable ignores them");
    }
}
