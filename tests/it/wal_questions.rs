//! `--source wal` where what it remembers and what the database holds could part: its records
//! committed asynchronously while the slot moves past them, a repair of the publication while a
//! leader starts, and an outbox table dropped and created again under a publication for all
//! tables.

use std::time::Duration;

use testkit::outbox::{cli, CliRelay, Env};
use testkit::wait_until;
use uuid::Uuid;

use crate::wal::{all_out_in_order, cli_wal, drained, streaming};
use crate::wal_truth::insert_poison;

const T: Duration = Duration::from_secs(30);

/// The setting of `name` in a new session of the test's database.
async fn setting(env: &Env, name: &str) -> String {
    env.client()
        .await
        .query_one("SELECT current_setting($1)", &[&name])
        .await
        .expect("current_setting")
        .get(0)
}

/// Sets `synchronous_commit` for every new session of the test's database (a database's setting
/// comes before the server's, so the test does not depend on the cluster's).
async fn database_commits(env: &Env, synchronous_commit: &str) {
    env.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET synchronous_commit = {synchronous_commit}",
            env.slot_name()
        ))
        .await
        .expect("alter database");
    assert_eq!(setting(env, "synchronous_commit").await, synchronous_commit);
}

/// Keeps, for each statement that writes what the slot's position relies on (the hand-over to the
/// table and back, the delete of published rows, failures recorded), the table, the operation,
/// the session's application_name and the `synchronous_commit` its transaction commits with.
async fn keep_commit_settings(env: &Env) {
    env.client()
        .await
        .batch_execute(
            "CREATE TABLE commit_settings (tbl text, op text, app text, setting text);
             CREATE FUNCTION commit_setting_keep() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO commit_settings VALUES (TG_TABLE_NAME, TG_OP,
                     current_setting('application_name'), current_setting('synchronous_commit'));
                 RETURN NULL;
             END $$;
             CREATE TRIGGER commit_setting_keep AFTER INSERT OR DELETE ON outbox_wal_deferred
                 FOR EACH STATEMENT EXECUTE FUNCTION commit_setting_keep();
             CREATE TRIGGER commit_setting_keep AFTER UPDATE OR DELETE ON outbox_events
                 FOR EACH STATEMENT EXECUTE FUNCTION commit_setting_keep();",
        )
        .await
        .expect("the commit settings' triggers");
}

