//! `--source wal` with commits streamed before they are visible: behind a synchronous standby a
//! transaction's commit record is flushed (and decoded, and streamed) a network round trip before
//! the transaction becomes visible to other sessions. Here the standby never answers
//! (`synchronous_standby_names = 'ghost'`), so a writer's commit stays in that state until the
//! test cancels its wait (`pg_cancel_backend`), which makes it visible. Every other session
//! commits with `synchronous_commit = off` (the harness default) and never waits.
//!
//! Also: a relay that is stopped while it waits to create its slot.

use std::time::Duration;

use testkit::outbox::{assert_ledger, CliRelay, Env};
use testkit::{wait_until, PgCluster, PgOptions};
use tokio::task::JoinHandle;

const T: Duration = Duration::from_secs(30);

/// A cluster whose synchronous standby never answers.
async fn cluster_without_its_standby() -> PgCluster {
    tokio::task::spawn_blocking(|| {
        PgCluster::start(PgOptions::default().setting("synchronous_standby_names", "ghost"))
    })
    .await
    .expect("start the cluster")
}

/// A transaction that committed (its commit record is flushed and streams) but is not visible:
/// it waits for the standby. [`Invisible::reveal`] cancels the wait: it becomes visible.
struct Invisible {
    pid: i32,
    /// The WAL position after its commit record.
    commit_end: String,
    commit: JoinHandle<()>,
}

impl Invisible {
    async fn insert(env: &Env, aggregate_id: &str, event_type: &str) -> Invisible {
        let writer = env.client().await;
        let pid: i32 = writer
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        let sql = format!(
            "SET synchronous_commit = on;
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', '{aggregate_id}', '{event_type}', '{{}}')"
        );
        let commit = tokio::spawn(async move {
            // `batch_execute` runs the statements in one implicit transaction: its commit waits.
            // Cancelling the wait ends it with a warning; the transaction committed all the same.
            writer
                .batch_execute(&sql)
                .await
                .expect("the insert commits");
        });
        let admin = env.client().await;
        wait_until("the commit waits for the standby", T, || async {
            admin
                .query_one(
                    "SELECT coalesce(wait_event = 'SyncRep', false) FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .expect("pg_stat_activity")
                .get(0)
        })
        .await;
        let commit_end: String = admin
            .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
            .await
            .expect("lsn")
            .get(0);
        Invisible {
            pid,
            commit_end,
            commit,
        }
    }

    /// Waits until the relay's stream has been sent the commit (it is in the relay's hands).
    async fn streamed(&self, env: &Env) {
        let admin = env.client().await;
        wait_until("the commit is streamed to the relay", T, || async {
            admin
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_stat_replication r
                        JOIN pg_replication_slots s ON s.active_pid = r.pid
                        WHERE s.slot_name = $1 AND r.sent_lsn >= $2::text::pg_lsn)",
                    &[&env.slot_name(), &self.commit_end],
                )
                .await
                .expect("pg_stat_replication")
                .get(0)
        })
        .await;
    }

    /// Ends the wait: the transaction becomes visible.
    async fn reveal(self, env: &Env) {
        let admin = env.client().await;
        admin
            .execute("SELECT pg_cancel_backend($1)", &[&self.pid])
            .await
            .expect("cancel the wait");
        tokio::time::timeout(T, self.commit)
            .await
            .expect("the commit returns once its wait is cancelled")
            .expect("the writer task");
    }
}

pub(crate) async fn deferred(env: &Env, aggregate_id: &str) -> bool {
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

/// The slot's confirmed position has reached the WAL position of now.
async fn wait_confirmed_to_now(env: &Env) {
    let admin = env.client().await;
    let now: String = admin
        .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    wait_until("the slot confirms everything published", T, || async {
        admin
            .query_one(
                "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false)
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&env.slot_name(), &now],
            )
            .await
            .expect("pg_replication_slots")
            .get(0)
    })
    .await;
}

async fn streaming_relay(env: &Env) -> testkit::outbox::RunningRelay {
    let config = {
        let mut config = env.wal_config().await;
        config.source.fallback_interval = Duration::from_millis(300);
        config
    };
    let relay = env.spawn(config).await;
    crate::wal::streaming(env).await;
    relay
}

/// The dead letter's id.
async fn dead_letter(env: &Env) -> String {
    env.wait_dead_letters(1, T).await;
    env.client()
        .await
        .query_one(
            "SELECT id::text FROM outbox_events WHERE dead_lettered_at IS NOT NULL",
            &[],
        )
        .await
        .expect("dead letter")
        .get(0)
}

