use super::nats::split_credentials;
use super::*;
use crate::error::field_of;

#[test]
fn defaults_validate_once_a_url_is_set() {
    assert!(RelayConfig::default().validate().is_err());
    RelayConfig::new("postgres://localhost/db")
        .validate()
        .expect("defaults are valid");
}

#[test]
fn errors_name_the_field() {
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.batch.size = 0;
    assert_eq!(field_of(c.validate()), Some("batch_size"));
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.publish.subject_prefix = "a.*".into();
    assert_eq!(field_of(c.validate()), Some("subject_prefix"));
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.publish.subject_template = Some("app.{nope}".into());
    assert_eq!(field_of(c.validate()), Some("subject_template"));
    // A template starting with a placeholder is fine, but no stream can be created for it.
    c.publish.subject_template = Some("{aggregate_type}.{event_type}".into());
    c.validate().expect("valid without create_stream");
    c.nats.create_stream = true;
    assert_eq!(field_of(c.validate()), Some("subject_template"));
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.publish.ce_source = "has space".into();
    c.validate()
        .expect("ce_source unused with the Outbox-* headers");
    for format in [HeaderFormat::CloudEvents, HeaderFormat::Both] {
        c.publish.header_format = format;
        assert_eq!(field_of(c.validate()), Some("ce_source"));
    }
    c.publish.ce_source = String::new();
    assert_eq!(field_of(c.validate()), Some("ce_source"));
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.nats.stream = "has.dot".into();
    assert_eq!(field_of(c.validate()), Some("stream"));
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.retention.processed_events = Some(Duration::ZERO);
    assert_eq!(field_of(c.validate()), Some("processed_events_retention"));
    c.retention.processed_events = Some(Duration::from_secs(86_400));
    c.metrics.event_types_max = 0; // everything counted as `other`: allowed
    c.validate().expect("valid");
    type Set = fn(&mut RelayConfig);
    let cases: [(&str, Set); 9] = [
        ("fallback_interval", |c| {
            c.source.fallback_interval = Duration::ZERO
        }),
        ("publish_timeout", |c| c.publish.timeout = Duration::ZERO),
        ("retry_initial", |c| c.retry.initial = Duration::ZERO),
        ("retry_max", |c| c.retry.max = Duration::from_millis(1)),
        ("stats_interval", |c| {
            c.metrics.stats_interval = Duration::ZERO
        }),
        ("max_attempts", |c| c.retry.max_attempts = 0),
        ("max_batch_bytes", |c| c.batch.max_bytes = 0),
        ("slot_name", |c| c.wal.slot_name = Some("Bad-Name".into())),
        ("retention", |c| {
            c.retention.processed = Some(Duration::ZERO)
        }),
    ];
    for (field, set) in cases {
        let mut c = RelayConfig::new("postgres://localhost/db");
        set(&mut c);
        assert_eq!(field_of(c.validate()), Some(field));
    }
}

#[test]
fn derived_limits_come_from_the_batch_size() {
    let b = BatchConfig {
        size: 100,
        max_bytes: 1000,
        ..BatchConfig::default()
    };
    assert_eq!(b.acks_in_flight(), 512);
    assert_eq!(b.stream_buffer(), 200);
    assert_eq!(b.sweep_slice(), (25, 250));
    assert_eq!(b.per_aggregate(5), 5);
    assert_eq!(b.per_aggregate(300), 1);
    assert!(b.is_full(100, 0) && b.is_full(1, 1000) && !b.is_full(99, 999));
}

#[test]
fn the_slot_is_named_after_the_schema() {
    let mut c = RelayConfig::new("postgres://localhost/db");
    assert_eq!(c.slot().expect("slot"), "outbox_relay");
    c.postgres.schema = Some("public".into());
    assert_eq!(c.slot().expect("slot"), "outbox_relay");
    c.postgres.schema = Some("billing".into());
    assert_eq!(c.slot().expect("slot"), "outbox_relay_billing");
    c.wal.slot_name = Some("mine".into());
    assert_eq!(c.slot().expect("slot"), "mine");
}

const SECRET: &str = "s3cret-Pa55";

fn leaky_config() -> RelayConfig {
    let mut c = RelayConfig::new(format!(
        r"host=db user=app password = '{SECRET} and more' application_name='it\'s me'"
    ));
    c.postgres.listen_url =
        Some(format!("postgres://app:{SECRET}@db:5432/x?sslmode=require&password={SECRET}").into());
    c.nats.url = format!("nats://relay:{SECRET}@n1:4222, tls://{SECRET}@n2:4222,n3:4222").into();
    c
}

