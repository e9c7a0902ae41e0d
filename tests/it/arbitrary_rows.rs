//! No row content can panic or stall the relay, with either source.
//!
//! Rows are written by raw SQL too, so whatever a column of `outbox_events` can hold must end in
//! one of two outcomes: published to JetStream (`processed_at` set; with the wal source the row is
//! deleted), or dead-lettered (`dead_lettered_at` set, with a `last_error` saying why); and the
//! relay keeps running. A row behind a dead letter of its own aggregate stays pending: that is
//! per-aggregate order.
//!
//! One relay runs for the whole test; every proptest case inserts a few rows with arbitrary column
//! values (by raw SQL with parameters, not `enqueue`, which validates), waits until they settle and
//! checks them against the stream. The seed is printed; set `ARBITRARY_ROWS_SEED` to replay it
//! (`RUST_LOG=outbox_relay=info` shows the relay's log).
//!
//! Cases the property found get a test of their own at the end: headers over JetStream's 64 KiB,
//! and `outbox-relay status` with an infinite `created_at`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_relay::event::{MAX_AGGREGATE_LEN, MAX_EVENT_TYPE_LEN};
use outbox_relay::Source;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use testkit::outbox::{assert_unique, cli, Env, RunningRelay, Stored};
use testkit::wait_until;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

/// Cases of 1 to 8 rows each: 10 to 20 s on two cores.
const CASES: u32 = 40;
const MAX_ROWS: usize = 8;
/// Environment variable that replays a run.
const SEED_ENV: &str = "ARBITRARY_ROWS_SEED";
/// Every case must settle within this.
const SETTLE: Duration = Duration::from_secs(30);
/// Name of the relay runtime's threads (with the source's name after it): a panic on one of them
/// is the relay's.
const RELAY_THREAD: &str = "relay-runtime";

// ---------------------------------------------------------------------------------------------
// Generated column values
// ---------------------------------------------------------------------------------------------

/// A generated value, and whether it is plainly valid: a row made only of such values must be
/// published (never dead-lettered), unless it waits behind a dead letter of its aggregate.
#[derive(Clone)]
struct Gen<T> {
    value: T,
    clean: bool,
}

impl<T: fmt::Debug> fmt::Debug for Gen<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)?;
        if self.clean {
            f.write_str(" (clean)")?;
        }
        Ok(())
    }
}

fn clean<T>(value: T) -> Gen<T> {
    Gen { value, clean: true }
}

fn dirty<T>(value: T) -> Gen<T> {
    Gen {
        value,
        clean: false,
    }
}

/// Characters that mean something to subjects, headers, JSON or the database, and some that only
/// look harmless. No NUL: PostgreSQL text cannot hold it.
const SPECIAL: &str =
    ".*> \t\n\r:\"\\\u{1}\u{1b}\u{7f}\u{85}\u{a0}\u{2028}\u{200b}\u{feff}\u{fffd}\u{10ffff}éü中😀";

fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => prop::char::range('a', 'z'),
        2 => prop::sample::select(vec!['A', 'Z', '0', '9', '_', '-', '$', '~', '/']),
        2 => Just('.'),
        3 => prop::sample::select(SPECIAL.chars().collect::<Vec<_>>()),
        1 => any::<char>().prop_map(|c| if c == '\0' { '\u{1}' } else { c }),
    ]
}

fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any_char(), 0..=max).prop_map(String::from_iter)
}

