//! The dead-letter list's filter ([`Filter`]), its order ([`Sort`]) and a row's place in it
//! ([`Key`]), as links and forms carry them, and the word a cause filter searches for first.

use bytes::BytesMut;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

/// The filter of the dead-letter list, which a bulk action applies as it is: every field `None`
/// matches every dead letter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    pub(crate) event_type: Option<String>,
    pub(crate) aggregate_type: Option<String>,
    pub(crate) aggregate_id: Option<String>,
    /// Text somewhere in `last_error`, in any case.
    pub(crate) error: Option<String>,
    /// Dead-lettered at or after: as typed ([`read_time`]); the statements get it resolved to an
    /// instant with its zone (`actions::resolve`).
    pub(crate) since: Option<String>,
    /// Dead-lettered before (likewise).
    pub(crate) until: Option<String>,
    /// The cause (`error_cause.sql`: the error text without what varies), exactly.
    pub(crate) cause: Option<String>,
}

impl Filter {
    /// The form fields and query parameters, by name.
    pub(crate) const FIELDS: [&'static str; 7] = [
        "event_type",
        "aggregate_type",
        "aggregate_id",
        "error",
        "since",
        "until",
        "cause",
    ];

    /// Each field's cap, in characters: the column's own for ids and types; enough for any error
    /// text worth searching and any timestamp. A longer value is refused (a 400 naming the
    /// field) rather than searched for and echoed into pages and redirects.
    pub(crate) const CAPS: [usize; 7] = [100, 255, 255, 1_000, 100, 100, 300];

    /// The first field over its cap ([`Filter::CAPS`]), with that cap.
    pub(crate) fn over_cap(&self) -> Option<(&'static str, usize)> {
        Filter::FIELDS
            .iter()
            .zip(Filter::CAPS)
            .zip(self.values())
            .find(|((_, cap), value)| value.is_some_and(|v| v.chars().count() > *cap))
            .map(|((field, cap), _)| (*field, cap))
    }

    /// From form or query pairs; empty values match anything.
    pub(crate) fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut f = Filter::default();
        for (k, v) in pairs {
            let v = v.trim();
            let value = (!v.is_empty()).then(|| v.to_string());
            match k {
                "event_type" => f.event_type = value,
                "aggregate_type" => f.aggregate_type = value,
                "aggregate_id" => f.aggregate_id = value,
                "error" => f.error = value,
                "since" => f.since = value,
                "until" => f.until = value,
                "cause" => f.cause = value,
                _ => {}
            }
        }
        f
    }

    /// (name, value) of the fields set, in [`Filter::FIELDS`] order.
    pub(crate) fn pairs(&self) -> Vec<(&'static str, &str)> {
        Filter::FIELDS
            .iter()
            .zip(self.values())
            .filter_map(|(k, v)| v.map(|v| (*k, v)))
            .collect()
    }

    /// Every field, set or not, in [`Filter::FIELDS`] order.
    pub(crate) fn values(&self) -> [Option<&str>; 7] {
        [
            self.event_type.as_deref(),
            self.aggregate_type.as_deref(),
            self.aggregate_id.as_deref(),
            self.error.as_deref(),
            self.since.as_deref(),
            self.until.as_deref(),
            self.cause.as_deref(),
        ]
    }

    /// The field `name` unset.
    pub(crate) fn clear(&mut self, name: &str) {
        let field = match name {
            "event_type" => &mut self.event_type,
            "aggregate_type" => &mut self.aggregate_type,
            "aggregate_id" => &mut self.aggregate_id,
            "error" => &mut self.error,
            "since" => &mut self.since,
            "until" => &mut self.until,
            "cause" => &mut self.cause,
            _ => return,
        };
        *field = None;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.values().iter().all(Option::is_none)
    }

    /// `$1`..`$8` of the filtered statements: the fields, then a word every error of the cause
    /// contains (see [`Filter::cause_word`]).
    pub(super) fn params(&self) -> Vec<Option<&str>> {
        let mut params = self.values().to_vec();
        params.push(self.cause.as_deref().map(cause_word));
        params
    }
}

/// A time of the filter ("dead since", "dead before") as typed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TimeText<'a> {
    /// That many seconds before the database's clock: `10 minutes ago`, `-5 min`, `-2h`.
    Ago(f64),
    /// A time of day alone, UTC, in seconds after midnight: `04:29`, `04:29:30` (the last one).
    OfDay(u32),
    /// Anything else, for PostgreSQL to read as a timestamptz (without a zone: UTC).
    Text(&'a str),
}

/// How [`TimeText`] reads `text`: a relative time (a number and a unit, s, min, h, d or w and
/// their longer names, after `-` or before `ago`), a time of day (`HH:MM[:SS]`), or else text.
pub(crate) fn read_time(text: &str) -> TimeText<'_> {
    let t = text.trim();
    if let Some(ago) = relative(t) {
        return TimeText::Ago(ago);
    }
    if let Some(of_day) = time_of_day(t) {
        return TimeText::OfDay(of_day);
    }
    TimeText::Text(t)
}

