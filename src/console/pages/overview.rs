//! The overview: counts, the published-per-minute chart, relays, connections, blocked aggregates.

use axum::response::Html;
use maud::{html, Markup};

use super::format::{age, bytes, num, opt_when, when};
use super::{causes_table, layout};
use crate::console::actions::{Overview, BLOCKED_COUNTED};
use crate::console::queries::{Filter, PerMinute, ReportedRelay, Sort};
use crate::console::{App, Identity};
use crate::timestamp::Timestamp;

fn card(label: &str, value: Markup, warn: bool) -> Markup {
    html! {
        div class=(if warn { "card warn" } else { "card" }) {
            b { (value) }
            (label)
        }
    }
}

/// Half of `n`, as the chart's middle tick writes it: `0.5`, `1`, `1.5`, `1,000`.
fn half(n: i64) -> String {
    match n % 2 {
        0 => num(n / 2),
        _ => format!("{}.5", num(n / 2)),
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
            // Half an odd top is a half: "0.5" where the top is 1, never a second 0.
            @for (value, y) in [
                (num(0), base),
                (half(top), h / 2 + pad),
                (num(top), pad),
            ] {
                line class="grid" x1=(left) y1=(y) x2=(left + w) y2=(y) {}
                text class="tick" x=(left - 4) y=(y + 4) text-anchor="end" { (value) }
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
    layout(
        app,
        Some(who),
        "Overview",
        Some(super::OVERVIEW_REFRESH),
        body,
    )
}
