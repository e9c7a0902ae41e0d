use super::*;

#[test]
fn kinds_and_predicates() {
    let cases = [
        (
            Error::config("batch_size", "x"),
            ErrorKind::Config,
            false,
            true,
        ),
        (
            Error::invalid_event("x"),
            ErrorKind::InvalidEvent,
            false,
            true,
        ),
        (
            Error::schema_missing(Some(1), 2),
            ErrorKind::SchemaMissing,
            false,
            false,
        ),
        (
            Error::sqlx("x".into(), true),
            ErrorKind::Database,
            true,
            false,
        ),
        (
            Error::sqlx("x".into(), false),
            ErrorKind::Database,
            false,
            false,
        ),
        (
            Error::broker_connect("x"),
            ErrorKind::BrokerConnect,
            true,
            false,
        ),
        (Error::refused("x"), ErrorKind::Refused, false, false),
        (Error::stream("x"), ErrorKind::Stream, false, false),
        (
            Error::broker_unavailable("x"),
            ErrorKind::BrokerUnavailable,
            true,
            false,
        ),
        (
            Error::timeout(Duration::from_secs(1), "x"),
            ErrorKind::Timeout,
            true,
            false,
        ),
        (Error::not_found("x"), ErrorKind::NotFound, false, false),
        (
            Error::from(std::io::Error::other("x")),
            ErrorKind::Io,
            true,
            false,
        ),
        (Error::database_state("x"), ErrorKind::Database, true, false),
        (
            Error::replication("x", true),
            ErrorKind::Database,
            true,
            false,
        ),
        (
            Error::replication("x", false),
            ErrorKind::Database,
            false,
            false,
        ),
        // A cause changes neither the kind nor the predicates.
        (
            Error::broker_connect("x").caused_by(std::io::Error::other("y")),
            ErrorKind::BrokerConnect,
            true,
            false,
        ),
        (
            Error::stream("x").caused_by(std::io::Error::other("y")),
            ErrorKind::Stream,
            false,
            false,
        ),
        (
            Error::replication("x", false).caused_by(std::io::Error::other("y")),
            ErrorKind::Database,
            false,
            false,
        ),
    ];
    for (e, kind, retryable, usage) in cases {
        assert_eq!(e.kind(), kind, "{e}");
        assert_eq!(e.is_retryable(), retryable, "{e}");
        assert_eq!(e.is_usage(), usage, "{e}");
        assert_eq!(e.is_not_found(), kind == ErrorKind::NotFound, "{e}");
        assert_eq!(
            e.is_broker_unavailable(),
            kind == ErrorKind::BrokerUnavailable
        );
        assert!(!e.is_prepared_statement_lost());
    }
    assert_eq!(
        Error::config("batch_size", "must be between 1 and 10000").config_field(),
        Some(("batch_size", "must be between 1 and 10000"))
    );
    assert_eq!(Error::invalid_event("x").config_field(), None);
}

#[test]
fn waiting_heals_what_it_did_before() {
    assert!(Error::database_state("x").heals_by_waiting());
    assert!(Error::replication("x", true).heals_by_waiting());
    assert!(!Error::replication("x", false).heals_by_waiting());
    let caused = |e: Error| e.caused_by(std::io::Error::other("y"));
    assert!(caused(Error::broker_connect("x")).heals_by_waiting());
    assert!(!caused(Error::refused("x")).heals_by_waiting());
    assert!(!caused(Error::stream("x")).heals_by_waiting());
}

#[test]
fn a_cause_is_the_source_and_ends_the_message() {
    use std::error::Error as _;
    let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
    let e = Error::broker_connect("cannot read creds file /etc/app.creds").caused_by(io);
    assert_eq!(
        e.to_string(),
        "NATS connection failed: cannot read creds file /etc/app.creds: no such file"
    );
    let source = e.source().expect("a source");
    let io = source
        .downcast_ref::<std::io::Error>()
        .expect("the io error");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    // Without a cause: no source, the message as it was.
    let plain = Error::broker_connect("cannot connect");
    assert!(plain.source().is_none());
    assert_eq!(plain.to_string(), "NATS connection failed: cannot connect");
    // An error of a kind that holds its failure keeps that as its source, as before.
    let from_io = Error::from(std::io::Error::other("gone"));
    assert!(from_io.source().is_some());
}

#[test]
fn a_cause_does_not_bring_back_a_password() {
    let cause = std::io::Error::other("nats://app:s3cret@nats:4222 refused; password=hunter2");
    for e in [
        Error::broker_connect("cannot connect (nats://app:***@nats:4222)")
            .caused_by(std::io::Error::other(cause.to_string())),
        Error::replication("replication connection", true).caused_by(cause),
    ] {
        for shown in [e.to_string(), e.redacted(), format!("{e}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("nats://app:***@nats:4222"), "{shown}");
        }
    }
}

#[test]
fn transient_sqlstates() {
    for code in [
        "40001", "40P01", "57P01", "57P02", "57P03", "55P03", "57014", "08006", "08001",
    ] {
        assert!(is_transient_sqlstate(code), "{code}");
    }
    for code in [
        "23505", "42P01", "42501", "28P01", "53300", "22P02", "25P02",
    ] {
        assert!(!is_transient_sqlstate(code), "{code}");
    }
}
