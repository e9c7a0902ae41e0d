//! Least privilege and `--schema`: the relay and a writer run under restricted roles, with every
//! object in a schema of the user's choice.

use std::process::Command;
use std::time::Duration;

use outbox_relay::{enqueue, NewEvent, Relay, RelayConfig};
use testkit::outbox::{CliRelay, Env};

fn role_url(db_url: &str, role: &str) -> String {
    db_url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1)
}

#[tokio::test]
async fn relay_and_writer_under_least_privilege_roles_in_a_custom_schema() {
    let env = Env::new().await; // the public schema is migrated too; this test uses another one
    let admin = env.client().await;
    let suffix = env.db.rsplit('/').next().expect("db name").to_string();
    let (writer, relay_role) = (format!("w_{suffix}"), format!("r_{suffix}"));
    admin
        .batch_execute(&format!(
            "CREATE ROLE {writer} LOGIN; CREATE ROLE {relay_role} LOGIN;"
        ))
        .await
        .expect("roles");

    let bin = testkit::relay_bin();
    let out = Command::new(bin)
        .args([
            "migrate",
            "--schema",
            "app_events",
            "--grant-writer",
            &writer,
            "--grant-relay",
            &relay_role,
        ])
        .env("DATABASE_URL", &env.db)
        .output()
        .expect("migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let owner: String = admin
        .query_one(
            "SELECT tableowner FROM pg_tables WHERE schemaname = 'app_events' AND tablename = 'outbox_events'",
            &[],
        )
        .await
        .expect("table in the schema")
        .get(0);
    assert_eq!(owner, "postgres", "neither role owns the schema");

    // The relay, as the relay role, in the schema.
    let relay_url = role_url(&env.db, &relay_role);
    let mut cmd = testkit::relay_command();
    cmd.args([
        "run",
        "--schema",
        "app_events",
        "--metrics-addr",
        "off",
        "--fallback-interval",
        "60s",
    ])
    .env("DATABASE_URL", &relay_url)
    .env("NATS_URL", env.nats.url())
    .env("RUST_LOG", "warn");
    let relay = CliRelay::from_command(cmd);

    // The writer, as the writer role, in its own transaction.
    let writer_url = testkit::with_schema(&role_url(&env.db, &writer), "app_events");
    let mut w = testkit::pg_client(&writer_url).await;
    let tx = w.transaction().await.expect("tx");
    let id = enqueue(
        &tx,
        &NewEvent::new("order", "1", "order.created", &serde_json::json!({"a": 1})).expect("event"),
    )
    .await
    .expect("enqueue as the writer role");
    tx.commit().await.expect("commit");
    env.wait_stream_len(1, Duration::from_secs(15)).await;
    assert_eq!(env.stored().await[0].event_id(), id);

    // The writer can do nothing else with the outbox.
    for stmt in [
        "SELECT payload FROM outbox_events",
        "UPDATE outbox_events SET attempts = 0",
        "DELETE FROM outbox_events",
    ] {
        let err = w.batch_execute(stmt).await.expect_err(stmt);
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{stmt}: {err:?}"
        );
    }
    // The relay role cannot change the schema.
    let r = testkit::pg_client(&testkit::with_schema(&relay_url, "app_events")).await;
    assert!(r.batch_execute("DROP TABLE outbox_events").await.is_err());
    assert!(r
        .batch_execute("CREATE TABLE app_events.x (a int)")
        .await
        .is_err());
    // The operator commands work as the relay role.
    let out = Command::new(bin)
        .args(["status", "--json", "--schema", "app_events"])
        .env("DATABASE_URL", &relay_url)
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["pending"], 0);
    // The retention of both tables, as the relay role (the relay runs the same statements).
    admin
        .batch_execute(
            "INSERT INTO app_events.processed_events (event_id, processed_at)
             SELECT gen_random_uuid(), now() - interval '2 days' FROM generate_series(1, 3)",
        )
        .await
        .expect("old processed_events");
    let out = Command::new(bin)
        .args([
            "cleanup",
            "--schema",
            "app_events",
            "--older-than",
            "1d",
            "--processed-events-older-than",
            "1d",
        ])
        .env("DATABASE_URL", &relay_url)
        .output()
        .expect("cleanup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        crate::cli::summaries(&String::from_utf8_lossy(&out.stdout)),
        ["deleted 0 rows", "deleted 3 processed_events rows"]
    );
    // The public schema's outbox was untouched.
    assert_eq!(env.count("true").await, 0);
    assert_eq!(relay.terminate(), Some(0));
}

#[tokio::test]
async fn schema_names_are_checked() {
    let config = |url: &str, schema: &str| {
        let mut config = RelayConfig::new(url);
        config.postgres.schema = Some(schema.into());
        config
    };
    assert!(config("postgres://h/db", "Bad-Name").validate().is_err());
    // A URL that sets `options` itself cannot take the schema as well: refused before connecting.
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        Relay::new(config("postgres://127.0.0.1:1/db?options=-c%20x%3Dy", "ok")),
    )
    .await
    .expect("refused at once");
    let err = refused
        .err()
        .expect("a URL with options and --schema is refused");
    assert!(err.to_string().contains("already sets `options`"), "{err}");
    let out = testkit::relay_command()
        .args(["migrate", "--print", "--schema", "x;drop"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--schema"));
}
