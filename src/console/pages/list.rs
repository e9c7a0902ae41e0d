//! The dead letters' list: its filter, its pages both ways, its selection for bulk actions.

use axum::response::Html;
use maud::{html, Markup};

use super::format::{num, query, when};
use super::{
    causes_table, csrf_field, filter_fields, form_carries, form_value, holds_escaped, layout,
};
use crate::console::actions::TOTAL_COUNTED;
use crate::console::queries::{Cause, Filter, Key, ListedDeadLetter, Sort};
use crate::console::{App, Identity};
use crate::timestamp::Timestamp;

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
        let value = value.unwrap_or("");
        html! {
            label {
                (label) " "
                input type="text" name=(name) id={ "f-" (name) } value=(form_value(value))
                    class=[marked.then_some("wrong")] aria-invalid=[marked.then_some("true")];
                // The input holds the value as it is, invisible characters and all: the page
                // says what it holds.
                @if !form_carries(value) {
                    small class="held" id={ "held-" (name) } {
                        "holds " (value) ", which a form cannot send back: its links keep it"
                    }
                } @else if holds_escaped(value) {
                    small class="held" id={ "held-" (name) } { "holds " (value) }
                }
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
    // A filter a form cannot send back would act on another one: its bulk actions are off.
    let carried = filter.pairs().iter().all(|(_, v)| form_carries(v));
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
        @if actions && !carried {
            p class="problem" id="bulk-off" {
                "This filter holds a line break or a C1 control, which a browser's form cannot send \
                 back, so the actions on every dead letter matching it are off: select the rows \
                 below to act on them."
            }
        }
        @if actions && carried {
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
