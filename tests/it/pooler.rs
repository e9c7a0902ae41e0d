//! Through PgBouncer in transaction mode (two server connections per database): the operator
//! commands, `migrate` and the writer API work with `--schema`, and leave no session state on the
//! pooled server connections that other clients would inherit.
//!
//! [`Pooled`] is one test database behind a PgBouncer of its own; tests of the relay through the
//! pooler build on it the same way.

use std::collections::HashSet;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use outbox_relay::{enqueue, enqueue_many, process_once, NewEvent};
use testkit::{pg_client, shared_pg, simple_value, PgBouncer};
use tokio_postgres::types::Type;
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);
const SCHEMA: &str = "app_events";

/// Settings that an operator command or a writer could leave behind on a server connection.
const WATCHED: &[&str] = &[
    "search_path",
    "enable_seqscan",
    "statement_timeout",
    "lock_timeout",
];

/// A fresh database on the shared cluster, and a PgBouncer (transaction mode, pool size 2) in
/// front of it.
struct Pooled {
    /// Direct URL (bypasses the pooler): setup and checks.
    direct: String,
    /// The same database through PgBouncer.
    pooled: String,
    bouncer: PgBouncer,
    /// The watched settings as a fresh server connection has them.
    defaults: Vec<(String, String)>,
}

impl Pooled {
    async fn new() -> Pooled {
        let pg = shared_pg();
        let direct = pg.create_database().await;
        let bouncer = PgBouncer::start(pg);
        let pooled = bouncer.url_for(&direct);
        let fresh = pg_client(&direct).await;
        let mut defaults = Vec::new();
        for name in WATCHED {
            defaults.push((
                name.to_string(),
                simple_value(&fresh, &format!("SHOW {name}")).await,
            ));
        }
        Pooled {
            direct,
            pooled,
            bouncer,
            defaults,
        }
    }

    /// Runs the CLI with `DATABASE_URL` pointing at the pooler and `--schema` set (bounded).
    async fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = testkit::relay_command();
        cmd.args(args)
            .args(["--schema", SCHEMA])
            .env("DATABASE_URL", &self.pooled)
            .env_remove("OUTBOX_SCHEMA")
            .env("RUST_LOG", "warn");
        let what = format!("outbox-relay {}", args.join(" "));
        tokio::task::spawn_blocking(move || run_bounded(cmd, &what))
            .await
            .expect("CLI runner thread")
    }

    /// [`Pooled::cli`], which must exit 0; returns its stdout.
    async fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args).await;
        assert!(
            out.status.success(),
            "outbox-relay {} exited with {}\nstdout: {}\nstderr: {}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.bouncer.log_tail(20)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Asserts that every pooled server connection still has the default value of every watched
    /// setting. Two clients each hold a transaction, so together they check both server
    /// connections of the pool; `rounds` repeats that with new clients.
    async fn assert_no_session_state(&self, after: &str, rounds: usize) {
        for _ in 0..rounds {
            let a = pg_client(&self.pooled).await;
            let b = pg_client(&self.pooled).await;
            let mut backends = HashSet::new();
            for c in [&a, &b] {
                backends.insert(pin(c).await);
            }
            assert_eq!(backends.len(), 2, "two clients, two server connections");
            for c in [&a, &b] {
                for (name, default) in &self.defaults {
                    let now = simple_value(c, &format!("SHOW {name}")).await;
                    assert_eq!(
                        &now, default,
                        "after {after}: {name} on a pooled server connection is {now:?}, \
                         a fresh connection has {default:?}"
                    );
                }
                c.batch_execute("COMMIT").await.expect("COMMIT");
            }
        }
    }

    /// Runs `sql` directly (not through the pooler), in the outbox schema.
    async fn direct_sql(&self, sql: &str) {
        let client = pg_client(&self.direct).await;
        client
            .batch_execute(&format!("SET search_path TO {SCHEMA}; {sql}"))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// `outbox-relay run --schema ... --metrics-addr off` plus `args`, with `database_url` (the
    /// pooler's, possibly with parameters) and LISTEN on a direct connection; stderr is the
    /// caller's to set.
    fn relay_command(
        &self,
        nats: &testkit::NatsServer,
        database_url: &str,
        args: &[&str],
    ) -> Command {
        let mut cmd = testkit::relay_command();
        cmd.args(["run", "--schema", SCHEMA, "--metrics-addr", "off"])
            .args(args)
            .env("DATABASE_URL", database_url)
            .env("OUTBOX_LISTEN_DATABASE_URL", &self.direct)
            .env("NATS_URL", nats.url())
            .env_remove("OUTBOX_SCHEMA")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd
    }

    /// `per` events for each of `aggregates` (`agg-N`), round-robin, each in a transaction of its
    /// own through the pooler, by the writer API (the application's own transactions).
    async fn write(&self, aggregates: std::ops::Range<usize>, per: usize) {
        let mut client = pg_client(&self.pooled).await;
        for n in 0..per {
            for a in aggregates.clone() {
                let tx = client.transaction().await.expect("tx");
                tx.batch_execute(&format!("SET LOCAL search_path TO {SCHEMA}"))
                    .await
                    .expect("search_path");
                enqueue(&tx, &event(&format!("agg-{a}"), n))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }
        }
    }

    async fn direct_count(&self, where_clause: &str) -> i64 {
        let client = pg_client(&self.direct).await;
        let v = simple_value(
            &client,
            &format!("SELECT count(*) FROM {SCHEMA}.outbox_events WHERE {where_clause}"),
        )
        .await;
        v.parse().expect("count")
    }
}

/// Runs `cmd` to its end and returns its output; SIGKILLs it and panics after `T`.
fn run_bounded(mut cmd: Command, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} could not run: {e}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(T) {
        Ok(output) => output.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{what} did not finish within {T:?}");
        }
    }
}

