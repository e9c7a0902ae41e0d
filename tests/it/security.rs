//! Credentials: NATS authentication, and secrets never printed.

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use outbox_relay::{Relay, RelayConfig};
use testkit::outbox::RunningRelay;
use testkit::{NatsServer, PgCluster, PgOptions};

const SECRET: &str = "s3cret-Pa55";

fn auth_server() -> NatsServer {
    NatsServer::start_with_config(&format!(
        "authorization {{\n  users = [ {{ user: relay, password: \"{SECRET}\" }} ]\n}}"
    ))
}

/// `outbox-relay <args>` logging at debug level, against a database that is not there and against
/// `nats`, the secret the password in both URLs.
fn with_secrets_in_urls(args: &[&str], nats: &NatsServer) -> Command {
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut cmd = testkit::relay_command();
    cmd.args(args)
        .env(
            "DATABASE_URL",
            format!("postgres://app:{SECRET}@127.0.0.1:{dead_port}/x"),
        )
        .env(
            "NATS_URL",
            format!("nats://relay:{SECRET}@127.0.0.1:{}", nats.port()),
        )
        .env("RUST_LOG", "debug");
    cmd
}

async fn migrated_db() -> String {
    testkit::shared_pg().create_migrated_database().await
}

#[tokio::test]
async fn nats_user_and_password_in_the_url() {
    let nats = auth_server();
    let good = format!("nats://relay:{SECRET}@127.0.0.1:{}", nats.port());
    let db = migrated_db().await;

    // (async-nats itself ignores credentials in the URL; the relay moves them into the options.)
    let client = async_nats::ConnectOptions::with_user_and_password("relay".into(), SECRET.into())
        .connect(format!("127.0.0.1:{}", nats.port()))
        .await
        .expect("connect with credentials");
    jetstream::new(client)
        .create_stream(stream::Config {
            name: "OUTBOX".into(),
            subjects: vec!["outbox.>".into()],
            ..Default::default()
        })
        .await
        .expect("stream");

    let mut config = RelayConfig::new(db.clone());
    config.nats.url = good.into();
    let relay = RunningRelay::start(config).await;
    // Right credentials: the relay starts and runs until stopped.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!relay.handle.is_finished(), "the relay stopped on its own");
    relay.token.cancel();
    relay
        .handle
        .await
        .expect("task")
        .expect("right credentials connect");

    // Wrong credentials: waiting cannot heal that, so the relay fails at once.
    let mut config = RelayConfig::new(db);
    config.nats.url = format!("nats://relay:wrong-{SECRET}@127.0.0.1:{}", nats.port()).into();
    let started = std::time::Instant::now();
    let relay = Relay::new(config).await.expect("valid config");
    let err = match tokio::time::timeout(
        Duration::from_secs(20),
        relay.run(tokio_util::sync::CancellationToken::new()),
    )
    .await
    {
        Ok(Ok(())) => panic!("wrong credentials must fail"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("wrong credentials did not fail within 20 s"),
    };
    assert!(started.elapsed() < Duration::from_secs(10), "fails fast");
    assert!(err.contains("authentication failed"), "{err}");
    assert!(!err.contains(SECRET), "secret leaked: {err}");
}

#[tokio::test]
async fn cli_output_never_contains_secrets() {
    let nats = auth_server();
    let db = migrated_db().await;
    let bin = testkit::relay_bin();

    // Wrong NATS password: exit 1, says authentication failed, never prints the password.
    let out = Command::new(bin)
        .args(["run", "--metrics-addr", "off"])
        .env("DATABASE_URL", &db)
        .env(
            "NATS_URL",
            format!("nats://relay:wrong-{SECRET}@127.0.0.1:{}", nats.port()),
        )
        .env("RUST_LOG", "debug")
        .output()
        .expect("run");
    let all =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("authentication failed"), "{all}");
    assert!(!all.contains(SECRET), "secret leaked:\n{all}");

    // A database password in the URL of a server that is not there: not printed either, in the
    // startup config line nor in the error. (`run` waits for such a database, logging why: see
    // run_waits_for_an_unreachable_database_without_printing_its_password.)
    for args in [vec!["status"], vec!["migrate"]] {
        let out = with_secrets_in_urls(&args, &nats).output().expect("run");
        let all = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {all}");
        assert!(!all.contains(SECRET), "{args:?} leaked the secret:\n{all}");
    }

    // --help shows env names, never env values.
    let out = Command::new(bin)
        .args(["run", "--help"])
        .env("DATABASE_URL", format!("postgres://app:{SECRET}@h/x"))
        .env("NATS_URL", format!("nats://relay:{SECRET}@h"))
        .output()
        .expect("help");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(SECRET));
}

