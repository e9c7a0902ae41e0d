//! Checks the files in `deploy/` against the relay: the Prometheus alert rules and the Grafana
//! dashboard must parse, have the expected shape, and use only metrics the relay exports, so a
//! renamed metric breaks this test instead of silently breaking an alert.

use std::collections::{BTreeMap, BTreeSet};

use yaml_rust2::{Yaml, YamlLoader};

/// The relay's metrics (src/metrics.rs) as registered, and their types. Counters are exposed with
/// a `_total` suffix, histograms as `_bucket`/`_sum`/`_count`, info metrics with `_info`.
const METRICS: &[(&str, &str)] = &[
    ("outbox_events_published", "counter"),
    ("outbox_events_failed", "counter"),
    ("outbox_events_dead_lettered", "counter"),
    ("outbox_transactions_split", "counter"),
    ("outbox_transactions_held", "counter"),
    ("outbox_events_pending", "gauge"),
    ("outbox_oldest_pending_age_seconds", "gauge"),
    ("outbox_dead_letters", "gauge"),
    ("outbox_batch_duration_seconds", "histogram"),
    ("outbox_publish_duration_seconds", "histogram"),
    ("outbox_commit_to_publish_seconds", "histogram"),
    ("outbox_wakeups", "counter"),
    ("outbox_listener_connected", "gauge"),
    ("outbox_listener_reconnects", "counter"),
    ("outbox_broker_connected", "gauge"),
    ("outbox_retention_deleted_rows", "counter"),
    ("outbox_replication_lag_bytes", "gauge"),
    ("outbox_wal_streaming", "gauge"),
    ("outbox_wal_stranded_events", "counter"),
    ("outbox_relay_build", "info"),
];

/// Alert name -> (severity, a metric its expression must use).
const ALERTS: &[(&str, &str, &str)] = &[
    ("OutboxBacklogHigh", "warning", "outbox_events_pending"),
    ("OutboxBacklogGrowing", "warning", "outbox_events_pending"),
    ("OutboxDeadLetters", "critical", "outbox_dead_letters"),
    (
        "OutboxBatchSlow",
        "warning",
        "outbox_batch_duration_seconds_bucket",
    ),
    (
        "OutboxListenerDisconnected",
        "warning",
        "outbox_listener_connected",
    ),
    (
        "OutboxEventsStuck",
        "critical",
        "outbox_oldest_pending_age_seconds",
    ),
    (
        "OutboxReplicationSlotRetainsWal",
        "warning",
        "outbox_replication_lag_bytes",
    ),
    (
        "OutboxReplicationSlotNearLimit",
        "critical",
        "outbox_replication_lag_bytes",
    ),
    (
        "OutboxWalStrandedEvents",
        "warning",
        "outbox_wal_stranded_events_total",
    ),
];

fn exposed_names(name: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" => vec![format!("{name}_total")],
        "histogram" => ["bucket", "sum", "count"]
            .iter()
            .map(|s| format!("{name}_{s}"))
            .collect(),
        "info" => vec![format!("{name}_info")],
        _ => vec![name.to_string()],
    }
}

fn known_series() -> BTreeSet<String> {
    METRICS
        .iter()
        .flat_map(|(name, kind)| exposed_names(name, kind))
        .collect()
}

fn read(rel: &str) -> String {
    let path = crate::repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The list above is what the relay registers: compare it with the `# TYPE` lines of the real
/// registry, so this test notices a metric that was renamed, retyped, added or removed.
#[test]
fn metric_list_matches_the_registry() {
    use outbox_relay::metrics::{EventTypeLabel, FailedLabels, Metrics};
    // Label families are only encoded once they have a series.
    let metrics = Metrics::new();
    let event_type = "x".to_string();
    metrics
        .published
        .get_or_create(&EventTypeLabel {
            event_type: event_type.clone(),
        })
        .inc();
    metrics
        .failed
        .get_or_create(&FailedLabels {
            event_type,
            reason: "broker".into(),
        })
        .inc();
    metrics.wakeup("notify");
    metrics.count_retention_deleted("processed_events", 1);
    let text = metrics.encode();
    let registered: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some((name.to_string(), kind.trim().to_string()))
        })
        .collect();
    let listed: BTreeMap<String, String> = METRICS
        .iter()
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect();
    assert_eq!(
        registered, listed,
        "src/metrics.rs registers other metrics than tests/deploy_files.rs lists: update the list \
         and check deploy/prometheus/alerts.yml and deploy/grafana/outbox-relay.json"
    );
}