fn strings(values: &[&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(values.to_vec()).prop_map(str::to_string)
}

/// `aggregate_type` or `aggregate_id` (varchar(255): at most 255 characters).
fn aggregate_part() -> impl Strategy<Value = Gen<String>> {
    prop_oneof![
        6 => "[a-z0-9][a-z0-9-]{0,11}".prop_map(clean),
        2 => strings(&[
            "", " ", "   ", "x ", " x", " x ", "\tx", "x\n", "a\r\nb", "a\u{1}b", "a\u{7f}",
            "\u{85}", "\u{a0}x", "x\u{2028}",
        ])
        .prop_map(dirty),
        3 => text(24).prop_map(dirty),
        1 => (1..=MAX_AGGREGATE_LEN, prop::sample::select(vec!['x', 'é', '中', '😀']))
            .prop_map(|(n, c)| clean(std::iter::repeat_n(c, n).collect())),
        1 => "[a-z]{1,6}".prop_map(|s| clean(format!("{s}-😀🎉"))),
    ]
}

/// `event_type` (varchar(100)): dotted tokens, wildcards, spaces, unicode, empty tokens.
fn event_type() -> impl Strategy<Value = Gen<String>> {
    prop_oneof![
        5 => prop::collection::vec("[A-Za-z0-9_-]{1,8}", 1..4).prop_map(|t| clean(t.join("."))),
        3 => strings(&[
            "*", ">", "order.*", "order.>", "*.created", "order.>.x", "order created",
            "order..created", ".order", "order.", "", " ", " order", "order\t", "order\r\nx", "ü",
            "order.créé", "😀", "order\u{7f}", "order\u{1}", "order.a:b",
        ])
        .prop_map(dirty),
        3 => text(20).prop_map(dirty),
        1 => (90..=MAX_EVENT_TYPE_LEN).prop_map(|n| clean("x".repeat(n))),
        1 => (1..=MAX_EVENT_TYPE_LEN, prop::sample::select(vec!['é', '😀', '.']))
            .prop_map(|(n, c)| dirty(std::iter::repeat_n(c, n).collect())),
    ]
}

/// One value of a `headers` object, as JSON text.
#[derive(Clone, Debug)]
enum HeaderValue {
    Str(String),
    /// Numbers, booleans, null, nested values: sent as their JSON text.
    Raw(String),
}

impl HeaderValue {
    fn json(&self) -> String {
        match self {
            HeaderValue::Str(s) => json_string(s),
            HeaderValue::Raw(raw) => raw.clone(),
        }
    }
}

/// The `headers` column.
#[derive(Clone, Debug)]
enum Headers {
    SqlNull,
    /// JSON text as it is: JSON null, what is not an object, an object serde_json cannot read.
    Literal(String),
    Object(Vec<(String, HeaderValue)>),
    /// `{"X-Big": "vvv…"}` with a value of this many bytes.
    BigValue(usize),
    /// `{"X-Deep": [[…]]}` nested this deep (the document is one deeper).
    Deep(usize),
    /// A valid header name this long.
    LongName(usize),
}

impl Headers {
    fn json(&self) -> Option<String> {
        Some(match self {
            Headers::SqlNull => return None,
            Headers::Literal(text) => text.clone(),
            Headers::Object(entries) => {
                let fields: Vec<String> = entries
                    .iter()
                    .map(|(name, value)| format!("{}: {}", json_string(name), value.json()))
                    .collect();
                format!("{{{}}}", fields.join(", "))
            }
            Headers::BigValue(n) => format!("{{\"X-Big\": \"{}\"}}", "v".repeat(*n)),
            Headers::Deep(depth) => {
                format!(
                    "{{\"X-Deep\": {}{}}}",
                    "[".repeat(*depth),
                    "]".repeat(*depth)
                )
            }
            Headers::LongName(n) => format!("{{\"{}\": \"v\"}}", "h".repeat(*n)),
        })
    }

    /// The headers the stream must carry when the row is published: string values as they are.
    fn expected(&self) -> Vec<(String, String)> {
        match self {
            Headers::Object(entries) => entries
                .iter()
                .filter_map(|(name, value)| match value {
                    HeaderValue::Str(s) => Some((name.clone(), s.clone())),
                    HeaderValue::Raw(_) => None,
                })
                .collect(),
            Headers::BigValue(n) => vec![("X-Big".into(), "v".repeat(*n))],
            Headers::LongName(n) => vec![("h".repeat(*n), "v".into())],
            _ => Vec::new(),
        }
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string is JSON")
}

fn header_name() -> impl Strategy<Value = Gen<String>> {
    prop_oneof![
        5 => "[A-Za-z][A-Za-z0-9-]{0,15}".prop_map(|name| {
            let lower = name.to_ascii_lowercase();
            let reserved = lower.starts_with("nats-")
                || lower.starts_with("outbox-")
                || lower == "traceparent";
            Gen { value: name, clean: !reserved }
        }),
        2 => strings(&[
            "Nats-Msg-Id", "nats-msg-id", "Nats-Expected-Stream", "Nats-Rollup", "Outbox-Event-Id",
            "outbox-created-at", "traceparent", "Traceparent", "tracestate", "", " ", "a b",
            "a:b", "ü", "x\r\ny", "\t", "X-😀",
        ])
        .prop_map(dirty),
        2 => text(10).prop_map(dirty),
    ]
}

fn header_value() -> impl Strategy<Value = Gen<HeaderValue>> {
    prop_oneof![
        4 => "[ -~]{0,20}".prop_map(|s| Gen {
            clean: s.trim() == s,
            value: HeaderValue::Str(s),
        }),
        2 => text(20).prop_map(|s| dirty(HeaderValue::Str(s))),
        1 => strings(&["a\r\nb", "a\nb", "a\rb", " padded ", "\t", "x\u{85}", "x\u{1}", "é中😀"])
            .prop_map(|s| dirty(HeaderValue::Str(s))),
        1 => strings(&[
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "not a trace",
        ])
        .prop_map(|s| dirty(HeaderValue::Str(s))),
        2 => strings(&[
            "0", "-0", "42", "-1.5", "1e2", "1.0E+2", "123456789012345678901234567890",
            "1e400", "-1e-400", "true", "false", "null", "[]", "[1, \"a\"]", "{}",
            "{\"a\": {\"b\": [1, null]}}", "\"\"",
        ])
        .prop_map(|s| dirty(HeaderValue::Raw(s))),
    ]
}

fn headers() -> impl Strategy<Value = Gen<Headers>> {
    // jsonb keeps the last of duplicate keys; so does this.
    let object = prop::collection::vec((header_name(), header_value()), 0..5).prop_map(|entries| {
        let entries: BTreeMap<String, (bool, Gen<HeaderValue>)> = entries
            .into_iter()
            .map(|(name, value)| (name.value, (name.clean, value)))
            .collect();
        let clean = entries.values().all(|(name_clean, value)| {
            *name_clean && value.clean && matches!(value.value, HeaderValue::Str(_))
        });
        let entries = entries
            .into_iter()
            .map(|(name, (_, value))| (name, value.value))
            .collect();
        Gen {
            value: Headers::Object(entries),
            clean,
        }
    });
    // Names and values any NATS header takes: must reach the stream as they are.
    let plain = prop::collection::btree_map(
        "[A-Za-z][A-Za-z0-9_-]{0,15}".prop_filter("not reserved", |name| {
            let lower = name.to_ascii_lowercase();
            !lower.starts_with("nats-") && !lower.starts_with("outbox-") && lower != "traceparent"
        }),
        prop_oneof![
            3 => "[!-~]([ -~]{0,18}[!-~])?",
            1 => "[a-z]{1,4}( [a-zé中😀]{1,4}){0,2}",
        ]
        .prop_map(HeaderValue::Str),
        1..5,
    )
    .prop_map(|entries| clean(Headers::Object(entries.into_iter().collect())));
    prop_oneof![
        3 => Just(clean(Headers::SqlNull)),
        3 => plain,
        1 => Just(clean(Headers::Literal("null".into()))),
        2 => strings(&[
            "[]", "[1, 2]", "[{\"a\": \"b\"}]", "0", "-1.5e300", "\"x\"", "\"\"", "true", "false",
            "{\"a\": 1e400}",
        ])
        .prop_map(|s| dirty(Headers::Literal(s))),
        5 => object,
        1 => prop_oneof![100..=160usize, 160..=5_000usize].prop_map(|d| dirty(Headers::Deep(d))),
        1 => prop_oneof![1_000..=200_000usize, 1_040_000..=1_200_000usize]
            .prop_map(|n| dirty(Headers::BigValue(n))),
        1 => (1_000..=70_000usize).prop_map(|n| dirty(Headers::LongName(n))),
    ]
}

/// The `payload` column.
#[derive(Clone, Debug)]
enum Payload {
    /// Small JSON, written as is.
    Json(String),
    /// `{"blob": "<len × ch>"}`.
    Big { len: usize, ch: char },
    /// Arrays (or objects `{"a": …}`) nested this deep.
    Deep { depth: usize, objects: bool },
}

impl Payload {
    fn json(&self) -> String {
        match self {
            Payload::Json(text) => text.clone(),
            Payload::Big { len, ch } => {
                let blob: String = std::iter::repeat_n(*ch, *len).collect();
                format!("{{\"blob\": \"{blob}\"}}")
            }
            Payload::Deep {
                depth,
                objects: false,
            } => format!("{}{}", "[".repeat(*depth), "]".repeat(*depth)),
            Payload::Deep {
                depth,
                objects: true,
            } => format!("{}1{}", "{\"a\": ".repeat(*depth), "}".repeat(*depth)),
        }
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from), // NaN and infinities become null
        text(24).prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(8), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn payload() -> impl Strategy<Value = Gen<Payload>> {
    prop_oneof![
        2 => strings(&[
            "null", "true", "0", "-0", "1.5e300", "-1e-300", "123456789012345678901234567890.5",
            "\"\"", "{}", "[]", "\"😀\\n\\t\\u0001\\u001f\"", "{\"a\": 1, \"a\": 2}",
            "\"a\\u0000b\"",
        ])
        .prop_map(|s| clean(Payload::Json(s))),
        4 => json_value().prop_map(|v| clean(Payload::Json(v.to_string()))),
        2 => (
            prop_oneof![
                2 => 1_000..=700_000usize,
                1 => 1_047_800..=1_048_700usize,
                2 => 1_100_000..=1_600_000usize,
            ],
            prop::sample::select(vec!['y', 'y', 'y', 'é']),
        )
            .prop_map(|(len, ch)| Gen {
                clean: len * ch.len_utf8() < 1_000_000,
                value: Payload::Big { len, ch },
            }),
        1 => (prop_oneof![3 => 100..=12_000usize, 1 => 12_000..=20_000usize], any::<bool>())
            .prop_map(|(depth, objects)| clean(Payload::Deep { depth, objects })),
    ]
}

/// `created_at`, as microseconds since 2000-01-01 UTC (PostgreSQL's own epoch: its largest
/// timestamp is past `i64::MAX` microseconds since 1970) or an infinity.
#[derive(Clone, Copy)]
enum CreatedAt {
    Infinity,
    NegInfinity,
    At(i64),
}

/// PostgreSQL's range: 4714-11-24 00:00:00 BC to 294276-12-31 23:59:59.999999 (UTC).
const PG_MIN: i64 = -211_813_488_000_000_000;
const PG_MAX: i64 = 9_223_371_331_200_000_000 - 1;
const UNIX_EPOCH: i64 = -946_684_800_000_000;
/// 0000-01-01 (1 BC), 0001-01-01, 2100-01-01 and 10000-01-01.
const YEAR_0: i64 = -63_113_904_000_000_000;
const YEAR_1: i64 = -63_082_281_600_000_000;
const YEAR_2100: i64 = 3_155_760_000_000_000;
const YEAR_10000: i64 = 252_455_616_000_000_000;

impl CreatedAt {
    fn datetime(self) -> Option<time::OffsetDateTime> {
        let CreatedAt::At(micros) = self else {
            return None;
        };
        let unix_nanos = (i128::from(micros) - i128::from(UNIX_EPOCH)) * 1000;
        Some(
            time::OffsetDateTime::from_unix_timestamp_nanos(unix_nanos)
                .expect("generated instants are in time's range"),
        )
    }

    /// As PostgreSQL reads it (years before 1 as `BC`).
    fn sql(self) -> String {
        match self {
            CreatedAt::Infinity => "infinity".into(),
            CreatedAt::NegInfinity => "-infinity".into(),
            CreatedAt::At(_) => {
                let dt = self.datetime().expect("finite");
                let (year, era) = if dt.year() <= 0 {
                    (1 - dt.year(), " BC")
                } else {
                    (dt.year(), "")
                };
                format!(
                    "{year:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}+00{era}",
                    u8::from(dt.month()),
                    dt.day(),
                    dt.hour(),
                    dt.minute(),
                    dt.second(),
                    dt.microsecond()
                )
            }
        }
    }

    /// `Outbox-Created-At` for a date of years 0000 to 9999 (astronomical: 0000 is 1 BC); none for
    /// what RFC 3339 cannot write, which must never be published.
    fn rfc3339(self) -> Option<String> {
        let dt = self.datetime()?;
        (0..=9999).contains(&dt.year()).then(|| {
            format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
                dt.year(),
                u8::from(dt.month()),
                dt.day(),
                dt.hour(),
                dt.minute(),
                dt.second(),
                dt.microsecond()
            )
        })
    }
}

impl fmt::Debug for CreatedAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sql())
    }
}