/// `run` keeps waiting for a database that is not there (it may start after the relay) and logs
/// each failed attempt with its reason: never with the password.
#[tokio::test]
async fn run_waits_for_an_unreachable_database_without_printing_its_password() {
    let nats = auth_server();
    let mut child = with_secrets_in_urls(&["run", "--metrics-addr", "off"], &nats)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    // Several attempts (the backoff starts at 200 ms): it must keep waiting, not exit.
    for _ in 0..20 {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "run exited instead of waiting for the database"
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // the observation window
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    let all =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(all.contains("database not ready; waiting"), "{all}");
    assert!(!all.contains(SECRET), "run leaked the secret:\n{all}");
}

/// The combined stdout and stderr of the CLI run with `args` and `env`.
fn cli(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = testkit::relay_command();
    cmd.args(args).env("RUST_LOG", "debug");
    for var in [
        "DATABASE_URL",
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGSSLCERT",
        "PGSSLKEY",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the CLI");
    let all =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), all)
}

/// The output of the CLI run with `args` and `env`, stopped after 1.5 s if still running.
fn run_for_a_while(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = testkit::relay_command();
    cmd.args(args).env("RUST_LOG", "debug");
    for var in ["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the CLI");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    std::thread::sleep(Duration::from_millis(1500)); // the observation window
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let out = child.wait_with_output().expect("output");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[tokio::test]
async fn key_value_passwords_are_never_printed() {
    let nats = auth_server();
    let nats_url = format!("nats://relay:{SECRET}@127.0.0.1:{}", nats.port());
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let base = format!("host=127.0.0.1 port={dead_port} user=app dbname=x");
    for url in [
        format!("{base} password = {SECRET}"),
        format!("{base} password= {SECRET}"),
        format!("{base} password ={SECRET}"),
        format!("{base} password='{SECRET} and {SECRET}'"),
        format!(r"{base} password = 'it\'s {SECRET}'"),
        format!(r"{base} password=a\ {SECRET}"),
        format!("password\t=\t{SECRET} {base}"),
        format!(
            "postgres://app:{SECRET}@127.0.0.1:{dead_port}/x?password={SECRET}&sslmode=disable"
        ),
    ] {
        // `run` waits for the database (it may start later), logging why: stop it meanwhile.
        let all = run_for_a_while(
            &[
                "run",
                "--metrics-addr",
                "off",
                "--listen-database-url",
                &url,
            ],
            &[("DATABASE_URL", &url), ("NATS_URL", &nats_url)],
        );
        assert!(all.contains("starting relay"), "{url}: {all}");
        assert!(all.contains("database not ready"), "{url}: {all}");
        assert!(all.contains("password=***"), "{url}: {all}");
        assert!(!all.contains(SECRET), "{url} leaked the secret:\n{all}");
        for args in [vec!["status"], vec!["migrate"]] {
            let (code, all) = cli(&args, &[("DATABASE_URL", &url)]);
            assert_eq!(code, Some(1), "{args:?} {url}: {all}");
            assert!(
                !all.contains(SECRET),
                "{args:?} {url} leaked the secret:\n{all}"
            );
        }
    }

    // A string that does not parse is a usage error that quotes none of it.
    for url in [
        format!("host=127.0.0.1 password='{SECRET}"),
        format!("host=127.0.0.1 {SECRET}"),
    ] {
        let (code, all) = cli(&["status"], &[("DATABASE_URL", &url)]);
        assert_eq!(code, Some(2), "{all}");
        assert!(all.contains("--database-url"), "{all}");
        assert!(!all.contains(SECRET), "{url} leaked the secret:\n{all}");
    }
}

/// A cluster where every role but `postgres` logs in with a SCRAM password over TCP.
fn password_cluster(dir: &std::path::Path) -> PgCluster {
    use std::os::unix::fs::PermissionsExt;
    let hba = dir.join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         host all all 127.0.0.1/32 scram-sha-256\n",
    )
    .expect("write pg_hba.conf");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&hba, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    PgCluster::start(
        PgOptions::default()
            .setting("hba_file", hba.display().to_string())
            .setting("log_connections", "on"),
    )
}

