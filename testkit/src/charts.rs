//! SVG charts of benchmark results: line charts (linear or logarithmic x axis) and grouped bars.
//!
//! Rendered with `plotters`' SVG backend alone: text goes into `<text>` elements that the viewer
//! renders with its own fonts, so rendering needs no font files, fontconfig or system libraries
//! (plotters only estimates text widths to lay out legends and labels).

use std::fmt::Display;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width and height of every chart, in pixels.
pub const SIZE: (u32, u32) = (800, 450);

/// Tableau 10: distinguishable from each other, also in greyscale print.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0x79, 0x70, 0x6e),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Where the legend goes: the corner the data leaves free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legend {
    UpperLeft,
    UpperRight,
    LowerLeft,
    LowerRight,
}

impl Legend {
    fn position(self) -> SeriesLabelPosition {
        match self {
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            Legend::UpperRight => SeriesLabelPosition::UpperRight,
            Legend::LowerLeft => SeriesLabelPosition::LowerLeft,
            Legend::LowerRight => SeriesLabelPosition::LowerRight,
        }
    }
}

/// One line: its legend entry and its points (x, y).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart. Axis labels should carry their units, e.g. `"time since the relay started (s)"`.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Logarithmic x axis (latencies spanning several orders of magnitude); points with x <= 0
    /// are left out.
    pub log_x: bool,
    pub legend: Legend,
    /// The y axis ends at this multiple of the largest y: room above the lines for the legend.
    pub y_headroom: f64,
    /// The x axis ends here (else at the largest x); lines going on beyond it are cut there.
    pub x_max: Option<f64>,
}

/// One bar per group: its legend entry and a value per group (`None`: no bar, e.g. a failed run).
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// Grouped bars: groups along the x axis, one bar of each series in every group.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
    pub legend: Legend,
}

/// The empirical CDF of `values` in percent: (value, share of values at or below it), one point
/// per value, sorted. NaNs are left out.
pub fn cdf(values: &[f64]) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    sorted
        .into_iter()
        .enumerate()
        .map(|(i, v)| (v, (i + 1) as f64 * 100.0 / n))
        .collect()
}

/// Rates from cumulative counts: for samples (t, count) and a count of 0 at t = 0, the slope at
/// each sample over about `window` centred on it (from the last sample at or before t - window/2
/// to the first at or after t + window/2, clipped to the samples there are). Counting per sample
/// interval alone would quantise the rate by the batch size and turn a short last interval into a
/// spike.
pub fn rates(cumulative: &[(f64, f64)], window: f64) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(cumulative.len() + 1);
    points.push((0.0, 0.0));
    points.extend(
        cumulative
            .iter()
            .copied()
            .filter(|(t, c)| *t > 0.0 && t.is_finite() && c.is_finite()),
    );
    let half = window / 2.0;
    (1..points.len())
        .filter_map(|i| {
            let t = points[i].0;
            let lo = points[..i]
                .iter()
                .rposition(|p| p.0 <= t - half)
                .unwrap_or(0);
            let hi = points[i..]
                .iter()
                .position(|p| p.0 >= t + half)
                .map_or(points.len() - 1, |j| i + j);
            let ((t0, c0), (t1, c1)) = (points[lo], points[hi]);
            (t1 > t0).then(|| (t, (c1 - c0) / (t1 - t0)))
        })
        .collect()
}

