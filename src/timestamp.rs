//! PostgreSQL timestamps as the relay reads them: any value a column can hold, including dates
//! before 1970, years past 9999 or before year 1, and `±infinity`, without panicking. Rows are
//! written by raw SQL too, so none of these may stop the relay.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::format_description::FormatItem;
use time::macros::format_description;
use time::OffsetDateTime;
use tokio_postgres::types::{FromSql, Type};

/// Microseconds between 1970-01-01 and PostgreSQL's epoch, 2000-01-01 (UTC).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// RFC 3339 with microseconds, as the `Outbox-Created-At` header has always been written.
const RFC3339_MICROS: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");

/// A `timestamptz` (or `timestamp`, read as UTC) exactly as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    /// Microseconds since 2000-01-01 UTC; `i64::MAX` is `infinity`, `i64::MIN` `-infinity`.
    pg_micros: i64,
}

impl Timestamp {
    /// The current time.
    pub fn now() -> Timestamp {
        Timestamp::from(SystemTime::now())
    }

    /// Not `infinity` or `-infinity`.
    pub fn is_finite(self) -> bool {
        self.pg_micros != i64::MAX && self.pg_micros != i64::MIN
    }

    fn datetime(self) -> Option<OffsetDateTime> {
        if !self.is_finite() {
            return None;
        }
        let unix_micros = i128::from(self.pg_micros) + i128::from(PG_EPOCH_OFFSET_MICROS);
        OffsetDateTime::from_unix_timestamp_nanos(unix_micros * 1000).ok()
    }

    /// RFC 3339 (`1969-07-20T20:17:40.500000Z`), or why the value is not one: RFC 3339 has four
    /// digit years (0000 to 9999) and no infinities.
    pub fn rfc3339(self) -> Result<String, String> {
        match self.pg_micros {
            i64::MAX => return Err("infinity is not a date".into()),
            i64::MIN => return Err("-infinity is not a date".into()),
            _ => {}
        }
        let dt = self
            .datetime()
            .ok_or_else(|| "out of the range of dates".to_string())?;
        if !(0..=9999).contains(&dt.year()) {
            return Err(format!(
                "year {} is outside RFC 3339's 0000 to 9999",
                dt.year()
            ));
        }
        dt.format(RFC3339_MICROS)
            .map_err(|e| format!("cannot be formatted: {e}"))
    }

    /// The same instant as a `SystemTime` (none for the infinities).
    pub fn system_time(self) -> Option<SystemTime> {
        if !self.is_finite() {
            return None;
        }
        let unix = self.pg_micros.checked_add(PG_EPOCH_OFFSET_MICROS)?;
        if unix >= 0 {
            UNIX_EPOCH.checked_add(Duration::from_micros(unix.unsigned_abs()))
        } else {
            UNIX_EPOCH.checked_sub(Duration::from_micros(unix.unsigned_abs()))
        }
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        let unix = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN, |m| -m),
        };
        Timestamp {
            pg_micros: unix.saturating_sub(PG_EPOCH_OFFSET_MICROS),
        }
    }
}

/// RFC 3339 where the value is one; otherwise `infinity`, `-infinity`, or an ISO 8601 date with an
/// expanded year (`-0099-01-01T00:00:00.000000Z` is 100 BC).
impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.pg_micros, self.rfc3339()) {
            (_, Ok(s)) => f.write_str(&s),
            (i64::MAX, _) => f.write_str("infinity"),
            (i64::MIN, _) => f.write_str("-infinity"),
            _ => match self.datetime() {
                Some(dt) => write!(
                    f,
                    "{:+05}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
                    dt.year(),
                    u8::from(dt.month()),
                    dt.day(),
                    dt.hour(),
                    dt.minute(),
                    dt.second(),
                    dt.microsecond()
                ),
                None => write!(f, "{} microseconds from 2000-01-01", self.pg_micros),
            },
        }
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'a> FromSql<'a> for Timestamp {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        let bytes: [u8; 8] = raw
            .try_into()
            .map_err(|_| format!("a timestamp is 8 bytes, got {}", raw.len()))?;
        Ok(Timestamp {
            pg_micros: i64::from_be_bytes(bytes),
        })
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::TIMESTAMPTZ | Type::TIMESTAMP)
    }
}

