//! Self-test of the integration-test harness in `testkit/`.

use std::time::Duration;

use async_nats::jetstream;
use testkit::{
    pg_client, shared_pg, simple_value, wait_until, NatsServer, PgBouncer, PgCluster, PgOptions,
};

const T: Duration = Duration::from_secs(10);

async fn select_one(url: &str) -> String {
    let client = pg_client(url).await;
    let row = tokio::time::timeout(
        T,
        client.query_one("SELECT 1::int4, current_database()", &[]),
    )
    .await
    .expect("SELECT 1 timed out")
    .expect("SELECT 1 failed");
    assert_eq!(row.get::<_, i32>(0), 1);
    row.get(1)
}

async fn show(client: &tokio_postgres::Client, setting: &str) -> String {
    let row = tokio::time::timeout(T, client.query_one(&format!("SHOW {setting}"), &[]))
        .await
        .expect("SHOW timed out")
        .expect("SHOW failed");
    row.get(0)
}

#[tokio::test]
async fn shared_pg_databases_are_separate() {
    let pg = shared_pg();
    let (a, b, c) = tokio::join!(
        pg.create_database(),
        pg.create_database(),
        pg.create_database()
    );
    let names = [
        select_one(&a).await,
        select_one(&b).await,
        select_one(&c).await,
    ];
    assert_ne!(names[0], names[1]);
    assert_ne!(names[1], names[2]);
    assert_ne!(names[0], names[2]);
    assert!(names.iter().all(|n| n.starts_with("t_")), "{names:?}");

    let client = pg_client(&a).await;
    assert_eq!(show(&client, "fsync").await, "off");
    assert_eq!(show(&client, "max_connections").await, "200");
    assert_eq!(show(&client, "listen_addresses").await, "127.0.0.1");
}

#[tokio::test]
async fn shared_pg_is_shared() {
    let a = shared_pg();
    let b = shared_pg();
    assert!(std::ptr::eq(a, b));
    assert_eq!(a.port(), b.port());
    let url = a.create_database().await;
    select_one(&url).await;
}

#[tokio::test]
async fn pg_restart_and_kill() {
    let mut pg = PgCluster::start(PgOptions::default().setting("work_mem", "7MB"));
    let url = pg.create_database().await;
    {
        let client = pg_client(&url).await;
        assert_eq!(show(&client, "work_mem").await, "7MB");
        client
            .batch_execute("CREATE TABLE t (id int primary key); INSERT INTO t VALUES (1), (2);")
            .await
            .expect("create table");
    }

    // Clean restart keeps data.
    let old_pid = pg.pid().expect("running");
    pg.restart();
    assert_ne!(pg.pid(), Some(old_pid));
    let client = pg_client(&url).await;
    let row = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("count after restart");
    assert_eq!(row.get::<_, i64>(0), 2);

    // Crash: the existing connection breaks, a new one after start_again works.
    pg.kill();
    assert_eq!(pg.pid(), None);
    let err = tokio::time::timeout(T, client.simple_query("SELECT 1"))
        .await
        .expect("query on a killed server must fail, not hang");
    assert!(err.is_err(), "query after kill unexpectedly succeeded");
    assert!(
        tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .is_err(),
        "connect after kill unexpectedly succeeded"
    );
    pg.start_again();
    select_one(&url).await;

    // Drop removes everything.
    let pid = pg.pid().expect("running");
    let dir = pg.data_dir().parent().expect("base dir").to_path_buf();
    assert!(dir.exists());
    drop(pg);
    assert!(!dir.exists(), "{} not removed", dir.display());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true),
        "postmaster {pid} still running after drop"
    );
}

#[tokio::test]
async fn pg_fsync_on() {
    let pg = PgCluster::start(PgOptions {
        fsync: true,
        extra: vec![],
    });
    let client = pg_client(&pg.url("postgres")).await;
    assert_eq!(show(&client, "fsync").await, "on");
    assert_eq!(show(&client, "synchronous_commit").await, "on");
}

