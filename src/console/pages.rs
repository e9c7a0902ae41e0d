//! The console's HTML, rendered on the server from maud templates, which escape by construction:
//! a value spliced into a page (`(value)` in element content or an attribute) is always written
//! escaped, so a payload, header, error text or aggregate id holding markup or quotes shows as
//! text; nothing here writes markup from a string. [`finish`] then makes control characters and
//! invisible format characters visible, once over the whole page, wherever a value stands.

use axum::http::StatusCode;
use axum::response::Html;
use maud::{html, Markup, DOCTYPE};
use uuid::Uuid;

use super::actions::{Action, Overview, BLOCKED_COUNTED, CAUSES_LOOKED, TOTAL_COUNTED};
use super::bulk::JobState;
use super::queries::{
    Cause, Detail, Filter, Follower, Key, ListedDeadLetter, PerMinute, ReportedRelay, Sort,
};
use super::{App, Caller, Identity};
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
.age{color:#667;font-size:.85em}tr.stale td{color:#b3261e}.source{color:#556;font-size:.85em}input.wrong,select.wrong{border:2px solid #b3261e}.big{background:#fff8e1;border:1px solid #e8cf7a;padding:.4em .8em}
";

/// Whether [`finish`] writes `c` as `\u{..}`: a control character (but newline and tab, which a
/// payload or an error text lays out with) or an invisible format character ([`crate::text`]).
fn made_visible(c: char) -> bool {
    c != '\n' && c != '\t' && crate::text::is_escaped(c)
}

/// The page as sent. The templates have escaped every value (`&`, `<`, `>`, `"`); once over the
/// whole page, this writes the apostrophe as `&#39;` and every character [`made_visible`] as
/// `\u{..}`, so that a right-to-left override or a zero-width space in a row is shown, not obeyed,
/// wherever a template puts the value. Sound for the pages' markup: every attribute is quoted with
/// `"`, and there is no script, style or comment, where an entity would read otherwise.
fn finish(markup: Markup) -> String {
    let html = markup.into_string();
    if !html.chars().any(|c| c == '\'' || made_visible(c)) {
        return html;
    }
    let mut out = String::with_capacity(html.len() + 64);
    for c in html.chars() {
        match c {
            '\'' => out.push_str("&#39;"),
            c if made_visible(c) => {
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
fn when(t: &Timestamp, now: &Timestamp) -> Markup {
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

fn opt_when(t: Option<&Timestamp>, now: &Timestamp) -> Markup {
    match t {
        Some(t) => when(t, now),
        None => html! { "–" },
    }
}

fn csrf_field(who: &Identity) -> Markup {
    hidden("csrf", who.csrf())
}

fn hidden(name: &str, value: &str) -> Markup {
    html! { input type="hidden" name=(name) value=(value); }
}

fn filter_fields(filter: &Filter) -> Markup {
    html! {
        @for (k, v) in filter.pairs() {
            (hidden(k, v))
        }
    }
}

/// A whole page. `refresh`: reload every that many seconds (no script needed).
fn layout(
    app: &App,
    who: Option<&Identity>,
    title: &str,
    refresh: Option<u32>,
    body: Markup,
) -> Html<String> {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(s) = refresh {
                    meta http-equiv="refresh" content=(s);
                }
                title { (title) " · outbox console" }
                // Every page, the login and the refusals too (the stylesheet is served without a
                // session).
                link rel="stylesheet" href=(app.href("/static/console.css"));
            }
            body {
                @if let Some(who) = who {
                    header {
                        strong { "outbox console" }
                        a href=(app.href("/")) { "Overview" }
                        a href=(app.href("/dead-letters")) { "Dead letters" }
                        @if app.config.read_only {
                            span class="ro" { "read-only" }
                        }
                        @if matches!(who.caller, Caller::Session { .. }) {
                            form method="post" action=(app.href("/logout")) {
                                (csrf_field(who))
                                button { "Log out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    };
    Html(finish(page))
}

/// The login form (what a request without the token gets, with its 401).
pub(crate) fn login(app: &App, wrong: bool) -> Html<String> {
    let body = html! {
        div class="login" {
            h1 { "outbox console" }
            @if wrong {
                p class="problem" { "Wrong token." }
            }
            form method="post" action=(app.href("/login")) {
                label {
                    "Token "
                    input type="password" name="token" id="token" autocomplete="current-password" autofocus required;
                }
                " "
                button id="login" { "Log in" }
            }
        }
    };
    layout(app, None, "Log in", None, body)
}

/// A refusal: the status and one sentence, nothing of the outbox.
pub(crate) fn refusal(app: &App, code: StatusCode, message: &str) -> Html<String> {
    let body = html! {
        h1 { (code.as_u16()) }
        p class="problem" { (message) }
    };
    layout(
        app,
        None,
        code.canonical_reason().unwrap_or("refused"),
        None,
        body,
    )
}

/// A failure while serving a logged-in caller.
pub(crate) fn error(app: &App, who: &Identity, code: StatusCode, message: &str) -> Html<String> {
    let body = html! {
        h1 { (code.canonical_reason().unwrap_or("error")) }
        p class="problem" { (message) }
    };
    layout(app, Some(who), "Error", None, body)
}

fn card(label: &str, value: Markup, warn: bool) -> Markup {
    html! {
        div class=(if warn { "card warn" } else { "card" }) {
            b { (value) }
            (label)
        }
    }
}

/// The last hour, a minute a bar: published (blue) and dead-lettered (red) on one scale, with its
/// axis in events per minute and the rate of the last whole minute. Made of numbers only, written
/// as elements of the template like the rest of the page (each SVG element closed with its end
/// tag, which HTML's parser needs for SVG in a page).
fn chart(m: &PerMinute) -> Markup {
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
    let base = h + pad;
    let bar = |n: i64| (n as f64 / top as f64 * h as f64).round() as i64;
    html! {
        p id="rate" {
            "Now: " strong { (num(m.published[58])) } " published/min, "
            strong { (num(m.dead_lettered[58])) } " dead-lettered/min (the last whole minute)"
        }
        svg id="chart" width=(left + w) height=(base + 30)
            viewBox={ "0 0 " (left + w) " " (base + 30) } role="img"
            aria-label="events published and dead-lettered per minute, last hour" {
            // The y axis: 0, half and the top, in events per minute.
            @for (value, y) in [(0, base), (top / 2, h / 2 + pad), (top, pad)] {
                line class="grid" x1=(left) y1=(y) x2=(left + w) y2=(y) {}
                text class="tick" x=(left - 4) y=(y + 4) text-anchor="end" { (num(value)) }
            }
            @for i in 0..60 {
                @let x = left + i * 10;
                @let (p, d) = (m.published[i], m.dead_lettered[i]);
                rect class="bar" x=(x) y=(base as i64 - bar(p)) width="6" height=(bar(p)) {
                    title { (num(p)) " published, " (59 - i) " min ago" }
                }
                @if d > 0 {
                    rect class="dead" x=(x + 6) y=(base as i64 - bar(d)) width="3" height=(bar(d)) {
                        title { (num(d)) " dead-lettered, " (59 - i) " min ago" }
                    }
                }
            }
            line class="axis" x1=(left) y1=(pad) x2=(left) y2=(base) {}
            line class="axis" x1=(left) y1=(base) x2=(left + w) y2=(base) {}
            text class="unit" x="0" y=(base + 26) { "events/min" }
            text x=(left) y=(base + 13) { "-60 min" }
            text x=(left + w) y=(base + 13) text-anchor="end" { "now" }
            text class="legend-published" x=(left + 200) y=(base + 26) { "■ published" }
            text class="legend-dead" x=(left + 300) y=(base + 26) { "■ dead-lettered" }
        }
    }
}

/// The relays as they report themselves (schema version 8), one row each.
fn relays_table(relays: &[ReportedRelay], now: &Timestamp) -> Markup {
    html! {
        h2 { "Relays" }
        table id="relays" {
            tr {
                th { "Relay" } th { "Source" } th { "Version" } th { "Since" }
                th { "Last publish" } th { "Published, last minute" } th { "Oldest pending" }
                th { "Slot retains" } th { "Reported" }
            }
            @for r in relays {
                // Three reports missed: a relay that stopped without saying so (killed), or
                // cannot reach the database.
                @let stale = r.seen_seconds_ago > 3.0 * r.interval_seconds.max(1.0);
                tr class=[stale.then_some("stale")] {
                    td { (r.host) " · pid " (r.pid) }
                    td {
                        (r.source)
                        @if let Some(slot) = &r.slot {
                            " (slot " (slot) ")"
                        }
                    }
                    td { (r.version) }
                    td class="t" { (when(&r.started_at, now)) }
                    td class="t" { (opt_when(r.last_publish_at.as_ref(), now)) }
                    td class="n" { (num(r.published_last_minute)) }
                    td class="n" { (r.oldest_pending_seconds.map_or_else(|| "–".into(), age)) }
                    td class="n" { (r.slot_lag_bytes.map_or_else(|| "–".into(), bytes)) }
                    td class="t" {
                        @if stale {
                            "not for " (age(r.seen_seconds_ago)) ": stopped?"
                        } @else {
                            (age(r.seen_seconds_ago)) " ago"
                        }
                    }
                }
            }
        }
        p class="source" {
            "Each relay reports its own figures (as its " code { "/metrics" }
            " has them) every few seconds into " code { "outbox_relays" }
            "; ages and \"Reported\" are by the database's clock."
        }
    }
}

/// The connections whose application name says outbox-relay (`pg_stat_activity`): what the
/// overview lists where no relay reports itself (relays older than `outbox_relays`).
fn connections_table(o: &Overview) -> Markup {
    html! {
        h2 { "Relays connected" }
        @if o.relays.is_empty() {
            p class="problem" id="no-relays" { "No relay is connected to this database." }
        } @else {
            table id="relays" {
                tr { th { "Connection" } th { "Client" } th { "Connections" } th { "Since" } }
                @for r in &o.relays {
                    tr {
                        td { (r.application_name) }
                        td { (r.client_addr.as_deref().unwrap_or("local")) }
                        td class="n" { (num(r.connections)) }
                        td {
                            @match &r.since {
                                Some(since) => (since),
                                None => "–",
                            }
                        }
                    }
                }
            }
            p class="source" id="connections-only" {
                "Connections by application name (" code { "pg_stat_activity" } "): no relay "
                "reports itself here (relays older than outbox_relays)."
            }
        }
    }
}

/// The overview: counts, blocked aggregates, the chart, relays and wal slots. Reloads every 10 s.
pub(crate) fn overview(app: &App, who: &Identity, o: &Overview) -> Html<String> {
    let s = &o.status;
    let blocked_capped = s.blocked_aggregates > BLOCKED_COUNTED;
    let blocked_count = if blocked_capped {
        format!("{}+", num(BLOCKED_COUNTED))
    } else {
        num(s.blocked_aggregates)
    };
    let body = html! {
        h1 { "Overview" }
        div class="cards" id="counts" {
            (card("pending", html! { (num(s.pending)) }, false))
            (card("oldest pending", html! { (age(s.oldest_pending_age_seconds)) }, false))
            (card("waiting for retry", html! { (num(s.waiting_for_retry)) }, false))
            (card(
                "dead letters",
                html! {
                    a id="dead-letters-count" href=(app.href("/dead-letters")) { (num(s.dead_letters)) }
                },
                s.dead_letters > 0,
            ))
            (card(
                "blocked aggregates",
                html! { span id="blocked-count" { (blocked_count) } },
                s.blocked_aggregates > 0,
            ))
            @if s.future_dated > 0 {
                (card("dated in the future", html! { (num(s.future_dated)) }, true))
            }
        }
        h2 { "Published and dead-lettered per minute, last hour" }
        (chart(&o.per_minute))

        h2 { "Blocked aggregates" }
        @if o.blocked.is_empty() {
            p { "None." }
        } @else {
            table id="blocked" {
                tr {
                    th { "Aggregate" } th { "Dead letter at its head" } th { "Error" }
                    th { "Dead since" } th { "Waiting behind" }
                }
                @for a in &o.blocked {
                    tr {
                        td { (a.aggregate_type) " / " (a.aggregate_id) }
                        td {
                            a href=(app.href(&format!("/dead-letters/{}", a.event_id))) { (a.event_type) }
                        }
                        td class="err" { (a.last_error.as_deref().unwrap_or("")) }
                        td class="t" { (when(&a.dead_lettered_at, &o.now)) }
                        td class="n" { (num(a.waiting_events)) }
                    }
                }
            }
            @if blocked_capped {
                p id="blocked-capped" {
                    "The " (o.blocked.len()) " oldest of more than " (num(BLOCKED_COUNTED))
                    " (the overview counts up to " (num(BLOCKED_COUNTED)) "; "
                    code { "outbox-relay status" } " counts them all)."
                }
            } @else if s.blocked_aggregates > o.blocked.len() as i64 {
                p { "The " (o.blocked.len()) " oldest of " (num(s.blocked_aggregates)) "." }
            }
        }

        @if !o.causes.0.is_empty() {
            h2 { "Dead letters by cause" }
            (causes_table(app, "causes", &Filter::default(), Sort::default(), &o.causes, &o.now))
        }

        @if o.reported.is_empty() {
            (connections_table(o))
        } @else {
            (relays_table(&o.reported, &o.now))
        }

        @if !o.wal_slots.is_empty() {
            h2 { "WAL slots" }
            table id="wal-slots" {
                tr {
                    th { "Slot" } th { "Streaming" } th { "wal_status" } th { "WAL retained" }
                    th { "Unconfirmed" } th { "Caught up" } th { "Aggregates handed to the table" }
                }
                @for w in &o.wal_slots {
                    tr {
                        td { (w.slot_name) }
                        td {
                            @if !w.present { "missing" } @else if w.active { "yes" } @else { "no" }
                        }
                        td { (w.wal_status.as_deref().unwrap_or("–")) }
                        td class="n" { (bytes(w.retained_bytes)) }
                        td class="n" { (bytes(w.unconfirmed_bytes)) }
                        td { @if w.caught_up { "yes" } @else { "no" } }
                        td class="n" { (num(w.deferred_aggregates)) }
                    }
                }
            }
        }
    };
    layout(app, Some(who), "Overview", Some(10), body)
}

/// Dead letters by cause (`id`: the table's), each linking to the list filtered to it; `filter`
/// and `sort`: the list's, which the links keep. Says when the count stopped at [`CAUSES_LOOKED`].
fn causes_table(
    app: &App,
    id: &str,
    filter: &Filter,
    sort: Sort,
    causes: &(Vec<Cause>, i64),
    now: &Timestamp,
) -> Markup {
    let (causes, looked_at) = causes;
    let link = |cause: &str| {
        let mut pairs: Vec<(&str, &str)> = filter
            .pairs()
            .into_iter()
            .filter(|(k, _)| *k != "cause")
            .collect();
        pairs.push(("cause", cause));
        pairs.extend(sort.pair());
        format!("{}{}", app.href("/dead-letters"), query(&pairs))
    };
    html! {
        @if !causes.is_empty() {
            table id=(id) {
                tr { th { "Cause" } th { "Dead letters" } th { "First seen" } th { "Last seen" } }
                @for c in causes {
                    tr {
                        td class="err" { a class="cause" href=(link(&c.cause)) { (c.cause) } }
                        td class="n" { (num(c.dead_letters)) }
                        td class="t" { (when(&c.first_seen, now)) }
                        td class="t" { (when(&c.last_seen, now)) }
                    }
                }
            }
            @if *looked_at >= CAUSES_LOOKED {
                p id={ (id) "-capped" } {
                    "Counted among " (num(CAUSES_LOOKED))
                    " of the dead letters; the list and its actions take them all."
                }
            }
        }
    }
}

/// What the last action did, from the redirect's query (known words and numbers only).
pub(crate) fn notice(done: Option<Action>, n: Option<u64>) -> Markup {
    html! {
        @if let (Some(a), Some(n)) = (done, n) {
            p class="notice" id="notice" {
                @match a {
                    Action::Retry => "Retried",
                    Action::Discard => "Discarded",
                }
                " " (num(n)) " dead letter" @if n != 1 { "s" } "."
            }
        }
    }
}

/// What the list's order is called in its form.
fn sort_label(sort: Sort) -> &'static str {
    match sort {
        Sort::Seq => "by seq (as written)",
        Sort::Dead => "by time dead",
    }
}

/// The list's filter form, with its order; `wrong`: the field to mark as the one refused.
fn filter_form(app: &App, filter: &Filter, sort: Sort, wrong: Option<&str>) -> Markup {
    let sort_marked = wrong == Some("sort");
    let field = |name: &str, label: &str, value: Option<&str>| {
        let marked = wrong == Some(name);
        html! {
            label {
                (label) " "
                input type="text" name=(name) id={ "f-" (name) } value=(value.unwrap_or(""))
                    class=[marked.then_some("wrong")] aria-invalid=[marked.then_some("true")];
            }
        }
    };
    html! {
        form class="filter" method="get" action=(app.href("/dead-letters")) {
            (field("event_type", "Event type", filter.event_type.as_deref()))
            (field("aggregate_type", "Aggregate type", filter.aggregate_type.as_deref()))
            (field("aggregate_id", "Aggregate id", filter.aggregate_id.as_deref()))
            (field("error", "Error contains", filter.error.as_deref()))
            (field("since", "Dead since", filter.since.as_deref()))
            (field("until", "Dead before", filter.until.as_deref()))
            (field("cause", "Cause", filter.cause.as_deref()))
            label {
                "Order "
                select name="sort" id="f-sort" class=[sort_marked.then_some("wrong")]
                    aria-invalid=[sort_marked.then_some("true")] {
                    @for s in Sort::ALL {
                        option value=(s.name()) selected[s == sort] { (sort_label(s)) }
                    }
                }
            }
            button id="apply-filter" { "Filter" }
            " "
            // Clears the filter, keeps the order.
            a href={ (app.href("/dead-letters")) (query(&Vec::from_iter(sort.pair()))) } { "Clear" }
        }
    }
}

/// "Go to an event by its id".
fn jump_form(app: &App) -> Markup {
    html! {
        form class="filter" method="get" action=(app.href("/dead-letters/go")) id="jump" {
            label { "Event id " input type="text" name="id" id="f-id" size="38"; }
            button id="go" { "Go" }
        }
    }
}

/// The dead-letter list refused for its filter (a 400): the form again, with what was right in it
/// and `field`, the one that was wrong (left empty), marked.
pub(crate) fn filter_refused(
    app: &App,
    who: &Identity,
    kept: &Filter,
    sort: Sort,
    field: &str,
    message: &str,
) -> Html<String> {
    let body = html! {
        h1 { "Dead letters" }
        p class="problem" id="refused" { (message) }
        (filter_form(app, kept, sort, Some(field)))
    };
    layout(app, Some(who), "Dead letters", None, body)
}

/// What the dead-letter list shows.
pub(crate) struct ListPage<'a> {
    pub(crate) filter: &'a Filter,
    pub(crate) sort: Sort,
    pub(crate) rows: &'a [ListedDeadLetter],
    /// How many match, counted up to [`TOTAL_COUNTED`] + 1.
    pub(crate) total: i64,
    /// The causes of the matching dead letters (first page only).
    pub(crate) causes: Option<&'a (Vec<Cause>, i64)>,
    /// The place the previous page ends before, if there is one.
    pub(crate) prev_before: Option<Key>,
    /// The place the next page starts after, if there is one.
    pub(crate) next_after: Option<Key>,
    pub(crate) first_page: bool,
    pub(crate) notice: &'a Markup,
    /// The database's clock (for the ages).
    pub(crate) now: &'a Timestamp,
}

/// The rows of the list, with their checkboxes when `select`.
fn list_table(app: &App, rows: &[ListedDeadLetter], now: &Timestamp, select: bool) -> Markup {
    html! {
        table id="dead-letter-list" {
            tr {
                @if select { th {} }
                th { "Event" } th { "Aggregate" } th { "Error" } th { "Attempts" } th { "Created" }
                th { "Dead since" }
            }
            @for r in rows {
                tr {
                    @if select {
                        td { input type="checkbox" name="id" value=(r.id) aria-label="select"; }
                    }
                    td {
                        a class="event" href=(app.href(&format!("/dead-letters/{}", r.id))) { (r.event_type) }
                        br;
                        small { "seq " (r.seq) }
                    }
                    td class="aggregate" { (r.aggregate_type) " / " (r.aggregate_id) }
                    td class="err" { (r.last_error.as_deref().unwrap_or("")) }
                    td class="n" { (r.attempts) }
                    td class="t" { (when(&r.created_at, now)) }
                    td class="t" { (when(&r.dead_lettered_at, now)) }
                }
            }
        }
    }
}

/// The dead-letter list: filter, the causes, a page of rows with their checkboxes, actions, next
/// page.
pub(crate) fn dead_letters(app: &App, who: &Identity, page: &ListPage) -> Html<String> {
    let ListPage {
        filter,
        sort,
        rows,
        total,
        causes,
        prev_before,
        next_after,
        first_page,
        notice,
        now,
    } = *page;
    let actions = !app.config.read_only;
    // The filter and the order stay in every link.
    let link = |at: Option<(&str, Key)>| {
        let mut pairs = filter.pairs();
        pairs.extend(sort.pair());
        let place = at.map(|(_, key)| key.param(sort));
        if let (Some((name, _)), Some(place)) = (at, place.as_deref()) {
            pairs.push((name, place));
        }
        format!("{}{}", app.href("/dead-letters"), query(&pairs))
    };
    let mut nav = Vec::new();
    if !first_page {
        nav.push(("first-page", "First page", link(None)));
    }
    if let Some(before) = prev_before {
        nav.push(("prev-page", "Previous page", link(Some(("before", before)))));
    }
    if let Some(after) = next_after {
        nav.push(("next-page", "Next page", link(Some(("after", after)))));
    }
    let body = html! {
        h1 { "Dead letters" }
        (notice)
        (jump_form(app))
        (filter_form(app, filter, sort, None))
        p id="total" {
            strong {
                @if total > TOTAL_COUNTED { (num(TOTAL_COUNTED)) "+" } @else { (num(total)) }
            }
            " dead letter" @if total != 1 { "s" } " match" @if total == 1 { "es" } "."
        }
        @if let Some(causes) = causes.filter(|c| !c.0.is_empty()) {
            h2 { "By cause" }
            (causes_table(app, "list-causes", filter, sort, causes, now))
        }
        @if actions {
            form method="post" action=(app.href("/dead-letters/bulk")) id="bulk" class="actions" {
                (csrf_field(who))
                (filter_fields(filter))
                span { "Every dead letter matching this filter:" }
                button name="action" value="retry" id="bulk-retry" { "Retry all matching…" }
                button name="action" value="discard" id="bulk-discard" class="danger" { "Discard all matching…" }
            }
        }
        @if rows.is_empty() {
            p id="empty" { "No dead letter matches." }
        } @else if actions {
            form method="post" action=(app.href("/dead-letters/selected")) id="selection" {
                (csrf_field(who))
                (list_table(app, rows, now, true))
                div class="actions" {
                    span { "Selected:" }
                    button name="action" value="retry" id="selected-retry" { "Retry selected…" }
                    button name="action" value="discard" id="selected-discard" class="danger" { "Discard selected…" }
                }
            }
        } @else {
            (list_table(app, rows, now, false))
        }
        @if !nav.is_empty() {
            p {
                @for (i, (id, label, href)) in nav.iter().enumerate() {
                    @if i > 0 { " · " }
                    a id=(id) href=(href) { (label) }
                }
            }
        }
    };
    layout(app, Some(who), "Dead letters", None, body)
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

/// One row of the detail view's table.
fn field_row(name: &str, value: Markup) -> Markup {
    html! { tr { th { (name) } td { (value) } } }
}

/// One event: everything it holds, its state, and the events of its aggregate waiting behind it.
pub(crate) fn detail(
    app: &App,
    who: &Identity,
    d: &Detail,
    followers: &[Follower],
    total: i64,
    notice: &Markup,
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
    let shown = head(&d.payload, PAYLOAD_SHOWN);
    let body = html! {
        h1 { (d.event_type) }
        (notice)
        p { "State: " strong id="state" { (state) } }
        table id="event" {
            (field_row("Id", html! { (d.id) }))
            (field_row("Seq", html! { (d.seq) }))
            (field_row("Aggregate type", html! { (d.aggregate_type) }))
            (field_row("Aggregate id", html! { span id="aggregate-id" { (d.aggregate_id) } }))
            (field_row("Attempts", html! { (d.attempts) }))
            (field_row(
                "Last error",
                html! { span class="err" id="last-error" { (d.last_error.as_deref().unwrap_or("")) } },
            ))
            (field_row("Created", when(&d.created_at, &d.now)))
            (field_row("Dead-lettered", opt_when(d.dead_lettered_at.as_ref(), &d.now)))
            (field_row("Retry after", opt_when(d.retry_after.as_ref(), &d.now)))
            (field_row("Processed", opt_when(d.processed_at.as_ref(), &d.now)))
            (field_row("Discarded", opt_when(d.discarded_at.as_ref(), &d.now)))
        }
        @if dead && !app.config.read_only {
            div class="actions" {
                form method="post" action=(app.href(&format!("/dead-letters/{}/retry", d.id))) {
                    (csrf_field(who))
                    button id="retry" { "Retry" }
                }
                form method="post" action=(app.href(&format!("/dead-letters/{}/discard", d.id))) {
                    (csrf_field(who))
                    button id="discard" class="danger" { "Discard" }
                }
            }
        }
        h2 { "Payload" }
        @if shown.len() < d.payload.len() {
            p class="big" id="payload-size" {
                "The payload is " (bytes(d.payload.len() as f64)) " pretty-printed: below, its first "
                (bytes(PAYLOAD_SHOWN as f64)) ". "
                a id="payload-whole" href=(app.href(&format!("/dead-letters/{}/payload", d.id))) {
                    "The whole payload"
                }
                " (a JSON download)."
            }
        }
        pre id="payload" { (shown) }
        h2 { "Headers" }
        pre id="headers" { (d.headers.as_deref().unwrap_or("none")) }
        h2 {
            "Waiting behind it in its aggregate: "
            span id="followers-count" { (num(total)) }
        }
        @if !followers.is_empty() {
            table id="followers" {
                tr { th { "Seq" } th { "Event type" } th { "Id" } th { "Created" } }
                @for f in followers {
                    tr {
                        td { (f.seq) }
                        td { (f.event_type) }
                        td { (f.id) }
                        td { (f.created_at) }
                    }
                }
            }
            @if total > followers.len() as i64 {
                p { "The first " (followers.len()) " of " (num(total)) "." }
            }
        }
    };
    layout(app, Some(who), &d.event_type, None, body)
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
            html! {
                @if filter.is_empty() {
                    "every dead letter"
                } @else {
                    "every dead letter matching "
                    @for (i, (k, v)) in filter.pairs().into_iter().enumerate() {
                        @if i > 0 { ", " }
                        (k) " = “" (v) "”"
                    }
                }
            },
            "/dead-letters/bulk",
            html! {
                (filter_fields(filter))
                (hidden("upto", &upto.to_string()))
                (hidden("expected", &count.to_string()))
            },
        ),
        Scope::Selected(ids) => (
            html! { "the selected dead letters" },
            "/dead-letters/selected",
            html! {
                @for id in ids {
                    (hidden("id", &id.to_string()))
                }
            },
        ),
    };
    let body = html! {
        h1 { (verb) " " (num(count)) " dead letter" @if count != 1 { "s" } "?" }
        p { (verb) " " (what) ": " strong id="confirm-count" { (num(count)) } "." }
        p { (effect) }
        form method="post" action=(app.href(target)) class="actions" {
            (csrf_field(who))
            (hidden("action", action.name()))
            (hidden("confirm", "yes"))
            (fields)
            button id="confirm" class="danger" { (verb) " " (num(count)) }
            " "
            a href=(app.href("/dead-letters")) { "Cancel" }
        }
    };
    layout(app, Some(who), "Confirm", None, body)
}

/// A bulk action's progress; reloads every second until it is done.
pub(crate) fn job(app: &App, who: &Identity, s: &JobState) -> Html<String> {
    // Confirmed but gone when this job reached them: another operator's action (or a relay, for
    // one that was retried) handled them first.
    let gone = u64::try_from(s.expected)
        .unwrap_or(0)
        .saturating_sub(s.done);
    let body = html! {
        h1 {
            @match s.action {
                Action::Retry => "Retry",
                Action::Discard => "Discard",
            }
            " " (super::bulk::describe(&s.filter))
        }
        @match (&s.error, s.finished) {
            (Some(e), _) => {
                p class="problem" id="job-state" {
                    "Failed after " (num(s.done)) " " (s.action.past()) ": " (e)
                    ". Running it again continues with the rest."
                }
            }
            (None, true) => {
                p class="notice" id="job-state" {
                    "Done: " (num(s.done)) " dead letters " (s.action.past()) " in "
                    (format!("{:.1}", s.elapsed.as_secs_f64())) " s."
                    @if gone > 0 {
                        " " (num(gone)) " of the " (num(s.expected))
                        " confirmed were no longer dead letters when this action reached them: another action handled them first."
                    }
                }
            }
            (None, false) => {
                p id="job-state" { "Running…" }
            }
        }
        p {
            span id="job-done" { (num(s.done)) }
            " of " (num(s.expected)) " " (s.action.past()) " in " (s.batches) " batches."
        }
        progress max=(s.expected.max(1)) value=(s.done) {}
        p { a href=(app.href("/dead-letters")) { "Back to the dead letters" } }
    };
    layout(
        app,
        Some(who),
        "Bulk action",
        (!s.finished).then_some(1),
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_quotes_and_controls_become_text() {
        let value = "<script>alert(\"x\")</script>a'b&amp;c bell\u{7}esc\u{1b}del\u{7f}\u{85}\u{202e}\u{200b}line\nnext\ttab";
        let shown = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;a&#39;b&amp;amp;c bell\\u{7}esc\\u{1b}del\\u{7f}\\u{85}\\u{202e}\\u{200b}line\nnext\ttab";
        assert_eq!(
            finish(html! { p title=(value) { (value) } }),
            format!(r#"<p title="{shown}">{shown}</p>"#),
            "in element content and in attributes alike"
        );
        assert_eq!(finish(html! { p { "plain" } }), "<p>plain</p>");
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
