//! Bulk actions on every dead letter matching a filter: a job per confirmed action, in batches of
//! `batch_size` in seq order (each batch is one `dead-letters retry|discard ID...` of the operator
//! commands, which wakes the relays as it commits), with its progress for the job page. Only the
//! dead letters counted when the operator confirmed are touched (up to the highest seq counted).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::actions::{self, Action};
use super::queries::Filter;
use super::App;
use crate::error::Result;

/// Jobs kept for their pages, newest last.
const KEPT: usize = 50;
/// A batch whose rows changed under it (another operator's action, a relay) is selected again,
/// with only what is still a dead letter: each time, the other side has taken rows, so this only
/// bounds a pathological race (a relay dead-lettering the same rows again and again).
const RESELECTS: u32 = 100;

/// How far a job has come.
#[derive(Debug, Clone)]
pub(crate) struct JobState {
    pub(crate) action: Action,
    /// The filter as the operator saw it, for the page and the audit line.
    pub(crate) filter: Filter,
    /// What the confirmation counted.
    pub(crate) expected: i64,
    pub(crate) done: u64,
    pub(crate) batches: u64,
    pub(crate) finished: bool,
    pub(crate) error: Option<String>,
    pub(crate) elapsed: Duration,
}

/// The jobs of this console (in memory: a job's page is gone when the console restarts, the
/// rows it committed are not).
#[derive(Default)]
pub(crate) struct Jobs(Mutex<Vec<(Uuid, Arc<Mutex<JobState>>)>>);

impl Jobs {
    pub(crate) fn get(&self, id: Uuid) -> Option<JobState> {
        let jobs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter()
            .find(|(j, _)| *j == id)
            .map(|(_, s)| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn add(&self, state: JobState) -> (Uuid, Arc<Mutex<JobState>>) {
        let id = Uuid::new_v4();
        let state = Arc::new(Mutex::new(state));
        let mut jobs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.len() >= KEPT {
            jobs.remove(0);
        }
        jobs.push((id, Arc::clone(&state)));
        (id, state)
    }
}

/// The one audit line of an action: what, on which dead letters, how many, from where.
pub(crate) fn audit(
    action: Action,
    scope: &str,
    target: &str,
    rows: u64,
    from: &str,
    error: Option<&str>,
) {
    match error {
        None => tracing::info!(
            target: "outbox_relay::console::audit",
            action = action.name(),
            scope,
            dead_letters = target,
            rows,
            client_addr = from,
            "console action"
        ),
        Some(error) => tracing::warn!(
            target: "outbox_relay::console::audit",
            action = action.name(),
            scope,
            dead_letters = target,
            rows,
            client_addr = from,
            error,
            "console action failed"
        ),
    }
}

/// The filter as one line of text (for the audit log).
pub(crate) fn describe(filter: &Filter) -> String {
    if filter.is_empty() {
        return "all dead letters".into();
    }
    filter
        .pairs()
        .iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts `action` on the dead letters matching `filter` up to seq `upto` (what the operator
/// confirmed: `expected` of them); returns the job's id.
pub(crate) fn start(
    app: &Arc<App>,
    action: Action,
    filter: Filter,
    expected: i64,
    upto: i64,
    from: String,
) -> Uuid {
    let (id, state) = app.jobs.add(JobState {
        action,
        filter: filter.clone(),
        expected,
        done: 0,
        batches: 0,
        finished: false,
        error: None,
        elapsed: Duration::ZERO,
    });
    let app = Arc::clone(app);
    tokio::spawn(async move {
        let started = Instant::now();
        let result = run(&app, action, &filter, upto, &state, started).await;
        app.changed().await;
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.finished = true;
        s.elapsed = started.elapsed();
        let error = result.err().map(|e| e.redacted());
        s.error.clone_from(&error);
        audit(
            action,
            "filter",
            &describe(&filter),
            s.done,
            &from,
            error.as_deref(),
        );
    });
    id
}

async fn run(
    app: &App,
    action: Action,
    filter: &Filter,
    upto: i64,
    state: &Mutex<JobState>,
    started: Instant,
) -> Result<()> {
    let (mut client, _permit) = app.client().await?;
    let schema = app.schema();
    let batch_size = app.config.batch_size;
    let mut after = i64::MIN;
    let mut reselects = 0;
    loop {
        let batch = actions::batch(&mut client, schema, filter, after, upto, batch_size).await?;
        let Some(&(_, last)) = batch.last() else {
            return Ok(());
        };
        let ids: Vec<Uuid> = batch.iter().map(|(id, _)| *id).collect();
        let n = match actions::apply(&mut client, schema, action, &ids).await {
            Ok(n) => n,
            Err(e) if e.is_not_found() && reselects < RESELECTS => {
                // Some of them stopped being dead letters since the batch was read: read it again.
                reselects += 1;
                continue;
            }
            Err(e) if e.is_not_found() => {
                // Said with a count: the ids would fill the page and the audit line.
                return Err(crate::error::Error::not_found(format!(
                    "another action took these dead letters first {RESELECTS} times in a row; run \
                     it again to continue with the rest"
                )));
            }
            Err(e) => return Err(e),
        };
        reselects = 0;
        after = last;
        {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.done += n;
            s.batches += 1;
            s.elapsed = started.elapsed();
        }
        if (batch.len() as i64) < batch_size {
            return Ok(());
        }
    }
}
