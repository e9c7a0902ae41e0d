//! The sqlx writer (`--features sqlx`): events enqueued in a sqlx transaction are relayed when it
//! commits and never when it rolls back, with the same validation as the tokio-postgres writer.

use std::time::Duration;

use outbox_relay::{ErrorKind, NewEvent};
use sqlx::postgres::{PgPool, PgPoolOptions};
use testkit::outbox::{cli, Env};

fn event(aggregate_id: &str, n: i32) -> NewEvent {
    testkit::outbox::numbered_event(aggregate_id, n)
}

async fn pool(env: &Env) -> PgPool {
    pool_for(&env.db).await
}

async fn pool_for(db: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(db)
        .await
        .expect("sqlx pool")
}

#[tokio::test]
async fn committed_transaction_is_relayed() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let pool = pool(&env).await;

    let mut tx = pool.begin().await.expect("begin");
    let id = outbox_relay::sqlx::enqueue(
        &mut *tx,
        &event("s-1", 1).with_header("tracestate", "vendor=abc"),
    )
    .await
    .expect("enqueue");
    let more = outbox_relay::sqlx::enqueue_many(&mut *tx, &[event("s-1", 2), event("s-2", 3)])
        .await
        .expect("enqueue_many");
    tx.commit().await.expect("commit");

    env.wait_stream_len(3, Duration::from_secs(10)).await;
    let stored = env.stored().await;
    let ids: Vec<_> = stored.iter().map(|m| m.event_id()).collect();
    // Order is kept within an aggregate only.
    let s1: Vec<_> = stored
        .iter()
        .filter(|m| m.headers["Outbox-Aggregate-Id"] == "s-1")
        .map(|m| m.event_id())
        .collect();
    assert_eq!(s1, [id, more[0]]);
    assert!(ids.contains(&more[1]), "{ids:?}");
    let first = stored.iter().find(|m| m.event_id() == id).expect("first");
    assert_eq!(first.subject, "outbox.order.created");
    assert_eq!(first.headers["Nats-Msg-Id"], id.to_string());
    assert_eq!(first.headers["tracestate"], "vendor=abc");
    let last = stored
        .iter()
        .find(|m| m.event_id() == more[1])
        .expect("last");
    assert_eq!(last.headers["Outbox-Aggregate-Id"], "s-2");
    let payload: serde_json::Value = serde_json::from_str(&last.payload).expect("json");
    assert_eq!(payload, serde_json::json!({ "n": 3 }));
    assert_eq!(
        env.count("aggregate_id = 's-1' AND headers IS NULL").await,
        1,
        "an event without headers stores NULL, as the tokio-postgres writer does"
    );
    relay.stop().await;
}

#[tokio::test]
async fn rolled_back_transaction_publishes_nothing() {
    let env = Env::new().await;
    let relay = env.spawn(env.config()).await;
    let pool = pool(&env).await;

    let mut tx = pool.begin().await.expect("begin");
    let dropped = outbox_relay::sqlx::enqueue(&mut *tx, &event("r-1", 1))
        .await
        .expect("enqueue");
    tx.rollback().await.expect("rollback");

    // A connection and the pool are executors too; each commits on its own.
    let mut conn = pool.acquire().await.expect("connection");
    let later = outbox_relay::sqlx::enqueue(&mut *conn, &event("r-2", 2))
        .await
        .expect("enqueue on a connection");
    drop(conn);
    let last = outbox_relay::sqlx::enqueue(&pool, &event("r-3", 3))
        .await
        .expect("enqueue on the pool");

    env.wait_stream_len(2, Duration::from_secs(10)).await;
    // Give a stray publish of the rolled-back event time to show up after the later ones.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ids: Vec<_> = env.stored().await.iter().map(|m| m.event_id()).collect();
    ids.sort();
    let mut expected = [later, last];
    expected.sort();
    assert_eq!(ids, expected);
    assert!(!ids.contains(&dropped));
    assert_eq!(env.stream_len().await, 2);
    assert_eq!(env.count("true").await, 2);
    relay.stop().await;
}