fn event(aggregate_id: &str, n: usize) -> NewEvent {
    testkit::outbox::numbered_event(aggregate_id, n)
}

fn status_json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("status --json: {e}\n{stdout}"))
}

/// Opens a transaction on `client` and runs a statement in it, so that the pooler has given it a
/// server connection until COMMIT; returns that server connection's backend pid.
async fn pin(client: &tokio_postgres::Client) -> String {
    client.batch_execute("BEGIN").await.expect("BEGIN");
    simple_value(client, "SELECT pg_backend_pid()").await
}

/// Why the library sends unnamed statements: a named prepared statement lives on one server
/// connection, and the pooler hands the client's next transaction to whichever is free. The pool
/// has two server connections; `hold` keeps one of them busy so that the test decides which one
/// each statement gets.
#[tokio::test]
async fn named_statements_do_not_survive_transaction_pooling() {
    let p = Pooled::new().await;
    let (a, b) = (pg_client(&p.pooled).await, pg_client(&p.pooled).await);
    let (hold, other) = (pg_client(&p.pooled).await, pg_client(&p.pooled).await);
    let held = pin(&hold).await;
    assert_ne!(pin(&other).await, held, "two server connections");
    other.batch_execute("COMMIT").await.expect("COMMIT");

    // Prepared (Parse, Sync) on the free server connection, which then goes back to the pool. `b`
    // takes it for a transaction; once `hold` lets the other one go, `a`'s Bind gets that one.
    let stmt = a.prepare("SELECT 1::int4").await.expect("prepare");
    let first = pin(&b).await;
    hold.batch_execute("COMMIT").await.expect("COMMIT");
    let err = a
        .query(&stmt, &[])
        .await
        .expect_err("a named statement on another server connection");
    let message = err.as_db_error().map(|e| e.message().to_owned());
    assert!(
        message.as_deref().is_some_and(
            |m| m.starts_with("prepared statement \"s") && m.ends_with("does not exist")
        ),
        "{err:?}"
    );
    // The same query as an unnamed statement with its parameter types: one message, one server
    // connection, whichever it is.
    let row = a
        .query_typed_one(
            "SELECT $1::int4 + 1, pg_backend_pid()::text",
            &[(&41i32, Type::INT4)],
        )
        .await
        .expect("unnamed statement through the pooler");
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_ne!(row.get::<_, String>(1), first);
    b.batch_execute("COMMIT").await.expect("COMMIT");

    // Names are per server connection, not per client: with one server connection held, a second
    // client finds the first one's statement on the other (another process of the same program
    // starts counting at s0 again, and collides just so).
    pin(&hold).await;
    a.batch_execute("PREPARE outbox_demo AS SELECT 1")
        .await
        .expect("PREPARE");
    let err = b
        .batch_execute("PREPARE outbox_demo AS SELECT 2")
        .await
        .expect_err("the name is taken on the shared server connection");
    assert_eq!(
        err.as_db_error().map(|e| e.message()),
        Some("prepared statement \"outbox_demo\" already exists"),
        "{err:?}"
    );
    a.batch_execute("DEALLOCATE outbox_demo")
        .await
        .expect("DEALLOCATE");
    hold.batch_execute("COMMIT").await.expect("COMMIT");
}

