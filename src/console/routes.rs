//! The routes and their handlers. A GET never changes anything; every action is a POST behind
//! the guard (token, same origin, CSRF token) and refused in read-only mode.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use uuid::Uuid;

use super::actions::{self, Action};
use super::auth;
use super::bulk;
use super::pages::{self, Scope};
use super::queries::{Filter, From, Key, Sort};
use super::{App, Identity};
use crate::error::{Error, ErrorKind};
use crate::timestamp::Timestamp;

/// Ids one selection may name (a page holds at most 1000 rows).
const MAX_SELECTED: usize = 1000;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/static/console.css", get(css))
        .route("/dead-letters", get(list))
        .route("/dead-letters/go", get(go))
        .route("/dead-letters/selected", post(selected))
        .route("/dead-letters/bulk", post(bulk_action))
        .route("/dead-letters/{id}", get(detail))
        .route("/dead-letters/{id}/payload", get(download))
        .route("/dead-letters/{id}/{action}", post(one))
        .route("/jobs/{id}", get(job))
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/logout", post(auth::logout))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            auth::guard,
        ))
        .layer(middleware::from_fn(auth::security_headers))
        .with_state(app)
}

fn pairs(raw: &[u8]) -> Vec<(String, String)> {
    url::form_urlencoded::parse(raw)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn value<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The filter of a request, or what is wrong with it: a field over its cap (the value is not
/// echoed).
fn filter_of(pairs: &[(String, String)]) -> Result<Filter, String> {
    let filter = Filter::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    match filter.over_cap() {
        None => Ok(filter),
        Some((field, cap)) => Err(format!("{field}: longer than {cap} characters")),
    }
}

/// A failure as a page: the caller's mistakes say what is wrong; the database's own failures
/// are logged (redacted) and not shown.
fn fail(app: &App, who: &Identity, e: &Error) -> Response {
    let (code, message) = failure(e);
    (code, pages::error(app, who, code, &message)).into_response()
}

/// The status and the sentence of a failure (see [`fail`]).
fn failure(e: &Error) -> (StatusCode, String) {
    let bad_input = e
        .as_db_error()
        .and_then(|d| d.as_db_error())
        .filter(|d| d.code().code().starts_with("22"))
        .map(|d| d.message().to_string());
    let (code, message) = if let Some(message) = bad_input {
        (
            StatusCode::BAD_REQUEST,
            format!("the filter is not valid: {message}"),
        )
    } else if e.is_not_found() {
        (StatusCode::CONFLICT, e.to_string())
    } else if e.is_usage() {
        (StatusCode::BAD_REQUEST, e.to_string())
    } else if e.kind() == ErrorKind::SchemaMissing {
        (StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    } else {
        tracing::error!(error = %e.redacted(), "console: request failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the database failed; the console's log says why".to_string(),
        )
    };
    (code, message)
}

fn read_only(app: &App) -> Option<Response> {
    app.config.read_only.then(|| {
        (
            StatusCode::FORBIDDEN,
            pages::refusal(app, StatusCode::FORBIDDEN, "the console is read-only"),
        )
            .into_response()
    })
}

fn bad_request(app: &App, who: &Identity, message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        pages::error(app, who, StatusCode::BAD_REQUEST, message),
    )
        .into_response()
}

async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::CSS,
    )
}

async fn overview(State(app): State<Arc<App>>, Extension(who): Extension<Identity>) -> Response {
    match app.overview().await {
        Ok(o) => {
            app.overview_read(true);
            pages::overview(&app, &who, &o).into_response()
        }
        // The overview refreshes itself: its failure too, so that it comes back on its own.
        Err(e) => {
            let since = app.overview_read(false).unwrap_or_else(Timestamp::now);
            let (code, message) = failure(&e);
            (
                code,
                pages::failing(&app, &who, code, &message, &since, pages::OVERVIEW_REFRESH),
            )
                .into_response()
        }
    }
}

