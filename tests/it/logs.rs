//! The binary's text log as an operator reads it: in a file, a pipe or journald, and on a
//! terminal.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use testkit::outbox::{CliRelay, Env};
use testkit::relay_bin;

/// A relay that can reach neither its database nor its broker: it logs at once and keeps waiting.
fn unreachable_run(cmd: &mut Command) {
    cmd.env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .env("NATS_URL", "nats://127.0.0.1:1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
}

/// The first line `child` writes to `out` (its stderr or its stdout), within 10 s; the child is
/// killed then.
fn first_line(mut child: Child, out: impl std::io::Read + Send + 'static) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    line.expect("a log line within 10 s")
}

/// The first log line of `run` written to a pipe.
fn on_a_pipe() -> String {
    let mut cmd = Command::new(relay_bin());
    cmd.args(["run", "--metrics-addr", "off"]);
    unreachable_run(&mut cmd);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let err = child.stderr.take().expect("stderr");
    first_line(child, err)
}

/// The first log line of `run` written to a terminal (util-linux `script` gives it a pty), with
/// `NO_COLOR` set to `no_color` or unset.
fn on_a_terminal(no_color: Option<&str>) -> String {
    let command = format!("exec {} run --metrics-addr off", relay_bin().display());
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &command, "/dev/null"]);
    unreachable_run(&mut cmd);
    match no_color {
        Some(v) => cmd.env("NO_COLOR", v),
        None => cmd.env_remove("NO_COLOR"),
    };
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux) runs the relay on a pty");
    let out = child.stdout.take().expect("stdout");
    first_line(child, out)
}

/// Colours only on a terminal, and not there either with `NO_COLOR` set (to anything but the
/// empty string): written to a file, a pipe or journald the escape codes are noise in every line.
#[test]
fn the_text_log_has_colours_only_on_a_terminal_without_no_color() {
    let piped = on_a_pipe();
    assert!(piped.contains("starting relay"), "{piped:?}");
    assert!(!piped.contains('\u{1b}'), "colours in a pipe: {piped:?}");
    let terminal = on_a_terminal(None);
    assert!(terminal.contains("starting relay"), "{terminal:?}");
    assert!(
        terminal.contains('\u{1b}'),
        "no colours on a terminal: {terminal:?}"
    );
    let no_color = on_a_terminal(Some("1"));
    assert!(no_color.contains("starting relay"), "{no_color:?}");
    assert!(
        !no_color.contains('\u{1b}'),
        "colours with NO_COLOR: {no_color:?}"
    );
    let empty = on_a_terminal(Some(""));
    assert!(empty.contains('\u{1b}'), "NO_COLOR empty counts as unset");
}

/// Values from rows (aggregate id, event type, error text) reach the text log with their control
/// characters escaped: a row cannot forge a log line (a newline and a made-up line after it), move
/// the cursor or clear an operator's terminal.
#[tokio::test]
async fn values_from_rows_cannot_forge_log_lines_or_send_escapes() {
    let env = Env::new().await;
    let forged = "2026-01-01T00:00:00.000000Z  INFO outbox_relay: all clear";
    let relay = CliRelay::run_logged(&env, &[]);
    env.client()
        .await
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ('order', $1, $2, '{}', '\"not an object\"')",
            &[
                &format!("evil\n{forged}\u{1b}[2J\r\u{7}"),
                &"order.created\u{1b}]0;title\u{7}\u{202e}",
            ],
        )
        .await
        .expect("insert");
    env.wait_dead_letters(1, Duration::from_secs(30)).await;
    let log = relay.log();
    relay.kill();
    assert!(log.contains("evil"), "the dead letter is logged: {log}");
    for line in log.lines() {
        assert!(
            !line.starts_with(forged),
            "a row forged a log line: {line:?}"
        );
    }
    for raw in ["\u{1b}[2J", "\u{1b}]0;", "\r", "\u{7}", "\u{202e}"] {
        assert!(!log.contains(raw), "{raw:?} reached the log: {log:?}");
    }
    assert!(
        log.contains("evil\\n2026-01-01"),
        "the newline is shown escaped: {log}"
    );
}