#[tokio::test]
async fn operator_commands_and_writers_through_pgbouncer_with_a_schema() {
    let p = Pooled::new().await;

    // migrate, twice at once (the lock serialises them, one creates the schema), then again.
    let (first, second) = tokio::join!(p.cli(&["migrate"]), p.cli(&["migrate"]));
    let mut outputs = Vec::new();
    for out in [first, second] {
        assert!(
            out.status.success(),
            "migrate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    outputs.sort();
    assert!(
        outputs[0].starts_with("applied migrations [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"),
        "{outputs:?}"
    );
    assert!(
        outputs[1].starts_with("schema is up to date"),
        "{outputs:?}"
    );
    let again = p.cli_ok(&["migrate"]).await;
    assert!(again.starts_with("schema is up to date"), "{again}");
    assert_eq!(p.direct_count("true").await, 0, "the table is in {SCHEMA}");
    p.assert_no_session_state("migrate", 2).await;

    // Writers: several clients through the pooler at once, each event in the application's own
    // transaction, which sets the application's search_path for itself.
    const WRITERS: usize = 4;
    const TRANSACTIONS: usize = 10;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let url = p.pooled.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = pg_client(&url).await;
            let mut ids = Vec::new();
            for t in 0..TRANSACTIONS {
                let tx = client.transaction().await.expect("begin");
                tx.batch_execute(&format!("SET LOCAL search_path TO {SCHEMA}"))
                    .await
                    .expect("SET LOCAL");
                let aggregate = format!("w{w}");
                ids.push(
                    enqueue(&tx, &event(&aggregate, 2 * t))
                        .await
                        .expect("enqueue"),
                );
                ids.extend(
                    enqueue_many(&tx, &[event(&aggregate, 2 * t + 1)])
                        .await
                        .expect("enqueue_many"),
                );
                tx.commit().await.expect("commit");
            }
            ids
        }));
    }
    // Operator commands run while the writers do.
    let during = p.cli_ok(&["status"]).await;
    assert!(during.contains("pending:"), "{during}");
    let mut ids: Vec<Uuid> = Vec::new();
    for task in tasks {
        ids.extend(task.await.expect("writer task"));
    }
    let total = (WRITERS * TRANSACTIONS * 2) as i64;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len() as i64, total);
    assert_eq!(p.direct_count("processed_at IS NULL").await, total);
    p.assert_no_session_state("the writers", 2).await;

    // An idempotent consumer records what it handled through the pooler too.
    let mut consumer = pg_client(&p.pooled).await;
    for (id, first) in [(ids[0], true), (ids[1], true), (ids[0], false)] {
        let tx = consumer.transaction().await.expect("begin");
        tx.batch_execute(&format!("SET LOCAL search_path TO {SCHEMA}"))
            .await
            .expect("SET LOCAL");
        assert_eq!(
            process_once(&tx, id).await.expect("process_once"),
            first,
            "{id}"
        );
        tx.commit().await.expect("commit");
    }

    // status, text and JSON.
    let text = p.cli_ok(&["status"]).await;
    assert!(
        text.contains(&format!("pending:             {total}")),
        "{text}"
    );
    assert!(text.contains("dead letters:        0"), "{text}");
    let s = status_json(&p.cli_ok(&["status", "--json"]).await);
    assert_eq!(s["pending"], total);
    assert_eq!(s["dead_letters"], 0);
    assert_eq!(s["blocked_aggregates"], 0);
    p.assert_no_session_state("status", 2).await;

    // Three dead letters in two aggregates, made by SQL.
    let dead: Vec<Uuid> = vec![ids[0], ids[1], ids[TRANSACTIONS * 2]];
    let list: Vec<String> = dead.iter().map(|id| format!("'{id}'")).collect();
    p.direct_sql(&format!(
        "UPDATE outbox_events SET dead_lettered_at = now(), attempts = 10, last_error = 'boom' \
         WHERE id IN ({})",
        list.join(", ")
    ))
    .await;
    let s = status_json(&p.cli_ok(&["status", "--json"]).await);
    assert_eq!(s["pending"], total - 3);
    assert_eq!(s["dead_letters"], 3);
    assert_eq!(s["blocked_aggregates"], 2);

    // dead-letters list, text and JSON.
    let text = p.cli_ok(&["dead-letters", "list"]).await;
    assert_eq!(text.lines().count(), 3, "{text}");
    for id in &dead {
        assert!(text.contains(&id.to_string()), "{id} in\n{text}");
    }
    assert!(text.contains("error: boom"), "{text}");
    let json: serde_json::Value = serde_json::from_str(
        &p.cli_ok(&["dead-letters", "list", "--json", "--limit", "2"])
            .await,
    )
    .expect("list --json");
    let listed: Vec<&str> = json
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["id"].as_str().expect("id"))
        .collect();
    assert_eq!(listed.len(), 2, "{json}");
    assert!(listed
        .iter()
        .all(|id| dead.iter().any(|d| d.to_string() == *id)));
    p.assert_no_session_state("dead-letters list", 2).await;

    // retry one, discard one, an unknown id changes nothing (exit 2), retry the rest.
    let out = p
        .cli_ok(&["dead-letters", "retry", &dead[0].to_string()])
        .await;
    assert!(
        out.starts_with("1 dead letters queued for retry in "),
        "{out}"
    );
    let out = p
        .cli_ok(&["dead-letters", "discard", &dead[1].to_string()])
        .await;
    assert_eq!(out.trim(), "1 dead letters discarded");
    let unknown = Uuid::new_v4().to_string();
    let out = p
        .cli(&["dead-letters", "discard", &dead[2].to_string(), &unknown])
        .await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&unknown),
        "{out:?}"
    );
    let out = p.cli_ok(&["dead-letters", "retry", "--all"]).await;
    assert!(
        out.starts_with("1 dead letters queued for retry in "),
        "{out}"
    );
    let out = p.cli_ok(&["dead-letters", "list"]).await;
    assert_eq!(out.trim(), "no dead letters");
    assert_eq!(p.direct_count("discarded_at IS NOT NULL").await, 1);
    assert_eq!(
        p.direct_count("dead_lettered_at IS NULL AND processed_at IS NULL")
            .await,
        total - 1
    );
    p.assert_no_session_state("dead-letters retry/discard", 2)
        .await;

    // cleanup: 25 rows processed ten days ago go, in batches of 7; the discarded row (processed
    // now) and the pending ones stay.
    p.direct_sql(
        "UPDATE outbox_events SET processed_at = now() - interval '10 days' \
         WHERE id IN (SELECT id FROM outbox_events WHERE processed_at IS NULL ORDER BY seq LIMIT 25)",
    )
    .await;
    let out = p
        .cli_ok(&["cleanup", "--older-than", "7d", "--batch-size", "7"])
        .await;
    assert!(out.starts_with("deleted 25 rows in "), "{out}");
    assert_eq!(p.direct_count("true").await, total - 25);
    let out = p.cli_ok(&["cleanup", "--older-than", "7d"]).await;
    assert!(out.starts_with("deleted 0 rows in "), "{out}");
    p.assert_no_session_state("cleanup", 3).await;

    // The pooler saw no startup parameter it refused, and no statement failed on its server
    // connections.
    let log = std::fs::read_to_string(p.bouncer.log_path()).unwrap_or_default();
    assert!(!log.contains("unsupported startup parameter"), "{log}");
}

