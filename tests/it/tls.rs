//! PostgreSQL over TLS: libpq `sslmode` semantics against a throwaway cluster with a certificate
//! made in the test.

use std::os::unix::fs::PermissionsExt;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use testkit::outbox::Env;
use testkit::{PgCluster, PgOptions};

pub(crate) struct Pki {
    dir: tempfile::TempDir,
    pub(crate) ca: PathBuf,
    pub(crate) other_ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    /// A client certificate for the role `certuser`, signed by `ca`, and its key.
    pub(crate) client_cert: PathBuf,
    pub(crate) client_key: PathBuf,
    /// The same, signed by `other_ca`.
    other_client_cert: PathBuf,
    other_client_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca")
}

fn client_cert(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    user: &str,
) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, user);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, issuer).expect("client cert");
    (cert, key)
}

/// A CA, a server certificate for 127.0.0.1 signed by it, an unrelated CA, and client certificates
/// signed by each. Files readable by the server's OS user (the server key only by it, as PostgreSQL
/// demands).
pub(crate) fn pki() -> Pki {
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
    let (client, client_key) = client_cert(&root, "certuser");
    let (other_client, other_client_key) = client_cert(&other, "certuser");
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
        client_cert: write("client.crt", &client.pem(), 0o644),
        client_key: write("client.key", &client_key.serialize_pem(), 0o600),
        other_client_cert: write("other-client.crt", &other_client.pem(), 0o644),
        other_client_key: write("other-client.key", &other_client_key.serialize_pem(), 0o600),
        dir,
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

/// Connections as the server logs them (`log_connections`): how `outbox-relay status` reaches one
/// database of a cluster.
struct TlsProbe {
    log: PathBuf,
    /// `database=<name>`, as the log shows it.
    database: String,
}

impl TlsProbe {
    /// For the database of `url` (a `postgres://` URL) on `pg`, which must log connections.
    fn new(pg: &PgCluster, url: &str) -> TlsProbe {
        let name = url.rsplit('/').next().expect("db name");
        TlsProbe {
            log: pg.log_path().to_path_buf(),
            database: format!("database={name}"),
        }
    }

    /// Runs `status` against `url` (nothing from the environment): its stderr when it cannot
    /// connect, else what the server logged meanwhile.
    fn status_log(&self, url: &str) -> Result<String, String> {
        let from = std::fs::metadata(&self.log).map_or(0, |m| m.len()) as usize;
        let (code, stderr) = status(url, &[]);
        if code != Some(0) {
            return Err(stderr);
        }
        let log = std::fs::read(&self.log).expect("server log");
        Ok(String::from_utf8_lossy(&log[from.min(log.len())..]).into_owned())
    }

    /// [`TlsProbe::status_log`]: whether the connections the server authorized for the database
    /// use TLS.
    async fn uses_tls(&self, url: &str) -> Result<bool, String> {
        let ssl: Vec<bool> = self
            .status_log(url)?
            .lines()
            .filter(|l| {
                l.contains("connection authorized:")
                    && l.split_whitespace().any(|w| w == self.database)
            })
            .map(|l| l.contains(" SSL enabled"))
            .collect();
        assert!(!ssl.is_empty(), "{url}: the server logged no connection");
        assert!(
            ssl.iter().all(|&s| s == ssl[0]),
            "{url}: connections with and without TLS"
        );
        Ok(ssl[0])
    }
}

/// A cluster with TLS on (the test server certificate), logging connections.
fn tls_options(pki: &Pki) -> PgOptions {
    PgOptions::default()
        .setting("ssl", "on")
        .setting("ssl_cert_file", path(&pki.cert))
        .setting("ssl_key_file", path(&pki.key))
        .setting("log_connections", "on")
}

async fn tls_cluster(opts: PgOptions) -> PgCluster {
    tokio::task::spawn_blocking(move || PgCluster::start(opts))
        .await
        .expect("cluster")
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `status` run with `DATABASE_URL` and libpq variables `vars` (in a child process: they are
/// process-wide), none inherited from the test's environment: (exit code, stderr).
fn status(database_url: &str, vars: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = testkit::relay_command();
    cmd.arg("status").env("DATABASE_URL", database_url);
    for var in ["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"] {
        cmd.env_remove(var);
    }
    cmd.envs(vars.iter().copied());
    let out = cmd.output().expect("status");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn sslmodes_against_a_tls_cluster() {
    let pki = pki();
    let pg = tls_cluster(tls_options(&pki)).await;
    let url = pg.create_migrated_database().await;
    let probe = TlsProbe::new(&pg, &url);

    assert!(probe
        .uses_tls(&with_params(&url, "sslmode=require"))
        .await
        .expect("require connects"));
    assert!(
        probe
            .uses_tls(&url)
            .await
            .expect("prefer (default) connects"),
        "prefer uses TLS when offered"
    );
    assert!(!probe
        .uses_tls(&with_params(&url, "sslmode=disable"))
        .await
        .expect("disable connects"));
    let full = with_params(
        &url,
        &format!("sslmode=verify-full&sslrootcert={}", path(&pki.ca)),
    );
    assert!(probe
        .uses_tls(&full)
        .await
        .expect("verify-full with the right root connects"));
    let ca_only = with_params(
        &url,
        &format!("sslmode=verify-ca&sslrootcert={}", path(&pki.ca)),
    );
    assert!(probe
        .uses_tls(&ca_only)
        .await
        .expect("verify-ca with the right root connects"));

    for mode in ["verify-full", "verify-ca", "require"] {
        let wrong = with_params(
            &url,
            &format!("sslmode={mode}&sslrootcert={}", path(&pki.other_ca)),
        );
        let err = probe
            .uses_tls(&wrong)
            .await
            .expect_err("a wrong root must fail")
            .to_string();
        assert!(
            err.contains("certificate") && err.contains("UnknownIssuer"),
            "{mode}: unclear error: {err}"
        );
    }

    // The same in key=value form, with spaces around `=` and quoted values.
    let dbname = url.rsplit('/').next().expect("db name");
    let kv = format!(
        "host=127.0.0.1 port={} dbname={dbname} user=postgres",
        pg.port()
    );
    for params in [
        "sslmode = require".to_string(),
        "sslmode= 'require'".to_string(),
        format!("sslmode = verify-full sslrootcert = '{}'", path(&pki.ca)),
        format!("sslrootcert='{}' sslmode =verify-ca", path(&pki.ca)),
    ] {
        assert!(
            probe
                .uses_tls(&format!("{kv} {params}"))
                .await
                .unwrap_or_else(|e| panic!("{params}: {e}")),
            "{params}"
        );
    }
    assert!(!probe
        .uses_tls(&format!("{kv} sslmode = disable"))
        .await
        .expect("disable connects"));
    let err = probe
        .uses_tls(&format!(
            "{kv} sslmode = verify-full sslrootcert = '{}'",
            path(&pki.other_ca)
        ))
        .await
        .expect_err("a wrong root must fail")
        .to_string();
    assert!(err.contains("UnknownIssuer"), "{err}");

    // The system's roots do not know the test CA: sslrootcert=system (verify-full implied) fails.
    let err = probe
        .uses_tls(&format!("{kv} sslrootcert=system"))
        .await
        .expect_err("the test CA is not a system root")
        .to_string();
    assert!(
        err.contains("UnknownIssuer") || err.contains("no system CA certificates"),
        "{err}"
    );

    // The environment variables, in a child process (they are process-wide).
    let client = testkit::pg_client(&url).await;
    let (ca, other_ca) = (path(&pki.ca), path(&pki.other_ca));
    for (vars, ok) in [
        (
            vec![("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", ca.as_str())],
            true,
        ),
        (
            vec![
                ("PGSSLMODE", "verify-ca"),
                ("PGSSLROOTCERT", other_ca.as_str()),
            ],
            false,
        ),
        (vec![("PGSSLROOTCERT", "system")], false),
    ] {
        let (code, stderr) = status(&kv, &vars);
        assert_eq!(code, Some(if ok { 0 } else { 1 }), "{vars:?}: {stderr}");
    }

    // The relay end to end over verify-full (worker and LISTEN connections).
    let env = Env {
        db: full,
        nats: testkit::NatsServer::start(),
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

/// A server without TLS: `require`, `verify-ca` and `verify-full`, however they are written and
/// wherever they come from, fail instead of connecting in plaintext.
#[tokio::test]
async fn tls_modes_never_fall_back_to_plaintext() {
    let pki = pki();
    let url = testkit::shared_pg().create_migrated_database().await;
    let probe = TlsProbe::new(testkit::shared_pg(), &url);
    let dbname = url.rsplit('/').next().expect("db name");
    let kv = format!(
        "host=127.0.0.1 port={} dbname={dbname} user=postgres",
        testkit::shared_pg().port()
    );
    let ca = path(&pki.ca);
    for tls in [
        with_params(&url, "sslmode=require"),
        with_params(&url, "ssl=true"),
        with_params(&url, &format!("sslmode=verify-full&sslrootcert={ca}")),
        format!("{kv} sslmode = require"),
        format!("{kv} sslmode= require"),
        format!("{kv} sslmode ='require'"),
        format!("{kv}\tsslmode\t=\trequire"),
        format!("{kv} sslmode = verify-ca sslrootcert = '{ca}'"),
        format!("{kv} sslmode = 'verify-full' sslrootcert = '{ca}'"),
        format!("{kv} sslrootcert = '{ca}' sslmode = require"),
    ] {
        let err = match probe.uses_tls(&tls).await {
            Ok(ssl) => panic!("{tls}: connected (ssl={ssl}) to a server without TLS"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("server does not support TLS"), "{tls}: {err}");
        let (code, stderr) = status(&tls, &[]);
        assert_eq!(code, Some(1), "{tls}: {stderr}");
        assert!(
            stderr.contains("server does not support TLS"),
            "{tls}: {stderr}"
        );
    }
    assert!(!probe
        .uses_tls(&format!("{kv} sslmode = prefer"))
        .await
        .expect("prefer connects without TLS"));

    // From the environment, when the string does not say; the string wins over the environment.
    for (database_url, vars) in [
        (kv.clone(), vec![("PGSSLMODE", "require")]),
        (url.clone(), vec![("PGSSLMODE", "require")]),
        (
            kv.clone(),
            vec![("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", ca.as_str())],
        ),
        (
            format!("{kv} sslmode = require"),
            vec![("PGSSLMODE", "disable")],
        ),
    ] {
        let (code, stderr) = status(&database_url, &vars);
        assert_eq!(code, Some(1), "{vars:?}: {stderr}");
        assert!(
            stderr.contains("server does not support TLS"),
            "{vars:?}: {stderr}"
        );
    }
    let (code, stderr) = status(&kv, &[("PGSSLMODE", "prefer")]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = status(
        &format!("{kv} sslmode=disable"),
        &[("PGSSLMODE", "require")],
    );
    assert_eq!(code, Some(0), "{stderr}");

    // Settings that cannot be honoured are usage errors naming the flag.
    for (database_url, vars, needle) in [
        (
            format!("{kv} sslrootcert=system sslmode = require"),
            vec![],
            "sslrootcert=system",
        ),
        (
            format!("{kv} sslrootcert=system"),
            vec![("PGSSLMODE", "verify-ca")],
            "sslrootcert=system",
        ),
        (kv.clone(), vec![("PGSSLMODE", "on")], "PGSSLMODE"),
        (format!("{kv} sslcert=/nowhere.crt"), vec![], "sslkey"),
        (
            format!("{kv} sslmode=require"),
            vec![("PGSSLCERT", "/nowhere.crt"), ("PGSSLKEY", "/nowhere.key")],
            "sslcert /nowhere.crt",
        ),
    ] {
        let (code, stderr) = status(&database_url, &vars);
        assert_eq!(code, Some(2), "{database_url} {vars:?}: {stderr}");
        assert!(
            stderr.contains("--database-url") && stderr.contains(needle),
            "{database_url} {vars:?}: {stderr}"
        );
    }
}

/// A server that requires a client certificate (`cert` authentication for the role `certuser`).
#[tokio::test]
async fn client_certificates() {
    let pki = pki();
    let hba = pki.dir.path().join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\n\
         hostssl all certuser 127.0.0.1/32 cert\n\
         host all postgres 127.0.0.1/32 trust\n",
    )
    .expect("pg_hba.conf");
    std::fs::set_permissions(&hba, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let pg = tls_cluster(
        tls_options(&pki)
            .setting("ssl_ca_file", path(&pki.ca))
            .setting("hba_file", path(&hba)),
    )
    .await;
    let url = pg.create_migrated_database().await;
    let admin = testkit::pg_client(&url).await;
    admin
        .batch_execute("CREATE ROLE certuser LOGIN SUPERUSER")
        .await
        .expect("role");
    let probe = TlsProbe::new(&pg, &url);
    let dbname = url.rsplit('/').next().expect("db name");
    let kv = format!(
        "host=127.0.0.1 port={} dbname={dbname} user=certuser",
        pg.port()
    );
    let (ca, client_cert, client_key) =
        (path(&pki.ca), path(&pki.client_cert), path(&pki.client_key));

    for url in [
        format!("{kv} sslmode = verify-full sslrootcert = '{ca}' sslcert = '{client_cert}' sslkey = '{client_key}'"),
        format!("{kv} sslmode=require sslcert={client_cert} sslkey={client_key}"),
        format!(
            "postgres://certuser@127.0.0.1:{}/{dbname}?sslmode=verify-ca&sslrootcert={ca}&sslcert={client_cert}&sslkey={client_key}",
            pg.port()
        ),
    ] {
        let log = probe
            .status_log(&url)
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(
            log.lines().any(|l| l.contains("connection authenticated:")
                && l.contains("CN=certuser")
                && l.contains("method=cert")),
            "{url}: {log}"
        );
    }

    // Without a certificate, or with one the server's CA did not sign, the server refuses.
    for (url, needle) in [
        (
            format!("{kv} sslmode=verify-full sslrootcert={ca}"),
            "requires a valid client certificate",
        ),
        (
            format!(
                "{kv} sslmode=verify-full sslrootcert={ca} sslcert={} sslkey={}",
                path(&pki.other_client_cert),
                path(&pki.other_client_key)
            ),
            "UnknownCA",
        ),
    ] {
        let err = match probe.status_log(&url) {
            Ok(_) => panic!("{url}: connected without a valid client certificate"),
            Err(e) => e,
        };
        assert!(err.contains(needle), "{url}: {err}");
    }

    // From the environment (in a child process: the variables are process-wide).
    let vars = [
        ("PGSSLMODE", "verify-full"),
        ("PGSSLROOTCERT", ca.as_str()),
        ("PGSSLCERT", client_cert.as_str()),
        ("PGSSLKEY", client_key.as_str()),
    ];
    let (code, stderr) = status(&kv, &vars);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = status(&kv, &vars[..2]);
    assert_eq!(code, Some(1), "without the certificate: {stderr}");
    // A key that does not belong to the certificate is a usage error before anything is sent.
    let (code, stderr) = status(
        &format!("{kv} sslkey={}", path(&pki.other_client_key)),
        &vars,
    );
    assert_eq!(code, Some(2), "mismatched key: {stderr}");
    assert!(
        stderr.contains("--database-url") && stderr.contains("sslkey"),
        "{stderr}"
    );
}