async fn list(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or("").as_bytes());
    // The form again, with what was right in it and the field that was wrong (a value over its
    // cap or an order there is not: neither echoed).
    let refused = |field: &str, wrong: &str, sort: Sort| {
        let mut kept = Filter::from_pairs(q.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        kept.clear(field);
        (
            StatusCode::BAD_REQUEST,
            pages::filter_refused(&app, &who, &kept, sort, field, wrong),
        )
            .into_response()
    };
    let filter = match filter_of(&q) {
        Ok(filter) => filter,
        Err(wrong) => {
            let field = wrong.split(':').next().unwrap_or_default();
            let sort = Sort::parse(value(&q, "sort")).unwrap_or_default();
            return refused(field, &wrong, sort);
        }
    };
    let Some(sort) = Sort::parse(value(&q, "sort")) else {
        return refused("sort", "sort: not seq or dead", Sort::default());
    };
    let place = |name: &str| match value(&q, name).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => Key::parse(v, sort).map(Some).ok_or(match sort {
            Sort::Seq => format!("{name}: not a seq"),
            Sort::Dead => format!("{name}: not a place in the list by time dead"),
        }),
    };
    // A place that is not one: the form again, with the whole filter (the place is no field).
    let misplaced = |wrong: &str| {
        (
            StatusCode::BAD_REQUEST,
            pages::filter_refused(&app, &who, &filter, sort, "", wrong),
        )
            .into_response()
    };
    let from = match (place("after"), place("before")) {
        (Err(wrong), _) | (_, Err(wrong)) => return misplaced(&wrong),
        (Ok(Some(_)), Ok(Some(_))) => return misplaced("after, before: one or the other"),
        (Ok(Some(after)), Ok(None)) => From::After(after),
        (Ok(None), Ok(Some(before))) => From::Before(before),
        (Ok(None), Ok(None)) => From::After(Key::START),
    };
    let first_page = from == From::After(Key::START);
    let notice = pages::notice(
        value(&q, "done").and_then(Action::parse),
        value(&q, "n").and_then(|n| n.parse().ok()),
    );
    let limit = app.config.page_size;
    let result = async {
        let (mut client, _permit) = app.client().await?;
        let resolved = match actions::resolve(&mut client, app.schema(), &filter).await? {
            Ok(resolved) => resolved,
            Err(refused) => return Ok(Err(refused)),
        };
        // The causes atop the first page only.
        actions::page(
            &mut client,
            app.schema(),
            &resolved,
            sort,
            from,
            limit + 1,
            first_page,
        )
        .await
        .map(Ok)
    }
    .await;
    match result {
        Ok(Err((field, wrong))) => refused(field, &wrong, sort),
        Ok(Ok(mut listed)) => {
            let rows = &mut listed.rows;
            let more = rows.len() as i64 > limit;
            // One row more than a page was read: the next page's (or the previous one's) first.
            let (prev, next) = match from {
                From::After(after) => {
                    rows.truncate(limit as usize);
                    let next = more.then(|| rows.last().map(|r| r.key)).flatten();
                    let prev = (after != Key::START)
                        .then(|| rows.first().map(|r| r.key))
                        .flatten();
                    (prev, next)
                }
                From::Before(_) => {
                    if more {
                        rows.remove(0);
                    }
                    let prev = more.then(|| rows.first().map(|r| r.key)).flatten();
                    (prev, rows.last().map(|r| r.key))
                }
            };
            let page = pages::ListPage {
                filter: &filter,
                sort,
                rows: &listed.rows,
                total: listed.total,
                causes: listed.causes.as_ref(),
                prev_before: prev,
                next_after: next,
                first_page,
                notice: &notice,
                now: &listed.now,
            };
            pages::dead_letters(&app, &who, &page).into_response()
        }
        Err(e) => fail(&app, &who, &e),
    }
}

/// GET /dead-letters/go?id=ID: to that event's page (jump to an event by id).
async fn go(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or("").as_bytes());
    match value(&q, "id").map(str::trim).map(Uuid::parse_str) {
        Some(Ok(id)) => Redirect::to(&app.href(&format!("/dead-letters/{id}"))).into_response(),
        _ => bad_request(&app, &who, "id: not an event id"),
    }
}