fn relative(t: &str) -> Option<f64> {
    let lower = t.to_ascii_lowercase();
    let amount = match (lower.strip_prefix('-'), lower.strip_suffix("ago")) {
        (Some(rest), None) => rest.trim(),
        (None, Some(rest)) => rest.trim(),
        _ => return None,
    };
    let split = amount
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(amount.len());
    let (number, unit) = amount.split_at(split);
    let number: f64 = number.parse().ok().filter(|n: &f64| n.is_finite())?;
    let seconds = match unit.trim() {
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86_400.0,
        "w" | "week" | "weeks" => 604_800.0,
        _ => return None,
    };
    // Within a century: further back is a typo, and an interval that PostgreSQL cannot add.
    Some(number * seconds).filter(|s| *s <= 100.0 * 365.0 * 86_400.0)
}

fn time_of_day(t: &str) -> Option<u32> {
    let mut parts = t.split(':');
    let mut field = |max: u32| -> Option<u32> {
        let p = parts.next()?;
        (!p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
            .filter(|v| *v <= max)
    };
    let (h, m) = (field(23)?, field(59)?);
    let s = match parts.next() {
        None => 0,
        Some(p) if p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse().ok().filter(|s| *s <= 59)?
        }
        Some(_) => return None,
    };
    parts.next().is_none().then_some(h * 3600 + m * 60 + s)
}

/// The cause of a dead letter without an error text (`error_cause.sql`).
pub(crate) const NO_ERROR_TEXT: &str = "(no error text)";

/// The longest word of `cause` outside its placeholders (`error_cause.sql`: `<id>`, `<n>`,
/// `"..."`, white space made one space): a substring of every error text of that cause, which the
/// filter searches for before it computes a row's cause. Empty when the cause has none.
pub(crate) fn cause_word(cause: &str) -> &str {
    // Rows without an error text: there is no word to look for.
    if cause == NO_ERROR_TEXT {
        return "";
    }
    let words: Vec<&str> = cause.split(['<', '>', '"', ' ']).collect();
    // A cause cut at its 300 characters may end inside a placeholder (`<i`): not a word.
    let whole = match cause.chars().count() >= 300 {
        true => &words[..words.len().saturating_sub(1)],
        false => &words[..],
    };
    whole
        .iter()
        .filter(|w| !matches!(**w, "id" | "n" | "..."))
        .max_by_key(|w| w.len())
        .copied()
        .unwrap_or("")
}

/// The order of the dead-letter list (its `sort` parameter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Sort {
    /// By seq, the order the events were written in (the default).
    #[default]
    Seq,
    /// By the time they were dead-lettered, then by seq.
    Dead,
}

impl Sort {
    /// Every order, as the list offers them.
    pub(crate) const ALL: [Sort; 2] = [Sort::Seq, Sort::Dead];

    /// From the `sort` parameter: `seq` or `dead`; empty or absent, the default.
    pub(crate) fn parse(value: Option<&str>) -> Option<Sort> {
        match value.map(str::trim).unwrap_or("") {
            "" | "seq" => Some(Sort::Seq),
            "dead" => Some(Sort::Dead),
            _ => None,
        }
    }

    /// Its value of the `sort` parameter.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Sort::Seq => "seq",
            Sort::Dead => "dead",
        }
    }

    /// `("sort", name)` for a link that keeps this order; none for the default, whose links stay
    /// as they were before there was a choice.
    pub(crate) fn pair(self) -> Option<(&'static str, &'static str)> {
        (self != Sort::Seq).then_some(("sort", self.name()))
    }
}

/// A `timestamptz` exactly as PostgreSQL stores it: microseconds from 2000-01-01 UTC, `i64::MIN`
/// and `i64::MAX` being `-infinity` and `infinity`. Read from a row and sent back unconverted, so
/// that the list's keyset by time dead compares exactly what the rows hold, whatever they hold
/// (a value written by raw SQL may be any of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored(pub(crate) i64);

impl<'a> FromSql<'a> for Stored {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 8] = raw
            .try_into()
            .map_err(|_| format!("a timestamp is 8 bytes, got {}", raw.len()))?;
        Ok(Stored(i64::from_be_bytes(bytes)))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }
}

impl ToSql for Stored {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(&self.0.to_be_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }

    to_sql_checked!();
}

/// A row's place in the list's order: its seq and, by time dead, its `dead_lettered_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) dead: Stored,
    pub(crate) seq: i64,
}

impl Key {
    /// Before every row, in either order: where the first page starts.
    pub(crate) const START: Key = Key {
        dead: Stored(i64::MIN),
        seq: i64::MIN,
    };

    /// As a link's `after` or `before` in the order `sort`: the seq by seq; by time dead, the
    /// time as stored and the seq, `MICROSECONDS_SEQ` (exact, whatever the time).
    pub(crate) fn param(self, sort: Sort) -> String {
        match sort {
            Sort::Seq => self.seq.to_string(),
            Sort::Dead => format!("{}_{}", self.dead.0, self.seq),
        }
    }