fn created_at() -> impl Strategy<Value = Gen<CreatedAt>> {
    let at = |range: std::ops::RangeInclusive<i64>| range.prop_map(CreatedAt::At);
    prop_oneof![
        4 => at(UNIX_EPOCH..=YEAR_2100 - 1).prop_map(clean),
        2 => at(YEAR_1..=UNIX_EPOCH - 1).prop_map(clean),
        1 => at(YEAR_0..=YEAR_1 - 1).prop_map(dirty),
        2 => at(PG_MIN..=YEAR_0 - 1).prop_map(dirty),
        2 => at(YEAR_10000..=PG_MAX).prop_map(dirty),
        2 => prop::sample::select(vec![
            PG_MIN,
            PG_MAX,
            YEAR_0,
            YEAR_1 - 1,
            YEAR_10000 - 1,
            YEAR_10000,
            UNIX_EPOCH - 1,
        ])
        .prop_map(|m| dirty(CreatedAt::At(m))),
        1 => Just(dirty(CreatedAt::Infinity)),
        1 => Just(dirty(CreatedAt::NegInfinity)),
    ]
}

fn attempts() -> impl Strategy<Value = i32> {
    prop_oneof![
        2 => prop::sample::select(vec![i32::MIN, -1, 0, 1, 2, 1000, i32::MAX - 1, i32::MAX]),
        1 => any::<i32>(),
    ]
}