/// Metric names used by a PromQL expression (also with Grafana's `$variables`). Label matchers,
/// strings, range selectors and grouping label lists are dropped; of the remaining identifiers,
/// those followed by `(` are functions or aggregations, and keywords are skipped.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
        "atan2",
        // Aggregation operators, which may be followed by `by (...)` instead of `(`.
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Set after a grouping keyword (`by`, `without`, `on`, ...): its label list is skipped.
    let mut skip_next_group = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_next_group => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                skip_next_group = false;
            }
            '$' => {
                // Grafana variable such as $job or $__rate_interval.
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // Numbers and durations: 0.95, 5m, 1e3.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let ident: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let followed_by_paren = chars.get(j) == Some(&'(');
                if GROUPING.contains(&ident.as_str()) {
                    skip_next_group = followed_by_paren;
                } else if !followed_by_paren && !KEYWORDS.contains(&ident.as_str()) {
                    names.insert(ident);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn metric_name_extraction() {
    let names = metric_names(
        r#"histogram_quantile(0.95, sum by (job, le) (rate(outbox_batch_duration_seconds_bucket{job=~"$job"}[$__rate_interval]))) > 5
           and on (job) deriv(max without (instance, pod) (outbox_events_pending)[10m:1m]) > 0 offset 5m or up == 0"#,
    );
    let expected: BTreeSet<String> = [
        "outbox_batch_duration_seconds_bucket",
        "outbox_events_pending",
        "up",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(names, expected);
}

fn str_of<'a>(y: &'a Yaml, key: &str, what: &str) -> &'a str {
    y[key]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: `{key}` is missing or not a string"))
}

fn is_duration(s: &str) -> bool {
    // Prometheus durations: one or more <number><unit>, e.g. 1m, 1h30m.
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d", "w", "y"]
            .iter()
            .find(|u| rest.starts_with(*u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

#[test]
fn alert_rules_are_well_formed_and_use_relay_metrics() {
    let text = read("deploy/prometheus/alerts.yml");
    let docs = YamlLoader::load_from_str(&text).expect("alerts.yml is valid YAML");
    assert_eq!(docs.len(), 1, "alerts.yml holds one document");
    let groups = docs[0]["groups"].as_vec().expect("top-level `groups` list");
    let known = known_series();

    let group = groups
        .iter()
        .find(|g| g["name"].as_str() == Some("outbox-relay"))
        .expect("a group named outbox-relay");
    assert!(
        groups.iter().all(|g| g["rules"].as_vec().is_some()),
        "every group has a `rules` list"
    );

    let mut seen = BTreeMap::new();
    for rule in group["rules"].as_vec().expect("rules") {
        let name = str_of(rule, "alert", "rule").to_string();
        let what = format!("alert {name}");
        let expr = str_of(rule, "expr", &what);
        let for_ = str_of(rule, "for", &what);
        assert!(is_duration(for_), "{what}: `for: {for_}` is not a duration");
        let severity = str_of(&rule["labels"], "severity", &format!("{what} labels"));
        assert!(
            ["info", "warning", "critical"].contains(&severity),
            "{what}: unexpected severity {severity}"
        );
        let summary = str_of(
            &rule["annotations"],
            "summary",
            &format!("{what} annotations"),
        );
        let description = str_of(
            &rule["annotations"],
            "description",
            &format!("{what} annotations"),
        );
        assert!(!summary.trim().is_empty(), "{what}: empty summary");
        assert!(
            description.contains("outbox-relay status")
                || description.contains("outbox-relay dead-letters"),
            "{what}: the description should tell the operator which command to run"
        );

        let used = metric_names(expr);
        assert!(!used.is_empty(), "{what}: no metric in `{expr}`");
        for metric in &used {
            assert!(
                known.contains(metric),
                "{what}: `{metric}` is not a metric of the relay (known: {known:?})"
            );
        }
        assert!(
            seen.insert(name.clone(), (severity.to_string(), used))
                .is_none(),
            "{what} is defined twice"
        );
    }

    for (name, severity, metric) in ALERTS {
        let (got_severity, used) = seen
            .get(*name)
            .unwrap_or_else(|| panic!("alert {name} is missing"));
        assert_eq!(got_severity, severity, "alert {name}: severity");
        assert!(
            used.contains(*metric),
            "alert {name} should use {metric}, uses {used:?}"
        );
    }
    let dead = &group["rules"]
        .as_vec()
        .expect("rules")
        .iter()
        .find(|r| r["alert"].as_str() == Some("OutboxDeadLetters"))
        .expect("OutboxDeadLetters")["annotations"]["description"];
    assert!(
        dead.as_str()
            .is_some_and(|d| d.contains("outbox-relay dead-letters list")),
        "OutboxDeadLetters should point to `outbox-relay dead-letters list`"
    );
}

/// Panels, including those nested in collapsed rows.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("`panels` list") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

#[test]
fn grafana_dashboard_uses_relay_metrics() {
    let text = read("deploy/grafana/outbox-relay.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&text).expect("outbox-relay.json is valid JSON");
    let known = known_series();

    assert!(
        dashboard["schemaVersion"].as_i64().is_some(),
        "schemaVersion is set"
    );
    assert!(
        dashboard["templating"]["list"]
            .as_array()
            .expect("templating.list")
            .iter()
            .any(|v| v["name"] == "DS_PROMETHEUS" && v["type"] == "datasource"),
        "a DS_PROMETHEUS data source variable"
    );

    let mut ids = BTreeSet::new();
    let mut used_overall = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().expect("panel title").to_string();
        assert!(
            ids.insert(panel["id"].as_i64().expect("panel id")),
            "panel ids are unique ({title})"
        );
        assert!(panel["gridPos"].is_object(), "{title}: gridPos");
        titles.insert(title.clone());
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${DS_PROMETHEUS}",
            "{title}: data source"
        );
        let targets = panel["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: targets"));
        assert!(!targets.is_empty(), "{title}: no targets");
        for target in targets {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{title}: target without expr"));
            let used = metric_names(expr);
            assert!(!used.is_empty(), "{title}: no metric in `{expr}`");
            for metric in &used {
                assert!(
                    known.contains(metric),
                    "{title}: `{metric}` is not a metric of the relay"
                );
            }
            used_overall.extend(used);
        }
    }

    for title in [
        "Published rate by event type",
        "Failed publishes by reason",
        "Pending",
        "Oldest pending age",
        "Dead letters",
        "Batch duration p50 / p95",
        "Commit -> publish p50 / p99",
        "Wake-ups by reason",
        "Listener connected",
        "Broker connected",
    ] {
        assert!(titles.contains(title), "panel {title:?} is missing");
    }
    for metric in [
        "outbox_events_published_total",
        "outbox_events_failed_total",
        "outbox_events_pending",
        "outbox_oldest_pending_age_seconds",
        "outbox_dead_letters",
        "outbox_batch_duration_seconds_bucket",
        "outbox_commit_to_publish_seconds_bucket",
        "outbox_wakeups_total",
        "outbox_listener_connected",
        "outbox_broker_connected",
    ] {
        assert!(used_overall.contains(metric), "no panel shows {metric}");
    }
}
