//! The console's HTML, rendered on the server from maud templates, which escape by construction:
//! a value spliced into a page (`(value)` in element content or an attribute) is always written
//! escaped, so a payload, header, error text or aggregate id holding markup or quotes shows as
//! text; nothing here writes markup from a string. [`finish`] then makes control characters and
//! invisible format characters visible, once over the whole page, wherever a value stands.

mod confirm;
mod detail;
mod format;
mod list;
mod overview;

use axum::http::StatusCode;
use axum::response::Html;
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::actions::{Action, CAUSES_LOOKED};
use super::queries::{Cause, Filter, Sort};
use super::{App, Caller, Identity};
use crate::timestamp::Timestamp;
pub(crate) use confirm::{confirm, job, nothing_matches, Scope};
pub(crate) use detail::detail;
pub(crate) use format::query;
use format::{num, when};
pub(crate) use list::{dead_letters, filter_refused, ListPage};
pub(crate) use overview::overview;

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
.short{background:#fff8e1;border:1px solid #e8cf7a;padding:.5em 1em;margin-bottom:1em}.held{color:#8a5a00}
.past-err{color:#556;white-space:pre-wrap;overflow-wrap:anywhere}#relays td,td.aggregate{overflow-wrap:anywhere}
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

fn csrf_field(who: &Identity) -> Markup {
    hidden("csrf", who.csrf())
}

fn hidden(name: &str, value: &str) -> Markup {
    html! { input type="hidden" name=(name) value=(form_value(value)); }
}

/// A form control's value, written so that the browser sends back exactly `value`: markup
/// characters as entities, and every character [`finish`] would show as `\u{..}` as a numeric
/// character reference (`&#x200b;`), which the browser reads as that character (the page's text
/// never holds it as it is, and never sends its escape's text in its place). What a reference
/// cannot carry ([`form_carries`]) is the caller's to say.
fn form_value(value: &str) -> PreEscaped<String> {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if made_visible(c) => {
                let _ = write!(out, "&#x{:x};", u32::from(c));
            }
            c => out.push(c),
        }
    }
    PreEscaped(out)
}

/// Whether a browser's form sends `value` back as it is: not with a line break (a text input
/// drops it, a form turns it into CR LF) or a C1 control (a character reference to one reads as
/// another character), which no page can hand to a form.
pub(crate) fn form_carries(value: &str) -> bool {
    !value
        .chars()
        .any(|c| c == '\n' || c == '\r' || ('\u{80}'..='\u{9f}').contains(&c))
}

/// Whether `value` holds a character the page shows as `\u{..}` (so that its input, which holds
/// it as it is, reads otherwise than the page).
fn holds_escaped(value: &str) -> bool {
    value.chars().any(made_visible)
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

/// How often the overview reloads itself, in seconds (its failures too).
pub(crate) const OVERVIEW_REFRESH: u32 = 10;

/// A failure of a page that reloads itself every `refresh` seconds: it reloads too, and says since
/// when it has failed (`since`, by this machine's clock).
pub(crate) fn failing(
    app: &App,
    who: &Identity,
    code: StatusCode,
    message: &str,
    since: &Timestamp,
    refresh: u32,
) -> Html<String> {
    let now = Timestamp::now();
    let body = html! {
        h1 { (code.canonical_reason().unwrap_or("error")) }
        p class="problem" { (message) }
        p id="failing" {
            "Failing since "
            time id="failing-since" datetime=(since) { (when(since, &now)) }
            " (this machine's clock). This page tries again every " (refresh) " s."
        }
    };
    layout(app, Some(who), "Error", Some(refresh), body)
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
