//! Property tests of the mapping from an outbox row to a NATS message: the subject
//! `outbox.<event_type>` and the headers the relay sends.
//!
//! - Whatever `NewEvent::validate` accepts maps to a literal NATS subject and to header names and
//!   values NATS can carry, with the relay's own headers intact.
//! - The writer (`NewEvent::validate`) and the relay (`OutboxEvent::validate`, whose refusal
//!   dead-letters a row as invalid) agree on every input, over an alphabet broad enough that both
//!   verdicts occur often.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use async_nats::{HeaderName, HeaderValue, Subject};
use outbox_relay::wire::{
    headers, headers_as, CE_ID, CE_SUBJECT, CE_TYPE, HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE,
    HEADER_CREATED_AT, HEADER_EVENT_ID, HEADER_EVENT_TYPE,
};
use outbox_relay::{HeaderFormat, NewEvent, OutboxEvent};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use uuid::Uuid;

/// The default `subject_prefix`.
const PREFIX: &str = "outbox";

/// Characters that mean something to subjects, headers or the database, and some that only look
/// harmless (no-break space, line separator, zero-width space, BOM, NEL).
const SPECIAL: &[char] = &[
    '.', '*', '>', ' ', '\t', '\n', '\r', ':', '\0', '\u{7f}', '\u{85}', '\u{a0}', '\u{2028}',
    '\u{200b}', '\u{feff}', 'é', 'ü', '中', '😀',
];

/// Mostly ordinary characters, a good share of special ones, and now and then any char at all.
fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![
        8 => prop::char::range('a', 'z'),
        2 => prop::sample::select(vec!['A', 'Z', '0', '9', '_', '-', '$', '~', '/']),
        3 => Just('.'),
        2 => prop::sample::select(SPECIAL.to_vec()),
        1 => any::<char>(),
    ]
}

fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any_char(), 0..=max).prop_map(String::from_iter)
}

/// Around a column limit, in ASCII or in two-byte characters (the limits count characters).
fn near_limit(limit: usize) -> impl Strategy<Value = String> {
    (limit - 2..=limit + 2, prop::sample::select(vec!['x', 'é']))
        .prop_map(|(n, c)| std::iter::repeat_n(c, n).collect())
}

fn aggregate_part() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z0-9][a-z0-9-]{0,11}",
        3 => text(12),
        1 => near_limit(outbox_relay::event::MAX_AGGREGATE_LEN),
    ]
}

fn event_type() -> impl Strategy<Value = String> {
    prop_oneof![
        5 => prop::collection::vec("[A-Za-z0-9_-]{1,8}", 1..4).prop_map(|t| t.join(".")),
        4 => text(16),
        1 => near_limit(outbox_relay::event::MAX_EVENT_TYPE_LEN),
    ]
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[A-Za-z][A-Za-z0-9-]{0,15}",
        2 => prop::sample::select(vec![
            "traceparent", "Traceparent", "tracestate", "Nats-Msg-Id", "nats-msg-id",
            "Outbox-Event-Id", "outbox-anything", "X-Tenant", "",
        ])
        .prop_map(str::to_string),
        2 => text(10),
    ]
}

fn traceparent() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]",
        1 => prop::sample::select(vec![
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ])
        .prop_map(str::to_string),
    ]
}

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[ -~]{0,20}",
        3 => text(20),
        2 => traceparent(),
    ]
}

fn headers_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(header_name(), header_value(), 0..4)
}

prop_compose! {
    fn new_event()(
        aggregate_type in aggregate_part(),
        aggregate_id in aggregate_part(),
        event_type in event_type(),
        headers in headers_map(),
    ) -> NewEvent {
        NewEvent {
            aggregate_type,
            aggregate_id,
            event_type,
            payload: serde_json::json!({"n": 1}),
            headers,
        }
    }
}

/// The row the relay would claim after a writer enqueued `e`.
fn claimed(e: &NewEvent) -> OutboxEvent {
    OutboxEvent {
        id: Uuid::new_v4(),
        seq: 1,
        aggregate_type: e.aggregate_type.clone(),
        aggregate_id: e.aggregate_id.clone(),
        event_type: e.event_type.clone(),
        payload: e.payload.to_string().into(),
        headers: e.headers.clone(),
        attempts: 0,
        created_at: SystemTime::now().into(),
        defect: None,
        transaction: None,
    }
}

/// Runs `property` on `cases` fresh inputs (random seed; a failure panics with the shrunk input)
/// and returns how many inputs it called accepted and refused.
fn check<S>(
    cases: u32,
    strategy: S,
    property: impl Fn(S::Value) -> Result<bool, TestCaseError>,
) -> (usize, usize)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
{
    let accepted = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    let config = Config {
        failure_persistence: None,
        ..Config::with_cases(cases)
    };
    let result = TestRunner::new(config).run(&strategy, |input| {
        let counter = if property(input)? {
            &accepted
        } else {
            &refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, input)) => {
            panic!("{reason}\nminimal failing input: {input:#?}")
        }
        Err(TestError::Abort(reason)) => panic!("aborted: {reason}"),
    }
    (accepted.into_inner(), refused.into_inner())
}

