//! `--source wal` and a publication changed by hand. One that no longer publishes the outbox's
//! inserts (its table dropped from it, `publish` without `insert`, another schema's table) is
//! refused, at start and whenever the stream ends, with the fix; `migrate --wal` repairs it. One
//! dropped and created again under an existing slot is recovered from (the slot created again).
//! Nothing written meanwhile is lost.

use std::time::Duration;

use testkit::outbox::{cli, CliRelay, Env};
use testkit::wait_until;

use crate::wal::{all_out_in_order, cli_wal, streaming};

/// This outbox's publication (the schema of `client`'s session).
async fn publication(client: &tokio_postgres::Client) -> String {
    client
        .query_one("SELECT outbox_wal_publication()", &[])
        .await
        .expect("outbox_wal_publication()")
        .get(0)
}

/// Whether this outbox's publication publishes inserts into the outbox_events of `client`'s
/// schema.
async fn publishes_the_outbox(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_publication p
                            JOIN pg_publication_tables t ON t.pubname = p.pubname
                            WHERE p.pubname = outbox_wal_publication() AND p.pubinsert
                              AND t.schemaname = current_schema()
                              AND t.tablename = 'outbox_events')",
            &[],
        )
        .await
        .expect("publication query")
        .get(0)
}

/// Waits for `relay` to exit: its exit code and its whole log.
async fn exit_of(relay: &mut CliRelay, within: Duration) -> (Option<i32>, String) {
    wait_until("the relay exits", within, || {
        let exited = relay.try_wait().is_some();
        async move { exited }
    })
    .await;
    (relay.try_wait().and_then(|s| s.code()), relay.log())
}

/// Terminates the walsender streaming the test's slot (the relay's stream ends); how many.
async fn end_the_stream(env: &Env) -> i64 {
    env.client()
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(r.pid)) FROM pg_stat_replication r
             JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1",
            &[&env.slot_name()],
        )
        .await
        .expect("terminate the walsender")
        .get(0)
}

/// [`Env::wal_config`] (the publication, the ledger), an admin connection and the publication's
/// name.
async fn set_up(env: &Env) -> (tokio_postgres::Client, String) {
    env.wal_config().await;
    let admin = env.client().await;
    let name = publication(&admin).await;
    (admin, name)
}

/// A relay of the CLI streaming, with 10 events out.
async fn streaming_ten(env: &Env) -> testkit::RelayProcess {
    let relay = cli_wal(env, &[]);
    streaming(env).await;
    env.insert_interleaved(5, 2).await;
    env.wait_stream_len(10, Duration::from_secs(30)).await;
    relay
}

/// `migrate --wal` repairs the publication; 10 more events, and a relay publishes all 30 once and
/// in order (those the stream skipped from the table).
async fn repaired_and_all_out(env: &Env) {
    migrate_wal(env, &[]);
    env.insert_interleaved(5, 2).await;
    let relay = cli_wal(env, &[]);
    all_out_in_order(env, 30, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
}

/// The refusal: exit code 1, naming the publication and the fix.
fn assert_refused(code: Option<i32>, log: &str, publication: &str) {
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!("publication {publication} ")),
        "{log}"
    );
    assert!(log.contains("outbox-relay migrate --wal"), "{log}");
}

/// `migrate --wal`, which must succeed.
fn migrate_wal(env: &Env, extra: &[&str]) -> String {
    let mut args = vec!["migrate", "--wal"];
    args.extend_from_slice(extra);
    let (code, out, err) = cli(&env.db, &args);
    assert_eq!(code, Some(0), "{out}{err}");
    out
}

/// A relay started against the publication after `change` (`{name}`: the publication's name)
/// exits refused; its log.
async fn refused_after(change: &str) -> String {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    admin
        .batch_execute(&change.replace("{name}", &name))
        .await
        .expect("alter publication");
    let mut relay = cli_wal(&env, &[]);
    let (code, log) = exit_of(&mut relay, Duration::from_secs(20)).await;
    assert_refused(code, &log, &name);
    log
}

