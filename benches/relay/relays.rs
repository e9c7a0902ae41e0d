//! Scenario 5, `relays`: a backlog drained by 1 relay and by 3 relays at once.

use std::sync::Arc;
use std::time::Duration;

use crate::drain::*;
use crate::env::*;
use crate::report::*;

pub(crate) async fn scenario_relays(ctx: Arc<Ctx>) -> Vec<Row> {
    const S: &str = "5 one vs three relays";
    let events = ctx.backlog();
    let mut rows = Vec::new();
    for count in [1usize, 3] {
        let variant = format!(
            "{count} relay{}, batch 1000",
            if count > 1 { "s" } else { "" }
        );
        let drainer = Drainer::Relays {
            count,
            args: args(&["--batch-size", "1000"]),
        };
        let limit = ctx.drain_timeout(events, false) + Duration::from_secs(120);
        let fut = drain_variant(
            ctx.clone(),
            S,
            variant.clone(),
            Backlog::new(events),
            drainer,
            true,
        );
        let mut row = isolated(S, variant, limit, fut).await;
        if count > 1 && !row.is_failure() {
            row.note("peak RSS is the largest of the processes");
        }
        rows.push(row);
    }
    if let (Some(one), Some(three)) = (rows[0].events_per_s, rows[1].events_per_s) {
        rows[1].note(format!("{:.2}x one relay", three / one));
    }
    rows
}