/// Axis numbers: thousands separated, decimals only below 10.
pub fn format_number(v: f64) -> String {
    if v != 0.0 && v.abs() < 10.0 {
        let s = format!("{v:.2}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        return s.to_string();
    }
    let rounded = v.round() as i64;
    let digits = rounded.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if rounded < 0 {
        out.insert(0, '-');
    }
    out
}

fn err(e: impl Display) -> String {
    format!("chart: {e}")
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn caption_font() -> TextStyle<'static> {
    ("sans-serif", 20).into_font().into()
}

/// The range covering `values` (at least `floor..`), with a little room at the top.
fn upper(values: impl Iterator<Item = f64>, headroom: f64) -> f64 {
    let max = values.filter(|v| v.is_finite()).fold(0.0_f64, f64::max);
    if max > 0.0 {
        max * headroom
    } else {
        1.0
    }
}

/// Renders a line chart as an SVG document.
pub fn line_chart_svg(chart: &LineChart) -> Result<String, String> {
    let x_max = chart.x_max.filter(|max| *max > 0.0);
    let series: Vec<Series> = chart
        .series
        .iter()
        .map(|s| Series {
            name: s.name.clone(),
            points: s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite() && (!chart.log_x || *x > 0.0))
                .filter(|(x, _)| x_max.is_none_or(|max| *x <= max))
                .collect(),
        })
        .collect();
    let xs = || series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let y_max = upper(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        chart.y_headroom.max(1.0),
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        if chart.log_x {
            let lo = xs().fold(f64::INFINITY, f64::min);
            let hi = xs().fold(0.0_f64, f64::max);
            // From a whole decade (a hair below it, which plotters' rounding would otherwise leave
            // without a label), so that the ticks are powers of ten; at least one decade wide.
            let (lo, hi) = if lo.is_finite() && hi > 0.0 {
                let decade = 10f64.powf(lo.log10().floor());
                (decade * 0.999, (hi * 1.1).max(decade * 10.0))
            } else {
                (0.1, 10.0)
            };
            draw_lines(&root, chart, &series, (lo..hi).log_scale(), y_max)?;
        } else {
            let hi = x_max.unwrap_or_else(|| upper(xs(), 1.0));
            draw_lines(&root, chart, &series, 0.0..hi, y_max)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn draw_lines<X>(
    root: &Area<'_>,
    chart: &LineChart,
    series: &[Series],
    x: X,
    y_max: f64,
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let mut ctx = ChartBuilder::on(root)
        .caption(&chart.title, caption_font())
        .margin(12)
        // Room for the last x label, centred on the axis' end.
        .margin_right(30)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x, 0.0..y_max)
        .map_err(err)?;
    ctx.configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .x_label_formatter(&|v| format_number(*v))
        .y_label_formatter(&|v| format_number(*v))
        .light_line_style(WHITE.mix(0.0))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let style = ShapeStyle::from(color(i)).stroke_width(2);
        ctx.draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(err)?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    ctx.configure_series_labels()
        .position(chart.legend.position())
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Renders grouped bars as an SVG document, each bar labelled with its value.
pub fn bar_chart_svg(chart: &BarChart) -> Result<String, String> {
    let groups = chart.groups.len().max(1);
    let y_max = upper(
        chart
            .series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied()),
        // Room above the tallest bar for its value label and the legend.
        1.25 + 0.05 * chart.series.len() as f64,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut ctx = ChartBuilder::on(&root)
            .caption(&chart.title, caption_font())
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..groups as f64, 0.0..y_max)
            .map_err(err)?;
        // Group names are drawn below, centred under their groups; no numeric x labels.
        ctx.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .x_desc(&chart.x_label)
            .y_desc(&chart.y_label)
            .y_label_formatter(&|v| format_number(*v))
            .light_line_style(WHITE.mix(0.0))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        let k = chart.series.len().max(1) as f64;
        let width = 0.8 / k;
        let value_font = TextStyle::from(("sans-serif", 11).into_font())
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        for (j, s) in chart.series.iter().enumerate() {
            let fill = color(j).filled();
            let bars: Vec<(f64, f64, f64)> = s
                .values
                .iter()
                .enumerate()
                .filter_map(|(g, v)| {
                    let v = (*v)?;
                    v.is_finite().then(|| {
                        let left = g as f64 + 0.1 + j as f64 * width;
                        (left, left + width * 0.9, v)
                    })
                })
                .collect();
            ctx.draw_series(
                bars.iter()
                    .map(|&(l, r, v)| Rectangle::new([(l, 0.0), (r, v)], fill)),
            )
            .map_err(err)?
            .label(&s.name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], fill));
            for &(l, r, v) in &bars {
                let (px, py) = ctx.backend_coord(&((l + r) / 2.0, v));
                root.draw(&Text::new(
                    format_number(v),
                    (px, py - 2),
                    value_font.clone(),
                ))
                .map_err(err)?;
            }
        }
        let group_font =
            TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        for (g, name) in chart.groups.iter().enumerate() {
            let (px, py) = ctx.backend_coord(&(g as f64 + 0.5, 0.0));
            root.draw(&Text::new(name.clone(), (px, py + 6), group_font.clone()))
                .map_err(err)?;
        }
        ctx.configure_series_labels()
            .position(chart.legend.position())
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses the SVG (well formed, an `svg` root of the chart's size) and returns its texts.
    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(root.attribute("width"), Some("800"));
        assert_eq!(root.attribute("height"), Some("450"));
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect()
    }

    /// Every one of `expected` is the text of some element.
    fn assert_texts(texts: &[String], expected: &[&str]) {
        for expected in expected {
            assert!(
                texts.iter().any(|t| t == expected),
                "no text {expected:?} in {texts:?}"
            );
        }
    }

    fn polylines(svg: &str) -> usize {
        let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .count()
    }

    #[test]
    fn line_chart_has_title_axis_labels_and_every_series() {
        let chart = LineChart {
            title: "Drain rate".into(),
            x_label: "time since the relay started (s)".into(),
            y_label: "events/s".into(),
            series: vec![
                Series {
                    name: "batch 1000 (default)".into(),
                    points: rates(&[(0.25, 4000.0), (0.5, 8000.0), (0.75, 12000.0)], 0.5),
                },
                Series {
                    name: "ordering <none> & batch 2000".into(),
                    points: vec![(0.0, 0.0), (0.5, 20000.0), (1.0, 25000.0)],
                },
            ],
            log_x: false,
            legend: Legend::UpperRight,
            y_headroom: 1.5,
            x_max: None,
        };
        let svg = line_chart_svg(&chart).expect("renders");
        let texts = texts(&svg);
        assert_texts(
            &texts,
            &[
                "Drain rate",
                "time since the relay started (s)",
                "events/s",
                "batch 1000 (default)",
                "ordering <none> & batch 2000",
                "20,000",
            ],
        );
        // One line per series in the plot, one more per legend entry.
        assert!(polylines(&svg) >= 2, "{svg}");
    }

    #[test]
    fn x_max_cuts_lines_at_the_axis_end() {
        let chart = LineChart {
            title: "cut".into(),
            x_label: "time (s)".into(),
            y_label: "events/s".into(),
            series: vec![Series {
                name: "slow".into(),
                points: (0..=40).map(|i| (f64::from(i), 3000.0)).collect(),
            }],
            log_x: false,
            legend: Legend::UpperRight,
            y_headroom: 1.2,
            x_max: Some(8.0),
        };
        let svg = line_chart_svg(&chart).expect("renders");
        let texts = texts(&svg);
        assert!(texts.iter().any(|t| t == "8"), "{texts:?}");
        assert!(!texts.iter().any(|t| t == "40"), "{texts:?}");
        // Nothing drawn right of the plot: every line point within the 800 px width.
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        for line in doc.descendants().filter(|n| n.has_tag_name("polyline")) {
            for xy in line
                .attribute("points")
                .unwrap_or_default()
                .split_whitespace()
            {
                let x: f64 = xy
                    .split(',')
                    .next()
                    .and_then(|x| x.parse().ok())
                    .expect("x");
                assert!(x <= 800.0, "{xy}");
            }
        }
    }

    #[test]
    fn log_scaled_cdf_spans_whole_decades() {
        let chart = LineChart {
            title: "Latency".into(),
            x_label: "latency (ms, log scale)".into(),
            y_label: "events at or below (%)".into(),
            series: vec![
                Series {
                    name: "gated".into(),
                    points: cdf(&[1.2, 0.9, 2.5, 1.1, 4.8]),
                },
                Series {
                    name: "poll".into(),
                    points: cdf(&[12.0, 480.0, 990.0, 0.0]),
                },
            ],
            log_x: true,
            legend: Legend::UpperLeft,
            y_headroom: 1.05,
            x_max: None,
        };
        let texts = texts(&line_chart_svg(&chart).expect("renders"));
        assert_texts(&texts, &["gated", "poll", "0.1", "1", "10", "100", "1,000"]);
    }

    #[test]
    fn bar_chart_names_groups_series_and_values() {
        let chart = BarChart {
            title: "Writer throughput".into(),
            x_label: "writer clients".into(),
            y_label: "writer transactions/s".into(),
            groups: vec!["1 client".into(), "16 clients".into()],
            series: vec![
                BarSeries {
                    name: "(a) no trigger".into(),
                    values: vec![Some(1153.0), Some(2964.0)],
                },
                BarSeries {
                    name: "(c) ours (gated, per statement)".into(),
                    values: vec![None, Some(2402.4)],
                },
            ],
            legend: Legend::UpperLeft,
        };
        let svg = bar_chart_svg(&chart).expect("renders");
        let texts = texts(&svg);
        assert_texts(
            &texts,
            &[
                "Writer throughput",
                "writer clients",
                "writer transactions/s",
                "1 client",
                "16 clients",
                "(a) no trigger",
                "(c) ours (gated, per statement)",
                "1,153",
                "2,964",
                "2,402",
            ],
        );
    }

    #[test]
    fn empty_and_degenerate_data_still_render() {
        let empty = LineChart {
            title: "nothing measured".into(),
            x_label: "x (s)".into(),
            y_label: "y".into(),
            series: vec![Series {
                name: "failed run".into(),
                points: vec![(f64::NAN, 1.0), (0.0, f64::INFINITY)],
            }],
            log_x: true,
            legend: Legend::LowerRight,
            y_headroom: 0.0,
            x_max: Some(-1.0),
        };
        assert!(texts(&line_chart_svg(&empty).expect("renders")).contains(&"failed run".into()));
        let bars = BarChart {
            title: "no bars".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            groups: vec![],
            series: vec![],
            legend: Legend::LowerLeft,
        };
        texts(&bar_chart_svg(&bars).expect("renders"));
    }

    #[test]
    fn cdf_and_rates() {
        assert_eq!(
            cdf(&[3.0, 1.0, f64::NAN, 2.0, 4.0]),
            vec![(1.0, 25.0), (2.0, 50.0), (3.0, 75.0), (4.0, 100.0)]
        );
        // 1,000 events per 0.5 s: 2,000/s everywhere, including the edges.
        assert_eq!(
            rates(&[(0.5, 1000.0), (1.0, 2000.0), (1.5, 3000.0)], 0.5),
            vec![(0.5, 2000.0), (1.0, 2000.0), (1.5, 2000.0)]
        );
        // A batch of 1,000 lands every 0.1 s, sampled every 0.05 s, the last sample 0.01 s after
        // the one before: 10,000/s over a 0.4 s window, no spike at the end.
        let samples: Vec<(f64, f64)> = (1..=10)
            .map(|i| (i as f64 * 0.05, (i / 2) as f64 * 1000.0))
            .chain([(0.51, 5000.0)])
            .collect();
        let r = rates(&samples, 0.4);
        assert!(
            r.iter().all(|&(_, v)| (7_000.0..=12_500.0).contains(&v)),
            "{r:?}"
        );
        assert_eq!(rates(&[], 0.5), vec![]);
        assert_eq!(format_number(16417.4), "16,417");
        assert_eq!(format_number(-1234567.0), "-1,234,567");
        assert_eq!(format_number(0.5), "0.5");
        assert_eq!(format_number(2.0), "2");
        assert_eq!(format_number(0.0), "0");
    }
}
