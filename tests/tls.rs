//! PostgreSQL over TLS: libpq `sslmode` semantics against a throwaway cluster with a certificate
//! made in the test.

mod common;

use std::os::unix::fs::PermissionsExt;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::outbox::Env;
use common::{PgCluster, PgOptions};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca")
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and an unrelated CA. Files readable by
/// the server's OS user (the key only by it, as PostgreSQL demands).
fn pki() -> Pki {
    let dir = tempfile::Builder::new()
        .prefix("outbox-relay-tls-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let root = ca("outbox-relay test CA");
    let other = ca("somebody else's CA");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("params");
    params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &root).expect("server cert");
    let write = |name: &str, text: &str, mode: u32| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path
    };
    let pki = Pki {
        ca: write("ca.pem", &root.pem(), 0o644),
        other_ca: write("other-ca.pem", &other.pem(), 0o644),
        cert: write("server.crt", &cert.pem(), 0o644),
        key: write("server.key", &key.serialize_pem(), 0o600),
        _dir: dir,
    };
    if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("postgres")
            .expect("passwd")
            .expect("a postgres OS user");
        std::os::unix::fs::chown(&pki.key, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
            .expect("chown key");
    }
    pki
}

fn with_params(url: &str, params: &str) -> String {
    format!("{url}?{params}")
}

async fn uses_tls(url: &str) -> outbox_relay::Result<bool> {
    let client = outbox_relay::db::connect(url, "tls-test").await?;
    Ok(client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?
        .get(0))
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test]
async fn sslmodes_against_a_tls_cluster() {
    let pki = pki();
    let (cert, key) = (path(&pki.cert), path(&pki.key));
    let pg = tokio::task::spawn_blocking(move || {
        PgCluster::start(
            PgOptions::default()
                .setting("ssl", "on")
                .setting("ssl_cert_file", cert)
                .setting("ssl_key_file", key),
        )
    })
    .await
    .expect("cluster");
    let url = pg.create_database().await;

    assert!(uses_tls(&with_params(&url, "sslmode=require"))
        .await
        .expect("require connects"));
    assert!(
        uses_tls(&url).await.expect("prefer (default) connects"),
        "prefer uses TLS when offered"
    );
    assert!(!uses_tls(&with_params(&url, "sslmode=disable"))
        .await
        .expect("disable connects"));
    let full = with_params(
        &url,
        &format!("sslmode=verify-full&sslrootcert={}", path(&pki.ca)),
    );
    assert!(uses_tls(&full)
        .await
        .expect("verify-full with the right root connects"));
    let ca_only = with_params(
        &url,
        &format!("sslmode=verify-ca&sslrootcert={}", path(&pki.ca)),
    );
    assert!(uses_tls(&ca_only)
        .await
        .expect("verify-ca with the right root connects"));

    for mode in ["verify-full", "verify-ca", "require"] {
        let wrong = with_params(
            &url,
            &format!("sslmode={mode}&sslrootcert={}", path(&pki.other_ca)),
        );
        let err = uses_tls(&wrong)
            .await
            .expect_err("a wrong root must fail")
            .to_string();
        assert!(
            err.contains("certificate") && err.contains("UnknownIssuer"),
            "{mode}: unclear error: {err}"
        );
    }

    // The relay end to end over verify-full (worker and LISTEN connections).
    let mut client = common::pg_client(&url).await;
    outbox_relay::migrate::migrate(&mut client)
        .await
        .expect("migrate");
    let env = Env {
        db: full,
        nats: common::NatsServer::start(),
    };
    env.create_stream().await;
    let relay = env.spawn(env.config()).await;
    client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'order.created', '{}')",
            &[],
        )
        .await
        .expect("insert");
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    let listener_tls: bool = client
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name LIKE 'outbox-relay%'",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(listener_tls, "every relay connection uses TLS");
    relay.stop().await;
}