/// The relay itself behind PgBouncer in transaction mode with `--schema` and unnamed statements
/// (PgBouncer 1.18 keeps no prepared statements), LISTEN on a direct connection: two relays drain
/// a backlog and a live stream written through the pooler, each event once and in order per
/// aggregate, and leave no setting of theirs (planner settings, search_path, timeouts) on the
/// pooled server connections.
#[tokio::test]
async fn two_relays_through_pgbouncer_with_a_schema() {
    use testkit::outbox::{assert_ledger, ledger, Stored, Written};
    let p = Pooled::new().await;
    p.cli_ok(&["migrate"]).await;
    let nats = testkit::NatsServer::start();
    // A stream on the default subjects.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.expect("nats"));
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "OUTBOX".into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    })
    .await
    .expect("stream");

    // A backlog written through the pooler by the writer API (the application's own transactions).
    let writer = async |aggregates: std::ops::Range<usize>, per: usize| {
        p.write(aggregates, per).await;
    };
    writer(0..20, 10).await;

    // One relay as documented (`--prepared-statements false`), one left at the default: it finds
    // its prepared statements gone on the next server connection and falls back to unnamed ones.
    let relay = |name: &str, prepared: &str| {
        let mut cmd = p.relay_command(
            &nats,
            &format!("{}?application_name={name}", p.pooled),
            &[
                "--prepared-statements",
                prepared,
                "--batch-size",
                "50",
                "--fallback-interval",
                "60s",
            ],
        );
        cmd.stderr(Stdio::inherit());
        testkit::outbox::CliRelay::from_command(cmd)
    };
    let relays = [relay("relay-a", "false"), relay("relay-b", "true")];
    // A live stream on top, from two writers at once.
    tokio::join!(writer(20..30, 20), writer(30..40, 20));

    let total = 20 * 10 + 2 * 10 * 20;
    testkit::wait_until("everything relayed", T, || async {
        p.direct_count("processed_at IS NULL").await == 0
    })
    .await;
    let direct = pg_client(&p.direct).await;
    let written: Vec<Written> = ledger(&direct, &format!("{SCHEMA}.outbox_events")).await;
    assert_eq!(written.len(), total);
    let stored: Vec<Stored> = testkit::outbox::read_stream(&js, "OUTBOX").await;
    assert_ledger(&written, &stored);
    p.assert_no_session_state("two relays drained through the pooler", 3)
        .await;
    drop(relays);
}

