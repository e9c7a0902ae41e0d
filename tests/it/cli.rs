//! The operator CLI: natscli's environment names, shell completions and man pages, `--dry-run`,
//! and the summary line (and terminal progress) of the long operator commands.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use testkit::outbox::{cli, STREAM};
use testkit::{NatsServer, RelayProcess};

const SECRET: &str = "s3cret-Pa55";

/// Every variable the relay reads for NATS, so that the test's own environment plays no part.
const NATS_VARS: &[&str] = &[
    "NATS_URL",
    "NATS_USER",
    "NATS_PASSWORD",
    "NATS_CREDS",
    "NATS_NKEY",
    "NATS_CA",
    "NATS_CERT",
    "NATS_KEY",
    "NATS_TLS_CA",
    "NATS_TLS_CERT",
    "NATS_TLS_KEY",
];

/// `outbox-relay run --create-stream` against `db` and `nats_url` (no credentials in it), with
/// exactly the NATS variables `vars`.
fn run_command(db: &str, nats_url: &str, vars: &[(&str, &str)]) -> Command {
    let mut cmd = testkit::relay_command();
    cmd.args([
        "run",
        "--create-stream",
        "--metrics-addr",
        "off",
        "--fallback-interval",
        "60s",
    ])
    .env("DATABASE_URL", db)
    .env("RUST_LOG", "warn");
    for var in NATS_VARS {
        cmd.env_remove(var);
    }
    cmd.env("NATS_URL", nats_url);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `cmd` until it exits, or its output satisfies `enough`, or `within` passes (in both
/// cases it is killed): its exit code (`None` when killed), stdout and stderr together, and how
/// long it ran.
async fn run_for(
    mut cmd: Command,
    within: Duration,
    enough: impl Fn(&str) -> bool,
) -> (Option<i32>, String, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("out.log");
    let file = std::fs::File::create(&log).expect("log file");
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup"))
        .stderr(file);
    let started = Instant::now();
    let mut child = RelayProcess::spawn("outbox-relay", cmd, Some(log.clone())).expect("spawn");
    let code = loop {
        if let Some(status) = child.try_wait() {
            break status.code();
        }
        let seen = std::fs::read_to_string(&log).unwrap_or_default();
        if enough(&seen) || started.elapsed() > within {
            child.kill();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    (code, out, started.elapsed())
}

/// [`run_for`] of a command that must exit by itself within 30 s.
async fn run_to_end(cmd: Command) -> (Option<i32>, String, Duration) {
    let (code, out, took) = run_for(cmd, Duration::from_secs(30), |_| false).await;
    assert!(code.is_some(), "did not exit within 30 s: {out}");
    (code, out, took)
}

async fn insert_events(db: &str, n: i32) {
    let client = testkit::pg_client(db).await;
    client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'o' || g, 'order.created', '{}' FROM generate_series(1, $1::int) g",
            &[&n],
        )
        .await
        .expect("insert");
}

/// Waits until the relay (which created the stream) has published `n` events, reading the stream
/// through `client`.
async fn wait_published(client: async_nats::Client, n: u64) {
    let js = jetstream::new(client);
    testkit::wait_until(
        &format!("{n} events in the stream"),
        Duration::from_secs(30),
        || {
            let js = js.clone();
            async move {
                match js.get_stream(STREAM).await {
                    Ok(mut s) => s.info().await.is_ok_and(|i| i.state.messages >= n),
                    Err(_) => false,
                }
            }
        },
    )
    .await;
}

/// The relay with only natscli's NATS_USER/NATS_PASSWORD (or NATS_USER alone, a token) publishes;
/// a wrong password fails at once with exit 1 and never prints the password; credentials given
/// both in the URL and in the variables are a usage error naming the flag.
#[tokio::test]
async fn natscli_user_password_and_token_variables() {
    let users = NatsServer::start_with_config(&format!(
        "authorization {{\n  users = [ {{ user: relay, password: \"{SECRET}\" }} ]\n}}"
    ));
    let token = format!("tok-{SECRET}");
    let tokens =
        NatsServer::start_with_config(&format!("authorization {{\n  token: \"{token}\"\n}}"));
    let cases = [
        (
            &users,
            vec![("NATS_USER", "relay"), ("NATS_PASSWORD", SECRET)],
            async_nats::ConnectOptions::with_user_and_password("relay".into(), SECRET.into()),
        ),
        (
            &tokens,
            vec![("NATS_USER", token.as_str())],
            async_nats::ConnectOptions::with_token(token.clone()),
        ),
    ];
    for (nats, vars, options) in cases {
        let db = testkit::shared_pg().create_migrated_database().await;
        insert_events(&db, 3).await;
        let relay = RelayProcess::spawn(
            "relay",
            {
                let mut cmd = run_command(&db, &nats.url(), &vars);
                cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
                cmd
            },
            None,
        )
        .expect("spawn");
        let client = options
            .connect(nats.url())
            .await
            .expect("the test connects with the same credentials");
        wait_published(client, 3).await;
        assert_eq!(relay.stop().await, None, "{vars:?}");
    }

    let db = testkit::shared_pg().create_migrated_database().await;
    let wrong = format!("wrong-{SECRET}");
    let (code, out, took) = run_to_end(run_command(
        &db,
        &users.url(),
        &[("NATS_USER", "relay"), ("NATS_PASSWORD", &wrong)],
    ))
    .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("authentication failed"), "{out}");
    assert!(!out.contains(SECRET), "the password leaked:\n{out}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {out}");

    // Credentials in two places: refused before connecting, naming the flag.
    let url_with_user = format!("nats://relay:{SECRET}@127.0.0.1:{}", users.port());
    let (code, out, _) = run_to_end(run_command(
        &db,
        &url_with_user,
        &[("NATS_USER", "relay"), ("NATS_PASSWORD", SECRET)],
    ))
    .await;
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--nats-user"), "{out}");
    assert!(!out.contains(SECRET), "the password leaked:\n{out}");

    // A password without a user.
    let (code, out, _) =
        run_to_end(run_command(&db, &users.url(), &[("NATS_PASSWORD", SECRET)])).await;
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--nats-user"), "{out}");
    assert!(!out.contains(SECRET), "the password leaked:\n{out}");
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A nats-server requiring TLS with client certificates: the relay given only natscli's NATS_CA,
/// NATS_CERT and NATS_KEY publishes; NATS_TLS_CA wins over NATS_CA (a wrong CA there fails).
#[tokio::test]
async fn natscli_tls_variables_reach_the_relay() {
    // The build holds two rustls providers (ring, and aws-lc-rs through pgwire-replication):
    // this test's own NATS client needs the process default the relay installs too.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = crate::tls::pki();
    let nats = NatsServer::start_with_config(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}",
        path(&pki.cert),
        path(&pki.key),
        path(&pki.ca)
    ));
    let db = testkit::shared_pg().create_migrated_database().await;
    insert_events(&db, 2).await;
    let natscli_vars = [
        ("NATS_CA", path(&pki.ca)),
        ("NATS_CERT", path(&pki.client_cert)),
        ("NATS_KEY", path(&pki.client_key)),
    ];
    let relay = RelayProcess::spawn(
        "relay",
        {
            let mut cmd = run_command(&db, &nats.url(), &natscli_vars);
            cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
            cmd
        },
        None,
    )
    .expect("spawn");
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(pki.ca.clone())
        .add_client_certificate(pki.client_cert.clone(), pki.client_key.clone())
        .require_tls(true)
        .connect(nats.url())
        .await
        .expect("the test connects over TLS");
    wait_published(client, 2).await;
    assert_eq!(relay.stop().await, None);

    // Our name wins: NATS_TLS_CA names a CA that did not sign the server's certificate, so the
    // relay cannot verify the server. Waiting cannot heal that: it exits at once, saying why.
    let mut vars = natscli_vars.to_vec();
    vars.push(("NATS_TLS_CA", path(&pki.other_ca)));
    let (code, out, took) = run_to_end(run_command(&db, &nats.url(), &vars)).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("NATS") && out.contains("TLS") && out.contains("UnknownIssuer"),
        "the error names NATS, TLS and the cause: {out}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}: {out}");
}