#[tokio::test]
async fn invalid_event_is_refused_before_the_database() {
    // Nothing listens on this port: any round trip would fail with a connection error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let nowhere = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/none"))
        .expect("lazy pool");
    let bad = event("x", 1).with_header("Nats-Msg-Id", "mine");
    let err = outbox_relay::sqlx::enqueue(&nowhere, &bad)
        .await
        .expect_err("refused");
    assert!(err.kind() == ErrorKind::InvalidEvent, "{err:?}");
    assert!(err.is_usage());

    // And the driver's own errors come back as the library's, classified for retries.
    let err = outbox_relay::sqlx::enqueue(&nowhere, &event("x", 1))
        .await
        .expect_err("no server");
    assert!(err.kind() == ErrorKind::Database, "{err:?}");
    assert!(err.is_retryable(), "{err:?}");

    let env = Env::new().await;
    let pool = pool(&env).await;
    let mut tx = pool.begin().await.expect("begin");
    let mut bad_type = event("x", 2);
    bad_type.event_type = "order.*".into();
    let err = outbox_relay::sqlx::enqueue_many(&mut *tx, &[event("x", 1), bad_type])
        .await
        .expect_err("refused");
    assert!(err.kind() == ErrorKind::InvalidEvent, "{err:?}");
    // The transaction is intact (nothing failed inside it) and holds no event.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events")
        .fetch_one(&mut *tx)
        .await
        .expect("count in the transaction");
    assert_eq!(rows, 0);
    tx.commit().await.expect("commit");
    assert_eq!(env.count("true").await, 0);

    let err = outbox_relay::sqlx::enqueue(&pool, &event("", 1))
        .await
        .expect_err("empty aggregate id");
    assert!(err.kind() == ErrorKind::InvalidEvent, "{err:?}");
    let none = outbox_relay::sqlx::enqueue_many(&pool, &[])
        .await
        .expect("empty");
    assert!(none.is_empty());
}

#[tokio::test]
async fn server_errors_keep_their_message_and_are_not_retryable() {
    // A database without the outbox schema.
    let db = testkit::shared_pg().create_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db)
        .await
        .expect("pool");
    let err = outbox_relay::sqlx::enqueue(&pool, &event("x", 1))
        .await
        .expect_err("no table");
    assert!(err.kind() == ErrorKind::Database, "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("outbox_events") && text.contains("42P01"),
        "{text}"
    );
}

#[tokio::test]
async fn enqueue_through_pgbouncer_in_transaction_mode() {
    // Through the pooler, a statement cached under a name on one server connection is missing on
    // the next transaction's, and its name taken by another client's on a shared one.
    let pg = testkit::shared_pg();
    let db = pg.create_migrated_database().await;
    let direct = testkit::pg_client(&db).await;
    let bouncer = testkit::PgBouncer::start(pg);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&bouncer.url_for(&db))
        .await
        .expect("sqlx pool through pgbouncer");

    let mut tasks = Vec::new();
    for w in 0..4 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let aggregate = format!("p-{w}");
            for n in 0..10 {
                let mut tx = pool.begin().await.expect("begin");
                outbox_relay::sqlx::enqueue(&mut *tx, &event(&aggregate, 2 * n))
                    .await
                    .expect("enqueue through pgbouncer");
                outbox_relay::sqlx::enqueue_many(&mut *tx, &[event(&aggregate, 2 * n + 1)])
                    .await
                    .expect("enqueue_many through pgbouncer");
                tx.commit().await.expect("commit");
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer task");
    }
    let rows: i64 = direct
        .query_one("SELECT count(*) FROM outbox_events", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 80);
}

/// Each applied version with when it was applied, in sqlx's table and in the outbox's.
async fn applied_versions(pool: &PgPool) -> (Vec<(i64, String)>, Vec<(i32, String)>) {
    let sqlx_versions = sqlx::query_as(
        "SELECT version, installed_on::text FROM _sqlx_migrations WHERE success ORDER BY version",
    )
    .fetch_all(pool)
    .await
    .expect("_sqlx_migrations");
    let outbox_versions = sqlx::query_as(
        "SELECT version, applied_at::text FROM outbox_schema_migrations ORDER BY version",
    )
    .fetch_all(pool)
    .await
    .expect("outbox_schema_migrations");
    (sqlx_versions, outbox_versions)
}

/// The outbox versions as sqlx records them.
fn sqlx_versions() -> Vec<i64> {
    outbox_relay::migrate::MIGRATIONS
        .iter()
        .map(|m| outbox_relay::sqlx::VERSION_BASE + i64::from(m.version))
        .collect()
}