/// `--source wal` behind PgBouncer in transaction mode: the worker connections go through the
/// pooler (`--database-url`), the control and replication connections direct
/// (`--listen-database-url`). Left at `--prepared-statements true` by mistake, the relay finds its
/// statements gone on the next server connection and falls back to unnamed ones, as the table
/// source does (it used to reconnect and fail the same way again, forever).
#[tokio::test]
async fn the_wal_source_through_pgbouncer_falls_back_to_unnamed_statements() {
    use testkit::outbox::{assert_ledger, ledger, Stored, Written};
    let p = Pooled::new().await;
    p.cli_ok(&["migrate", "--wal"]).await;
    let nats = testkit::NatsServer::start();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.expect("nats"));
    testkit::outbox::create_stream(&js).await;
    let slot = format!(
        "{}_pooled",
        p.direct.rsplit('/').next().expect("a database name")
    );
    let log = std::env::temp_dir().join(format!(
        "outbox-relay-test-{}-wal-pooled.log",
        std::process::id()
    ));
    let mut cmd = p.relay_command(
        &nats,
        &p.pooled,
        &[
            "--source",
            "wal",
            "--slot-name",
            &slot,
            "--prepared-statements",
            "true",
        ],
    );
    cmd.stderr(std::fs::File::create(&log).expect("log file"));
    let relay = testkit::RelayProcess::spawn("outbox-relay", cmd, Some(log.clone()))
        .expect("spawn outbox-relay");
    let direct = pg_client(&p.direct).await;
    testkit::wait_until("the relay streams from its slot", T, || async {
        direct
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1 AND active)",
                &[&slot],
            )
            .await
            .expect("slot query")
            .get(0)
    })
    .await;
    // Published rows leave the outbox (`--wal-marking delete`): a trigger keeps each written
    // row's key for the ledger.
    p.direct_sql(
        "CREATE TABLE written_ledger (id uuid PRIMARY KEY, seq bigint, aggregate_type text, aggregate_id text);
         CREATE FUNCTION written_ledger_keep() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO written_ledger VALUES (NEW.id, NEW.seq, NEW.aggregate_type, NEW.aggregate_id);
             RETURN NULL;
         END $$;
         CREATE TRIGGER written_ledger_keep AFTER INSERT ON outbox_events
             FOR EACH ROW EXECUTE FUNCTION written_ledger_keep();",
    )
    .await;
    // Events in many transactions through the pooler; then the pooler's server connections go
    // (the relay's client connections stay): the statements the relay prepared are on none of
    // the new ones.
    p.write(0..10, 5).await;
    let relayed = || async { p.direct_count("true").await == 0 };
    testkit::wait_until("the first events relayed", T, relayed).await;
    // The pooler's server connections, by their local port.
    let servers = || async {
        let admin = pg_client(&p.bouncer.admin_url()).await;
        let rows = admin
            .simple_query("SHOW SERVERS")
            .await
            .expect("SHOW SERVERS");
        rows.iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get("local_port").map(String::from),
                _ => None,
            })
            .collect::<HashSet<String>>()
    };
    let before = servers().await;
    // Each server connection closes once released; the pooler opens new ones.
    pg_client(&p.bouncer.admin_url())
        .await
        .simple_query("RECONNECT")
        .await
        .expect("RECONNECT");
    testkit::wait_until("new server connections", T, || async {
        servers().await.is_disjoint(&before)
    })
    .await;
    p.write(0..10, 5).await;
    testkit::wait_until("everything relayed", T, relayed).await;
    let written: Vec<Written> = ledger(&direct, &format!("{SCHEMA}.written_ledger")).await;
    assert_eq!(written.len(), 100);
    let stored: Vec<Stored> = testkit::outbox::read_stream(&js, "OUTBOX").await;
    assert_ledger(&written, &stored);
    let mut relay = relay;
    assert_eq!(relay.check_alive(), Ok(()));
    assert_eq!(relay.terminate(), Some(0));
    // One fallback, then no statement is lost again (the line after the fallback's reports the
    // failure that led to it).
    let text = std::fs::read_to_string(&log).expect("relay log");
    let lines: Vec<&str> = text.lines().collect();
    let fallback = lines
        .iter()
        .position(|l| l.contains("sending them unnamed"))
        .unwrap_or_else(|| panic!("no fallback to unnamed statements in the log:\n{text}"));
    assert!(
        !lines
            .iter()
            .skip(fallback + 2)
            .any(|l| l.contains("prepared statement \"")),
        "statements lost after the fallback:\n{text}"
    );
    direct
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .expect("drop the test's slot");
}