/// Aggregate `a` is with the table (its head is dead-lettered). Its next event is streamed while
/// not visible. The head is discarded and the table finds no visible pending row of `a`: `a` goes
/// back to the stream. The event, visible afterwards, must still go out (it was lost for good:
/// the stream dropped it counting on the table, the slot confirmed past it, and `status` showed it
/// pending forever).
#[tokio::test]
async fn an_event_streamed_before_it_is_visible_is_not_lost_while_its_aggregate_is_with_the_table()
{
    let pg = cluster_without_its_standby().await;
    let env = Env::on(&pg).await;
    let relay = streaming_relay(&env).await;
    env.insert_sql(1, "a", "bad.*").await; // an invalid subject: dead-lettered at once
    let head = dead_letter(&env).await;
    wait_until("a is with the table", T, || deferred(&env, "a")).await;

    let next = Invisible::insert(&env, "a", "order.next").await;
    next.streamed(&env).await;
    let (code, out, err) = testkit::outbox::cli(&env.db, &["dead-letters", "discard", &head]);
    assert_eq!(code, Some(0), "{out}{err}");
    // The table has no visible pending row of `a` now: it goes back to the stream.
    wait_until("a is back with the stream", T, || async {
        !deferred(&env, "a").await
    })
    .await;
    next.reveal(&env).await;

    env.wait_stream_len(1, T).await;
    let stored = env.stored().await;
    assert_eq!(stored[0].headers["Outbox-Event-Type"], "order.next");
    assert_eq!(env.count("processed_at IS NULL").await, 0);
    env.insert_sql(1, "b", "order.created").await;
    env.wait_stream_len(2, T).await;
    wait_confirmed_to_now(&env).await;
    relay.stop().await;
}

/// A streamed row of `a` is not visible yet, so it is carried; meanwhile `a`'s earlier event
/// fails and `a` is handed to the table. The slot must go on confirming once everything is out
/// (it stayed where it was until the relay restarted: the carried row was dropped from the batch
/// but never from the carried set, and WAL was retained without bound).
#[tokio::test]
async fn the_slot_goes_on_confirming_after_a_carried_rows_aggregate_is_handed_to_the_table() {
    let pg = cluster_without_its_standby().await;
    let env = Env::on(&pg).await;
    let config = {
        let mut config = env.wal_config().await;
        config.source.fallback_interval = Duration::from_millis(300);
        config
    };
    // The slot first, then stopped: both rows below stream at once when the relay comes back,
    // and are claimed in one batch.
    let relay = env.spawn(config.clone()).await;
    crate::wal::streaming(&env).await;
    relay.stop().await;
    env.insert_sql(1, "a", "bad.*").await;
    let next = Invisible::insert(&env, "a", "order.next").await;
    let relay = env.spawn(config).await;
    next.streamed(&env).await;
    let head = dead_letter(&env).await;
    next.reveal(&env).await;
    let (code, out, err) = testkit::outbox::cli(&env.db, &["dead-letters", "discard", &head]);
    assert_eq!(code, Some(0), "{out}{err}");
    env.wait_stream_len(1, T).await;
    env.insert_sql(1, "b", "order.created").await;
    env.wait_stream_len(2, T).await;
    let written: Vec<_> = env
        .written()
        .await
        .into_iter()
        .filter(|w| w.id.to_string() != head)
        .collect();
    assert_ledger(&written, &env.stored().await);
    wait_confirmed_to_now(&env).await;
    relay.stop().await;
}

/// `--transactions atomic`: Q (aggregate `b`) is streamed but not visible; then a transaction T
/// of an event of `a` and U of `b` commits, visible at once. The claim holding T's event of `a`
/// takes the rest of T from the table, where the check for an older pending row of `b` cannot
/// see Q: U went out before Q (without atomic mode Q goes first). The stream's order proves Q is
/// the earlier commit, so T waits for it: `b` goes out Q, U, and T whole, in one atomic batch.
#[tokio::test]
async fn an_atomic_transaction_waits_for_an_earlier_commit_of_its_aggregate_not_visible_yet() {
    atomic_transaction_behind_a_commit_not_visible_yet(false).await;
}

