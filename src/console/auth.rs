//! Who may use the console: the token (login form or bearer header), sessions with their CSRF
//! token, the same-origin check of every POST, and the slow-down after wrong tokens.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{pages, App, Caller, Identity};

/// The session cookie's name.
pub(crate) const COOKIE: &str = "outbox_console_session";
/// Sessions kept at most; the oldest go first.
const MAX_SESSIONS: usize = 1000;
/// Form bodies read at most (a selection of a page of ids is far below).
pub(crate) const MAX_BODY: usize = 1 << 20;

/// Equal without an early exit: the time taken does not tell how much of a guess was right.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

/// 256 random bits (two v4 uuids from the operating system's generator), as hex.
fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

struct Session {
    csrf: String,
    expires: Instant,
}

/// Logged-in browsers: session id (the cookie) to CSRF token.
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Session>>);

impl Sessions {
    /// A new session: (id, csrf token).
    fn create(&self, ttl: Duration) -> (String, String) {
        let id = random_token();
        let csrf = random_token();
        let now = Instant::now();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + ttl,
            },
        );
        (id, csrf)
    }

    /// The CSRF token of the live session `id`. Looked up by its id as a map key: the id is 256
    /// random bits, which no timing of the lookup narrows down.
    fn csrf(&self, id: &str) -> Option<String> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.csrf.clone()),
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    fn remove(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

/// Wrong tokens in a row (forgotten after ten quiet minutes). Each wrong token waits longer
/// before its 401 (up to 2 s), one at a time: guessing in parallel gains nothing.
#[derive(Default)]
pub(crate) struct Throttle(tokio::sync::Mutex<(u32, Option<Instant>)>);

impl Throttle {
    async fn wrong_token(&self, from: Option<SocketAddr>) {
        let mut state = self.0.lock().await;
        let now = Instant::now();
        if state
            .1
            .is_some_and(|last| now.duration_since(last) > Duration::from_secs(600))
        {
            state.0 = 0;
        }
        state.0 = state.0.saturating_add(1);
        state.1 = Some(now);
        let delay = Duration::from_millis(25 << state.0.min(7)).min(Duration::from_secs(2));
        tracing::warn!(
            client_addr = ?from,
            failures = state.0,
            delay_ms = delay.as_millis() as u64,
            "console: wrong token"
        );
        tokio::time::sleep(delay).await;
    }
}

fn cookie_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// A POST must come from a page of this console: its `Origin` (else its `Referer`) names the
/// host the request was sent to, and a browser's `Sec-Fetch-Site` does not say cross-site.
/// Without `Origin` and `Referer` (not a browser) only a bearer caller passes.
fn same_origin(headers: &HeaderMap, bearer: bool) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return false;
        }
    }
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let source = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|v| v.to_str().ok());
    match source {
        Some(source) => {
            let rest = source
                .strip_prefix("http://")
                .or_else(|| source.strip_prefix("https://"));
            rest.map(|r| r.split('/').next().unwrap_or(""))
                .is_some_and(|authority| authority.eq_ignore_ascii_case(host))
        }
        None => bearer,
    }
}

fn form_value(body: &[u8], name: &str) -> Option<String> {
    url::form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn refuse(app: &App, code: StatusCode, message: &str) -> Response {
    (code, pages::refusal(app, code, message)).into_response()
}

/// The 401 every request without the token gets: the login form and nothing else.
fn unauthorized(app: &App, wrong: bool) -> Response {
    let mut res = (StatusCode::UNAUTHORIZED, pages::login(app, wrong)).into_response();
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// The guard in front of every route: the login form is the only thing served without the
/// token; POSTs pass the same-origin check and (for a session) the CSRF token.
pub(crate) async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let addr = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let is_post = req.method() == Method::POST;
    let headers = req.headers().clone();
    let path = req.uri().path().to_string();

    // The login form, and the stylesheet that styles it (it holds no secret): without a session.
    if path == "/login" || (path == "/static/console.css" && req.method() == Method::GET) {
        return next.run(req).await;
    }

    let token = app.config.token.expose().as_bytes();
    let caller = if let Some(given) = bearer(&headers) {
        if !constant_time_eq(given.as_bytes(), token) {
            app.throttle.wrong_token(addr).await;
            return unauthorized(&app, true);
        }
        Caller::Bearer
    } else if let Some(id) = cookie_session(&headers) {
        match app.sessions.csrf(&id) {
            Some(csrf) => Caller::Session { id, csrf },
            None => return unauthorized(&app, false),
        }
    } else {
        return unauthorized(&app, false);
    };

    let mut req = req;
    if is_post {
        if !same_origin(&headers, matches!(caller, Caller::Bearer)) {
            tracing::warn!(client_addr = ?addr, path = %path, "console: cross-site POST refused");
            return refuse(&app, StatusCode::FORBIDDEN, "cross-site request refused");
        }
        if let Caller::Session { csrf, .. } = &caller {
            let (parts, body) = req.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
                return refuse(&app, StatusCode::PAYLOAD_TOO_LARGE, "request too large");
            };
            let given = form_value(&bytes, "csrf").unwrap_or_default();
            if !constant_time_eq(given.as_bytes(), csrf.as_bytes()) {
                tracing::warn!(client_addr = ?addr, path = %path, "console: POST without its CSRF token refused");
                return refuse(
                    &app,
                    StatusCode::FORBIDDEN,
                    "the form is stale or not from this console: reload the page",
                );
            }
            req = Request::from_parts(parts, Body::from(bytes));
        }
    }
    req.extensions_mut().insert(Identity { caller, addr });
    next.run(req).await
}