async fn detail(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let Ok(id) = Uuid::parse_str(&id) else {
        return bad_request(&app, &who, "not an event id");
    };
    let q = pairs(raw.as_deref().unwrap_or("").as_bytes());
    let notice = pages::notice(
        value(&q, "done").and_then(Action::parse),
        value(&q, "n").and_then(|n| n.parse().ok()),
    );
    let result = async {
        let (mut client, _permit) = app.client().await?;
        actions::detail(&mut client, app.schema(), id).await
    }
    .await;
    match result {
        Ok(Some((d, followers, total))) => {
            pages::detail(&app, &who, &d, &followers, total, &notice).into_response()
        }
        Ok(None) => (
            StatusCode::NOT_FOUND,
            pages::error(&app, &who, StatusCode::NOT_FOUND, "no such event"),
        )
            .into_response(),
        Err(e) => fail(&app, &who, &e),
    }
}

/// Runs `action` on `ids` in one transaction, with its audit line.
async fn apply(
    app: &App,
    who: &Identity,
    action: Action,
    ids: &[Uuid],
    scope: &str,
) -> Result<u64, Error> {
    let result = async {
        let (mut client, _permit) = app.client().await?;
        actions::apply(&mut client, app.schema(), action, ids).await
    }
    .await;
    app.changed().await;
    let target = ids
        .iter()
        .map(Uuid::to_string)
        .collect::<Vec<_>>()
        .join(",");
    match &result {
        Ok(n) => bulk::audit(action, scope, &target, *n, &who.from(), None),
        Err(e) => bulk::audit(action, scope, &target, 0, &who.from(), Some(&e.redacted())),
    }
    result
}

/// POST /dead-letters/{id}/retry|discard: one dead letter, at once.
async fn one(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    Path((id, action)): Path<(String, String)>,
) -> Response {
    if let Some(refused) = read_only(&app) {
        return refused;
    }
    let (Ok(id), Some(action)) = (Uuid::parse_str(&id), Action::parse(&action)) else {
        return bad_request(&app, &who, "unknown action");
    };
    match apply(&app, &who, action, &[id], "one").await {
        Ok(n) => {
            Redirect::to(&app.href(&format!("/dead-letters/{id}?done={}&n={n}", action.name())))
                .into_response()
        }
        Err(e) => fail(&app, &who, &e),
    }
}

/// GET /dead-letters/{id}/payload: the event's whole payload as a JSON download (the detail view
/// shows the first 64 KiB of a bigger one).
async fn download(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = Uuid::parse_str(&id) else {
        return bad_request(&app, &who, "not an event id");
    };
    let result = async {
        let (mut client, _permit) = app.client().await?;
        actions::detail(&mut client, app.schema(), id).await
    }
    .await;
    match result {
        Ok(Some((d, _, _))) => (
            [
                (header::CONTENT_TYPE, "application/json".to_string()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{id}.json\""),
                ),
            ],
            d.payload,
        )
            .into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            pages::error(&app, &who, StatusCode::NOT_FOUND, "no such event"),
        )
            .into_response(),
        Err(e) => fail(&app, &who, &e),
    }
}

/// POST /dead-letters/selected: the checked rows; confirmed first.
async fn selected(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    body: Bytes,
) -> Response {
    if let Some(refused) = read_only(&app) {
        return refused;
    }
    let form = pairs(&body);
    let Some(action) = value(&form, "action").and_then(Action::parse) else {
        return bad_request(&app, &who, "unknown action");
    };
    let mut ids = Vec::new();
    for (_, v) in form.iter().filter(|(k, _)| k == "id") {
        match Uuid::parse_str(v) {
            Ok(id) if !ids.contains(&id) => ids.push(id),
            Ok(_) => {}
            Err(_) => return bad_request(&app, &who, "not an event id"),
        }
    }
    if ids.is_empty() {
        return bad_request(&app, &who, "select at least one dead letter");
    }
    if ids.len() > MAX_SELECTED {
        return bad_request(&app, &who, "too many selected at once");
    }
    if value(&form, "confirm") != Some("yes") {
        return pages::confirm(&app, &who, action, Scope::Selected(&ids), ids.len() as i64)
            .into_response();
    }
    match apply(&app, &who, action, &ids, "selected").await {
        Ok(n) => Redirect::to(&app.href(&format!("/dead-letters?done={}&n={n}", action.name())))
            .into_response(),
        Err(e) => fail(&app, &who, &e),
    }
}