/// As above, and the relay restarts while Q is still not visible: T's event of `a` waits with
/// the table (its transaction postponed), and the restarted relay sweeps the table before its stream
/// has brought anything again. The sweep's claim takes the rest of T, U, which the new stream has
/// not brought yet: it waits for the stream (which brings Q first), so `b` still goes out Q, U.
#[tokio::test]
async fn an_atomic_transaction_waits_for_an_earlier_commit_not_visible_yet_across_a_restart() {
    atomic_transaction_behind_a_commit_not_visible_yet(true).await;
}

/// The scenario of the two tests above; `restart`: the relay restarts once T is postponed.
async fn atomic_transaction_behind_a_commit_not_visible_yet(restart: bool) {
    if !crate::atomic::atomic_server() {
        return;
    }
    let pg = cluster_without_its_standby().await;
    let env = Env::on(&pg).await;
    crate::atomic::allow_atomic(&env).await;
    let config = {
        let mut config = env.wal_config().await;
        config.source.fallback_interval = Duration::from_millis(300);
        config.publish.transactions = outbox_relay::TransactionMode::Atomic;
        config
    };
    let mut relay = env.spawn(config.clone()).await;
    crate::wal::streaming(&env).await;

    let q = Invisible::insert(&env, "b", "order.q").await;
    q.streamed(&env).await;
    env.client()
        .await
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'a', 'order.t', '{}'), ('order', 'b', 'order.u', '{}');
             COMMIT;",
        )
        .await
        .expect("T");
    if restart {
        wait_until("T's event of a waits with the table", T, || {
            deferred(&env, "a")
        })
        .await;
        relay.stop().await;
        assert_eq!(env.stream_len().await, 0, "nothing out while Q is hidden");
        relay = env.spawn(config).await;
        crate::wal::streaming(&env).await;
    }
    // A later commit of another aggregate: once it is out, the relay has had T in its hands.
    env.insert_sql(1, "c", "order.c").await;
    wait_until("the later commit is out", T, || async {
        env.stored()
            .await
            .iter()
            .any(|m| m.headers["Outbox-Event-Type"] == "order.c")
    })
    .await;
    q.reveal(&env).await;
    env.wait_stream_len(4, T).await;
    wait_until("everything published", T, || async {
        env.count("processed_at IS NULL").await == 0
    })
    .await;
    relay.stop().await;

    let stored = env.stored().await;
    assert_eq!(stored.len(), 4, "each event once: {stored:?}");
    let of_b: Vec<&str> = stored
        .iter()
        .filter(|m| m.headers["Outbox-Aggregate-Id"] == "b")
        .map(|m| m.headers["Outbox-Event-Type"].as_str())
        .collect();
    assert_eq!(of_b, ["order.q", "order.u"], "b in commit order");
    let t: Vec<_> = stored
        .iter()
        .filter(|m| ["order.t", "order.u"].contains(&m.headers["Outbox-Event-Type"].as_str()))
        .collect();
    assert_eq!(t.len(), 2);
    assert_eq!(t[1].seq, t[0].seq + 1, "T in one block");
    assert!(t[0].headers.contains_key("Nats-Batch-Id"));
    assert_eq!(
        t[0].headers.get("Nats-Batch-Id"),
        t[1].headers.get("Nats-Batch-Id"),
        "T as one atomic batch"
    );
    assert_eq!(t[0].headers["Outbox-Transaction-Events"], "2");
}

/// Creating a slot waits for every transaction that holds an xid. A relay stopped meanwhile
/// exits within seconds, and while it waits it says which backend it waits for.
#[tokio::test]
async fn sigterm_while_the_slot_is_created_stops_the_relay_promptly() {
    let env = Env::new().await;
    env.wal_config().await; // the publication
    let holder = env.client().await;
    holder
        .batch_execute("BEGIN; SELECT txid_current();")
        .await
        .expect("a transaction with an xid");
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    let slot = env.slot_name();
    let relay = CliRelay::run_logged(&env, &["--source", "wal", "--slot-name", slot.as_str()]);
    let admin = env.client().await;
    let creating = || async {
        admin
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_stat_activity
                    WHERE query LIKE '%pg_create_logical_replication_slot%' AND pid <> pg_backend_pid()
                      AND state = 'active')",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get::<_, bool>(0)
    };
    wait_until("the relay waits to create its slot", T, creating).await;
    wait_until("the relay says what it waits for", T, || async {
        relay.log_tail().contains(&holder_pid.to_string())
    })
    .await;
    assert_eq!(relay.terminate_within(Duration::from_secs(5)), Some(0));
    wait_until("the slot creation was cancelled", T, || async {
        !creating().await
    })
    .await;
    holder.batch_execute("ROLLBACK").await.expect("rollback");
}
