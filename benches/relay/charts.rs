//! The charts of a run, as SVG next to `results.json`: drain rate and progress over time (drain
//! and relays scenarios), the latency distribution per notify mode, writer throughput per
//! trigger. Drawn from the rows' chart fields; a scenario that did not run draws nothing.

use std::path::{Path, PathBuf};

use testkit::charts::{
    bar_chart_svg, cdf, format_number, line_chart_svg, rates, BarChart, BarSeries, Legend,
    LineChart, Series,
};

use crate::report::Row;

const DRAIN: &str = "1 backlog drain";
const IDLE: &str = "2 idle latency";
const WRITERS: &str = "3 writer throughput";
const RELAYS: &str = "5 one vs three relays";

fn of<'a>(rows: &'a [Row], scenario: &'a str) -> impl Iterator<Item = &'a Row> + 'a {
    rows.iter()
        .filter(move |r| r.scenario == scenario && !r.is_failure())
}

/// The backlog size of a drain scenario's rows, for titles.
fn backlog(rows: &[Row], scenario: &str) -> String {
    of(rows, scenario)
        .find_map(|r| r.events)
        .map_or_else(String::new, |n| {
            format!(" of {} events", format_number(n as f64))
        })
}

fn timelines(
    rows: &[Row],
    scenario: &str,
    f: impl Fn(&Row, &[(f64, u64)]) -> Vec<(f64, f64)>,
) -> Vec<Series> {
    of(rows, scenario)
        .filter_map(|r| {
            let timeline = r.timeline.as_deref()?;
            Some(Series {
                name: r.variant.clone(),
                points: f(r, timeline),
            })
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn rate_series(rows: &[Row], scenario: &str) -> Vec<Series> {
    timelines(rows, scenario, |_, t| {
        let cumulative: Vec<(f64, f64)> = t.iter().map(|&(s, n)| (s, n as f64)).collect();
        rates(&cumulative, RATE_WINDOW_S)
    })
}

fn remaining_series(rows: &[Row], scenario: &str) -> Vec<Series> {
    timelines(rows, scenario, |r, t| {
        let total = r.events.unwrap_or(0) as f64;
        std::iter::once((0.0, total))
            .chain(t.iter().map(|&(s, n)| (s, (total - n as f64).max(0.0))))
            .collect()
    })
}

const TIME: &str = "time since the drain started (s)";

/// The window of the rate at each sample: about 8 batches of 1,000 at the drain rates here.
const RATE_WINDOW_S: f64 = 0.5;

fn drain_rate(rows: &[Row], scenario: &str, what: &str) -> Option<LineChart> {
    let mut series = rate_series(rows, scenario);
    // The relays' drains set the time axis; the classic loop, five to ten times slower, is cut at
    // its end (its legend says how long it went on) rather than squeezing them into a corner.
    let end = |s: &Series| s.points.last().map_or(0.0, |p| p.0);
    let x_max = series
        .iter()
        .filter(|s| !s.name.starts_with("classic"))
        .map(end)
        .reduce(f64::max)
        .map(|t| (t * 1.1).ceil());
    if let Some(max) = x_max {
        for s in series.iter_mut().filter(|s| end(s) > max) {
            s.name = format!("{}, on to {:.0} s", s.name, end(s));
        }
    }
    (!series.is_empty()).then(|| LineChart {
        title: format!("{what}{}: delivery rate", backlog(rows, scenario)),
        x_label: TIME.into(),
        y_label: "events/s into the stream (0.5 s window)".into(),
        // Room for the legend above the lines (the classic loop alone runs on to the right).
        y_headroom: 1.1 + 0.06 * series.len() as f64,
        x_max,
        series,
        log_x: false,
        legend: Legend::UpperRight,
    })
}

fn drain_remaining(rows: &[Row], scenario: &str, what: &str) -> Option<LineChart> {
    let series = remaining_series(rows, scenario);
    (!series.is_empty()).then(|| LineChart {
        title: format!("{what}{}: events left", backlog(rows, scenario)),
        x_label: TIME.into(),
        y_label: "events not yet in the stream".into(),
        y_headroom: 1.05,
        x_max: None,
        series,
        log_x: false,
        legend: Legend::UpperRight,
    })
}

fn latency_cdf(rows: &[Row]) -> Option<LineChart> {
    let series: Vec<Series> = of(rows, IDLE)
        .filter_map(|r| {
            let ms = r.latencies_ms.as_deref()?;
            // The fallback interval of the notify modes is never reached: left out of the legend,
            // which then leaves the curves free.
            Some(Series {
                name: r.variant.replace(", fallback 60s", ""),
                points: cdf(ms),
            })
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    (!series.is_empty()).then(|| LineChart {
        title: "Idle latency per notify mode (one event every 20 ms)".into(),
        x_label: "COMMIT returned -> message received (ms, log scale)".into(),
        y_label: "events received within (%)".into(),
        y_headroom: 1.05,
        x_max: None,
        series,
        log_x: true,
        legend: Legend::UpperLeft,
    })
}

fn writer_bars(rows: &[Row]) -> Option<BarChart> {
    let measured: Vec<(&str, u64, f64)> = of(rows, WRITERS)
        .filter_map(|r| Some((r.config.as_deref()?, r.clients?, r.writer_tps?)))
        .collect();
    let mut clients: Vec<u64> = measured.iter().map(|m| m.1).collect();
    clients.sort_unstable();
    clients.dedup();
    let mut configs: Vec<&str> = Vec::new();
    for (config, _, _) in &measured {
        if !configs.contains(config) {
            configs.push(config);
        }
    }
    let series: Vec<BarSeries> = configs
        .iter()
        .map(|config| BarSeries {
            name: (*config).into(),
            values: clients
                .iter()
                .map(|c| {
                    measured
                        .iter()
                        .find(|m| m.0 == *config && m.1 == *c)
                        .map(|m| m.2)
                })
                .collect(),
        })
        .collect();
    (!series.is_empty()).then(|| BarChart {
        title: "Writer throughput per trigger, relay running".into(),
        x_label: "concurrent writer clients".into(),
        y_label: "writer transactions/s".into(),
        groups: clients
            .iter()
            .map(|&c| format!("{c} client{}", if c == 1 { "" } else { "s" }))
            .collect(),
        series,
        legend: Legend::UpperLeft,
    })
}

/// Renders every chart the rows have data for into `dir`; returns the files written.
pub(crate) fn write_charts(rows: &[Row], dir: &Path) -> Vec<PathBuf> {
    let lines = [
        ("drain-rate.svg", drain_rate(rows, DRAIN, "Backlog drain")),
        (
            "drain-left.svg",
            drain_remaining(rows, DRAIN, "Backlog drain"),
        ),
        (
            "relays-rate.svg",
            drain_rate(rows, RELAYS, "One vs three relays"),
        ),
        ("idle-latency-cdf.svg", latency_cdf(rows)),
    ];
    let mut rendered: Vec<(&str, Result<String, String>)> = lines
        .into_iter()
        .filter_map(|(file, chart)| Some((file, line_chart_svg(&chart?))))
        .collect();
    if let Some(chart) = writer_bars(rows) {
        rendered.push(("writers-tps.svg", bar_chart_svg(&chart)));
    }
    let mut written = Vec::new();
    for (file, svg) in rendered {
        let path = dir.join(file);
        match svg.and_then(|svg| std::fs::write(&path, svg).map_err(|e| e.to_string())) {
            Ok(()) => written.push(path),
            Err(e) => eprintln!("[bench] chart {}: {e}", path.display()),
        }
    }
    written
}