/// POST /dead-letters/bulk: every dead letter matching the filter. First the count to confirm;
/// confirmed, a job in batches, and its progress page.
async fn bulk_action(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    body: Bytes,
) -> Response {
    if let Some(refused) = read_only(&app) {
        return refused;
    }
    let form = pairs(&body);
    let Some(action) = value(&form, "action").and_then(Action::parse) else {
        return bad_request(&app, &who, "unknown action");
    };
    let filter = match filter_of(&form) {
        Ok(filter) => filter,
        Err(wrong) => return bad_request(&app, &who, &wrong),
    };
    if value(&form, "confirm") != Some("yes")
        && !filter.pairs().iter().all(|(_, v)| pages::form_carries(v))
    {
        return bad_request(
            &app,
            &who,
            "the filter holds a line break or a C1 control, which the confirmation's form cannot send back",
        );
    }
    if value(&form, "confirm") == Some("yes") {
        let upto = value(&form, "upto").and_then(|v| v.parse::<i64>().ok());
        let expected = value(&form, "expected").and_then(|v| v.parse::<i64>().ok());
        let (Some(upto), Some(expected)) = (upto, expected) else {
            return bad_request(&app, &who, "the confirmation is incomplete");
        };
        // The confirmation's times are instants already; a caller of its own may send others.
        let resolved = async {
            let (mut client, _permit) = app.client().await?;
            actions::resolve(&mut client, app.schema(), &filter).await
        }
        .await;
        let filter = match resolved {
            Ok(Ok(filter)) => filter,
            Ok(Err((_, wrong))) => return bad_request(&app, &who, &wrong),
            Err(e) => return fail(&app, &who, &e),
        };
        let id = bulk::start(&app, action, filter, expected, upto, who.from());
        return Redirect::to(&app.href(&format!("/jobs/{id}"))).into_response();
    }
    // The times resolved once, here: the confirmation carries the instants it counted.
    let result = async {
        let (mut client, _permit) = app.client().await?;
        let filter = match actions::resolve(&mut client, app.schema(), &filter).await? {
            Ok(filter) => filter,
            Err(refused) => return Ok(Err(refused)),
        };
        let counted = actions::count(&mut client, app.schema(), &filter).await?;
        Ok(Ok((filter, counted)))
    }
    .await;
    match result {
        Ok(Err((field, wrong))) => {
            let mut kept = filter.clone();
            kept.clear(field);
            (
                StatusCode::BAD_REQUEST,
                pages::filter_refused(&app, &who, &kept, Sort::default(), field, &wrong),
            )
                .into_response()
        }
        Ok(Ok((filter, (count, Some(upto))))) if count > 0 => pages::confirm(
            &app,
            &who,
            action,
            Scope::Filter {
                filter: &filter,
                upto,
            },
            count,
        )
        .into_response(),
        Ok(Ok((filter, _))) => pages::nothing_matches(&app, &who, action, &filter).into_response(),
        Err(e) => fail(&app, &who, &e),
    }
}

async fn job(
    State(app): State<Arc<App>>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Response {
    match Uuid::parse_str(&id).ok().and_then(|id| app.jobs.get(id)) {
        Some(state) => pages::job(&app, &who, &state).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            pages::error(&app, &who, StatusCode::NOT_FOUND, "no such job"),
        )
            .into_response(),
    }
}