/// GET /login: the form.
pub(crate) async fn login_form(State(app): State<Arc<App>>) -> Response {
    pages::login(&app, false).into_response()
}

/// POST /login: the token from the form; a session cookie on success.
pub(crate) async fn login(State(app): State<Arc<App>>, req: Request) -> Response {
    let app = &*app;
    let addr = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    if !same_origin(req.headers(), false) {
        return refuse(app, StatusCode::FORBIDDEN, "cross-site request refused");
    }
    let secure = req
        .headers()
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let Ok(bytes) = axum::body::to_bytes(req.into_body(), MAX_BODY).await else {
        return refuse(app, StatusCode::PAYLOAD_TOO_LARGE, "request too large");
    };
    let given = form_value(&bytes, "token").unwrap_or_default();
    if !constant_time_eq(
        given.trim().as_bytes(),
        app.config.token.expose().as_bytes(),
    ) {
        app.throttle.wrong_token(addr).await;
        return unauthorized(app, true);
    }
    let (id, _) = app.sessions.create(app.config.session_ttl);
    tracing::info!(client_addr = ?addr, "console: logged in");
    let cookie = format!(
        "{COOKIE}={id}; Path={}; HttpOnly; SameSite=Strict; Max-Age={}{}",
        cookie_path(app),
        app.config.session_ttl.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    let mut res = axum::response::Redirect::to(&app.href("/")).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, value);
    }
    res
}

fn cookie_path(app: &App) -> String {
    if app.config.base_path.is_empty() {
        "/".into()
    } else {
        app.config.base_path.clone()
    }
}

/// POST /logout: the session ends here and in the browser.
pub(crate) async fn logout(
    State(app): State<Arc<App>>,
    axum::Extension(who): axum::Extension<Identity>,
) -> Response {
    if let Caller::Session { id, .. } = &who.caller {
        app.sessions.remove(id);
    }
    let mut res = axum::response::Redirect::to(&app.href("/login")).into_response();
    let cookie = format!(
        "{COOKIE}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0",
        cookie_path(&app)
    );
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, value);
    }
    res
}

/// Headers of every response: no script runs (the pages need none), nothing is framed, sniffed,
/// cached or sent on as a referrer.
pub(crate) async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret-token", b"secret-token"));
        assert!(!constant_time_eq(b"secret-token", b"secret-tokex"));
        assert!(!constant_time_eq(b"secret-token", b"secret-token2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    #[test]
    fn a_post_must_come_from_the_console_itself() {
        let ok = headers(&[
            ("host", "127.0.0.1:9465"),
            ("origin", "http://127.0.0.1:9465"),
        ]);
        assert!(same_origin(&ok, false));
        let other = headers(&[
            ("host", "127.0.0.1:9465"),
            ("origin", "http://evil.example"),
        ]);
        assert!(!same_origin(&other, true));
        let prefix = headers(&[
            ("host", "127.0.0.1:9465"),
            ("origin", "http://127.0.0.1:9465.evil.example"),
        ]);
        assert!(!same_origin(&prefix, false));
        let referer = headers(&[
            ("host", "console.example"),
            ("referer", "https://console.example/dead-letters"),
        ]);
        assert!(same_origin(&referer, false));
        let cross = headers(&[
            ("host", "127.0.0.1:9465"),
            ("origin", "http://127.0.0.1:9465"),
            ("sec-fetch-site", "cross-site"),
        ]);
        assert!(!same_origin(&cross, false));
        let bare = headers(&[("host", "127.0.0.1:9465")]);
        assert!(!same_origin(&bare, false));
        assert!(same_origin(&bare, true));
    }
}
