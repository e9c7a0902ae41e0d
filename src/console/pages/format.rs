//! Values as the pages show them: numbers with separators, ages, sizes, times with their age by
//! the database's clock, query strings.

use maud::{html, Markup};

use crate::timestamp::Timestamp;

/// `n` with thousands separators.
pub(super) fn num(n: impl Into<i128>) -> String {
    let n: i128 = n.into();
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

pub(super) fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

pub(super) fn bytes(b: f64) -> String {
    let b = b.max(0.0);
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `?a=b&c=d` of `pairs` (empty without any).
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let mut s = url::form_urlencoded::Serializer::for_suffix(String::from("?"), 1);
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

/// `t` as its exact UTC time and how long ago that was by the database's clock (`now`).
pub(super) fn when(t: &Timestamp, now: &Timestamp) -> Markup {
    let ago = match (t.system_time(), now.system_time()) {
        (Some(t), Some(now)) => Some(match now.duration_since(t) {
            Ok(ago) => format!("{} ago", age(ago.as_secs_f64())),
            Err(ahead) => format!("in {}", age(ahead.duration().as_secs_f64())),
        }),
        _ => None,
    };
    html! {
        (t)
        @if let Some(ago) = ago {
            " " span class="age" { (ago) }
        }
    }
}

pub(super) fn opt_when(t: Option<&Timestamp>, now: &Timestamp) -> Markup {
    match t {
        Some(t) => when(t, now),
        None => html! { "–" },
    }
}