#[derive(Clone, Debug)]
struct Row {
    /// Index into the case's aggregates (modulo their number).
    aggregate: usize,
    event_type: Gen<String>,
    headers: Gen<Headers>,
    created_at: Gen<CreatedAt>,
    payload: Gen<Payload>,
    attempts: i32,
}

#[derive(Clone, Debug)]
struct Case {
    aggregates: Vec<(Gen<String>, Gen<String>)>,
    rows: Vec<Row>,
    /// All rows in one transaction (a savepoint each), or one transaction per row.
    one_transaction: bool,
}

impl Case {
    fn aggregate(&self, row: &Row) -> &(Gen<String>, Gen<String>) {
        &self.aggregates[row.aggregate % self.aggregates.len()]
    }

    fn is_clean(&self, row: &Row) -> bool {
        let (aggregate_type, aggregate_id) = self.aggregate(row);
        aggregate_type.clean
            && aggregate_id.clean
            && row.event_type.clean
            && row.headers.clean
            && row.created_at.clean
            && row.payload.clean
    }
}

/// Three times in four a value that is plainly valid, else any value: rows with every column
/// valid (published) and with one or two odd ones are both common.
fn mostly_clean<T, S>(any: fn() -> S) -> impl Strategy<Value = Gen<T>>
where
    T: fmt::Debug + Clone,
    S: Strategy<Value = Gen<T>> + 'static,
{
    prop_oneof![
        3 => any().prop_filter("a plainly valid value", |g| g.clean),
        1 => any(),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let row = (
        0..4usize,
        mostly_clean(event_type),
        mostly_clean(headers),
        mostly_clean(created_at),
        mostly_clean(payload),
        attempts(),
    )
        .prop_map(
            |(aggregate, event_type, headers, created_at, payload, attempts)| Row {
                aggregate,
                event_type,
                headers,
                created_at,
                payload,
                attempts,
            },
        );
    (
        prop::collection::vec(
            (mostly_clean(aggregate_part), mostly_clean(aggregate_part)),
            1..=4,
        ),
        prop::collection::vec(row, 1..=MAX_ROWS),
        any::<bool>(),
    )
        .prop_map(|(aggregates, rows, one_transaction)| Case {
            aggregates,
            rows,
            one_transaction,
        })
}

// ---------------------------------------------------------------------------------------------
// Writing rows and reading the outcome
// ---------------------------------------------------------------------------------------------

const INSERT: &str = "INSERT INTO outbox_events
         (aggregate_type, aggregate_id, event_type, headers, created_at, payload, attempts)
     VALUES ($1, $2, $3, $4::text::jsonb, $5::text::timestamptz, $6::text::jsonb, $7)
     RETURNING id, octet_length(payload::text)";

/// A row written: its id and the size of its payload as PostgreSQL renders it (and the relay
/// publishes it), read at the insert (the wal source deletes the rows it publishes).
type Inserted = (Uuid, i32);

async fn insert_row<C: tokio_postgres::GenericClient>(
    client: &C,
    case: &Case,
    row: &Row,
) -> Result<Inserted, tokio_postgres::Error> {
    let (aggregate_type, aggregate_id) = case.aggregate(row);
    let headers = row.headers.value.json();
    let created_at = row.created_at.value.sql();
    let payload = row.payload.value.json();
    let inserted = client
        .query_one(
            INSERT,
            &[
                &aggregate_type.value,
                &aggregate_id.value,
                &row.event_type.value,
                &headers,
                &created_at,
                &payload,
                &row.attempts,
            ],
        )
        .await?;
    Ok((inserted.get(0), inserted.get(1)))
}

/// Writes the case's rows; `None` for a row PostgreSQL refused (nesting too deep, `\u0000`).
async fn write(
    env: &Env,
    case: &Case,
    refusals: &Mutex<BTreeMap<String, usize>>,
) -> Vec<Option<Inserted>> {
    let mut client = env.client().await;
    let mut ids = Vec::with_capacity(case.rows.len());
    let refused = |e: tokio_postgres::Error| {
        let db = e
            .as_db_error()
            .unwrap_or_else(|| panic!("insert failed: {e}"));
        assert_ne!(
            db.code(),
            &SqlState::STRING_DATA_RIGHT_TRUNCATION,
            "a generated value exceeds its column: {e}"
        );
        *refusals
            .lock()
            .expect("refusals")
            .entry(db.message().to_string())
            .or_default() += 1;
    };
    if case.one_transaction {
        let mut tx = client.transaction().await.expect("begin");
        for row in &case.rows {
            let savepoint = tx.savepoint("row").await.expect("savepoint");
            match insert_row(&savepoint, case, row).await {
                Ok(id) => {
                    savepoint.commit().await.expect("release savepoint");
                    ids.push(Some(id));
                }
                Err(e) => {
                    savepoint.rollback().await.expect("rollback to savepoint");
                    refused(e);
                    ids.push(None);
                }
            }
        }
        tx.commit().await.expect("commit");
    } else {
        for row in &case.rows {
            match insert_row(&client, case, row).await {
                Ok(id) => ids.push(Some(id)),
                Err(e) => {
                    refused(e);
                    ids.push(None);
                }
            }
        }
    }
    ids
}

/// What became of one row.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Published,
    DeadLettered(String),
    /// Pending behind a dead letter of its aggregate.
    Waiting,
}