#[tokio::test]
async fn a_publication_without_the_outbox_table_is_refused_with_the_fix() {
    let log = refused_after("ALTER PUBLICATION {name} DROP TABLE outbox_events").await;
    assert!(log.contains("public.outbox_events"), "{log}");
}

#[tokio::test]
async fn a_publication_that_does_not_publish_inserts_is_refused_with_the_fix() {
    let log = refused_after("ALTER PUBLICATION {name} SET (publish = 'update')").await;
    assert!(log.contains("insert"), "{log}");
}

/// The events written while the publication published nothing are in no stream (pgoutput decides
/// by the publication as it was when each change was written): behind the repaired publication
/// they are caught up from the table.
#[tokio::test]
async fn migrate_wal_repairs_a_publication_changed_by_hand_and_nothing_written_meanwhile_is_lost() {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    let relay = cli_wal(&env, &[]);
    streaming(&env).await;
    env.insert_interleaved(5, 2).await;
    env.wait_stream_len(10, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
    admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {name} DROP TABLE outbox_events;
             ALTER PUBLICATION {name} SET (publish = 'update')"
        ))
        .await
        .expect("alter publication");
    env.insert_interleaved(5, 2).await;
    let out = migrate_wal(&env, &[]);
    assert!(
        publishes_the_outbox(&admin).await,
        "migrate --wal left the publication as it was: {out}"
    );
    assert!(
        out.contains(&format!("publication {name} repaired")),
        "{out}"
    );
    env.insert_interleaved(5, 2).await;
    let relay = cli_wal(&env, &[]);
    all_out_in_order(&env, 30, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
}

/// pgoutput takes the table's removal from the publication in its stride: the inserts after it are
/// not sent, and the stream goes on, empty. When it ends, the relay checks the publication again
/// and refuses it instead of streaming nothing.
#[tokio::test]
async fn a_relay_whose_stream_ends_checks_the_publication_again_and_refuses_it() {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    let mut relay = streaming_ten(&env).await;
    admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {name} DROP TABLE outbox_events"
        ))
        .await
        .expect("alter publication");
    env.insert_interleaved(5, 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.stream_len().await, 10, "pgoutput streamed no more");
    assert_eq!(end_the_stream(&env).await, 1);
    let (code, log) = exit_of(&mut relay, Duration::from_secs(20)).await;
    assert_refused(code, &log, &name);
    assert!(
        log.contains("replication stopped; retrying"),
        "refused after the stream ended: {log}"
    );
    // Repaired, a relay publishes what the stream skipped, from the table.
    repaired_and_all_out(&env).await;
}

/// While its stream goes on (empty), a relay notices within seconds that the publication no longer
/// publishes the outbox's inserts.
#[tokio::test]
async fn a_streaming_relay_refuses_a_publication_changed_under_it() {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    let mut relay = streaming_ten(&env).await;
    admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {name} SET (publish = 'update')"
        ))
        .await
        .expect("alter publication");
    env.insert_interleaved(5, 2).await;
    let (code, log) = exit_of(&mut relay, Duration::from_secs(30)).await;
    assert_refused(code, &log, &name);
    repaired_and_all_out(&env).await;
}

/// The publication repaired under a running relay before the relay noticed: the rows written
/// meanwhile are in no stream. `migrate --wal` marks the slot to catch up again; the relay sees that
/// at its next check and catches up from the table. (Rows streamed between the repair and that
/// check may overtake them: the test writes more only once they are out.)
#[tokio::test]
async fn a_repair_under_a_running_relay_makes_it_catch_up_what_no_stream_holds() {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    let relay = cli_wal(&env, &[]);
    streaming(&env).await;
    env.insert_interleaved(5, 2).await;
    env.wait_stream_len(10, Duration::from_secs(30)).await;
    admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {name} DROP TABLE outbox_events"
        ))
        .await
        .expect("alter publication");
    env.insert_interleaved(5, 2).await;
    // At once, in this process (the relay checks the publication every few seconds).
    let mut client = env.client().await;
    outbox_relay::ops::Outbox::new(&mut client, None)
        .create_publication()
        .await
        .expect("migrate --wal");
    assert!(publishes_the_outbox(&admin).await);
    all_out_in_order(&env, 20, Duration::from_secs(30)).await;
    env.insert_interleaved(5, 2).await;
    all_out_in_order(&env, 30, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
}

