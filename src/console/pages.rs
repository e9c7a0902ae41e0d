//! The console's HTML, rendered on the server. Every value from the database or the request goes
//! through [`esc`]: a payload, header, error text or aggregate id holding markup, quotes or
//! control characters shows as text, in element content and in attributes alike.

use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::Html;
use uuid::Uuid;

use super::actions::{Action, Overview, BLOCKED_COUNTED, CAUSES_LOOKED, TOTAL_COUNTED};
use super::auth::Identity;
use super::bulk::JobState;
use super::queries::{Cause, Detail, Filter, Follower, ListedDeadLetter, PerMinute, ReportedRelay};
use super::App;
use crate::timestamp::Timestamp;

/// The stylesheet (served at `/static/console.css`; the policy allows no inline style).
pub(crate) const CSS: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:center}
header a{color:#cfe0ff;text-decoration:none}header .ro{color:#ffd27a}
header form{margin-left:auto}main{padding:1em 1.2em;max-width:1200px}
h1{font-size:1.4em;margin:.2em 0 .6em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border:1px solid #dde1e7;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#eef1f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:1em;flex-wrap:wrap}.card{background:#fff;border:1px solid #dde1e7;padding:.6em 1em;min-width:9em}
.card b{display:block;font-size:1.6em}.warn b{color:#b3261e}
pre{background:#fff;border:1px solid #dde1e7;padding:.6em;white-space:pre-wrap;word-break:break-all}
.err{color:#b3261e;white-space:pre-wrap;overflow-wrap:anywhere}td.t{white-space:nowrap}
form.filter{display:flex;gap:.6em;flex-wrap:wrap;align-items:end;margin-bottom:1em}
form.filter label{display:flex;flex-direction:column;font-size:.85em}
.notice{background:#e5f4e8;border:1px solid #9bd1a5;padding:.5em 1em;margin-bottom:1em}
.problem{background:#fbe9e7;border:1px solid #e6a39b;padding:.5em 1em;margin-bottom:1em}
.actions{display:flex;gap:.6em;margin:.6em 0}button{cursor:pointer}
button.danger{background:#b3261e;color:#fff;border:0;padding:.35em .9em}
.bar{fill:#3d6fd6}.dead{fill:#b3261e}.axis{stroke:#99a}.grid{stroke:#e3e6ea}svg text{font-size:10px;fill:#556}
svg .legend-published{fill:#3d6fd6}svg .legend-dead{fill:#b3261e}
.login{max-width:26em;margin:12vh auto;background:#fff;border:1px solid #dde1e7;padding:1.2em 1.6em}
.login label{display:flex;flex-direction:column;gap:.3em;margin:.6em 0}.login input{padding:.4em}
.age{color:#667;font-size:.85em}tr.stale td{color:#b3261e}.source{color:#556;font-size:.85em}input.wrong{border:2px solid #b3261e}.big{background:#fff8e1;border:1px solid #e8cf7a;padding:.4em .8em}
";

/// `s` as HTML text (content or attribute value): markup and quotes escaped, control characters
/// (but newline and tab) shown as `\u{..}`.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            c if crate::text::is_escaped(c) => {
                let _ = crate::text::write_escape(&mut out, c);
            }
            c => out.push(c),
        }
    }
    out
}

/// `n` with thousands separators.
fn num(n: impl Into<i128>) -> String {
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

fn ts(t: &Timestamp) -> String {
    esc(&t.to_string())
}

fn opt_ts(t: Option<&Timestamp>) -> String {
    t.map(ts).unwrap_or_else(|| "–".into())
}

/// `t` as its exact UTC time and how long ago that was by the database's clock (`now`).
fn when(t: &Timestamp, now: &Timestamp) -> String {
    let exact = ts(t);
    let (Some(t), Some(now)) = (t.system_time(), now.system_time()) else {
        return exact;
    };
    match now.duration_since(t) {
        Ok(ago) => format!(
            r#"{exact} <span class="age">{} ago</span>"#,
            age(ago.as_secs_f64())
        ),
        Err(ahead) => format!(
            r#"{exact} <span class="age">in {}</span>"#,
            age(ahead.duration().as_secs_f64())
        ),
    }
}

fn opt_when(t: Option<&Timestamp>, now: &Timestamp) -> String {
    t.map(|t| when(t, now)).unwrap_or_else(|| "–".into())
}

fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

fn bytes(b: f64) -> String {
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

fn csrf_field(who: &Identity) -> String {
    format!(
        r#"<input type="hidden" name="csrf" value="{}">"#,
        esc(who.csrf())
    )
}

fn hidden(name: &str, value: &str) -> String {
    format!(
        r#"<input type="hidden" name="{}" value="{}">"#,
        esc(name),
        esc(value)
    )
}

fn filter_fields(filter: &Filter) -> String {
    filter.pairs().iter().map(|(k, v)| hidden(k, v)).collect()
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

/// A whole page. `refresh`: reload every that many seconds (no script needed).
fn layout(
    app: &App,
    who: Option<&Identity>,
    title: &str,
    refresh: Option<u32>,
    body: &str,
) -> Html<String> {
    let mut out = String::with_capacity(body.len() + 2048);
    out.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str(r#"<meta name="viewport" content="width=device-width, initial-scale=1">"#);
    if let Some(s) = refresh {
        let _ = write!(out, r#"<meta http-equiv="refresh" content="{s}">"#);
    }
    let _ = write!(out, r#"<title>{} · outbox console</title>"#, esc(title));
    // Every page, the login and the refusals too (the stylesheet is served without a session).
    let _ = write!(
        out,
        r#"<link rel="stylesheet" href="{}">"#,
        esc(&app.href("/static/console.css"))
    );
    out.push_str("</head><body>");
    if let Some(who) = who {
        let _ = write!(
            out,
            r#"<header><strong>outbox console</strong><a href="{}">Overview</a><a href="{}">Dead letters</a>{}"#,
            esc(&app.href("/")),
            esc(&app.href("/dead-letters")),
            if app.config.read_only {
                r#"<span class="ro">read-only</span>"#
            } else {
                ""
            }
        );
        if matches!(who.caller, super::auth::Caller::Session { .. }) {
            let _ = write!(
                out,
                r#"<form method="post" action="{}">{}<button>Log out</button></form>"#,
                esc(&app.href("/logout")),
                csrf_field(who)
            );
        }
        out.push_str("</header>");
    }
    out.push_str("<main>");
    out.push_str(body);
    out.push_str("</main></body></html>");
    Html(out)
}

/// The login form (what a request without the token gets, with its 401).
pub(crate) fn login(app: &App, wrong: bool) -> Html<String> {
    let body = format!(
        r#"<div class="login"><h1>outbox console</h1>{}<form method="post" action="{}"><label>Token <input type="password" name="token" id="token" autocomplete="current-password" autofocus required></label> <button id="login">Log in</button></form></div>"#,
        if wrong {
            r#"<p class="problem">Wrong token.</p>"#
        } else {
            ""
        },
        esc(&app.href("/login"))
    );
    layout(app, None, "Log in", None, &body)
}

/// A refusal: the status and one sentence, nothing of the outbox.
pub(crate) fn refusal(app: &App, code: StatusCode, message: &str) -> Html<String> {
    let body = format!(
        r#"<h1>{}</h1><p class="problem">{}</p>"#,
        code.as_u16(),
        esc(message)
    );
    layout(
        app,
        None,
        code.canonical_reason().unwrap_or("refused"),
        None,
        &body,
    )
}

/// A failure while serving a logged-in caller.
pub(crate) fn error(app: &App, who: &Identity, code: StatusCode, message: &str) -> Html<String> {
    let body = format!(
        r#"<h1>{}</h1><p class="problem">{}</p>"#,
        esc(code.canonical_reason().unwrap_or("error")),
        esc(message)
    );
    layout(app, Some(who), "Error", None, &body)
}

fn card(label: &str, value: &str, warn: bool) -> String {
    format!(
        r#"<div class="card{}"><b>{}</b>{}</div>"#,
        if warn { " warn" } else { "" },
        value,
        esc(label)
    )
}

/// The last hour, a minute a bar: published (blue) and dead-lettered (red) on one scale, with its
/// axis in events per minute and the rate of the last whole minute.
fn chart(m: &PerMinute) -> String {
    let top = m
        .published
        .iter()
        .chain(&m.dead_lettered)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    // `h` the bars' height, below a margin of `pad` for the top label.
    let (left, w, h, pad) = (56, 600, 120, 8);
    let mut out = format!(
        r#"<p id="rate">Now: <strong>{}</strong> published/min, <strong>{}</strong> dead-lettered/min (the last whole minute)</p><svg id="chart" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="events published and dead-lettered per minute, last hour">"#,
        num(m.published[58]),
        num(m.dead_lettered[58]),
        left + w,
        h + pad + 30,
        left + w,
        h + pad + 30
    );
    // The y axis: 0, half and the top, in events per minute.
    for (value, y) in [(0, h + pad), (top / 2, h / 2 + pad), (top, pad)] {
        let _ = write!(
            out,
            r#"<line class="grid" x1="{left}" y1="{y}" x2="{}" y2="{y}"/><text class="tick" x="{}" y="{}" text-anchor="end">{}</text>"#,
            left + w,
            left - 4,
            y + 4,
            num(value)
        );
    }
    let bar = |n: i64| (n as f64 / top as f64 * h as f64).round() as i64;
    for i in 0..60 {
        let x = left + i * 10;
        let (p, d) = (m.published[i], m.dead_lettered[i]);
        let _ = write!(
            out,
            r#"<rect class="bar" x="{x}" y="{}" width="6" height="{}"><title>{} published, {} min ago</title></rect>"#,
            (h + pad) as i64 - bar(p),
            bar(p),
            num(p),
            59 - i
        );
        if d > 0 {
            let _ = write!(
                out,
                r#"<rect class="dead" x="{}" y="{}" width="3" height="{}"><title>{} dead-lettered, {} min ago</title></rect>"#,
                x + 6,
                (h + pad) as i64 - bar(d),
                bar(d),
                num(d),
                59 - i
            );
        }
    }
    let base = h + pad;
    let _ = write!(
        out,
        r#"<line class="axis" x1="{left}" y1="{pad}" x2="{left}" y2="{base}"/><line class="axis" x1="{left}" y1="{base}" x2="{}" y2="{base}"/><text class="unit" x="0" y="{}">events/min</text><text x="{left}" y="{}">-60 min</text><text x="{}" y="{}" text-anchor="end">now</text><text class="legend-published" x="{}" y="{}">■ published</text><text class="legend-dead" x="{}" y="{}">■ dead-lettered</text></svg>"#,
        left + w,
        base + 26,
        base + 13,
        left + w,
        base + 13,
        left + 200,
        base + 26,
        left + 300,
        base + 26
    );
    out
}

/// The relays as they report themselves (schema version 8), one row each.
fn relays_table(relays: &[ReportedRelay], now: &Timestamp) -> String {
    let mut b = String::from(
        r#"<h2>Relays</h2><table id="relays"><tr><th>Relay</th><th>Source</th><th>Version</th><th>Since</th><th>Last publish</th><th>Published, last minute</th><th>Oldest pending</th><th>Slot retains</th><th>Reported</th></tr>"#,
    );
    for r in relays {
        // Three reports missed: a relay that stopped without saying so (killed), or cannot
        // reach the database.
        let stale = r.seen_seconds_ago > 3.0 * r.interval_seconds.max(1.0);
        let _ = write!(
            b,
            r#"<tr{}><td>{} · pid {}</td><td>{}</td><td>{}</td><td class="t">{}</td><td class="t">{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{}</td><td class="t">{}</td></tr>"#,
            if stale { r#" class="stale""# } else { "" },
            esc(&r.host),
            r.pid,
            match &r.slot {
                Some(slot) => format!("{} (slot {})", esc(&r.source), esc(slot)),
                None => esc(&r.source),
            },
            esc(&r.version),
            when(&r.started_at, now),
            opt_when(r.last_publish_at.as_ref(), now),
            num(r.published_last_minute),
            r.oldest_pending_seconds.map_or_else(|| "–".into(), age),
            r.slot_lag_bytes.map_or_else(|| "–".into(), bytes),
            match stale {
                true => format!("not for {}: stopped?", age(r.seen_seconds_ago)),
                false => format!("{} ago", age(r.seen_seconds_ago)),
            }
        );
    }
    b.push_str(
        r#"</table><p class="source">Each relay reports its own figures (as its <code>/metrics</code> has them) every few seconds into <code>outbox_relays</code>; ages and "Reported" are by the database's clock.</p>"#,
    );
    b
}

/// The connections whose application name says outbox-relay (`pg_stat_activity`): what the
/// overview lists where no relay reports itself (a schema before version 8, relays older than it).
fn connections_table(o: &Overview) -> String {
    let mut b = String::from("<h2>Relays connected</h2>");
    if o.relays.is_empty() {
        b.push_str(
            r#"<p class="problem" id="no-relays">No relay is connected to this database.</p>"#,
        );
        return b;
    }
    b.push_str(r#"<table id="relays"><tr><th>Connection</th><th>Client</th><th>Connections</th><th>Since</th></tr>"#);
    for r in &o.relays {
        let _ = write!(
            b,
            r#"<tr><td>{}</td><td>{}</td><td class="n">{}</td><td>{}</td></tr>"#,
            esc(&r.application_name),
            esc(r.client_addr.as_deref().unwrap_or("local")),
            num(r.connections),
            opt_ts(r.since.as_ref())
        );
    }
    b.push_str("</table>");
    let _ = write!(
        b,
        r#"<p class="source" id="connections-only">Connections by application name (<code>pg_stat_activity</code>){}.</p>"#,
        match o.reported {
            None => ": schema version 8 lists each relay with its figures (run <code>outbox-relay migrate</code>)",
            Some(_) => ": no relay reports itself here (relays older than outbox_relays)",
        }
    );
    b
}

/// The overview: counts, blocked aggregates, the chart, relays and wal slots. Reloads every 10 s.
pub(crate) fn overview(app: &App, who: &Identity, o: &Overview) -> Html<String> {
    let s = &o.status;
    let mut b = String::from(r#"<h1>Overview</h1><div class="cards" id="counts">"#);
    b.push_str(&card("pending", &num(s.pending), false));
    b.push_str(&card(
        "oldest pending",
        &age(s.oldest_pending_age_seconds),
        false,
    ));
    b.push_str(&card("waiting for retry", &num(s.waiting_for_retry), false));
    b.push_str(&card(
        "dead letters",
        &format!(
            r#"<a id="dead-letters-count" href="{}">{}</a>"#,
            esc(&app.href("/dead-letters")),
            num(s.dead_letters)
        ),
        s.dead_letters > 0,
    ));
    let blocked_capped = s.blocked_aggregates > BLOCKED_COUNTED;
    let blocked_count = if blocked_capped {
        format!("{}+", num(BLOCKED_COUNTED))
    } else {
        num(s.blocked_aggregates)
    };
    b.push_str(&card(
        "blocked aggregates",
        &format!(r#"<span id="blocked-count">{blocked_count}</span>"#),
        s.blocked_aggregates > 0,
    ));
    if s.future_dated > 0 {
        b.push_str(&card("dated in the future", &num(s.future_dated), true));
    }
    b.push_str("</div><h2>Published and dead-lettered per minute, last hour</h2>");
    b.push_str(&chart(&o.per_minute));

    b.push_str("<h2>Blocked aggregates</h2>");
    if o.blocked.is_empty() {
        b.push_str("<p>None.</p>");
    } else {
        b.push_str(r#"<table id="blocked"><tr><th>Aggregate</th><th>Dead letter at its head</th><th>Error</th><th>Dead since</th><th>Waiting behind</th></tr>"#);
        for a in &o.blocked {
            let _ = write!(
                b,
                r#"<tr><td>{} / {}</td><td><a href="{}">{}</a></td><td class="err">{}</td><td class="t">{}</td><td class="n">{}</td></tr>"#,
                esc(&a.aggregate_type),
                esc(&a.aggregate_id),
                esc(&app.href(&format!("/dead-letters/{}", a.event_id))),
                esc(&a.event_type),
                esc(a.last_error.as_deref().unwrap_or("")),
                when(&a.dead_lettered_at, &o.now),
                num(a.waiting_events)
            );
        }
        b.push_str("</table>");
        if blocked_capped {
            let _ = write!(
                b,
                r#"<p id="blocked-capped">The {} oldest of more than {} (the overview counts up to {}; <code>outbox-relay status</code> counts them all).</p>"#,
                o.blocked.len(),
                num(BLOCKED_COUNTED),
                num(BLOCKED_COUNTED)
            );
        } else if s.blocked_aggregates > o.blocked.len() as i64 {
            let _ = write!(
                b,
                "<p>The {} oldest of {}.</p>",
                o.blocked.len(),
                num(s.blocked_aggregates)
            );
        }
    }

    if !o.causes.0.is_empty() {
        b.push_str("<h2>Dead letters by cause</h2>");
        b.push_str(&causes_table(
            app,
            "causes",
            &Filter::default(),
            &o.causes,
            &o.now,
        ));
    }

    match &o.reported {
        Some(relays) if !relays.is_empty() => b.push_str(&relays_table(relays, &o.now)),
        _ => b.push_str(&connections_table(o)),
    }

    if !o.wal_slots.is_empty() {
        b.push_str(r#"<h2>WAL slots</h2><table id="wal-slots"><tr><th>Slot</th><th>Streaming</th><th>wal_status</th><th>WAL retained</th><th>Unconfirmed</th><th>Caught up</th><th>Aggregates handed to the table</th></tr>"#);
        for w in &o.wal_slots {
            let _ = write!(
                b,
                r#"<tr><td>{}</td><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td><td>{}</td><td class="n">{}</td></tr>"#,
                esc(&w.slot_name),
                if !w.present {
                    "missing"
                } else if w.active {
                    "yes"
                } else {
                    "no"
                },
                esc(w.wal_status.as_deref().unwrap_or("–")),
                bytes(w.retained_bytes),
                bytes(w.unconfirmed_bytes),
                if w.caught_up { "yes" } else { "no" },
                num(w.deferred_aggregates)
            );
        }
        b.push_str("</table>");
    }
    layout(app, Some(who), "Overview", Some(10), &b)
}

/// Dead letters by cause (`id`: the table's), each linking to the list filtered to it; `filter`:
/// the list's, which the links keep. Says when the count stopped at [`CAUSES_LOOKED`].
fn causes_table(
    app: &App,
    id: &str,
    filter: &Filter,
    causes: &(Vec<Cause>, i64),
    now: &Timestamp,
) -> String {
    let (causes, looked_at) = causes;
    if causes.is_empty() {
        return String::new();
    }
    let mut b = format!(
        r#"<table id="{id}"><tr><th>Cause</th><th>Dead letters</th><th>First seen</th><th>Last seen</th></tr>"#
    );
    for c in causes {
        let mut pairs: Vec<(&str, &str)> = filter
            .pairs()
            .into_iter()
            .filter(|(k, _)| *k != "cause")
            .collect();
        pairs.push(("cause", &c.cause));
        let _ = write!(
            b,
            r#"<tr><td class="err"><a class="cause" href="{}{}">{}</a></td><td class="n">{}</td><td class="t">{}</td><td class="t">{}</td></tr>"#,
            esc(&app.href("/dead-letters")),
            esc(&query(&pairs)),
            esc(&c.cause),
            num(c.dead_letters),
            when(&c.first_seen, now),
            when(&c.last_seen, now)
        );
    }
    b.push_str("</table>");
    if *looked_at >= CAUSES_LOOKED {
        let _ = write!(
            b,
            r#"<p id="{id}-capped">Counted among {} of the dead letters; the list and its actions take them all.</p>"#,
            num(CAUSES_LOOKED)
        );
    }
    b
}

/// What the last action did, from the redirect's query (known words and numbers only).
pub(crate) fn notice(done: Option<Action>, n: Option<u64>) -> String {
    match (done, n) {
        (Some(a), Some(n)) => format!(
            r#"<p class="notice" id="notice">{} {} dead letter{}.</p>"#,
            match a {
                Action::Retry => "Retried",
                Action::Discard => "Discarded",
            },
            num(n),
            if n == 1 { "" } else { "s" }
        ),
        _ => String::new(),
    }
}

/// The list's filter form; `wrong`: the field to mark as the one refused.
fn filter_form(app: &App, filter: &Filter, wrong: Option<&str>) -> String {
    let field = |name: &str, label: &str, value: Option<&str>, kind: &str| {
        let marked = match wrong == Some(name) {
            true => r#" class="wrong" aria-invalid="true""#,
            false => "",
        };
        format!(
            r#"<label>{} <input type="{kind}" name="{name}" id="f-{name}" value="{}"{marked}></label>"#,
            esc(label),
            esc(value.unwrap_or(""))
        )
    };
    format!(
        r#"<form class="filter" method="get" action="{}">{}{}{}{}{}{}{}<button id="apply-filter">Filter</button> <a href="{}">Clear</a></form>"#,
        esc(&app.href("/dead-letters")),
        field(
            "event_type",
            "Event type",
            filter.event_type.as_deref(),
            "text"
        ),
        field(
            "aggregate_type",
            "Aggregate type",
            filter.aggregate_type.as_deref(),
            "text"
        ),
        field(
            "aggregate_id",
            "Aggregate id",
            filter.aggregate_id.as_deref(),
            "text"
        ),
        field("error", "Error contains", filter.error.as_deref(), "text"),
        field("since", "Dead since", filter.since.as_deref(), "text"),
        field("until", "Dead before", filter.until.as_deref(), "text"),
        field("cause", "Cause", filter.cause.as_deref(), "text"),
        esc(&app.href("/dead-letters"))
    )
}

/// "Go to an event by its id".
fn jump_form(app: &App) -> String {
    format!(
        r#"<form class="filter" method="get" action="{}" id="jump"><label>Event id <input type="text" name="id" id="f-id" size="38"></label><button id="go">Go</button></form>"#,
        esc(&app.href("/dead-letters/go"))
    )
}

/// The dead-letter list refused for its filter (a 400): the form again, with what was right in it
/// and `field`, the one that was wrong (left empty), marked.
pub(crate) fn filter_refused(
    app: &App,
    who: &Identity,
    kept: &Filter,
    field: &str,
    message: &str,
) -> Html<String> {
    let body = format!(
        r#"<h1>Dead letters</h1><p class="problem" id="refused">{}</p>{}"#,
        esc(message),
        filter_form(app, kept, Some(field))
    );
    layout(app, Some(who), "Dead letters", None, &body)
}

/// What the dead-letter list shows.
pub(crate) struct ListPage<'a> {
    pub(crate) filter: &'a Filter,
    pub(crate) rows: &'a [ListedDeadLetter],
    /// How many match, counted up to [`TOTAL_COUNTED`] + 1.
    pub(crate) total: i64,
    /// The causes of the matching dead letters (first page only).
    pub(crate) causes: Option<&'a (Vec<Cause>, i64)>,
    /// The seq the previous page ends before, if there is one.
    pub(crate) prev_before: Option<i64>,
    /// The seq the next page starts after, if there is one.
    pub(crate) next_after: Option<i64>,
    pub(crate) first_page: bool,
    pub(crate) notice: &'a str,
    /// The database's clock (for the ages).
    pub(crate) now: &'a Timestamp,
}

/// The dead-letter list: filter, the causes, a page of rows with their checkboxes, actions, next
/// page.
pub(crate) fn dead_letters(app: &App, who: &Identity, page: &ListPage) -> Html<String> {
    let ListPage {
        filter,
        rows,
        total,
        causes,
        prev_before,
        next_after,
        first_page,
        notice,
        now,
    } = *page;
    let mut b = String::from("<h1>Dead letters</h1>");
    b.push_str(notice);
    b.push_str(&jump_form(app));
    b.push_str(&filter_form(app, filter, None));
    let _ = write!(
        b,
        r#"<p id="total"><strong>{}</strong> dead letter{} match{}.</p>"#,
        match total > TOTAL_COUNTED {
            true => format!("{}+", num(TOTAL_COUNTED)),
            false => num(total),
        },
        if total == 1 { "" } else { "s" },
        if total == 1 { "es" } else { "" }
    );
    if let Some(causes) = causes.filter(|c| !c.0.is_empty()) {
        b.push_str("<h2>By cause</h2>");
        b.push_str(&causes_table(app, "list-causes", filter, causes, now));
    }
    let actions = !app.config.read_only;
    if actions {
        let _ = write!(
            b,
            r#"<form method="post" action="{}" id="bulk" class="actions">{}{}<span>Every dead letter matching this filter:</span><button name="action" value="retry" id="bulk-retry">Retry all matching…</button><button name="action" value="discard" id="bulk-discard" class="danger">Discard all matching…</button></form>"#,
            esc(&app.href("/dead-letters/bulk")),
            csrf_field(who),
            filter_fields(filter)
        );
    }
    if rows.is_empty() {
        b.push_str(r#"<p id="empty">No dead letter matches.</p>"#);
    } else {
        if actions {
            let _ = write!(
                b,
                r#"<form method="post" action="{}" id="selection">{}"#,
                esc(&app.href("/dead-letters/selected")),
                csrf_field(who)
            );
        }
        b.push_str(r#"<table id="dead-letter-list"><tr>"#);
        if actions {
            b.push_str("<th></th>");
        }
        b.push_str("<th>Event</th><th>Aggregate</th><th>Error</th><th>Attempts</th><th>Created</th><th>Dead since</th></tr>");
        for r in rows {
            b.push_str("<tr>");
            if actions {
                let _ = write!(
                    b,
                    r#"<td><input type="checkbox" name="id" value="{}" aria-label="select"></td>"#,
                    r.id
                );
            }
            let _ = write!(
                b,
                r#"<td><a class="event" href="{}">{}</a><br><small>seq {}</small></td><td class="aggregate">{} / {}</td><td class="err">{}</td><td class="n">{}</td><td class="t">{}</td><td class="t">{}</td></tr>"#,
                esc(&app.href(&format!("/dead-letters/{}", r.id))),
                esc(&r.event_type),
                r.seq,
                esc(&r.aggregate_type),
                esc(&r.aggregate_id),
                esc(r.last_error.as_deref().unwrap_or("")),
                r.attempts,
                when(&r.created_at, now),
                when(&r.dead_lettered_at, now)
            );
        }
        b.push_str("</table>");
        if actions {
            b.push_str(r#"<div class="actions"><span>Selected:</span><button name="action" value="retry" id="selected-retry">Retry selected…</button><button name="action" value="discard" id="selected-discard" class="danger">Discard selected…</button></div></form>"#);
        }
    }
    let mut nav = Vec::new();
    let link = |id: &str, label: &str, at: Option<(&str, i64)>| {
        let mut pairs = filter.pairs();
        let seq = at.map(|(_, seq)| seq.to_string());
        if let (Some((name, _)), Some(seq)) = (at, seq.as_deref()) {
            pairs.push((name, seq));
        }
        format!(
            r#"<a id="{id}" href="{}{}">{label}</a>"#,
            esc(&app.href("/dead-letters")),
            esc(&query(&pairs))
        )
    };
    if !first_page {
        nav.push(link("first-page", "First page", None));
    }
    if let Some(before) = prev_before {
        nav.push(link("prev-page", "Previous page", Some(("before", before))));
    }
    if let Some(after) = next_after {
        nav.push(link("next-page", "Next page", Some(("after", after))));
    }
    if !nav.is_empty() {
        let _ = write!(b, "<p>{}</p>", nav.join(" · "));
    }
    layout(app, Some(who), "Dead letters", None, &b)
}

/// The most of a payload the detail view shows (pretty-printed bytes): a bigger one is cut there,
/// with its size and a link to the whole of it, so that a 100 MB payload makes no 100 MB page.
pub(crate) const PAYLOAD_SHOWN: usize = 64 * 1024;

/// The first `max` bytes of `s`, cut at a character's boundary.
fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One event: everything it holds, its state, and the events of its aggregate waiting behind it.
pub(crate) fn detail(
    app: &App,
    who: &Identity,
    d: &Detail,
    followers: &[Follower],
    total: i64,
    notice: &str,
) -> Html<String> {
    let dead = d.dead_lettered_at.is_some() && d.processed_at.is_none();
    let state = if d.discarded_at.is_some() {
        "discarded"
    } else if d.processed_at.is_some() {
        "published"
    } else if dead {
        "dead letter"
    } else {
        "pending"
    };
    let mut b = format!(
        r#"<h1>{}</h1>{notice}<p>State: <strong id="state">{state}</strong></p><table id="event">"#,
        esc(&d.event_type)
    );
    let mut row = |k: &str, v: String| {
        let _ = write!(b, "<tr><th>{}</th><td>{v}</td></tr>", esc(k));
    };
    row("Id", d.id.to_string());
    row("Seq", d.seq.to_string());
    row("Aggregate type", esc(&d.aggregate_type));
    row(
        "Aggregate id",
        format!(r#"<span id="aggregate-id">{}</span>"#, esc(&d.aggregate_id)),
    );
    row("Attempts", d.attempts.to_string());
    row(
        "Last error",
        format!(
            r#"<span class="err" id="last-error">{}</span>"#,
            esc(d.last_error.as_deref().unwrap_or(""))
        ),
    );
    row("Created", when(&d.created_at, &d.now));
    row(
        "Dead-lettered",
        opt_when(d.dead_lettered_at.as_ref(), &d.now),
    );
    row("Retry after", opt_when(d.retry_after.as_ref(), &d.now));
    row("Processed", opt_when(d.processed_at.as_ref(), &d.now));
    row("Discarded", opt_when(d.discarded_at.as_ref(), &d.now));
    b.push_str("</table>");
    if dead && !app.config.read_only {
        let _ = write!(
            b,
            r#"<div class="actions"><form method="post" action="{}">{}<button id="retry">Retry</button></form><form method="post" action="{}">{}<button id="discard" class="danger">Discard</button></form></div>"#,
            esc(&app.href(&format!("/dead-letters/{}/retry", d.id))),
            csrf_field(who),
            esc(&app.href(&format!("/dead-letters/{}/discard", d.id))),
            csrf_field(who)
        );
    }
    b.push_str("<h2>Payload</h2>");
    let shown = head(&d.payload, PAYLOAD_SHOWN);
    if shown.len() < d.payload.len() {
        let _ = write!(
            b,
            r#"<p class="big" id="payload-size">The payload is {} pretty-printed: below, its first {}. <a id="payload-whole" href="{}">The whole payload</a> (a JSON download).</p>"#,
            bytes(d.payload.len() as f64),
            bytes(PAYLOAD_SHOWN as f64),
            esc(&app.href(&format!("/dead-letters/{}/payload", d.id)))
        );
    }
    let _ = write!(
        b,
        r#"<pre id="payload">{}</pre><h2>Headers</h2><pre id="headers">{}</pre>"#,
        esc(shown),
        esc(d.headers.as_deref().unwrap_or("none"))
    );
    let _ = write!(
        b,
        r#"<h2>Waiting behind it in its aggregate: <span id="followers-count">{}</span></h2>"#,
        num(total)
    );
    if !followers.is_empty() {
        b.push_str(r#"<table id="followers"><tr><th>Seq</th><th>Event type</th><th>Id</th><th>Created</th></tr>"#);
        for f in followers {
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                f.seq,
                esc(&f.event_type),
                f.id,
                ts(&f.created_at)
            );
        }
        b.push_str("</table>");
        if total > followers.len() as i64 {
            let _ = write!(b, "<p>The first {} of {}.</p>", followers.len(), num(total));
        }
    }
    layout(app, Some(who), &d.event_type, None, &b)
}

/// What a confirmation covers.
pub(crate) enum Scope<'a> {
    /// Every dead letter matching the filter, up to seq `upto`.
    Filter { filter: &'a Filter, upto: i64 },
    /// The selected ids.
    Selected(&'a [Uuid]),
}

/// "This touches N dead letters: confirm?"
pub(crate) fn confirm(
    app: &App,
    who: &Identity,
    action: Action,
    scope: Scope<'_>,
    count: i64,
) -> Html<String> {
    let verb = match action {
        Action::Retry => "Retry",
        Action::Discard => "Discard",
    };
    let effect = match action {
        Action::Retry => "They get a fresh set of attempts; each goes out before the events of its aggregate waiting behind it.",
        Action::Discard => "They are marked discarded (kept, never published); the events of their aggregates waiting behind them go out.",
    };
    let (what, target, fields) = match scope {
        Scope::Filter { filter, upto } => (
            if filter.is_empty() {
                "every dead letter".to_string()
            } else {
                format!(
                    "every dead letter matching {}",
                    filter
                        .pairs()
                        .iter()
                        .map(|(k, v)| format!("{} = “{}”", esc(k), esc(v)))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            "/dead-letters/bulk",
            format!(
                "{}{}{}",
                filter_fields(filter),
                hidden("upto", &upto.to_string()),
                hidden("expected", &count.to_string())
            ),
        ),
        Scope::Selected(ids) => (
            "the selected dead letters".to_string(),
            "/dead-letters/selected",
            ids.iter().map(|id| hidden("id", &id.to_string())).collect(),
        ),
    };
    let b = format!(
        r#"<h1>{verb} {} dead letter{}?</h1><p>{verb} {what}: <strong id="confirm-count">{}</strong>.</p><p>{effect}</p><form method="post" action="{}" class="actions">{}{}{}{}<button id="confirm" class="danger">{verb} {}</button> <a href="{}">Cancel</a></form>"#,
        num(count),
        if count == 1 { "" } else { "s" },
        num(count),
        esc(&app.href(target)),
        csrf_field(who),
        hidden("action", action.name()),
        hidden("confirm", "yes"),
        fields,
        num(count),
        esc(&app.href("/dead-letters"))
    );
    layout(app, Some(who), "Confirm", None, &b)
}

/// A bulk action's progress; reloads every second until it is done.
pub(crate) fn job(app: &App, who: &Identity, s: &JobState) -> Html<String> {
    let status = match (&s.error, s.finished) {
        (Some(e), _) => format!(
            r#"<p class="problem" id="job-state">Failed after {} {}: {}. Running it again continues with the rest.</p>"#,
            num(s.done),
            s.action.past(),
            esc(e)
        ),
        (None, true) => {
            // Confirmed but gone when this job reached them: another operator's action (or a
            // relay, for one that was retried) handled them first.
            let gone = u64::try_from(s.expected)
                .unwrap_or(0)
                .saturating_sub(s.done);
            let others = if gone > 0 {
                format!(
                    " {} of the {} confirmed were no longer dead letters when this action reached them: another action handled them first.",
                    num(gone),
                    num(s.expected)
                )
            } else {
                String::new()
            };
            format!(
                r#"<p class="notice" id="job-state">Done: {} dead letters {} in {:.1} s.{}</p>"#,
                num(s.done),
                s.action.past(),
                s.elapsed.as_secs_f64(),
                others
            )
        }
        (None, false) => r#"<p id="job-state">Running…</p>"#.to_string(),
    };
    let b = format!(
        r#"<h1>{} {}</h1>{status}<p><span id="job-done">{}</span> of {} {} in {} batches.</p><progress max="{}" value="{}"></progress><p><a href="{}">Back to the dead letters</a></p>"#,
        match s.action {
            Action::Retry => "Retry",
            Action::Discard => "Discard",
        },
        esc(&super::bulk::describe(&s.filter)),
        num(s.done),
        num(s.expected),
        s.action.past(),
        s.batches,
        s.expected.max(1),
        s.done,
        esc(&app.href("/dead-letters"))
    );
    layout(
        app,
        Some(who),
        "Bulk action",
        (!s.finished).then_some(1),
        &b,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_quotes_and_controls_become_text() {
        assert_eq!(
            esc(r#"<script>alert("x")</script>"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"
        );
        assert_eq!(esc("a'b&c"), "a&#39;b&amp;c");
        assert_eq!(
            esc("bell\u{7}esc\u{1b}del\u{7f}"),
            "bell\\u{7}esc\\u{1b}del\\u{7f}"
        );
        assert_eq!(esc("line\nnext\ttab"), "line\nnext\ttab");
    }

    #[test]
    fn numbers_have_separators() {
        assert_eq!(num(0), "0");
        assert_eq!(num(999), "999");
        assert_eq!(num(1000), "1,000");
        assert_eq!(num(1_234_567), "1,234,567");
        assert_eq!(num(-10_000), "-10,000");
    }

    #[test]
    fn query_strings_are_encoded() {
        assert_eq!(query(&[]), "");
        assert_eq!(
            query(&[("aggregate_id", "a&b=c <d>"), ("after", "5")]),
            "?aggregate_id=a%26b%3Dc+%3Cd%3E&after=5"
        );
    }
}