#[derive(Debug)]
struct TableRow {
    aggregate: (String, String),
    processed: bool,
    dead: bool,
    last_error: Option<String>,
}

/// Every row written, in `seq` order. With the wal source the rows written are in
/// `written_ledger` ([`Env::wal_config`]): one no longer in the table was published (deleted).
async fn table(env: &Env, source: Source) -> Vec<(Uuid, TableRow)> {
    let sql = match source {
        Source::Notify => {
            "SELECT id, aggregate_type, aggregate_id, processed_at IS NOT NULL,
                    dead_lettered_at IS NOT NULL, last_error
             FROM outbox_events ORDER BY seq"
        }
        Source::Wal => {
            "SELECT w.id, w.aggregate_type, w.aggregate_id, e.id IS NULL OR e.processed_at IS NOT NULL,
                    coalesce(e.dead_lettered_at IS NOT NULL, false), e.last_error
             FROM written_ledger w LEFT JOIN outbox_events e USING (id) ORDER BY w.seq"
        }
    };
    env.client()
        .await
        .query(sql, &[])
        .await
        .expect("read the table")
        .iter()
        .map(|r| {
            (
                r.get(0),
                TableRow {
                    aggregate: (r.get(1), r.get(2)),
                    processed: r.get(3),
                    dead: r.get(4),
                    last_error: r.get(5),
                },
            )
        })
        .collect()
}