/// The relay's statements kept by [`keep_commit_settings`] (its worker connections are
/// `outbox-relay`, its control connection `outbox-relay-wal`): (table, operation, application,
/// setting).
async fn relay_commit_settings(env: &Env) -> Vec<(String, String, String, String)> {
    env.client()
        .await
        .query(
            "SELECT tbl, op, app, setting FROM commit_settings
             WHERE app IN ('outbox-relay', 'outbox-relay-wal') ORDER BY tbl, op, app",
            &[],
        )
        .await
        .expect("commit settings")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// (a) The slot's position is sent once the batch's transaction committed. Committed
/// asynchronously (`synchronous_commit = off`), that commit may still be in PostgreSQL's WAL
/// buffers when the slot saves its position (at a checkpoint, or when its restart point moves): a
/// crash then keeps the position and loses the record, and with it an aggregate handed to the
/// table (its streamed events pending, in no stream any more) or the delete of published rows.
/// The wal source's own writes are therefore committed durably whatever the database says, on
/// its worker connections (the batches) and on its control connection (the aggregates it hands
/// to the table at start).
#[tokio::test]
async fn the_wal_sources_records_are_durable_before_the_slot_confirms_past_them() {
    let env = Env::new().await;
    let config = env.wal_config().await;
    keep_commit_settings(&env).await;
    database_commits(&env, "off").await;

    let relay = env.spawn(config.clone()).await;
    streaming(&env).await;
    insert_poison(&env, "a").await; // dead-lettered: a failure recorded
    env.wait_dead_letters(1, T).await;
    env.insert_sql(1, "a", "order.next").await; // handed to the table behind its head
    wait_until("a is handed to the table", T, || {
        super::wal_visibility::deferred(&env, "a")
    })
    .await;
    env.insert_sql(1, "b", "order.created").await; // published, then deleted
    env.wait_stream_len(1, T).await;
    drained_of(&env, "b").await;
    relay.stop().await;
    // At start, the control connection records what the table holds (a's dead head).
    let relay = env.spawn(config.clone()).await;
    streaming(&env).await;
    relay.stop().await;

    let kept = relay_commit_settings(&env).await;
    for expected in [
        ("outbox_events", "UPDATE", "outbox-relay"),
        ("outbox_events", "DELETE", "outbox-relay"),
        ("outbox_wal_deferred", "INSERT", "outbox-relay"),
        ("outbox_wal_deferred", "INSERT", "outbox-relay-wal"),
    ] {
        assert!(
            kept.iter()
                .any(|(t, o, a, _)| (t.as_str(), o.as_str(), a.as_str()) == expected),
            "no statement {expected:?} kept: {kept:?}"
        );
    }
    let asynchronous: Vec<_> = kept.iter().filter(|k| k.3 == "off").collect();
    assert!(
        asynchronous.is_empty(),
        "the wal source committed its records asynchronously: {asynchronous:?}"
    );

    // A stronger setting of the database's is kept: never weakened to make the records durable.
    client_execute(&env, "TRUNCATE commit_settings").await;
    database_commits(&env, "remote_apply").await;
    let relay = env.spawn(config).await;
    streaming(&env).await;
    env.insert_sql(1, "c", "order.created").await;
    env.wait_stream_len(2, T).await;
    drained_of(&env, "c").await;
    relay.stop().await;
    let kept = relay_commit_settings(&env).await;
    assert!(
        kept.iter().any(|k| k.1 == "DELETE"),
        "no delete kept: {kept:?}"
    );
    assert!(
        kept.iter().all(|k| k.3 == "remote_apply"),
        "the database's remote_apply was not kept: {kept:?}"
    );
}

async fn client_execute(env: &Env, sql: &str) {
    env.client()
        .await
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Waits until no row of `aggregate_id` is left (published and deleted).
async fn drained_of(env: &Env, aggregate_id: &str) {
    wait_until(&format!("{aggregate_id}'s rows deleted"), T, || async {
        env.count(&format!("aggregate_id = '{aggregate_id}'")).await == 0
    })
    .await;
}

/// `migrate --wal` through the CLI: it must repair the publication (and so mark the slot to
/// catch up again).
fn migrate_wal_repairs(env: &Env) {
    let (code, out, err) = cli(&env.db, &["migrate", "--wal"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("repaired"), "{out}{err}");
}

/// The publication no longer publishes the outbox's table (as an operator might leave it).
async fn break_the_publication(env: &Env) {
    client_execute(
        env,
        "ALTER PUBLICATION outbox_relay DROP TABLE outbox_events",
    )
    .await;
}

/// Waits until the control connection of the relay (`outbox-relay-wal`) waits for a lock in a
/// statement that names `table`.
async fn control_waits_for_a_lock_on(env: &Env, table: &str) {
    let pattern = format!("%{table}%");
    env.wait_true(
        &format!("the control connection waits for {table}"),
        T,
        "SELECT EXISTS (SELECT FROM pg_stat_activity
                        WHERE datname = current_database()
                          AND application_name = 'outbox-relay-wal'
                          AND wait_event_type = 'Lock' AND query LIKE $1)",
        &[&pattern],
    )
    .await;
}

/// A relay of the wal source streaming, the slot created and caught up, and ten events of five
/// aggregates published through it.
async fn streaming_with_ten_out(env: &Env) -> CliRelay {
    env.wal_config().await;
    let relay = cli_wal(env, &[]);
    streaming(env).await;
    env.insert_interleaved(5, 2).await;
    all_out_in_order(env, 10, T).await;
    relay
}

/// (b) `migrate --wal` repairs the publication and clears the slot's catch-up mark after the
/// leader read the mark (set) and before its first check while streaming. The rows written while
/// the publication was broken are in no stream: the leader must notice the cleared mark and catch
/// up from the table. Made deterministic by holding the leader between its reading of the slot's
/// state and the stream's start (it waits for `outbox_wal_deferred`, which it writes at start).
#[tokio::test]
async fn a_repair_while_the_leader_starts_is_caught_up_from_the_table() {
    let env = Env::new().await;
    // The slot, created and caught up.
    let relay = streaming_with_ten_out(&env).await;
    assert_eq!(relay.terminate(), Some(0));

    let mut locker = env.client().await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute("LOCK TABLE outbox_wal_deferred IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock outbox_wal_deferred");
    let relay = cli_wal(&env, &[]);
    control_waits_for_a_lock_on(&env, "outbox_wal_deferred").await;
    // The leader has read the slot's state (caught up, the publication whole). Now the
    // publication breaks, 10 events go in no stream, and migrate --wal repairs it.
    break_the_publication(&env).await;
    env.insert_interleaved(5, 2).await;
    migrate_wal_repairs(&env);
    lock.commit().await.expect("unlock");
    streaming(&env).await;

    // The 10 written while it was broken come from the table (within two of the leader's checks).
    wait_published(
        &env,
        "the events written while the publication was broken are published",
        20,
    )
    .await;
    drained(&env, T).await;
    // Later events of the same aggregates stream behind them.
    env.insert_interleaved(5, 2).await;
    all_out_in_order(&env, 30, T).await;
    assert_eq!(relay.terminate(), Some(0));
}

/// Waits (up to 30 s) until `n` messages are in the stream, naming `what` on a timeout, with how
/// many there were.
async fn wait_published(env: &Env, what: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let len = env.stream_len().await;
        if len >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {T:?} waiting until {what}: {len} of {n} messages in the stream, {} rows pending",
            env.count("processed_at IS NULL").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the leader of a streaming relay has checked the publication since it started
/// streaming: its control connection's last statement is the publication's check.
async fn first_check_done(env: &Env) {
    env.wait_true(
        "the leader's first check while streaming",
        T,
        "SELECT EXISTS (SELECT FROM pg_stat_activity
                        WHERE datname = current_database()
                          AND application_name = 'outbox-relay-wal'
                          AND query LIKE '%pg_publication_tables%')",
        &[],
    )
    .await;
}

/// (b, order) A streaming relay, the publication broken and repaired by `migrate --wal` between
/// two of its checks: events of the same aggregates written right after the repair were streamed
/// and published at once, overtaking the ones written while it was broken (the next check caught
/// those up from the table later). The claim now finds those older pending rows, which it does
/// not know, and hands their aggregates to the table, which publishes in seq order.
#[tokio::test]
async fn events_streamed_after_a_repair_wait_for_the_ones_no_stream_holds() {
    let env = Env::new().await;
    let relay = streaming_with_ten_out(&env).await;
    // Right after a check: the next is 10 s away.
    first_check_done(&env).await;
    break_the_publication(&env).await;
    env.insert_interleaved(5, 2).await;
    migrate_wal_repairs(&env);
    env.insert_interleaved(5, 2).await;
    all_out_in_order(&env, 30, Duration::from_secs(40)).await;
    assert_eq!(relay.terminate(), Some(0));
}

/// (b) The leader starts its checks knowing the slot caught up, so a slot created by hand (no row
/// in `outbox_wal_slots`) must get its mark when its catch-up is done: otherwise the first check
/// would find none and start over, again and again (and `migrate --wal` could not mark it).
#[tokio::test]
async fn a_slot_created_by_hand_is_marked_caught_up_once_caught_up() {
    let env = Env::new().await;
    env.wal_config().await;
    client_execute(
        &env,
        &format!(
            "SELECT pg_create_logical_replication_slot('{}', 'pgoutput')",
            env.slot_name()
        ),
    )
    .await;
    env.insert_interleaved(5, 2).await;
    let relay = cli_wal(&env, &[]);
    all_out_in_order(&env, 10, T).await;
    first_check_done(&env).await;
    let marked: Option<bool> = env
        .client()
        .await
        .query_opt(
            "SELECT caught_up_at IS NOT NULL FROM outbox_wal_slots WHERE slot_name = $1",
            &[&env.slot_name()],
        )
        .await
        .expect("outbox_wal_slots")
        .map(|r| r.get(0));
    assert_eq!(marked, Some(true), "the slot's catch-up is not recorded");
    env.insert_interleaved(5, 2).await;
    all_out_in_order(&env, 20, T).await;
    let log = relay.log();
    assert!(!log.contains("replication stopped"), "{log}");
    assert_eq!(relay.terminate(), Some(0));
}

/// A publication for all tables instead of `migrate --wal`'s.
async fn publication_for_all_tables(env: &Env) {
    client_execute(
        env,
        "DROP PUBLICATION outbox_relay;
         CREATE PUBLICATION outbox_relay FOR ALL TABLES WITH (publish = 'insert')",
    )
    .await;
}

/// The outbox table dropped and created again by `migrate` (its record of the versions applied
/// dropped too, or it would find the schema up to date); the test's ledger trigger is put on the
/// new table, whose `seq` goes on after the old one's (the ledger's order is by seq).
async fn drop_and_create_the_table_again(env: &Env) {
    drop_and_migrate(env).await;
    keep_the_ledger(env).await;
}

/// The outbox table dropped and created again by `migrate`.
async fn drop_and_migrate(env: &Env) {
    client_execute(
        env,
        "DROP TABLE outbox_events CASCADE; DROP TABLE outbox_schema_migrations",
    )
    .await;
    let (code, out, err) = cli(&env.db, &["migrate"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("applied migrations"), "{out}{err}");
}

/// The new table's inserts kept in the ledger, its seq going on from the old one's.
async fn keep_the_ledger(env: &Env) {
    env.wal_config().await;
    client_execute(
        env,
        "SELECT setval(pg_get_serial_sequence('outbox_events', 'seq'),
                       (SELECT max(seq) FROM written_ledger))",
    )
    .await;
}

/// (c) A publication for all tables streams the outbox table that replaces a dropped one: its
/// inserts come with another relation id than the one the relay read at start. They must be
/// published (the relay starts the stream again and reads the table's id anew), never skipped
/// while the slot confirms past them.
#[tokio::test]
async fn inserts_into_an_outbox_table_dropped_and_created_again_are_streamed() {
    let env = Env::new().await;
    env.wal_config().await;
    publication_for_all_tables(&env).await;
    let relay = cli_wal(&env, &[]);
    streaming(&env).await;
    env.insert_interleaved(5, 2).await;
    all_out_in_order(&env, 10, T).await;

    // While no table is there the publication lists none, and a check of the relay's then would
    // refuse it (exit 1, naming the fix): that is not the question here, so the checks wait (for
    // outbox_wal_slots, which they read) until the table is back.
    // The harness's own look at the publication (in keep_the_ledger) reads it too on PostgreSQL
    // 18, where listing a publication for all tables locks every table: it comes after the
    // unlock.
    let mut locker = env.client().await;
    let lock = locker.transaction().await.expect("begin");
    lock.batch_execute("LOCK TABLE outbox_wal_slots IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock outbox_wal_slots");
    drop_and_migrate(&env).await;
    lock.commit().await.expect("unlock");
    keep_the_ledger(&env).await;

    env.insert_interleaved(5, 2).await;
    all_out_in_order(&env, 20, T).await;
    let log = relay.log();
    assert!(log.contains("dropped and created again"), "{log}");
    assert_eq!(relay.terminate(), Some(0));
}

/// (c) The same while no relay runs, with events of the old table after the slot's position: the
/// stream carries them under the old table's id (they were dropped with it), then the new table's.
/// The old ones are skipped, the new ones published.
#[tokio::test]
async fn a_relay_started_after_the_table_was_dropped_and_created_again_streams_the_new_one() {
    let env = Env::new().await;
    env.wal_config().await;
    publication_for_all_tables(&env).await;
    let relay = cli_wal(&env, &[]);
    streaming(&env).await;
    env.insert_interleaved(5, 2).await;
    all_out_in_order(&env, 10, T).await;
    assert_eq!(relay.terminate(), Some(0));

    // Streamed after the slot's position, then gone with their table.
    let gone: Vec<Uuid> = env
        .client()
        .await
        .query(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'gone', 'order.created', '{}' FROM generate_series(1, 3)
             RETURNING id",
            &[],
        )
        .await
        .expect("insert")
        .iter()
        .map(|r| r.get(0))
        .collect();
    drop_and_create_the_table_again(&env).await;
    env.client()
        .await
        .execute("DELETE FROM written_ledger WHERE id = ANY($1)", &[&gone])
        .await
        .expect("the dropped events leave the ledger");
    env.insert_interleaved(5, 2).await;

    let relay = cli_wal(&env, &[]);
    all_out_in_order(&env, 20, T).await;
    // The old table's inserts came first; from the second start on they are skipped.
    let log = relay.log();
    assert!(log.contains("the stream skips its changes"), "{log}");
    assert_eq!(relay.terminate(), Some(0));
}