#[test]
fn debug_shows_parsed_urls_without_secrets() {
    let c = leaky_config();
    for shown in [format!("{c:?}"), format!("{c:#?}")] {
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(!shown.contains("and more"), "{shown}");
        assert!(shown.contains("password=***"), "{shown}");
        assert!(
            shown.contains(r"host=db user=app password=*** application_name='it\\'s me'"),
            "{shown}"
        );
        assert!(
            shown.contains("user=app password=*** host=db port=5432 dbname=x sslmode=require"),
            "{shown}"
        );
        assert!(
            shown.contains("nats://relay:***@n1:4222,tls://***@n2:4222,nats://n3:4222"),
            "{shown}"
        );
    }
    assert!(format!("{c:?}").contains("size: 1000"));
    let mut c = leaky_config();
    c.postgres.url = format!("host=db '{SECRET}").into();
    c.nats.url = format!("nats://[{SECRET}").into();
    let shown = format!("{c:?}");
    assert!(!shown.contains(SECRET), "{shown}");
}

#[test]
fn nats_user_and_password_are_complete_and_in_one_place() {
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.nats.user = Some("relay".into());
    c.nats.password = Some(SECRET.into());
    c.validate().expect("user and password");
    c.nats.password = None;
    c.validate().expect("a user alone is a token");
    c.nats.user = None;
    c.nats.password = Some(SECRET.into());
    assert_eq!(field_of(c.validate()), Some("nats_password"));
    c.nats.user = Some("".into());
    assert_eq!(field_of(c.validate()), Some("nats_user"));
    // Credentials in the URL as well: refused, whichever form.
    for url in ["nats://u:p@a:4222", "nats://a:4222,tok3n@b:4222"] {
        c.nats.user = Some("relay".into());
        c.nats.url = url.into();
        let err = c.validate().expect_err(url);
        assert_eq!(err.config_field().map(|(f, _)| f), Some("nats_user"));
        assert!(!err.to_string().contains(SECRET), "{err}");
    }
}

#[test]
fn nats_password_and_token_are_never_shown() {
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.nats.user = Some(SECRET.into());
    c.nats.password = Some(SECRET.into());
    let shown = format!("{c:?}");
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(
        shown.contains("user: Some(***), password: Some(***)"),
        "{shown}"
    );
}

#[test]
fn tls_parameters_are_checked_with_the_field_named() {
    let mut c = RelayConfig::new("host=db sslmode = verify-everything");
    assert_eq!(field_of(c.validate()), Some("database_url"));
    c.postgres.url = "host=db".into();
    c.postgres.listen_url = Some("host=db sslrootcert=system sslmode=require".into());
    assert_eq!(field_of(c.validate()), Some("listen_database_url"));
}

#[test]
fn credentials_move_out_of_the_url() {
    let (servers, creds) =
        split_credentials("nats://u:p%40ss@a:4222, nats://b:4223").expect("parse");
    assert_eq!(servers[0].as_str(), "nats://a:4222");
    assert_eq!(servers[1].as_str(), "nats://b:4223");
    assert!(matches!(creds, Some(Credentials::UserPassword(u, p)) if u == "u" && p == "p@ss"));
    let (_, creds) = split_credentials("tok3n@localhost:4222").expect("parse");
    assert!(matches!(creds, Some(Credentials::Token(t)) if t == "tok3n"));
    let (_, creds) = split_credentials("nats://127.0.0.1:4222").expect("parse");
    assert!(creds.is_none());
    assert!(split_credentials(" , ").is_err());
}

#[test]
fn fast_ingest_batches_do_not_combine_with_atomic_transactions() {
    let mut c = RelayConfig::new("postgres://localhost/db");
    c.publish.batches = PublishBatches::FastIngest;
    c.validate().expect("fast-ingest batches alone are valid");
    c.publish.transactions = TransactionMode::Atomic;
    let err = c.validate().expect_err("both at once");
    assert!(err.is_usage());
    assert_eq!(
        err.config_field().map(|(field, _)| field),
        Some("publish_batches")
    );
    let text = err.to_string();
    assert!(text.contains("--publish-batches fast-ingest"), "{text}");
    assert!(text.contains("--transactions atomic"), "{text}");
}
