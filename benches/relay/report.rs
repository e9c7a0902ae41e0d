//! The results: one row per variant, the markdown table and `results.json`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Row {
    pub(crate) scenario: String,
    pub(crate) variant: String,
    pub(crate) events: Option<u64>,
    pub(crate) seconds: Option<f64>,
    pub(crate) events_per_s: Option<f64>,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
    pub(crate) writer_tps: Option<f64>,
    pub(crate) peak_rss_mb: Option<f64>,
    pub(crate) duplicates: Option<u64>,
    pub(crate) notes: String,
    // What the charts are drawn from (`charts.rs`); left out of results.json when absent.
    /// Drains: (seconds since the drainers started, messages in the stream), sampled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) timeline: Option<Vec<(f64, u64)>>,
    /// Idle latency: every event's latency (COMMIT returned -> receipt), in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) latencies_ms: Option<Vec<f64>>,
    /// Writers: the variant without its client count, and the client count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) config: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) clients: Option<u64>,
}

impl Row {
    pub(crate) fn new(scenario: &str, variant: &str) -> Row {
        Row {
            scenario: scenario.into(),
            variant: variant.into(),
            ..Default::default()
        }
    }

    pub(crate) fn failed(scenario: &str, variant: &str, error: &str) -> Row {
        Row {
            notes: format!("FAILED: {error}"),
            ..Row::new(scenario, variant)
        }
    }

    pub(crate) fn is_failure(&self) -> bool {
        self.notes.starts_with("FAILED")
    }

    pub(crate) fn note(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if text.is_empty() {
            return;
        }
        if !self.notes.is_empty() {
            self.notes.push_str("; ");
        }
        self.notes.push_str(text);
    }
}

/// Latency summary in milliseconds (nearest-rank percentiles).
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

pub(crate) fn percentiles(values: &mut [f64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let i = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
        values[i - 1]
    };
    Some(Percentiles {
        p50: rank(0.50),
        p99: rank(0.99),
        max: values[values.len() - 1],
    })
}

pub(crate) fn set_latency(row: &mut Row, values: &mut [f64]) {
    if let Some(p) = percentiles(values) {
        row.p50_ms = Some(p.p50);
        row.p99_ms = Some(p.p99);
        row.max_ms = Some(p.max);
    }
}

pub(crate) fn markdown_table(rows: &[Row]) -> String {
    fn num(v: Option<f64>, decimals: usize) -> String {
        v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
    }
    fn int(v: Option<u64>) -> String {
        v.map_or_else(|| "-".into(), |v| v.to_string())
    }
    let mut out = String::from(
        "| scenario | variant | events | seconds | events/s | p50 ms | p99 ms | max ms | writer tps | peak RSS MB | duplicates | notes |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.variant,
            int(r.events),
            num(r.seconds, 2),
            num(r.events_per_s, 0),
            num(r.p50_ms, 2),
            num(r.p99_ms, 2),
            num(r.max_ms, 2),
            num(r.writer_tps, 0),
            num(r.peak_rss_mb, 1),
            int(r.duplicates),
            r.notes.replace('|', "/").replace('\n', " "),
        ));
    }
    out
}