/// A subject a publisher can use as is: non-empty dot-separated tokens of printable ASCII
/// (no whitespace or control characters), none of them a wildcard, and no wildcard characters at
/// all (the library's stricter rule).
fn literal_subject_problem(subject: &str) -> Option<String> {
    if subject.is_empty() {
        return Some("empty".into());
    }
    if let Some(c) = subject.chars().find(|c| !c.is_ascii_graphic()) {
        return Some(format!("contains {c:?}"));
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Some("empty token".into());
        }
        if token == "*" || token == ">" {
            return Some(format!("wildcard token {token:?}"));
        }
        if token.contains(['*', '>']) {
            return Some(format!("wildcard character in token {token:?}"));
        }
    }
    if Subject::validated(subject).is_err() {
        return Some("async-nats refuses it".into());
    }
    None
}

/// A name NATS headers can carry: non-empty printable ASCII without ':'.
fn header_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("empty name".into());
    }
    if let Some(c) = name.chars().find(|&c| !c.is_ascii_graphic() || c == ':') {
        return Some(format!("name {name:?} contains {c:?}"));
    }
    if HeaderName::from_str(name).is_err() {
        return Some(format!("async-nats refuses the name {name:?}"));
    }
    None
}

/// A value NATS headers can carry: no line break.
fn header_value_problem(name: &str, value: &str) -> Option<String> {
    if value.contains(['\r', '\n']) || HeaderValue::from_str(value).is_err() {
        return Some(format!("value of {name} has a line break: {value:?}"));
    }
    None
}

/// Every header name and value of `sent` is one NATS can carry.
fn headers_problem(sent: &async_nats::HeaderMap) -> Result<(), TestCaseError> {
    for (name, values) in sent.iter() {
        let name = name.to_string();
        if let Some(problem) = header_name_problem(&name) {
            return Err(TestCaseError::fail(problem));
        }
        for value in values {
            if let Some(problem) = header_value_problem(&name, value.as_str()) {
                return Err(TestCaseError::fail(problem));
            }
        }
    }
    Ok(())
}

#[test]
fn accepted_events_map_to_a_literal_subject_and_valid_headers() {
    let (accepted, refused) = check(3_000, new_event(), |event| {
        if event.validate().is_err() {
            return Ok(false);
        }
        let subject = format!("{PREFIX}.{}", event.event_type);
        if let Some(problem) = literal_subject_problem(&subject) {
            return Err(TestCaseError::fail(format!(
                "subject {subject:?}: {problem}"
            )));
        }

        let row = claimed(&event);
        prop_assert!(
            row.validate().is_ok(),
            "the relay refuses what the writer accepted"
        );
        let sent = headers(&row);
        headers_problem(&sent)?;

        // The relay's own headers carry the row, and no header of the row displaced one of them.
        let id = row.id.to_string();
        let get = |name: &str| sent.get(name).map(|v| v.as_str().to_string());
        prop_assert_eq!(get("Nats-Msg-Id"), Some(id.clone()));
        prop_assert_eq!(get(HEADER_EVENT_ID), Some(id));
        prop_assert_eq!(
            get(HEADER_AGGREGATE_TYPE),
            Some(event.aggregate_type.clone())
        );
        prop_assert_eq!(get(HEADER_AGGREGATE_ID), Some(event.aggregate_id.clone()));
        prop_assert_eq!(get(HEADER_EVENT_TYPE), Some(event.event_type.clone()));
        prop_assert!(get(HEADER_CREATED_AT).is_some());
        for (name, value) in &event.headers {
            prop_assert_eq!(get(name), Some(value.clone()), "header {}", name);
        }
        prop_assert_eq!(
            sent.len(),
            event.headers.len() + 6,
            "headers sent: {:?}",
            sent
        );

        // The CloudEvents headers are as valid, and carry the same row.
        let ce = headers_as(&row, HeaderFormat::CloudEvents, "/orders");
        headers_problem(&ce)?;
        let get = |name: &str| ce.get(name).map(|v| v.as_str().to_string());
        prop_assert_eq!(get(CE_ID), Some(row.id.to_string()));
        prop_assert_eq!(get(CE_SUBJECT), Some(event.aggregate_id.clone()));
        prop_assert_eq!(get(CE_TYPE), Some(event.event_type.clone()));
        Ok(true)
    });
    eprintln!("{accepted} accepted, {refused} refused");
    assert!(
        accepted >= 300,
        "only {accepted} of 3000 inputs were valid: the property was barely exercised"
    );
}

#[test]
fn writer_and_relay_validation_agree() {
    // Broad inputs only: every field drawn from the whole alphabet, so both verdicts are common.
    let broad = (
        prop_oneof![3 => text(12), 1 => aggregate_part()],
        prop_oneof![3 => text(12), 1 => aggregate_part()],
        prop_oneof![3 => text(16), 1 => event_type()],
        prop::collection::btree_map(
            prop_oneof![text(10), header_name()],
            prop_oneof![text(20), header_value()],
            0..3,
        ),
    )
        .prop_map(
            |(aggregate_type, aggregate_id, event_type, headers)| NewEvent {
                aggregate_type,
                aggregate_id,
                event_type,
                payload: serde_json::json!({}),
                headers,
            },
        );
    let (accepted, refused) = check(5_000, broad, |event| {
        let row = claimed(&event);
        let writer = event.validate().map_err(|e| e.to_string());
        let relay = row.validate().map_err(|e| e.to_string());
        prop_assert_eq!(&writer, &relay, "writer and relay disagree");
        if writer.is_ok() {
            // The relay builds the headers of everything it accepts (this panics on a bad one).
            let _ = headers(&row);
        }
        Ok(writer.is_ok())
    });
    eprintln!("{accepted} accepted, {refused} refused");
    assert!(
        accepted >= 250 && refused >= 250,
        "{accepted} accepted, {refused} refused of 5000: one verdict is too rare to compare"
    );
}