#[test]
fn completions_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = testkit::relay_command()
            .args(["completions", shell])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0), "{shell}: {out:?}");
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["migrate", "run", "status", "dead-letters", "cleanup"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
        assert!(script.contains("older-than"), "{shell}: no flags");
    }
    let out = testkit::relay_command()
        .args(["completions", "tcsh"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tcsh"), "{err}");
    assert!(out.stdout.is_empty());
}

/// docs/man holds the pages the CLI generates now: a flag added without refreshing them fails here.
#[test]
fn man_pages_match_the_cli() {
    let checked_in = crate::repo_root().join("docs/man");
    let fresh = tempfile::tempdir().expect("tempdir");
    let out = testkit::relay_command()
        .args(["man", "--out-dir"])
        .arg(fresh.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let refresh = "refresh them with `cargo run -- man --out-dir docs/man` (and delete pages of \
                   removed commands)";
    let generated = names(fresh.path());
    assert_eq!(
        names(&checked_in),
        generated,
        "docs/man is out of date: {refresh}"
    );
    assert!(generated.contains(&"outbox-relay-run.1".to_string()));
    for name in &generated {
        let want = std::fs::read_to_string(fresh.path().join(name)).expect("generated page");
        let have = std::fs::read_to_string(checked_in.join(name)).expect("checked-in page");
        assert!(have == want, "docs/man/{name} is out of date: {refresh}");
    }

    // One page to stdout; an unknown subcommand is a usage error naming it.
    let out = testkit::relay_command()
        .args(["man", "dead-letters", "retry"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.starts_with(".ie"), "{page}");
    assert!(
        page.contains("outbox\\-relay\\-dead\\-letters\\-retry"),
        "{page}"
    );
    assert!(page.contains("\\-\\-dry\\-run"), "{page}");
    let out = testkit::relay_command()
        .args(["man", "nope"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}

/// `(pending, processed long ago, processed now, dead letters, attempts of the dead letters)`.
async fn counts(client: &tokio_postgres::Client) -> Vec<i64> {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE processed_at IS NULL AND dead_lettered_at IS NULL),
                    count(*) FILTER (WHERE processed_at < now() - interval '7 days'),
                    count(*) FILTER (WHERE processed_at >= now() - interval '7 days'),
                    count(*) FILTER (WHERE dead_lettered_at IS NOT NULL AND processed_at IS NULL),
                    coalesce(sum(attempts) FILTER (WHERE dead_lettered_at IS NOT NULL), 0)
             FROM outbox_events",
            &[],
        )
        .await
        .expect("counts");
    (0..5).map(|i| row.get(i)).collect()
}

/// 2,500 rows processed ten days ago, 10 processed now, 10 pending, and `dead` dead letters
/// (10 attempts each) in aggregates of their own.
async fn seed(db: &str, dead: i32) -> tokio_postgres::Client {
    let client = testkit::pg_client(db).await;
    testkit::outbox::seed_cleanup_rows(&client).await;
    client
        .execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, attempts,
                                        dead_lettered_at, last_error)
             SELECT 'payment', 'd' || g, 'payment.failed', '{}', 10, now(), 'no stream'
             FROM generate_series(1, $1::int) g",
            &[&dead],
        )
        .await
        .expect("seed dead letters");
    client
}

/// The one stdout line of a non-terminal run: `<done> in 1.2s (345 rows/s)`.
/// What each summary line of `out` says before its timing (`deleted 25 rows` of
/// `deleted 25 rows in 0.1s (250 rows/s)`), each line checked to carry a time and a rate.
pub(crate) fn summaries(out: &str) -> Vec<&str> {
    out.lines()
        .map(|line| {
            let (done, rest) = line
                .split_once(" in ")
                .unwrap_or_else(|| panic!("{line:?} is no summary line"));
            let (secs, rate) = rest.split_once("s (").expect("time and rate");
            secs.parse::<f64>().expect("seconds");
            let rate = rate.strip_suffix(" rows/s)").expect("rate");
            rate.parse::<u64>().expect("rows/s");
            done
        })
        .collect()
}

fn assert_summary(out: &str, done: &str) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "one summary line: {out:?}");
    let rest = lines[0]
        .strip_prefix(done)
        .and_then(|r| r.strip_prefix(" in "))
        .unwrap_or_else(|| panic!("{:?} does not start with {done:?}", lines[0]));
    let (secs, rate) = rest.split_once("s (").expect("time and rate");
    secs.parse::<f64>().expect("seconds");
    let rate = rate.strip_suffix(" rows/s)").expect("rate");
    rate.parse::<u64>().expect("rows/s");
}

