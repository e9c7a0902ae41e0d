//! `--source wal` where what it remembers and what the database holds could part: its records
//! committed asynchronously while the slot moves past them, a repair of the publication while a
//! leader starts, and an outbox table dropped and created again under a publication for all
//! tables.

use std::time::Duration;

use testkit::outbox::Env;
use testkit::wait_until;

use crate::wal::streaming;
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

async fn in_deferred(env: &Env, aggregate_id: &str) -> bool {
    env.client()
        .await
        .query_one(
            "SELECT EXISTS (SELECT FROM outbox_wal_deferred WHERE aggregate_id = $1)",
            &[&aggregate_id],
        )
        .await
        .expect("outbox_wal_deferred")
        .get(0)
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
    wait_until("a is handed to the table", T, || in_deferred(&env, "a")).await;
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