/// The outcome of every row once the whole table has settled, `None` while it has not. Panics on
/// what may never happen at any time: a row published or dead-lettered after a dead letter of its
/// own aggregate.
fn settled(rows: &[(Uuid, TableRow)]) -> Option<HashMap<Uuid, Outcome>> {
    let mut blocked: HashMap<&(String, String), Uuid> = HashMap::new();
    let mut outcomes = HashMap::new();
    let mut done = true;
    for (id, row) in rows {
        if let Some(dead) = blocked.get(&row.aggregate) {
            assert!(
                !row.processed && !row.dead && row.last_error.is_none(),
                "row {id} was touched behind the dead letter {dead} of its aggregate {:?}: {row:?}",
                row.aggregate
            );
            outcomes.insert(*id, Outcome::Waiting);
            continue;
        }
        match (row.processed, row.dead) {
            (true, false) => {
                outcomes.insert(*id, Outcome::Published);
            }
            (false, true) => {
                blocked.insert(&row.aggregate, *id);
                outcomes.insert(
                    *id,
                    Outcome::DeadLettered(row.last_error.clone().unwrap_or_default()),
                );
            }
            (false, false) => done = false,
            (true, true) => panic!("row {id} is both processed and dead-lettered: {row:?}"),
        }
    }
    done.then_some(outcomes)
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

#[derive(Default, Debug)]
struct Tally {
    written: usize,
    published: usize,
    dead: usize,
    waiting: usize,
    clean_published: usize,
    /// Dead-letter reasons (quoted values and numbers left out), to see what the run covered.
    reasons: BTreeMap<String, usize>,
}

/// `last_error` without the values it quotes and its numbers.
fn reason(error: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    for c in error.chars() {
        if c == '"' {
            if !quoted {
                out.push('…');
            }
            quoted = !quoted;
        } else if quoted {
        } else if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out.chars().take(90).collect()
}

/// Panics on the relay's threads (named `thread_name`), seen by a hook (a panic in a task the
/// relay spawned would otherwise only end that task).
fn watch_relay_panics(thread_name: String) -> Arc<AtomicBool> {
    let seen = Arc::new(AtomicBool::new(false));
    let flag = seen.clone();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some(thread_name.as_str()) {
            flag.store(true, AtomicOrdering::SeqCst);
        }
        default(info);
    }));
    seen
}

fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{SEED_ENV}={s:?} is not a u64: {e}")),
        Err(_) => fastrand::u64(..),
    }
}

for_each_source!(blocking rows_of_any_content_are_published_or_dead_lettered);

fn rows_of_any_content_are_published_or_dead_lettered(source: Source) {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let seed = seed();
    eprintln!("arbitrary rows, source {source:?}: seed {seed} (replay with {SEED_ENV}={seed})");
    let thread_name = format!("{RELAY_THREAD}-{source:?}");
    let relay_panicked = watch_relay_panics(thread_name.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(thread_name)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let _turn = rt.block_on(testkit::heavy());
    let (env, relay) = rt.block_on(async {
        let env = Env::new().await;
        // The wal source's slot in place before the relay starts: every row is streamed.
        let mut config = env.source_config(source).await;
        config.retry.max_attempts = 2;
        config.retry.initial = Duration::from_millis(50);
        config.retry.max = Duration::from_millis(200);
        // The status query behind the gauges runs often, over whatever the rows hold.
        config.metrics.stats_interval = Duration::from_millis(200);
        let relay = env.spawn(config).await;
        (env, relay)
    });
    let started = Instant::now();
    let refusals = Mutex::new(BTreeMap::new());
    let tally = Mutex::new(Tally::default());

    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        failure_persistence: None,
        // Every case leaves its rows behind, so a smaller input would not fail on its own.
        max_shrink_iters: 0,
        ..Config::with_cases(CASES)
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let result = runner.run(&case(), |case| {
        rt.block_on(check_case(&env, source, &relay, &case, &refusals, &tally));
        assert!(
            !relay_panicked.load(AtomicOrdering::SeqCst),
            "a relay thread panicked (see above)"
        );
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, case)) => {
            panic!("source {source:?}, seed {seed}: {reason}\nfailing case: {case:#?}")
        }
        Err(TestError::Abort(reason)) => {
            panic!("source {source:?}, seed {seed}: aborted: {reason}")
        }
    }

    let tally = tally.into_inner().expect("tally");
    let refusals = refusals.into_inner().expect("refusals");
    let refused: usize = refusals.values().sum();
    eprintln!(
        "{source:?}: {} rows written in {CASES} cases, {refused} refused by PostgreSQL {refusals:?}: {} published \
         ({} clean), {} dead-lettered, {} waiting behind a dead letter; {:.1} s",
        tally.written,
        tally.published,
        tally.clean_published,
        tally.dead,
        tally.waiting,
        started.elapsed().as_secs_f64()
    );
    for (reason, n) in &tally.reasons {
        eprintln!("  dead-lettered {n:>3}: {reason}");
    }
    assert!(
        refused * 10 <= tally.written + refused,
        "PostgreSQL refused {refused} of {} rows: the generator is off",
        tally.written + refused
    );
    assert!(
        tally.published > 0 && tally.dead > 0,
        "both outcomes must occur: {tally:?}"
    );

    rt.block_on(async {
        operator_commands_work(&env).await;
        assert!(!relay.handle.is_finished(), "the relay stopped");
        relay.stop().await;
    });
    assert!(
        !relay_panicked.load(AtomicOrdering::SeqCst),
        "a relay thread panicked (see above)"
    );
}