#[tokio::test]
async fn passwords_with_quotes_and_spaces_reach_the_server_intact() {
    let dir = tempfile::Builder::new()
        .prefix("outbox-relay-scram-")
        .tempdir()
        .expect("tempdir");
    let path = dir.path().to_path_buf();
    let pg = tokio::task::spawn_blocking(move || password_cluster(&path))
        .await
        .expect("cluster");
    let admin_url = pg.create_migrated_database().await;
    let dbname = admin_url.rsplit('/').next().expect("db name").to_string();
    let password = format!(r"it's {SECRET} \ 100%");
    let admin = testkit::pg_client(&admin_url).await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE app LOGIN SUPERUSER PASSWORD '{}'",
            password.replace('\'', "''")
        ))
        .await
        .expect("role");

    let port = pg.port();
    let quoted = password.replace('\\', r"\\").replace('\'', r"\'");
    let encoded =
        percent_encoding::utf8_percent_encode(&password, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    let good = [
        format!("host=127.0.0.1 port={port} dbname = {dbname} user = app password = '{quoted}' application_name = 'it\\'s \\\\ mine'"),
        format!("password\n=\n'{quoted}'\nhost=127.0.0.1\nport={port}\ndbname={dbname}\nuser=app"),
        format!("postgres://app:{encoded}@127.0.0.1:{port}/{dbname}?application_name=it%27s%20%5C%20mine"),
        format!("postgres://app@127.0.0.1:{port}/{dbname}?password={encoded}"),
    ];
    for url in &good {
        let from = testkit::file_len(pg.log_path());
        let (code, all) = cli(&["status"], &[("DATABASE_URL", url)]);
        assert_eq!(code, Some(0), "{url}: {all}");
        assert!(all.contains("pending:"), "{all}");
        assert!(!all.contains(SECRET), "{url} leaked the secret:\n{all}");
        // The server saw the application name as given (`log_connections`).
        let log = testkit::read_from(pg.log_path(), from);
        let names: Vec<&str> = log
            .lines()
            .filter_map(|l| {
                l.split_once("connection authorized: ")?
                    .1
                    .split_once(" application_name=")
            })
            .map(|(_, name)| name)
            .collect();
        assert!(!names.is_empty(), "{url}: no connection logged:\n{log}");
        if url.contains("mine") {
            assert!(
                names.iter().all(|n| *n == r"it's \ mine"),
                "{url}: {names:?}"
            );
        }
    }

    // With --schema the options are added to the parsed parameters; the password still works:
    // the relay's LISTEN connection (the one that gets them) finds the outbox of a schema of its
    // own and arms, which takes an advisory lock.
    let (code, all) = cli(
        &["migrate", "--schema", "sec"],
        &[("DATABASE_URL", &good[0])],
    );
    assert_eq!(code, Some(0), "migrate --schema: {all}");
    let nats = NatsServer::start();
    testkit::outbox::create_stream(&jetstream::new(
        async_nats::connect(nats.url()).await.expect("nats"),
    ))
    .await;
    let mut config = RelayConfig::new(good[0].clone());
    config.nats.url = nats.url().into();
    config.postgres.schema = Some("sec".into());
    let relay = RunningRelay::start(config).await;
    testkit::wait_until(
        "the relay's LISTEN connection (with --schema, as app) armed",
        Duration::from_secs(30),
        || async {
            let armed: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                     WHERE l.locktype = 'advisory' AND l.granted AND a.usename = 'app'",
                    &[],
                )
                .await
                .expect("pg_locks")
                .get(0);
            armed > 0
        },
    )
    .await;
    relay.stop().await;

    // A wrong password fails, and the error does not show the password given.
    let wrong = format!(
        "host=127.0.0.1 port={port} dbname={dbname} user=app password = 'not {SECRET} either'"
    );
    let (code, all) = cli(&["status"], &[("DATABASE_URL", &wrong)]);
    assert_eq!(code, Some(1), "{all}");
    assert!(all.contains("password authentication failed"), "{all}");
    assert!(!all.contains(SECRET), "leaked the secret:\n{all}");
}