impl Timestamp {
    /// A `timestamptz` as PostgreSQL writes it as text with `DateStyle` ISO (the default), as
    /// logical replication sends it: `2026-12-05 11:44:54.123456+00`, an offset of hours and
    /// optionally minutes and seconds, or `infinity` / `-infinity`. `None` for any other form
    /// (another `DateStyle`, a BC date, a year past 9999): the caller reads the value otherwise.
    pub(crate) fn parse_iso(text: &str) -> Option<Timestamp> {
        match text {
            "infinity" => {
                return Some(Timestamp {
                    pg_micros: i64::MAX,
                })
            }
            "-infinity" => {
                return Some(Timestamp {
                    pg_micros: i64::MIN,
                })
            }
            _ => {}
        }
        let b = text.as_bytes();
        let num = |from: usize, len: usize| -> Option<u32> {
            let digits = b.get(from..from.checked_add(len)?)?;
            digits.iter().try_fold(0u32, |n, d| {
                d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
            })
        };
        let sep = |at: usize, c: u8| b.get(at) == Some(&c);
        if !(sep(4, b'-') && sep(7, b'-') && sep(10, b' ') && sep(13, b':') && sep(16, b':')) {
            return None;
        }
        let year = i32::try_from(num(0, 4)?).ok()?;
        let month = time::Month::try_from(u8::try_from(num(5, 2)?).ok()?).ok()?;
        let date = time::Date::from_calendar_date(year, month, u8::try_from(num(8, 2)?).ok()?);
        let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
        let mut at = 19;
        let mut micros = 0u32;
        if sep(at, b'.') {
            let digits = b[at + 1..]
                .iter()
                .take_while(|d| d.is_ascii_digit())
                .count();
            if !(1..=6).contains(&digits) {
                return None;
            }
            micros = num(at + 1, digits)? * 10u32.pow(6 - u32::try_from(digits).ok()?);
            at += 1 + digits;
        }
        let sign: i32 = match b.get(at) {
            Some(b'+') => 1,
            Some(b'-') => -1,
            _ => return None,
        };
        let mut offset = [num(at + 1, 2)?, 0, 0];
        at += 3;
        for part in offset.iter_mut().skip(1) {
            if !sep(at, b':') {
                break;
            }
            *part = num(at + 1, 2)?;
            at += 3;
        }
        if at != b.len() {
            return None;
        }
        let time = time::Time::from_hms_micro(
            u8::try_from(hour).ok()?,
            u8::try_from(minute).ok()?,
            u8::try_from(second).ok()?,
            micros,
        )
        .ok()?;
        let offset_seconds =
            sign * i32::try_from(offset[0] * 3600 + offset[1] * 60 + offset[2]).ok()?;
        let utc = date
            .ok()?
            .with_time(time)
            .assume_utc()
            .unix_timestamp_nanos()
            / 1000
            - i128::from(offset_seconds) * 1_000_000;
        let unix = i64::try_from(utc).ok()?;
        Some(Timestamp {
            pg_micros: unix.checked_sub(PG_EPOCH_OFFSET_MICROS)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_text_as_logical_replication_sends_it() {
        let cases: &[(&str, Option<i64>)] = &[
            ("2000-01-01 00:00:00+00", Some(0)),
            ("2000-01-01 00:00:00.5+00", Some(500_000)),
            ("2000-01-01 00:00:00.000001+00", Some(1)),
            ("2000-01-01 01:00:00+01", Some(0)),
            ("1999-12-31 18:30:00-05:30", Some(0)),
            ("2000-01-01 00:00:01+00:00:01", Some(0)),
            ("1969-07-20 20:17:40.5+00", Some(-960_867_739_500_000)),
            ("infinity", Some(i64::MAX)),
            ("-infinity", Some(i64::MIN)),
            // Other forms are read from the table instead.
            ("0099-01-01 00:00:00+00 BC", None),
            ("10000-01-01 00:00:00+00", None),
            ("Sat Dec 05 11:44:54 2026 UTC", None),
            ("2000-01-01 00:00:00.1234567+00", None),
            ("2000-01-01 00:00:00", None),
            ("2000-02-30 00:00:00+00", None),
            ("2000-01-01 24:00:00+00", None),
            ("", None),
            ("2000-01-01 00:00:00+0", None),
        ];
        for (text, expected) in cases {
            assert_eq!(
                Timestamp::parse_iso(text).map(|t| t.pg_micros),
                *expected,
                "{text}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn iso_text_never_panics(text in "\\PC{0,40}") {
            let _ = Timestamp::parse_iso(&text);
        }
    }

    fn at(pg_micros: i64) -> Timestamp {
        Timestamp { pg_micros }
    }

    fn at_date(year: i32) -> Timestamp {
        let date = time::Date::from_calendar_date(year, time::Month::January, 1).expect("date");
        let unix = date.midnight().assume_utc().unix_timestamp_nanos() / 1000;
        at(i64::try_from(unix).expect("micros") - PG_EPOCH_OFFSET_MICROS)
    }

    #[test]
    fn dates_before_1970_are_dates() {
        let moon = Timestamp::from(UNIX_EPOCH - Duration::from_millis(14_182_939_500));
        assert_eq!(moon.rfc3339().as_deref(), Ok("1969-07-20T20:17:40.500000Z"));
        assert_eq!(
            Timestamp::from(UNIX_EPOCH).rfc3339().as_deref(),
            Ok("1970-01-01T00:00:00.000000Z")
        );
        let before = UNIX_EPOCH - Duration::from_micros(500_000);
        assert_eq!(Timestamp::from(before).system_time(), Some(before));
        assert_eq!(
            at_date(44).rfc3339().as_deref(),
            Ok("0044-01-01T00:00:00.000000Z")
        );
    }

    #[test]
    fn infinities_and_far_years_are_no_rfc3339_dates() {
        assert!(at(i64::MAX).rfc3339().is_err());
        assert!(at(i64::MIN).rfc3339().is_err());
        assert_eq!(at(i64::MAX).to_string(), "infinity");
        assert_eq!(at(i64::MIN).to_string(), "-infinity");
        assert_eq!(at(i64::MAX).system_time(), None);
        let bc = at_date(-99); // 100 BC
        assert!(bc.rfc3339().is_err(), "{bc}");
        assert_eq!(bc.to_string(), "-0099-01-01T00:00:00.000000Z");
        let far = at_date(10_000);
        assert!(far.rfc3339().unwrap_err().contains("10000"));
        assert_eq!(far.to_string(), "+10000-01-01T00:00:00.000000Z");
    }
}