/// The sqlx migrator on a fresh database: `migrate --check` accepts the schema, a relay publishes
/// what the sqlx writer enqueues, and running the migrator (or `outbox-relay migrate`) again
/// applies nothing.
#[tokio::test]
async fn sqlx_migrator_applies_a_schema_the_relay_accepts() {
    let db = testkit::shared_pg().create_database().await;
    let pool = pool_for(&db).await;
    let migrator = outbox_relay::sqlx::migrator().await.expect("migrator");
    migrator.run(&pool).await.expect("first run");

    let (code, out, err) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (sqlx_applied, outbox_applied) = applied_versions(&pool).await;
    let versions: Vec<i64> = sqlx_applied.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, sqlx_versions());
    let recorded: Vec<i32> = outbox_applied.iter().map(|(v, _)| *v).collect();
    let expected: Vec<i32> = outbox_relay::migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(recorded, expected);

    outbox_relay::sqlx::migrator()
        .await
        .expect("migrator")
        .run(&pool)
        .await
        .expect("second run");
    let (code, out, err) = cli(&db, &["migrate"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("schema is up to date"), "{out}");
    assert_eq!(
        applied_versions(&pool).await,
        (sqlx_applied, outbox_applied),
        "nothing applied again"
    );

    let env = Env {
        db: db.clone(),
        nats: testkit::NatsServer::start(),
    };
    env.create_stream().await;
    let relay = env.spawn(env.config()).await;
    let mut tx = pool.begin().await.expect("begin");
    let id = outbox_relay::sqlx::enqueue(&mut *tx, &event("m-1", 1))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    env.wait_stream_len(1, Duration::from_secs(10)).await;
    assert_eq!(env.stored().await[0].event_id(), id);
    relay.stop().await;
}

/// Next to the application's own sqlx migrations (version 1 here, which the outbox's must not
/// collide with), on a database that `outbox-relay migrate` set up before: both migrators run
/// once each ignores the other's versions, and the schema stays at the version the relay needs.
#[tokio::test]
async fn sqlx_migrator_next_to_the_applications_own_migrations() {
    let db = testkit::shared_pg().create_migrated_database().await;
    let pool = pool_for(&db).await;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("1_orders.sql"),
        "CREATE TABLE orders (id bigint PRIMARY KEY);\n\
         CREATE INDEX orders_outbox_idx ON outbox_events (aggregate_id) WHERE aggregate_type = 'order';\n",
    )
    .expect("write the application's migration");

    // Switching from `outbox-relay migrate`: the migrations run again, in order, and leave the
    // schema as it was.
    outbox_relay::sqlx::migrator()
        .await
        .expect("migrator")
        .run(&pool)
        .await
        .expect("outbox migrations over `outbox-relay migrate`");
    let (_, outbox_applied) = applied_versions(&pool).await;
    assert_eq!(
        outbox_applied.len(),
        outbox_relay::migrate::MIGRATIONS.len()
    );

    let strict = sqlx::migrate::Migrator::new(dir.path())
        .await
        .expect("application migrator");
    // On this error sqlx returns without releasing its session advisory lock: on a connection of
    // the shared pool, the next migrator would wait for it. Refuse on a pool of its own, closed.
    let strict_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db)
        .await
        .expect("sqlx pool");
    let err = strict
        .run(&strict_pool)
        .await
        .expect_err("sqlx refuses versions it does not know");
    strict_pool.close().await;
    assert!(
        matches!(err, sqlx::migrate::MigrateError::VersionMissing(v) if v == sqlx_versions()[0]),
        "{err:?}"
    );
    let mut app = sqlx::migrate::Migrator::new(dir.path())
        .await
        .expect("application migrator");
    app.set_ignore_missing(true);
    app.run(&pool).await.expect("application migrations");
    outbox_relay::sqlx::migrator()
        .await
        .expect("migrator")
        .run(&pool)
        .await
        .expect("outbox migrations after the application's");
    app.run(&pool).await.expect("application migrations again");

    let (sqlx_applied, _) = applied_versions(&pool).await;
    let versions: Vec<i64> = sqlx_applied.iter().map(|(v, _)| *v).collect();
    let mut expected = vec![1];
    expected.extend(sqlx_versions());
    assert_eq!(versions, expected);
    let (code, out, err) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'outbox_events' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    assert!(
        !indexes.contains(&"outbox_events_pending_seq_idx".to_owned()),
        "version 2 dropped it again: {indexes:?}"
    );
    assert!(
        indexes.contains(&"orders_outbox_idx".to_owned()),
        "{indexes:?}"
    );
}