#[tokio::test]
async fn cleanup_dry_run_counts_and_the_run_prints_one_summary_line() {
    let db = testkit::shared_pg().create_migrated_database().await;
    let client = seed(&db, 3).await;
    let before = counts(&client).await;
    assert_eq!(before, vec![10, 2500, 10, 3, 30]);

    let (code, out, err) = cli(&db, &["cleanup", "--older-than", "7d", "--dry-run"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "would delete 2500 rows (dry run)\n");
    assert_eq!(counts(&client).await, before, "a dry run changes nothing");

    let (code, out, err) = cli(
        &db,
        &["cleanup", "--older-than", "7d", "--batch-size", "300"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_summary(&out, "deleted 2500 rows");
    assert_eq!(err, "", "nothing on stderr without a terminal");
    assert_eq!(counts(&client).await, vec![10, 0, 10, 3, 30]);

    let (code, out, _) = cli(&db, &["cleanup", "--older-than", "7d", "--dry-run"]);
    assert_eq!(code, Some(0));
    assert_eq!(out, "would delete 0 rows (dry run)\n");
}

#[tokio::test]
async fn retry_dry_run_lists_and_retry_all_goes_in_batches() {
    let db = testkit::shared_pg().create_migrated_database().await;
    let client = seed(&db, 25).await;
    let before = counts(&client).await;
    let dead: Vec<uuid::Uuid> = client
        .query(
            "SELECT id FROM outbox_events WHERE dead_lettered_at IS NOT NULL ORDER BY seq",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(dead.len(), 25);

    // --all --dry-run: each dead letter (id, aggregate, type) in seq order, then the count.
    let (code, out, err) = cli(&db, &["dead-letters", "retry", "--all", "--dry-run"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 26, "{out}");
    for (line, id) in lines.iter().zip(&dead) {
        assert!(line.starts_with(&id.to_string()), "{line}");
        assert!(line.contains("payment/d"), "{line}");
        assert!(line.ends_with("payment.failed"), "{line}");
    }
    assert_eq!(lines[25], "would retry 25 dead letters (dry run)");
    assert_eq!(counts(&client).await, before);

    // Ids: the same check as the retry itself (an unknown id is exit 2, naming it).
    let (code, out, _) = cli(
        &db,
        &["dead-letters", "retry", "--dry-run", &dead[3].to_string()],
    );
    assert_eq!(code, Some(0));
    assert!(
        out.ends_with("would retry 1 dead letters (dry run)\n"),
        "{out}"
    );
    let unknown = uuid::Uuid::new_v4().to_string();
    let (code, _, err) = cli(
        &db,
        &[
            "dead-letters",
            "retry",
            "--dry-run",
            &dead[3].to_string(),
            &unknown,
        ],
    );
    assert_eq!(code, Some(2));
    assert!(err.contains(&unknown), "{err}");
    assert_eq!(counts(&client).await, before);

    // --batch-size belongs to --all.
    let (code, _, err) = cli(
        &db,
        &[
            "dead-letters",
            "retry",
            &dead[0].to_string(),
            "--batch-size",
            "7",
        ],
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--batch-size") || err.contains("--all"),
        "{err}"
    );

    // The retry: 25 in batches of 7, one summary line, every dead letter fresh.
    let (code, out, err) = cli(
        &db,
        &["dead-letters", "retry", "--all", "--batch-size", "7"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_summary(&out, "25 dead letters queued for retry");
    assert_eq!(err, "");
    assert_eq!(counts(&client).await, vec![35, 2500, 10, 0, 0]);
    let (code, out, _) = cli(&db, &["dead-letters", "retry", "--all"]);
    assert_eq!(code, Some(0));
    assert_summary(&out, "0 dead letters queued for retry");
}

/// On a terminal (`script` gives the command a pseudo-terminal) the summary line is printed too,
/// after the progress (which is cleared).
#[tokio::test]
async fn cleanup_on_a_terminal_prints_the_summary() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    }
    let db = testkit::shared_pg().create_migrated_database().await;
    let client = seed(&db, 0).await;
    let bin = testkit::relay_bin()
        .to_str()
        .expect("utf-8 path")
        .to_string();
    let out = Command::new("script")
        .args(["-qec"])
        .arg(format!("{bin} cleanup --older-than 7d --batch-size 100"))
        .arg("/dev/null")
        .env("DATABASE_URL", &db)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("deleted 2500 rows in "), "{text:?}");
    assert_eq!(counts(&client).await, vec![10, 0, 10, 0, 0]);
}
