//! `migrate --print --format`: the migrations shaped for users' own migration tools, applied the
//! way those tools apply a file (inside a transaction they open, recording their own version in a
//! table of theirs in the same transaction), are a schema `migrate --check` and the relay accept.

use testkit::outbox::cli;

/// Applies `sql` as Flyway, Atlas, refinery or goose apply one migration file: in a transaction
/// of the tool's, which also records the tool's version in `tool_history` (found through the
/// search_path, as those tools name their tables).
async fn apply_like_a_tool(db: &str, sql: &str, version: i32) {
    let mut client = testkit::pg_client(db).await;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS tool_history (version int PRIMARY KEY)")
        .await
        .expect("tool table");
    let tx = client.transaction().await.expect("begin");
    tx.batch_execute(sql).await.expect("the migration file");
    tx.execute(
        "INSERT INTO tool_history (version) VALUES ($1)",
        &[&version],
    )
    .await
    .expect("the tool records its version in the same transaction");
    tx.commit().await.expect("commit");
}

/// The goose statement block: what goose sends between `StatementBegin` and `StatementEnd`.
fn goose_block(text: &str) -> &str {
    assert!(text.starts_with("-- +goose Up\n"), "{text}");
    assert_eq!(text.matches("-- +goose StatementBegin\n").count(), 1);
    assert_eq!(text.matches("-- +goose StatementEnd\n").count(), 1);
    assert!(text.ends_with("-- +goose StatementEnd\n"));
    let start = text.find("-- +goose StatementBegin\n").expect("begin") + 25;
    let end = text.find("-- +goose StatementEnd\n").expect("end");
    &text[start..end]
}

#[tokio::test]
async fn print_formats_apply_inside_a_tools_transaction() {
    let latest = outbox_relay::migrate::current_version();

    // Bare (Flyway, Atlas, refinery): no transaction control of its own.
    let db = testkit::shared_pg().create_database().await;
    let (code, bare, err) = cli(&db, &["migrate", "--print", "--format", "bare"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !bare.contains("BEGIN;") && !bare.contains("COMMIT;"),
        "{bare}"
    );
    apply_like_a_tool(&db, &bare, 1).await;
    let (code, out, err) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(0), "{out}{err}");

    // Into a schema of its own: the tool's table stays reachable in the same transaction.
    let db = testkit::shared_pg().create_database().await;
    let (code, bare, err) = cli(
        &db,
        &[
            "migrate", "--schema", "events", "--print", "--format", "bare",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    apply_like_a_tool(&db, &bare, 1).await;
    let (code, out, err) = cli(&db, &["migrate", "--schema", "events", "--check"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let client = testkit::pg_client(&db).await;
    let placed: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'events' AND tablename = 'outbox_events'",
            &[],
        )
        .await
        .expect("tables")
        .get(0);
    assert_eq!(placed, 1);

    // Goose: one statement block, applied in two steps (a release adding the latest version).
    let db = testkit::shared_pg().create_database().await;
    let (code, first, err) = cli(&db, &["migrate", "--print", "--format", "goose"]);
    assert_eq!(code, Some(0), "{err}");
    let block = goose_block(&first);
    let cut = block
        .find(&format!("\n-- migration {latest:04}_"))
        .expect("latest migration in the script");
    let older = &block[..cut];
    apply_like_a_tool(&db, older, 1).await;
    let (code, _, _) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(1), "the latest version is still pending");
    let (code, rest, err) = cli(
        &db,
        &[
            "migrate",
            "--print",
            "--format",
            "goose",
            "--from",
            &latest.to_string(),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let block = goose_block(&rest);
    assert!(block.contains(&format!("-- migration {latest:04}_")));
    assert!(!block.contains("-- migration 0001_"), "{block}");
    apply_like_a_tool(&db, block, 2).await;
    let (code, out, err) = cli(&db, &["migrate", "--check"]);
    assert_eq!(code, Some(0), "{out}{err}");

    // --format belongs to --print.
    let (code, _, err) = cli(&db, &["migrate", "--format", "bare"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--print"), "{err}");
    let (code, _, err) = cli(&db, &["migrate", "--print", "--format", "flyway"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--format"), "{err}");
}
