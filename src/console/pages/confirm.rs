//! The bulk actions' pages: the confirmation of what an action touches, and the job's progress.

use axum::response::Html;
use maud::{html, Markup};
use uuid::Uuid;

use super::format::{num, query};
use super::{csrf_field, filter_fields, hidden, layout};
use crate::console::actions::Action;
use crate::console::bulk::JobState;
use crate::console::queries::Filter;
use crate::console::{App, Identity};

/// What a confirmation covers.
pub(crate) enum Scope<'a> {
    /// Every dead letter matching the filter, up to seq `upto`.
    Filter { filter: &'a Filter, upto: i64 },
    /// The selected ids.
    Selected(&'a [Uuid]),
}

/// "every dead letter matching event_type = “...”, ..."
fn matching(filter: &Filter) -> Markup {
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
    }
}

/// A bulk action whose filter matches no dead letter: nothing to confirm, nothing done (not a
/// success either: the operator expected some).
pub(crate) fn nothing_matches(
    app: &App,
    who: &Identity,
    action: Action,
    filter: &Filter,
) -> Html<String> {
    let back = filter.pairs();
    let body = html! {
        h1 { "Nothing to " (action.name()) }
        p class="problem" id="nothing-matches" {
            "No dead letter matches: " (matching(filter)) " is none now. Nothing was "
            (action.past()) "."
        }
        p { a href={ (app.href("/dead-letters")) (query(&back)) } { "Back to the dead letters" } }
    };
    layout(app, Some(who), "Nothing matches", None, body)
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
            matching(filter),
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
            " " (matching(&s.filter))
        }
        @match (&s.error, s.finished) {
            (Some(e), _) => {
                p class="problem" id="job-state" {
                    "Failed after " (num(s.done)) " " (s.action.past()) ": " (e)
                    ". Running it again continues with the rest."
                }
            }
            (None, true) => {
                // Fewer than confirmed: said as what it is, not as a success.
                p class=(if gone > 0 { "short" } else { "notice" }) id="job-state" {
                    "Done: " (num(s.done)) " dead letter" @if s.done != 1 { "s" } " "
                    (s.action.past()) " in " (format!("{:.1}", s.elapsed.as_secs_f64())) " s."
                    @if gone > 0 {
                        " " (num(gone)) " of the " (num(s.expected))
                        " confirmed were no longer dead letters when this action reached them: \
                         another action handled them first, or the filter matched fewer."
                    }
                }
            }
            (None, false) => {
                p id="job-state" { "Running…" }
            }
        }
        p {
            span id="job-done" { (num(s.done)) }
            " of " (num(s.expected)) " " (s.action.past()) " in " (num(s.batches)) " batch"
            @if s.batches != 1 { "es" } "."
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