    /// From a link's `after` or `before` ([`Key::param`]).
    pub(crate) fn parse(value: &str, sort: Sort) -> Option<Key> {
        match sort {
            Sort::Seq => value.parse().ok().map(|seq| Key {
                dead: Stored(i64::MIN),
                seq,
            }),
            Sort::Dead => {
                let (dead, seq) = value.split_once('_')?;
                Some(Key {
                    dead: Stored(dead.parse().ok()?),
                    seq: seq.parse().ok()?,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_word_searched_for_is_the_causes_longest_outside_its_placeholders() {
        use super::cause_word;
        let cause = r#"message <id> of <n> bytes is over the server's max_payload (<n>) for "...""#;
        assert_eq!(cause_word(cause), "max_payload");
        assert_eq!(cause_word("<n> <id>"), "");
        assert_eq!(cause_word(""), "");
        assert_eq!(cause_word(super::NO_ERROR_TEXT), "");
        assert_eq!(cause_word("utf<n>: bad byte"), "byte");
        let cut = format!("{} <i", "a".repeat(296));
        assert_eq!(cause_word(&cut), "a".repeat(296));
        let cut = format!("{} <i", "ab ".repeat(99));
        assert_eq!(cause_word(&cut), "ab", "not the cut placeholder");
    }

    use super::*;

    #[test]
    fn times_read_relative_of_day_or_as_text() {
        for (typed, seconds) in [
            ("10 minutes ago", 600.0),
            ("10 min ago", 600.0),
            ("10min ago", 600.0),
            ("-5 min", 300.0),
            ("-5min", 300.0),
            ("-5m", 300.0),
            ("-0.5 h", 1800.0),
            ("2 Hours Ago", 7200.0),
            ("-1 day", 86_400.0),
            ("-1w", 604_800.0),
            ("30 s ago", 30.0),
        ] {
            assert_eq!(read_time(typed), TimeText::Ago(seconds), "{typed}");
        }
        assert_eq!(read_time("04:29"), TimeText::OfDay(4 * 3600 + 29 * 60));
        assert_eq!(
            read_time(" 4:29:30 "),
            TimeText::OfDay(4 * 3600 + 29 * 60 + 30)
        );
        assert_eq!(read_time("00:00"), TimeText::OfDay(0));
        for text in [
            "2026-12-07 04:29:00",
            "2026-12-07T04:29:00Z",
            "25:00",
            "04:60",
            "04:29:3",
            "4:29:30:1",
            "-5 parsecs",
            "5 min",
            "- min",
            "-1e9 d",
            "-NaN s",
            "yesterday",
        ] {
            assert_eq!(read_time(text), TimeText::Text(text), "{text}");
        }
    }

    #[test]
    fn empty_fields_match_anything() {
        let f = Filter::from_pairs([("event_type", " order.created "), ("error", ""), ("x", "y")]);
        assert_eq!(f.event_type.as_deref(), Some("order.created"));
        assert_eq!(f.error, None);
        assert_eq!(f.pairs(), vec![("event_type", "order.created")]);
        assert!(!f.is_empty());
        assert!(Filter::from_pairs([("since", "  ")]).is_empty());
    }

    #[test]
    fn sorts_and_places_read_back_what_links_write() {
        assert_eq!(Sort::parse(None), Some(Sort::Seq));
        assert_eq!(Sort::parse(Some("")), Some(Sort::Seq));
        assert_eq!(Sort::parse(Some("seq")), Some(Sort::Seq));
        assert_eq!(Sort::parse(Some("dead")), Some(Sort::Dead));
        assert_eq!(Sort::parse(Some("Dead")), None);
        assert_eq!(Sort::parse(Some("newest")), None);
        for sort in Sort::ALL {
            assert_eq!(Sort::parse(Some(sort.name())), Some(sort));
        }
        assert_eq!(
            Sort::Seq.pair(),
            None,
            "the default's links stay as they were"
        );
        assert_eq!(Sort::Dead.pair(), Some(("sort", "dead")));

        let key = Key {
            dead: Stored(851_234_567_890_123),
            seq: 42,
        };
        assert_eq!(key.param(Sort::Seq), "42");
        assert_eq!(key.param(Sort::Dead), "851234567890123_42");
        assert_eq!(Key::parse("851234567890123_42", Sort::Dead), Some(key));
        assert_eq!(Key::parse("42", Sort::Seq).map(|k| k.seq), Some(42));
        for key in [
            Key::START,
            Key {
                dead: Stored(i64::MAX),
                seq: 7,
            },
            Key {
                dead: Stored(-5),
                seq: 1,
            },
        ] {
            assert_eq!(Key::parse(&key.param(Sort::Dead), Sort::Dead), Some(key));
        }
        assert_eq!(
            Key::parse(&Key::START.param(Sort::Seq), Sort::Seq),
            Some(Key::START)
        );
        for bad in ["", "42", "_42", "1_", "x_1", "1_2_3"] {
            assert_eq!(Key::parse(bad, Sort::Dead), None, "{bad:?}");
        }
        assert_eq!(Key::parse("1_2", Sort::Seq), None);
    }
}
