//! The console in headless Chromium (the distribution's `chromium` and `chromium-driver`), served
//! by the binary (`outbox-relay console`) beside a running relay: log in, read the overview,
//! filter dead letters (ordered by time dead), open one and retry it (published, its followers
//! after it), bulk-discard a filtered set after confirming, and check that markup in a payload and
//! an aggregate id stays text. Takes the README's screenshots (docs/console-overview.png,
//! docs/console-dead-letters.png; written there with `OUTBOX_UPDATE_SCREENSHOTS=1`).
//! Then, with more dead letters than a page holds: the login page styled before logging in (the
//! stylesheet served without a session), the filtered list's total and its next and previous
//! pages, jumping to an event by its id (a known one, an unknown one, one that is not an id), and
//! a payload over 64 KiB shown cut with its size and a link to the whole of it.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use testkit::browser::{Browser, Client, Locator};
use testkit::outbox::{CliRelay, Env};
use testkit::{relay_command, wait_until};

use super::console::{dead_letter, followers, send, TOKEN};

const XSS_AGGREGATE: &str = "<script>window.__xss=1</script>\"'";
const XSS_PAYLOAD: &str = "<script>window.__xss=2</script><img src=x onerror=\"window.__xss=3\">";

async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap_or_else(|e| panic!("text of {css}: {e}"))
}