/// An outbox in its own schema: its publication must publish that schema's outbox_events, not
/// another outbox's table of the same name.
#[tokio::test]
async fn the_publication_of_an_outbox_in_its_own_schema_must_publish_that_schemas_table() {
    let env = Env::new().await;
    migrate_wal(&env, &["--schema", "app"]);
    let admin = testkit::pg_client(&testkit::with_schema(&env.db, "app")).await;
    let name = publication(&admin).await;
    assert_eq!(name, "outbox_relay_app");
    admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {name} SET TABLE public.outbox_events"
        ))
        .await
        .expect("alter publication");
    let slot = format!("{}_app", env.slot_name());
    let args = [
        "--source",
        "wal",
        "--slot-name",
        slot.as_str(),
        "--schema",
        "app",
    ];
    let mut relay = CliRelay::run_logged(&env, &args);
    let (code, log) = exit_of(&mut relay, Duration::from_secs(20)).await;
    assert_refused(code, &log, &name);
    assert!(log.contains("app.outbox_events"), "{log}");
    let out = migrate_wal(&env, &["--schema", "app"]);
    assert!(publishes_the_outbox(&admin).await, "{out}");
    let relay = CliRelay::run_logged(&env, &args);
    admin
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'a', 'order.created', '{}' FROM generate_series(1, 5)",
            &[],
        )
        .await
        .expect("insert");
    env.wait_stream_len(5, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
}

