//! Credentials: NATS authentication, and secrets never printed.

mod common;

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use common::NatsServer;
use outbox_relay::{Relay, RelayConfig};

const SECRET: &str = "s3cret-Pa55";

fn auth_server() -> NatsServer {
    NatsServer::start_with_config(&format!(
        "authorization {{\n  users = [ {{ user: relay, password: \"{SECRET}\" }} ]\n}}"
    ))
}

async fn migrated_db() -> String {
    let db = common::shared_pg().create_database().await;
    let mut client = common::pg_client(&db).await;
    outbox_relay::migrate::migrate(&mut client)
        .await
        .expect("migrate");
    db
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
    config.nats_url = good;
    let token = tokio_util::sync::CancellationToken::new();
    let relay = tokio::spawn(
        Relay::new(config)
            .await
            .expect("valid config")
            .run(token.clone()),
    );
    // Right credentials: the relay starts and runs until stopped.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!relay.is_finished(), "the relay stopped on its own");
    token.cancel();
    relay
        .await
        .expect("task")
        .expect("right credentials connect");

    // Wrong credentials: waiting cannot heal that, so the relay fails at once.
    let mut config = RelayConfig::new(db);
    config.nats_url = format!("nats://relay:wrong-{SECRET}@127.0.0.1:{}", nats.port());
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
    let bin = env!("CARGO_BIN_EXE_outbox-relay");

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
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    for args in [vec!["status"], vec!["migrate"]] {
        let out = Command::new(bin)
            .args(&args)
            .env(
                "DATABASE_URL",
                format!("postgres://app:{SECRET}@127.0.0.1:{dead_port}/x"),
            )
            .env(
                "NATS_URL",
                format!("nats://relay:{SECRET}@127.0.0.1:{}", nats.port()),
            )
            .env("RUST_LOG", "debug")
            .output()
            .expect("run");
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
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["run", "--metrics-addr", "off"])
        .env(
            "DATABASE_URL",
            format!("postgres://app:{SECRET}@127.0.0.1:{dead_port}/x"),
        )
        .env(
            "NATS_URL",
            format!("nats://relay:{SECRET}@127.0.0.1:{}", nats.port()),
        )
        .env("RUST_LOG", "debug")
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