async fn check_case(
    env: &Env,
    source: Source,
    relay: &RunningRelay,
    case: &Case,
    refusals: &Mutex<BTreeMap<String, usize>>,
    tally: &Mutex<Tally>,
) {
    let ids = write(env, case, refusals).await;
    let settled_outcomes = std::cell::RefCell::new(None);
    wait_until(
        "every row published, dead-lettered or waiting behind a dead letter",
        SETTLE,
        || {
            let settled_outcomes = &settled_outcomes;
            async move {
                assert!(!relay.handle.is_finished(), "the relay stopped");
                let outcomes = settled(&table(env, source).await);
                let done = outcomes.is_some();
                *settled_outcomes.borrow_mut() = outcomes;
                done
            }
        },
    )
    .await;
    let outcomes = settled_outcomes.into_inner().expect("settled");
    assert!(!relay.handle.is_finished(), "the relay stopped");

    let payload_bytes: HashMap<Uuid, i32> = ids.iter().flatten().copied().collect();
    let stored = env.stored_headers().await;
    let stream_ids = assert_unique(&stored);
    let by_id: HashMap<Uuid, &Stored> = stream_ids.iter().copied().zip(&stored).collect();
    // The ledger: the stream holds exactly the published rows.
    let published: HashSet<Uuid> = outcomes
        .iter()
        .filter(|(_, o)| **o == Outcome::Published)
        .map(|(id, _)| *id)
        .collect();
    let in_stream: HashSet<Uuid> = stream_ids.iter().copied().collect();
    assert_eq!(
        in_stream, published,
        "the stream holds other events than the published rows"
    );

    let mut tally = tally.lock().expect("tally");
    for (row, inserted) in case.rows.iter().zip(&ids) {
        let Some((id, _)) = inserted else { continue };
        tally.written += 1;
        let (aggregate_type, aggregate_id) = case.aggregate(row);
        match &outcomes[id] {
            Outcome::Published => {
                tally.published += 1;
                tally.clean_published += usize::from(case.is_clean(row));
                let m = by_id[id];
                let header = |name: &str| m.headers.get(name).map(String::as_str);
                let created = row.created_at.value.rfc3339();
                assert!(
                    created.is_some(),
                    "row {id} with created_at {:?} was published as {:?}",
                    row.created_at.value,
                    header("Outbox-Created-At")
                );
                assert_eq!(header("Outbox-Created-At"), created.as_deref(), "row {id}");
                assert_eq!(m.subject, format!("outbox.{}", row.event_type.value));
                assert_eq!(
                    header("Outbox-Event-Type"),
                    Some(row.event_type.value.as_str())
                );
                assert_eq!(
                    header("Outbox-Aggregate-Type"),
                    Some(aggregate_type.value.as_str()),
                    "row {id}"
                );
                assert_eq!(
                    header("Outbox-Aggregate-Id"),
                    Some(aggregate_id.value.as_str()),
                    "row {id}"
                );
                for (name, value) in row.headers.value.expected() {
                    assert_eq!(
                        header(&name),
                        Some(value.as_str()),
                        "row {id}: header {name:?}"
                    );
                }
                // The payload is published as PostgreSQL renders it.
                assert_eq!(
                    header("Nats-Msg-Size").and_then(|s| s.parse::<i32>().ok()),
                    Some(payload_bytes[id]),
                    "row {id}: payload size"
                );
            }
            Outcome::DeadLettered(error) => {
                tally.dead += 1;
                *tally.reasons.entry(reason(error)).or_default() += 1;
                assert!(
                    !error.trim().is_empty(),
                    "row {id} dead-lettered without a last_error"
                );
                assert!(
                    !case.is_clean(row),
                    "row {id}, valid in every column, was dead-lettered: {error}"
                );
            }
            Outcome::Waiting => tally.waiting += 1,
        }
    }
}

/// The operator commands read every row left behind without failing.
async fn operator_commands_work(env: &Env) {
    let dead = env.count("dead_lettered_at IS NOT NULL").await;
    let (code, out, err) = cli(
        &env.db,
        &["dead-letters", "list", "--json", "--limit", "10000"],
    );
    assert_eq!(code, Some(0), "dead-letters list --json: {err}");
    let listed: serde_json::Value = serde_json::from_str(&out).expect("dead letters as JSON");
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(usize::try_from(dead).expect("count")),
        "dead-letters list --json lists every dead letter"
    );
    let (code, out, err) = cli(&env.db, &["dead-letters", "list"]);
    assert_eq!(code, Some(0), "dead-letters list: {out}{err}");
    for args in [["status", "--json"].as_slice(), ["status"].as_slice()] {
        let (code, out, err) = cli(&env.db, args);
        assert_eq!(code, Some(0), "{args:?}: {out}{err}");
    }
}