/// A publication `FOR ALL TABLES` publishes the outbox's table: accepted, the stream's other
/// tables left alone, and `migrate --wal` repairs its `publish` without trying to add the table.
#[tokio::test]
async fn a_publication_for_all_tables_streams_the_outbox_and_ignores_other_tables() {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    admin
        .batch_execute(&format!(
            "DROP PUBLICATION {name};
             CREATE PUBLICATION {name} FOR ALL TABLES WITH (publish = 'insert');
             CREATE TABLE side_table (note text)"
        ))
        .await
        .expect("a publication for all tables");
    let relay = cli_wal(&env, &[]);
    streaming(&env).await;
    for _ in 0..3 {
        env.insert_interleaved(5, 2).await;
        admin
            .execute("INSERT INTO side_table VALUES ('not an event')", &[])
            .await
            .expect("insert into side_table");
    }
    all_out_in_order(&env, 30, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
    admin
        .batch_execute(&format!(
            "ALTER PUBLICATION {name} SET (publish = 'update')"
        ))
        .await
        .expect("alter publication");
    env.insert_interleaved(5, 2).await;
    let mut relay = cli_wal(&env, &[]);
    let (code, log) = exit_of(&mut relay, Duration::from_secs(20)).await;
    assert_refused(code, &log, &name);
    migrate_wal(&env, &[]);
    assert!(publishes_the_outbox(&admin).await);
    let all_tables: bool = admin
        .query_one(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await
        .expect("publication")
        .get(0);
    assert!(all_tables, "still for all tables");
    let relay = cli_wal(&env, &[]);
    all_out_in_order(&env, 40, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
}

/// Rows in one transaction each, `n` of them over a few aggregates, a few milliseconds apart.
async fn write_steadily(env: &Env, n: i32) {
    let client = env.client().await;
    for k in 0..n {
        client
            .execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', 'w' || ($1::int % 7), 'order.step', jsonb_build_object('k', $1::int))",
                &[&k],
            )
            .await
            .expect("insert");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The cause, as the relay logs it: pgoutput's error and what it means.
fn assert_names_the_cause(log: &str, publication: &str) {
    assert!(
        log.contains(&format!("publication \"{publication}\" does not exist")),
        "{log}"
    );
    assert!(log.contains("dropped and created again"), "{log}");
}

/// pgoutput reads the publication as of each change it decodes: up to PostgreSQL 17 the rows
/// written between the drop and the create fail it ("publication does not exist") however often
/// the stream starts again, and the relay creates its slot again and catches up from the table.
/// PostgreSQL 18 skips those rows with a warning to the walsender's log only (nothing in the
/// stream says so): the stream's fallback finds them, pending and passed by the slot.
#[tokio::test]
async fn a_publication_dropped_and_created_again_under_a_streaming_relay_is_recovered_from() {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    let skips = server_version_num(&env).await >= 180_000;
    let relay = cli_wal(&env, fallback_for(skips));
    streaming(&env).await;
    env.insert_interleaved(5, 2).await;
    env.wait_stream_len(10, Duration::from_secs(30)).await;
    let writer = write_steadily(&env, 200);
    let by_hand = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        admin
            .batch_execute(&format!("DROP PUBLICATION {name}"))
            .await
            .expect("drop publication");
        env.insert_sql(3, "gap", "order.created").await;
        admin
            .batch_execute(&format!(
                "CREATE PUBLICATION {name} FOR TABLE outbox_events WITH (publish = 'insert')"
            ))
            .await
            .expect("create publication");
    };
    tokio::join!(writer, by_hand);
    all_out_in_order(&env, 213, Duration::from_secs(60)).await;
    assert_recovered(&relay.log(), &name, skips);
    assert_eq!(relay.terminate(), Some(0));
}

/// How the relay found the rows written while the publication was missing: on a server that
/// fails the stream for them, by the error (see [`assert_names_the_cause`]); on one that skips
/// them (PostgreSQL 18), by the table, through the older-row check of a later event of the
/// aggregate or the stream's fallback, whichever comes first.
fn assert_recovered(log: &str, publication: &str, skips: bool) {
    match skips {
        false => assert_names_the_cause(log, publication),
        true => assert!(
            log.contains("were in no stream") || log.contains("aggregates handed to the table"),
            "{log}"
        ),
    }
}

/// The relay's extra arguments: a short fallback where the server skips what it cannot publish
/// (the fallback is how the relay finds those rows), none elsewhere (the test's default, 60 s).
fn fallback_for(skips: bool) -> &'static [&'static str] {
    match skips {
        true => &["--fallback-interval", "1s"],
        false => &[],
    }
}

/// The server's version as a number (`150020`, `180006`).
async fn server_version_num(env: &Env) -> i32 {
    let row = env
        .client()
        .await
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server version");
    row.get(0)
}

#[tokio::test]
async fn a_publication_dropped_and_created_again_while_the_relay_is_stopped_is_recovered_from() {
    let env = Env::new().await;
    let (admin, name) = set_up(&env).await;
    let skips = server_version_num(&env).await >= 180_000;
    let relay = cli_wal(&env, &[]);
    streaming(&env).await;
    env.insert_interleaved(5, 2).await;
    env.wait_stream_len(10, Duration::from_secs(30)).await;
    assert_eq!(relay.terminate(), Some(0));
    admin
        .batch_execute(&format!("DROP PUBLICATION {name}"))
        .await
        .expect("drop publication");
    env.insert_interleaved(5, 2).await;
    let out = migrate_wal(&env, &[]);
    assert!(
        out.contains(&format!("publication {name} created")),
        "{out}"
    );
    env.insert_interleaved(5, 2).await;
    let relay = cli_wal(&env, fallback_for(skips));
    all_out_in_order(&env, 30, Duration::from_secs(60)).await;
    assert_recovered(&relay.log(), &name, skips);
    assert_eq!(relay.terminate(), Some(0));
}
