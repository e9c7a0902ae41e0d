//! One event's detail view.

use axum::response::Html;
use maud::{html, Markup};

use super::format::{bytes, num, opt_when, when};
use super::{csrf_field, layout};
use crate::console::queries::{Detail, Follower};
use crate::console::{App, Identity};

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
    // The relay writes an error with each failed attempt (attempts 1 and up), a retry sets the
    // attempts back to 0 and keeps the error: an error with 0 attempts and no dead-lettering
    // now is one a retry left behind, after the event was dead-lettered.
    let retried = d.last_error.is_some() && d.attempts == 0 && d.dead_lettered_at.is_none();
    // Published or discarded, the error is of the past; only a dead letter's or a pending one's
    // still failing is shown as a present one.
    let past_error = d.last_error.is_some() && (d.processed_at.is_some() || retried);
    let body = html! {
        h1 { (d.event_type) }
        (notice)
        p { "State: " strong id="state" { (state) } }
        @if retried {
            p id="history" {
                "It was dead-lettered, then retried (its attempts set back to 0), "
                @if d.discarded_at.is_some() {
                    "then discarded."
                } @else if d.processed_at.is_some() {
                    "then published: the error below is the last one before it was retried."
                } @else {
                    "and waits to be published: the error below is the last one before the retry."
                }
            }
        } @else if d.processed_at.is_some() && d.attempts > 0 {
            p id="history" {
                "Published after " (d.attempts) " failed attempt" @if d.attempts != 1 { "s" } "."
            }
        }
        table id="event" {
            (field_row("Id", html! { (d.id) }))
            (field_row("Seq", html! { (d.seq) }))
            (field_row("Aggregate type", html! { (d.aggregate_type) }))
            (field_row("Aggregate id", html! { span id="aggregate-id" { (d.aggregate_id) } }))
            (field_row("Attempts", html! {
                (d.attempts)
                @if retried { " " span class="age" { "(reset by a retry)" } }
            }))
            (field_row(
                "Last error",
                html! {
                    @if past_error {
                        span class="past-err" id="last-error" { (d.last_error.as_deref().unwrap_or("")) }
                        " " span class="age" { "(before it was "
                            @if d.discarded_at.is_some() { "discarded" }
                            @else if d.processed_at.is_some() { "published" }
                            @else { "retried" }
                        ")" }
                    } @else {
                        span class="err" id="last-error" { (d.last_error.as_deref().unwrap_or("")) }
                    }
                },
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
                        td class="t" { (when(&f.created_at, &d.now)) }
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