for_each_source!(
    status_with_an_infinite_created_at_pending,
    headers_over_jetstream_64k_are_dead_lettered_at_once,
);

/// Found by the property test: `now() - min(created_at) FILTER (WHERE dead_lettered_at IS NULL)`
/// failed with "cannot subtract infinite timestamps" (PostgreSQL 16 and
/// older; 17 returns an infinite interval) while a pending row with `created_at` infinity or
/// -infinity is not dead-lettered: a row waiting behind a dead letter of its aggregate, or any such
/// row until the relay dead-letters it. Then `outbox-relay status` exits 1, and the relay's gauge
/// task fails every `stats_interval`, leaves the gauges stale and marks the database as down, so
/// `/readyz` answers 503 for as long as the row waits.
async fn status_with_an_infinite_created_at_pending(source: Source) {
    let env = Env::new().await;
    let mut config = env.source_config(source).await;
    let client = env.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', '1', 'not a subject', '{}');
             INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at)
             VALUES ('order', '1', 'order.created', '{}', 'infinity')",
        )
        .await
        .expect("insert");
    let addr = testkit::free_addr();
    config.metrics.addr = Some(addr);
    config.metrics.stats_interval = Duration::from_millis(100);
    let relay = env.spawn(config).await;
    wait_until(
        "the head dead-lettered",
        Duration::from_secs(10),
        || async { env.count("dead_lettered_at IS NOT NULL").await == 1 },
    )
    .await;
    // Some stats ticks over the waiting row.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ready = testkit::http_get(addr, "/readyz").await;
    let (code, out, err) = cli(&env.db, &["status", "--json"]);
    relay.stop().await;
    assert_eq!(code, Some(0), "status --json: {out}{err}");
    assert_eq!(ready.as_ref().map(|r| r.0), Some(200), "/readyz: {ready:?}");
}

/// JetStream stores a message's header block with a 16-bit length and refuses one over 65,535
/// bytes ("header size exceeds maximum allowed of 64k", error 10097). A row whose headers reach
/// that is dead-lettered at once, like a payload over max_payload; one byte less is published.
async fn headers_over_jetstream_64k_are_dead_lettered_at_once(source: Source) {
    let env = Env::new().await;
    let mut config = env.source_config(source).await;
    // The header block as NATS writes it: "NATS/1.0\r\n", "Name: value\r\n" per header, "\r\n".
    let line = |name: &str, value_len: usize| name.len() + ": ".len() + value_len + "\r\n".len();
    let relay_headers = line("Nats-Msg-Id", 36)
        + line("Outbox-Event-Id", 36)
        + line("Outbox-Aggregate-Type", "order".len())
        + line("Outbox-Aggregate-Id", "big".len())
        + line("Outbox-Event-Type", "order.big".len())
        + line("Outbox-Created-At", "2024-01-01T00:00:00.000000Z".len())
        // Each row names its own transaction id of 7 digits (below): one event each.
        + line("Outbox-Transaction-Id", "1000000".len())
        + line("Outbox-Transaction-Index", 1)
        + line("Outbox-Transaction-Events", 1);
    let value_len_for = |total: usize| {
        total - "NATS/1.0\r\n".len() - relay_headers - line("X-Big", 0) - "\r\n".len()
    };
    let client = env.client().await;
    let insert = |aggregate: &'static str, value_len: usize, txid: &'static str| {
        let client = &client;
        async move {
            let headers = format!("{{\"X-Big\": \"{}\"}}", "v".repeat(value_len));
            let id: Uuid = client
                .query_one(
                    "INSERT INTO outbox_events
                         (aggregate_type, aggregate_id, event_type, payload, headers, created_at,
                          txid)
                     VALUES ('order', $1, 'order.big', '{}', $2::text::jsonb,
                             '2024-01-01 00:00:00+00', $3::text::xid8)
                     RETURNING id",
                    &[&aggregate, &headers, &txid],
                )
                .await
                .expect("insert")
                .get(0);
            id
        }
    };
    let over = insert("big", value_len_for(65_536), "1000000").await;
    let fits = insert("fit", value_len_for(65_535), "1000001").await; // "fit" is as long as "big"
    env.insert_sql(1, "big", "order.after").await;
    config.retry.max_attempts = 10;
    config.retry.initial = Duration::from_secs(1);
    let relay = env.spawn(config).await;
    // One dead-lettered, one published (the wal source deletes it): counted where both sources
    // show it.
    wait_until("both rows settled", Duration::from_secs(10), || async {
        env.count("dead_lettered_at IS NOT NULL").await == 1 && env.stream_len().await == 1
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