#[tokio::test]
async fn nats_stream_survives_kill() {
    let mut nats = NatsServer::start();
    assert_eq!(nats.url(), format!("nats://127.0.0.1:{}", nats.port()));
    {
        let client = async_nats::connect(nats.url())
            .await
            .expect("connect to nats");
        let js = jetstream::new(client);
        js.create_stream(jetstream::stream::Config {
            name: "T".into(),
            subjects: vec!["t.>".into()],
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .expect("create stream");
        let ack = tokio::time::timeout(T, async {
            js.publish("t.one", "hello".into())
                .await
                .expect("publish")
                .await
        })
        .await
        .expect("publish ack timed out")
        .expect("publish ack");
        assert_eq!(ack.stream, "T");
        assert_eq!(ack.sequence, 1);
    }

    nats.kill();
    assert_eq!(nats.pid(), None);
    nats.start_again();

    let client = async_nats::connect(nats.url())
        .await
        .expect("reconnect to nats");
    let js = jetstream::new(client);
    let stream = js.get_stream("T").await.expect("stream T after restart");
    let info = stream.get_info().await.expect("stream info");
    assert_eq!(info.state.messages, 1);

    // Graceful restart works too.
    nats.restart();
    let client = async_nats::connect(nats.url())
        .await
        .expect("reconnect to nats");
    jetstream::new(client)
        .get_stream("T")
        .await
        .expect("stream T after graceful restart");

    let dir = nats.store_dir();
    assert!(dir.exists());
    drop(nats);
    assert!(!dir.exists(), "{} not removed", dir.display());
}

#[tokio::test]
async fn nats_with_config_token_auth() {
    let nats = NatsServer::start_with_config("authorization { token: \"s3cret\" }");
    let denied = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(nats.url())
        .await;
    assert!(
        denied.is_err(),
        "connect without token unexpectedly succeeded"
    );

    let client = async_nats::ConnectOptions::with_token("s3cret".into())
        .connect(nats.url())
        .await
        .expect("connect with token");
    // (Not `query_account()`: async-nats 0.51 cannot decode nats-server 2.9's
    // account info.)
    let js = jetstream::new(client);
    js.create_stream(jetstream::stream::Config {
        name: "AUTH".into(),
        subjects: vec!["a.>".into()],
        storage: jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .expect("jetstream with token");
}

#[tokio::test]
async fn pgbouncer_pools_per_transaction() {
    let pg = shared_pg();
    let db = pg.create_database().await;
    let bouncer = PgBouncer::start(pg);
    let url = bouncer.url_for(&db);
    assert_eq!(bouncer.url_for(&db), url);
    assert!(url.contains(&format!(":{}/t_", bouncer.port())), "{url}");

    let a = pg_client(&url).await;
    let b = pg_client(&url).await;
    assert_eq!(
        simple_value(&a, "SELECT current_database()").await,
        db.rsplit('/').next().expect("db name")
    );
    // Two server connections: two open transactions take both, a third client waits for one.
    a.batch_execute("BEGIN").await.expect("BEGIN a");
    b.batch_execute("BEGIN").await.expect("BEGIN b");
    let pid_a = simple_value(&a, "SELECT pg_backend_pid()").await;
    let pid_b = simple_value(&b, "SELECT pg_backend_pid()").await;
    assert_ne!(pid_a, pid_b);
    let c = pg_client(&url).await;
    let waiting = tokio::spawn(async move {
        let pid = simple_value(&c, "SELECT pg_backend_pid()").await;
        (c, pid)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a third server connection was opened"
    );
    a.batch_execute("COMMIT").await.expect("COMMIT a");
    let (c, pid_c) = tokio::time::timeout(T, waiting)
        .await
        .expect("the waiting client got no server connection")
        .expect("task");
    assert_eq!(pid_c, pid_a, "the released server connection is reused");

    // Session state leaks from one client to the next on the same server connection: what the
    // pooler tests look for. `b` still holds the other server connection.
    a.batch_execute("SET statement_timeout = '1234ms'")
        .await
        .expect("SET");
    assert_eq!(simple_value(&c, "SHOW statement_timeout").await, "1234ms");
    a.batch_execute("RESET statement_timeout")
        .await
        .expect("RESET");
    b.batch_execute("COMMIT").await.expect("COMMIT b");

    let admin = pg_client(&bouncer.admin_url()).await;
    let config = admin
        .simple_query("SHOW CONFIG")
        .await
        .expect("SHOW CONFIG");
    let pool_mode = config.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("pool_mode") => {
            row.get(1).map(str::to_owned)
        }
        _ => None,
    });
    assert_eq!(pool_mode.as_deref(), Some("transaction"));

    // Kill and start again on the same port.
    let mut bouncer = bouncer;
    let pid = bouncer.pid().expect("running");
    bouncer.kill();
    assert!(
        simple_query_fails(&a).await,
        "query through a killed pgbouncer"
    );
    bouncer.start_again();
    assert_ne!(bouncer.pid(), Some(pid));
    let d = pg_client(&url).await;
    assert_eq!(simple_value(&d, "SELECT 1").await, "1");
}

async fn simple_query_fails(client: &tokio_postgres::Client) -> bool {
    tokio::time::timeout(T, client.simple_query("SELECT 1"))
        .await
        .expect("a query through a killed pgbouncer must fail, not hang")
        .is_err()
}

#[tokio::test]
async fn wait_until_polls() {
    let start = std::time::Instant::now();
    let mut n = 0;
    wait_until("counter reaches 3", T, || {
        n += 1;
        let done = n >= 3;
        async move { done }
    })
    .await;
    assert_eq!(n, 3);
    assert!(start.elapsed() >= Duration::from_millis(20));
}

#[tokio::test]
#[should_panic(expected = "waiting for never true")]
async fn wait_until_times_out() {
    wait_until("never true", Duration::from_millis(50), || async { false }).await;
}

#[tokio::test]
#[should_panic(expected = "waiting for hangs")]
async fn wait_until_bounds_a_hanging_check() {
    wait_until("hangs", Duration::from_millis(50), || {
        std::future::pending::<bool>()
    })
    .await;
}
