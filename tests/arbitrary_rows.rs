//! Rows with arbitrary column values, written by raw SQL: each is published or dead-lettered, and
//! the relay keeps running.

mod common;

use std::time::Duration;

use common::outbox::{assert_unique, Env};
use common::wait_until;
use uuid::Uuid;

/// JetStream stores a message's header block with a 16-bit length and refuses one over 65,535
/// bytes ("header size exceeds maximum allowed of 64k", error 10097). A row whose headers reach
/// that is dead-lettered at once, like a payload over max_payload; one byte less is published.
#[tokio::test]
async fn headers_over_jetstream_64k_are_dead_lettered_at_once() {
    let env = Env::new().await;
    // The header block as NATS writes it: "NATS/1.0\r\n", "Name: value\r\n" per header, "\r\n".
    let line = |name: &str, value_len: usize| name.len() + ": ".len() + value_len + "\r\n".len();
    let relay_headers = line("Nats-Msg-Id", 36)
        + line("Outbox-Event-Id", 36)
        + line("Outbox-Aggregate-Type", "order".len())
        + line("Outbox-Aggregate-Id", "big".len())
        + line("Outbox-Event-Type", "order.big".len())
        + line("Outbox-Created-At", "2024-01-01T00:00:00.000000Z".len());
    let value_len_for = |total: usize| {
        total - "NATS/1.0\r\n".len() - relay_headers - line("X-Big", 0) - "\r\n".len()
    };
    let client = env.client().await;
    let insert = |aggregate: &'static str, value_len: usize| {
        let client = &client;
        async move {
            let headers = format!("{{\"X-Big\": \"{}\"}}", "v".repeat(value_len));
            let id: Uuid = client
                .query_one(
                    "INSERT INTO outbox_events
                         (aggregate_type, aggregate_id, event_type, payload, headers, created_at)
                     VALUES ('order', $1, 'order.big', '{}', $2::text::jsonb,
                             '2024-01-01 00:00:00+00')
                     RETURNING id",
                    &[&aggregate, &headers],
                )
                .await
                .expect("insert")
                .get(0);
            id
        }
    };
    let over = insert("big", value_len_for(65_536)).await;
    let fits = insert("fit", value_len_for(65_535)).await; // "fit" is as long as "big"
    env.insert_sql(1, "big", "order.after").await;
    let mut config = env.config();
    config.max_attempts = 10;
    config.retry_initial = Duration::from_secs(1);
    let relay = env.spawn(config).await;
    wait_until("both rows settled", Duration::from_secs(10), || async {
        env.count("processed_at IS NOT NULL OR dead_lettered_at IS NOT NULL")
            .await
            == 2
    })
    .await;
    let row = client
        .query_one(
            "SELECT dead_lettered_at IS NOT NULL, last_error FROM outbox_events WHERE id = $1",
            &[&over],
        )
        .await
        .expect("row");
    let error: Option<String> = row.get(1);
    assert!(row.get::<_, bool>(0), "not dead-lettered: {error:?}");
    let error = error.unwrap_or_default();
    assert!(error.contains("65536"), "size in {error}");
    let stored = env.stored_headers().await;
    assert_eq!(assert_unique(&stored), [fits]);
    assert_eq!(stored[0].headers["X-Big"].len(), value_len_for(65_535));
    assert!(!relay.handle.is_finished(), "the relay stopped");
    relay.stop().await;
}