/// The text of `css` on the page now, if it is there (a page being replaced has none).
async fn try_text(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

async fn type_into(c: &Client, css: &str, value: &str) {
    let input = c
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    input.clear().await.expect("clear");
    input.send_keys(value).await.expect("type");
}

/// Waits (up to 20 s) until the element `css` exists and its text contains `wanted`.
async fn wait_text(c: &Client, css: &str, wanted: &str) {
    wait_until(
        &format!("{css} to show {wanted:?}"),
        Duration::from_secs(20),
        || async { try_text(c, css).await.is_some_and(|t| t.contains(wanted)) },
    )
    .await;
}

/// The ids of the rows of the dead-letter list on the page now, in order (`None` while a page is
/// being replaced).
async fn row_ids(c: &Client) -> Option<Vec<String>> {
    let ids = c
        .execute(
            r#"return Array.from(document.querySelectorAll('#dead-letter-list input[name="id"]'), e => e.value);"#,
            vec![],
        )
        .await
        .ok()?;
    serde_json::from_value(ids).ok()
}

/// Waits (up to 20 s) until the list shows exactly the rows `ids`, in that order.
async fn wait_rows(c: &Client, what: &str, ids: &[String]) {
    wait_until(what, Duration::from_secs(20), || async {
        row_ids(c).await.is_some_and(|shown| shown == ids)
    })
    .await;
}

/// No script ran: nothing set the marker the injected markup would set.
async fn assert_no_script_ran(c: &Client) {
    let ran = c
        .execute("return window.__xss === undefined && document.scripts.length === 0 && document.images.length === 0;", vec![])
        .await
        .expect("execute");
    assert_eq!(
        ran,
        serde_json::Value::Bool(true),
        "an injected script or image is in the page"
    );
}

/// A screenshot of the page as `name`: into docs/ (the README's) with
/// `OUTBOX_UPDATE_SCREENSHOTS=1`, else into the temporary directory, so that a test run leaves the
/// working tree as it was.
async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let dir = if std::env::var_os("OUTBOX_UPDATE_SCREENSHOTS").is_some() {
        crate::repo_root().join("docs")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(name);
    std::fs::write(&path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// `outbox-relay console` on a free port, ready.
async fn console_binary(env: &Env) -> (CliRelay, String) {
    let addr = testkit::free_addr();
    let mut cmd = relay_command();
    cmd.args(["console", "--listen", &addr.to_string()])
        .env("DATABASE_URL", &env.db)
        .env("OUTBOX_CONSOLE_TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let process = CliRelay::from_command(cmd);
    wait_until("the console listening", Duration::from_secs(20), || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    (process, format!("http://{addr}"))
}

#[tokio::test]
async fn an_operator_works_through_the_console_in_a_browser() {
    let _turn = testkit::heavy().await;
    let env = Env::new().await;
    let client = env.client().await;
    // An hour of history for the chart.
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, processed_at)
             SELECT 'order', 'hist-' || g, 'order.created', '{}',
                    now() - (g % 60) * interval '1 minute' - (g % 7) * interval '1 second'
             FROM generate_series(1, 2400) g WHERE g % 60 < 40 OR g % 3 = 0",
        )
        .await
        .expect("history");
    let head = dead_letter(
        &client,
        "A-1",
        "order.failed",
        r#"{"sku": "X-1", "qty": 2, "note": "first order"}"#,
        "publish timed out: no ack from the stream",
    )
    .await;
    client
        .execute(
            r#"UPDATE outbox_events SET headers = '{"trace": "abc-123"}' WHERE id = $1"#,
            &[&head],
        )
        .await
        .expect("headers");
    followers(&client, "A-1", 3).await;
    for i in 1..=30 {
        let id = format!("C-{i}");
        dead_letter(
            &client,
            &id,
            "invoice.failed",
            r#"{"lines": 400}"#,
            "stream refused: maximum payload exceeded",
        )
        .await;
        followers(&client, &id, 1).await;
    }
    let xss = dead_letter(
        &client,
        XSS_AGGREGATE,
        "order.failed",
        &serde_json::json!({ "html": XSS_PAYLOAD }).to_string(),
        "<b>not bold</b>",
    )
    .await;
    let relay = env.spawn(env.config()).await;
    let (console, base) = console_binary(&env).await;
    let browser = Browser::start().await;
    let c = &browser.client;

    // Log in.
    c.goto(&format!("{base}/")).await.expect("goto");
    type_into(c, "#token", TOKEN).await;
    click(c, "#login").await;
    wait_text(c, "h1", "Overview").await;

    // The overview.
    // (The overview reloads itself every 10 s: read it through waits, which outlast a reload.)
    wait_text(c, "#dead-letters-count", "32").await;
    wait_text(c, "#blocked", "order / A-1").await;
    wait_text(c, "#blocked", "publish timed out: no ack").await;
    wait_text(c, "#relays", "outbox-relay").await;
    wait_text(c, "#causes", "stream refused: maximum payload exceeded").await;
    c.find(Locator::Css("#chart")).await.expect("the chart");
    assert_no_script_ran(c).await;
    screenshot(c, "console-overview.png").await;

    // The dead letters, then filtered.
    c.goto(&format!("{base}/dead-letters")).await.expect("goto");
    wait_text(c, "#dead-letter-list", "invoice.failed").await;
    assert_no_script_ran(c).await;
    let list = text(c, "#dead-letter-list").await;
    assert!(
        list.contains(XSS_AGGREGATE),
        "the aggregate id as text: {list}"
    );
    screenshot(c, "console-dead-letters.png").await;
    type_into(c, "#f-event_type", "order.failed").await;
    type_into(c, "#f-aggregate_id", "A-1").await;
    click(c, r#"#f-sort option[value="dead"]"#).await;
    click(c, "#apply-filter").await;
    wait_until("the filtered list", Duration::from_secs(20), || async {
        try_text(c, "#dead-letter-list").await.is_some_and(|list| {
            list.contains("A-1")
                && !list.contains("invoice.failed")
                && !list.contains("window.__xss")
        })
    })
    .await;
    // The order chosen in the form is in the address and stays chosen.
    let url = c.current_url().await.expect("the address");
    assert!(url.as_str().contains("sort=dead"), "{url}");
    assert_eq!(text(c, "#f-sort option[selected]").await, "by time dead");

    // Open it: payload, headers, error, followers; retry it.
    click(c, "a.event").await;
    wait_text(c, "#state", "dead letter").await;
    let payload = text(c, "#payload").await;
    assert!(
        payload.contains(r#""sku": "X-1""#),
        "pretty-printed: {payload}"
    );
    assert!(text(c, "#headers").await.contains("abc-123"));
    assert_eq!(
        text(c, "#last-error").await,
        "publish timed out: no ack from the stream"
    );
    assert_eq!(text(c, "#followers-count").await, "3");
    click(c, "#retry").await;
    wait_text(c, "#notice", "Retried 1 dead letter").await;
    env.wait_stream_len(4, Duration::from_secs(30)).await;
    let stored = env.stored().await;
    assert_eq!(stored[0].event_id(), head, "the retried head first");
    let ns: Vec<String> = stored[1..].iter().map(|m| m.payload.clone()).collect();
    assert_eq!(
        ns,
        [r#"{"n": 1}"#, r#"{"n": 2}"#, r#"{"n": 3}"#],
        "then its followers, in order"
    );

    // Bulk-discard every dead letter of the most frequent cause, through its link, after
    // confirming.
    c.goto(&format!("{base}/dead-letters")).await.expect("goto");
    wait_text(
        c,
        "#list-causes",
        "stream refused: maximum payload exceeded",
    )
    .await;
    click(c, "#list-causes a.cause").await;
    wait_until("the filtered list", Duration::from_secs(20), || async {
        try_text(c, "#dead-letter-list")
            .await
            .is_some_and(|list| !list.contains("order.failed"))
    })
    .await;
    click(c, "#bulk-discard").await;
    wait_text(c, "#confirm-count", "30").await;
    assert_eq!(
        env.count("discarded_at IS NOT NULL").await,
        0,
        "nothing before confirming"
    );
    click(c, "#confirm").await;
    wait_text(c, "#job-state", "Done: 30 dead letters discarded").await;
    assert_eq!(env.count("discarded_at IS NOT NULL").await, 30);
    // Discarding released their followers.
    env.wait_stream_len(34, Duration::from_secs(30)).await;

    // Markup in a payload and an aggregate id stays text; no script ran.
    c.goto(&format!("{base}/dead-letters/{xss}"))
        .await
        .expect("goto");
    wait_text(c, "#state", "dead letter").await;
    assert_eq!(text(c, "#aggregate-id").await, XSS_AGGREGATE);
    assert!(text(c, "#payload")
        .await
        .contains("<script>window.__xss=2</script>"));
    assert_eq!(text(c, "#last-error").await, "<b>not bold</b>");
    assert_no_script_ran(c).await;
    c.goto(&format!("{base}/")).await.expect("goto");
    wait_text(c, "h1", "Overview").await;
    assert_no_script_ran(c).await;

    browser.close().await;
    relay.stop().await;
    assert_eq!(console.terminate(), Some(0), "the console stops on SIGTERM");
}

/// The login page styled before logging in; the filtered list's total, its next page and back;
/// jumping to an event by id; a payload over 64 KiB cut, and the whole of it through its link with
/// the browser's session.
#[tokio::test]
async fn the_console_pages_jumps_to_an_id_and_cuts_a_big_payload_in_a_browser() {
    let _turn = testkit::heavy().await;
    let env = Env::new().await;
    let client = env.client().await;
    // More dead letters of one type than a page (50) holds, one of another type with a payload
    // over 64 KiB.
    client
        .batch_execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, attempts,
                                        last_error, dead_lettered_at)
             SELECT 'order', 'P-' || g, 'page.failed', jsonb_build_object('n', g), 5,
                    'publish timed out', now()
             FROM generate_series(1, 60) g",
        )
        .await
        .expect("dead letters");
    let paged: Vec<(String, String)> = client
        .query(
            "SELECT id::text, aggregate_id FROM outbox_events WHERE event_type = 'page.failed'
             ORDER BY seq",
            &[],
        )
        .await
        .expect("their ids")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let ids: Vec<String> = paged.iter().map(|(id, _)| id.clone()).collect();
    let (first, second) = ids.split_at(50);
    let lines: Vec<String> = (0..20_000).map(|i| format!("line {i}")).collect();
    let big_json = serde_json::json!({ "lines": lines });
    let big = dead_letter(
        &client,
        "B-1",
        "big.failed",
        &big_json.to_string(),
        "stream refused: maximum payload exceeded",
    )
    .await;
    let pretty: i32 = client
        .query_one(
            "SELECT octet_length(jsonb_pretty(payload)) FROM outbox_events WHERE id = $1",
            &[&big],
        )
        .await
        .expect("its pretty-printed size")
        .get(0);
    assert!(pretty > 64 * 1024, "a payload over 64 KiB: {pretty} bytes");
    let (console, base) = console_binary(&env).await;
    let addr: SocketAddr = base
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .expect("the console's address");
    let browser = Browser::start().await;
    let c = &browser.client;

    // The login page, before logging in: styled, its stylesheet served without a session.
    c.goto(&format!("{base}/")).await.expect("goto");
    c.find(Locator::Css("#token"))
        .await
        .expect("the login form");
    let style = c
        .execute(
            "const body = getComputedStyle(document.body);
             return {
               background: body.backgroundColor,
               font: body.fontFamily,
               box: getComputedStyle(document.querySelector('.login')).backgroundColor,
               sheets: Array.from(document.styleSheets, s => [s.href, s.cssRules.length]),
             };",
            vec![],
        )
        .await
        .expect("execute");
    assert_eq!(style["background"], "rgb(246, 247, 249)", "{style}");
    assert_eq!(style["box"], "rgb(255, 255, 255)", "{style}");
    assert!(
        style["font"]
            .as_str()
            .is_some_and(|f| f.contains("system-ui")),
        "{style}"
    );
    let sheets = style["sheets"].as_array().expect("the style sheets");
    assert_eq!(sheets.len(), 1, "{style}");
    assert_eq!(
        sheets[0][0],
        format!("{base}/static/console.css").as_str(),
        "{style}"
    );
    assert!(
        sheets[0][1].as_u64().is_some_and(|rules| rules > 0),
        "its rules were loaded: {style}"
    );
    assert!(
        c.get_all_cookies().await.expect("cookies").is_empty(),
        "no session yet"
    );
    type_into(c, "#token", TOKEN).await;
    click(c, "#login").await;
    wait_text(c, "h1", "Overview").await;

    // The list: how many match, unfiltered then filtered.
    c.goto(&format!("{base}/dead-letters")).await.expect("goto");
    wait_text(c, "#total", "61 dead letters match.").await;
    type_into(c, "#f-event_type", "page.failed").await;
    click(c, "#apply-filter").await;
    wait_text(c, "#total", "60 dead letters match.").await;
    wait_rows(c, "the first page", first).await;
    assert!(
        c.find(Locator::Css("#prev-page")).await.is_err(),
        "no previous page"
    );

    // The next page: the other rows, the same total, the filter kept.
    click(c, "#next-page").await;
    wait_rows(c, "the second page", second).await;
    assert!(first.iter().all(|id| !second.contains(id)), "other rows");
    assert_eq!(text(c, "#total").await, "60 dead letters match.");
    let url = c.current_url().await.expect("the address");
    assert!(url.as_str().contains("event_type=page.failed"), "{url}");
    assert!(url.as_str().contains("after="), "{url}");
    assert!(
        c.find(Locator::Css("#next-page")).await.is_err(),
        "the last page"
    );

    // And back: the first page again.
    click(c, "#prev-page").await;
    wait_rows(c, "the first page again", first).await;
    assert_eq!(text(c, "#total").await, "60 dead letters match.");
    let url = c.current_url().await.expect("the address");
    assert!(url.as_str().contains("event_type=page.failed"), "{url}");
    assert!(url.as_str().contains("before="), "{url}");
    assert!(
        c.find(Locator::Css("#prev-page")).await.is_err(),
        "no page before the first"
    );
    c.find(Locator::Css("#next-page"))
        .await
        .expect("a next page again");

    // Jump to an event by its id (one of the second page's): its detail page.
    let (target, aggregate) = &paged[55];
    type_into(c, "#f-id", target).await;
    click(c, "#go").await;
    wait_text(c, "#state", "dead letter").await;
    assert_eq!(text(c, "#aggregate-id").await, *aggregate);
    assert!(text(c, "#event").await.contains(target.as_str()));
    let url = c.current_url().await.expect("the address");
    assert_eq!(url.as_str(), format!("{base}/dead-letters/{target}"));
    // An id no event has: the console's "no such event" page.
    c.goto(&format!("{base}/dead-letters")).await.expect("goto");
    type_into(c, "#f-id", &uuid::Uuid::new_v4().to_string()).await;
    click(c, "#go").await;
    wait_text(c, "p.problem", "no such event").await;
    assert_eq!(text(c, "h1").await, "Not Found");
    // Not an id at all: the console says so.
    c.goto(&format!("{base}/dead-letters")).await.expect("goto");
    type_into(c, "#f-id", "not-an-id").await;
    click(c, "#go").await;
    wait_text(c, "p.problem", "id: not an event id").await;
    assert_eq!(text(c, "h1").await, "Bad Request");

    // A payload over 64 KiB: cut, with its size and a link to the whole of it.
    c.goto(&format!("{base}/dead-letters/{big}"))
        .await
        .expect("goto");
    wait_text(c, "#state", "dead letter").await;
    let notice = text(c, "#payload-size").await;
    let size = format!(
        "The payload is {:.1} KiB pretty-printed: below, its first 64.0 KiB.",
        f64::from(pretty) / 1024.0
    );
    assert!(notice.contains(&size), "{size:?} in {notice:?}");
    let shown = text(c, "#payload").await;
    assert!(shown.contains(r#""line 0""#), "its start is shown");
    assert!(!shown.contains(r#""line 19999""#), "not its end");
    let href = c
        .find(Locator::Css("#payload-whole"))
        .await
        .expect("the link to the whole payload")
        .prop("href")
        .await
        .expect("its href")
        .expect("an href");
    let path = format!("/dead-letters/{big}/payload");
    assert_eq!(href, format!("{base}{path}"));
    // Fetched with the browser's session, it is the whole payload, as a JSON download.
    let cookie = c
        .get_all_cookies()
        .await
        .expect("cookies")
        .iter()
        .map(|k| format!("{}={}", k.name(), k.value()))
        .collect::<Vec<_>>()
        .join("; ");
    assert!(!cookie.is_empty(), "a session");
    let whole = send(addr, "GET", &path, &[("cookie", &cookie)], "").await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert_eq!(whole.header("content-type"), Some("application/json"));
    assert_eq!(
        whole.header("content-disposition"),
        Some(format!(r#"attachment; filename="{big}.json""#).as_str())
    );
    let got: serde_json::Value = serde_json::from_str(&whole.body).expect("JSON");
    assert_eq!(got, big_json, "the whole payload");
    assert_eq!(
        send(addr, "GET", &path, &[], "").await.status,
        401,
        "only with the session"
    );

    browser.close().await;
    assert_eq!(console.terminate(), Some(0), "the console stops on SIGTERM");
}

/// In a browser: a filter holding a zero-width space stays that filter through the form and the
/// bulk action's confirmation (the escape's text, another dead letter's aggregate id, is left
/// alone); at 1280 px one long value in the relays table does not push it past the page.
#[tokio::test]
async fn an_invisible_character_in_a_filter_round_trips_in_a_browser() {
    let _turn = testkit::heavy().await;
    let env = Env::new().await;
    let client = env.client().await;
    let zero_width = "ord-zero\u{200b}width";
    let target = dead_letter(&client, zero_width, "order.failed", "{}", "boom").await;
    let decoy = dead_letter(
        &client,
        "ord-zero\\u{200b}width",
        "order.failed",
        "{}",
        "boom",
    )
    .await;
    client
        .execute(
            "INSERT INTO outbox_relays (id, host, pid, version, source, slot, interval_seconds)
             VALUES (gen_random_uuid(), $1, 1, '0.1.0', 'notify', NULL, 5)",
            &[&"h".repeat(300)],
        )
        .await
        .expect("a relay with a long host name");
    let (console, base) = console_binary(&env).await;
    let browser = Browser::start().await;
    let c = &browser.client;
    c.goto(&format!("{base}/")).await.expect("goto");
    type_into(c, "#token", TOKEN).await;
    click(c, "#login").await;
    wait_text(c, "h1", "Overview").await;
    wait_text(c, "#relays", "hhhh").await;
    let fits = c
        .execute(
            "const t = document.querySelector('#relays').getBoundingClientRect();
             return [t.right, document.documentElement.clientWidth];",
            vec![],
        )
        .await
        .expect("execute");
    let (right, width) = (fits[0].as_f64(), fits[1].as_f64());
    assert!(
        matches!((right, width), (Some(r), Some(w)) if r <= w),
        "the relays table within the page: {fits}"
    );

    c.goto(&format!(
        "{base}/dead-letters?aggregate_id=ord-zero%E2%80%8Bwidth"
    ))
    .await
    .expect("goto");
    wait_text(c, "#total", "1 dead letter matches.").await;
    let held = || async move {
        c.execute(
            "return document.querySelector('#f-aggregate_id').value;",
            vec![],
        )
        .await
        .expect("execute")
    };
    assert_eq!(held().await, zero_width, "the input holds the value");
    // Filter again: the same filter.
    click(c, "#apply-filter").await;
    wait_until("the list again", Duration::from_secs(20), || async {
        c.current_url()
            .await
            .is_ok_and(|u| u.as_str().contains("ord-zero%E2%80%8Bwidth"))
    })
    .await;
    wait_text(c, "#total", "1 dead letter matches.").await;
    assert_eq!(held().await, zero_width, "still the value");
    click(c, "#bulk-discard").await;
    wait_text(c, "#confirm-count", "1").await;
    click(c, "#confirm").await;
    wait_text(c, "#job-state", "Done: 1 dead letter discarded").await;
    let dead = |id| {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT processed_at IS NULL FROM outbox_events WHERE id = $1",
                    &[&id],
                )
                .await
                .expect("state")
                .get::<_, bool>(0)
        }
    };
    assert!(!dead(target).await, "the filtered dead letter is discarded");
    assert!(dead(decoy).await, "the escape's text's is not");
    browser.close().await;
    assert_eq!(console.terminate(), Some(0), "the console stops on SIGTERM");
}
