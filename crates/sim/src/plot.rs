//! Plots as SVG or PNG (by the file's extension), with plotters. Text is set
//! in the Hack typeface embedded in the binary (from `epaint_default_fonts`),
//! so PNGs render the same on a machine with no fonts installed.

use std::path::Path;

/// Why a plot could not be drawn or written (plotters' error, in words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlotError(pub String);

impl PlotError {
    fn new(e: impl std::fmt::Display) -> Self {
        Self(e.to_string())
    }
}

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Registers the embedded font once.
fn fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, epaint_default_fonts::HACK_REGULAR);
    });
}

/// Draws with `draw` on an SVG or a PNG canvas of `size`, chosen by `path`'s extension.
fn canvas(
    path: &Path,
    size: (u32, u32),
    draw: impl Fn(DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), PlotError>,
    draw_png: impl Fn(DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), PlotError>,
) -> Result<(), PlotError> {
    fonts();
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")) {
        draw_png(BitMapBackend::new(path, size).into_drawing_area())
    } else {
        draw(SVGBackend::new(path, size).into_drawing_area())
    }
}

/// Colours for up to eight series.
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A chart with linear x and y axes.
type LinearChart<'a, DB> =
    ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>>;

/// Fills `root` white and builds a titled chart over `x` × `y` on it.
fn linear_chart<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
) -> Result<LinearChart<'a, DB>, PlotError> {
    root.fill(&WHITE).map_err(PlotError::new)?;
    ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(PlotError::new)
}

/// Draws the series legend at `pos` and writes the file.
fn legend_and_present<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    root: &DrawingArea<DB, Shift>,
    pos: SeriesLabelPosition,
) -> Result<(), PlotError> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(pos)
        .draw()
        .map_err(PlotError::new)?;
    root.present().map_err(PlotError::new)
}

/// Draws the empirical CDFs of `series` (name, values) into an SVG or PNG file.
/// Values beyond the `clip` quantile of all series are left out of the x range
/// so one heavy tail does not flatten the rest.
pub fn cdf_svg(
    path: &std::path::Path,
    title: &str,
    x_label: &str,
    series: &[(String, Vec<f64>)],
    clip: f64,
) -> Result<(), PlotError> {
    canvas(path, (900, 560), |a| cdf_on(a, title, x_label, series, clip), |a| cdf_on(a, title, x_label, series, clip))
}

/// The empirical CDF points of each series (at most ~2,000 per curve), each
/// value passed through `fix` (clipping, a floor) first.
fn cdf_points(series: &[(String, Vec<f64>)], fix: impl Fn(f64) -> f64) -> Vec<(String, Vec<(f64, f64)>)> {
    series
        .iter()
        .map(|(name, values)| {
            let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).map(&fix).collect();
            v.sort_by(f64::total_cmp);
            let n = v.len() as f64;
            let step = (v.len() / 2000).max(1);
            (name.clone(), v.iter().enumerate().step_by(step).map(|(i, &x)| (x, (i + 1) as f64 / n)).collect())
        })
        .collect()
}

/// Draws CDF curves `curves` on `root` with x coordinates `x` (linear or log).
fn cdf_chart<DB: DrawingBackend, X>(
    root: &DrawingArea<DB, Shift>,
    (title, x_label): (&str, &str),
    x: X,
    curves: Vec<(String, Vec<(f64, f64)>)>,
) -> Result<(), PlotError>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    root.fill(&WHITE).map_err(PlotError::new)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x, 0.0..1.0)
        .map_err(PlotError::new)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("CDF")
        .x_label_formatter(&|v| tick_label(*v))
        .draw()
        .map_err(PlotError::new)?;
    for (k, (name, pts)) in curves.into_iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        let c = COLOURS[k % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(PlotError::new)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    legend_and_present(&mut chart, root, SeriesLabelPosition::LowerRight)
}

fn cdf_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    series: &[(String, Vec<f64>)],
    clip: f64,
) -> Result<(), PlotError> {
    let mut all: Vec<f64> = series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|x| x.is_finite()).collect();
    if all.is_empty() {
        return Err(PlotError("nothing to plot".into()));
    }
    all.sort_by(f64::total_cmp);
    let lo = all[0].min(0.0);
    let hi = all[((clip * all.len() as f64) as usize).min(all.len() - 1)].max(lo + 1e-9) * 1.05;
    let curves = cdf_points(series, |x| x.min(hi));
    cdf_chart(&root, (title, x_label), lo..hi, curves)
}

/// As [`cdf_svg`] with a logarithmic x axis, so series an order of magnitude
/// or more apart are all readable; values below `floor` are drawn at `floor`.
pub fn cdf_log_svg(
    path: &std::path::Path,
    title: &str,
    x_label: &str,
    series: &[(String, Vec<f64>)],
    floor: f64,
) -> Result<(), PlotError> {
    assert!(floor > 0.0, "a log axis needs a positive floor");
    canvas(
        path,
        (900, 560),
        |a| cdf_log_on(&a, (title, x_label), series, floor),
        |a| cdf_log_on(&a, (title, x_label), series, floor),
    )
}

fn cdf_log_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    labels: (&str, &str),
    series: &[(String, Vec<f64>)],
    floor: f64,
) -> Result<(), PlotError> {
    let curves = cdf_points(series, |x| x.max(floor));
    let xs = curves.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let (lo, hi) = xs.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if !lo.is_finite() {
        return Err(PlotError("nothing to plot".into()));
    }
    // At least a factor of 4 across, so a narrow range still reads as a log axis.
    let (lo, hi) = (lo * 0.8, hi.max(lo * 4.0) * 1.25);
    cdf_chart(root, labels, (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)), curves)
}

/// Tick values for a log axis over `lo..hi`: the 1-2-5 steps of every decade
/// that fall inside (1-1.5-2-3-5-7 where that gives fewer than four), at most
/// ten, so labels sit where the data are and never run into each other.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let pick = |steps: &[f64]| -> Vec<f64> {
        let mut v = Vec::new();
        let mut decade = 10f64.powf(lo.log10().floor());
        while decade <= hi {
            for &s in steps {
                let x = decade * s;
                if x >= lo && x <= hi {
                    v.push(x);
                }
            }
            decade *= 10.0;
        }
        v
    };
    let mut v = pick(&[1.0, 2.0, 5.0]);
    if v.len() < 4 {
        v = pick(&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0]);
    }
    if v.len() > 10 {
        // Too many decades: the powers of ten, every k-th so that ten at most remain.
        v.retain(|x| (x.log10() - x.log10().round()).abs() < 1e-9);
        let k = v.len().div_ceil(10);
        v = v.into_iter().step_by(k).collect();
    }
    v
}

/// A tick label: no more digits than the value needs (150, 2.5, 0.02, 10k).
pub fn tick_label(x: f64) -> String {
    if x >= 10_000.0 {
        let k = x / 1_000.0;
        return if (k - k.round()).abs() < 1e-9 { format!("{}k", k.round()) } else { format!("{k:.1}k") };
    }
    let s = format!("{x:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Draws line series (x, y) into an SVG or PNG file; y clipped at the `clip`
/// quantile of all points so a few spikes do not flatten the rest.
pub fn lines_svg(
    path: &std::path::Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    clip: f64,
) -> Result<(), PlotError> {
    let labels = (title, x_label, y_label);
    canvas(path, (900, 480), |a| lines_on(a, labels, series, clip), |a| lines_on(a, labels, series, clip))
}

fn lines_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    (title, x_label, y_label): (&str, &str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    clip: f64,
) -> Result<(), PlotError> {
    let mut ys: Vec<f64> = series.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).filter(|y| y.is_finite()).collect();
    if ys.is_empty() {
        return Err(PlotError("nothing to plot".into()));
    }
    ys.sort_by(f64::total_cmp);
    let y_hi = ys[((clip * ys.len() as f64) as usize).min(ys.len() - 1)] * 1.05;
    let x_hi = series.iter().flat_map(|(_, v)| v.iter().map(|p| p.0)).fold(1.0f64, f64::max);
    let mut chart = linear_chart(&root, title, 0.0..x_hi, 0.0..y_hi.max(1e-9))?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw().map_err(PlotError::new)?;
    for (k, (name, pts)) in series.iter().enumerate() {
        let step = (pts.len() / 3000).max(1);
        let c = COLOURS[k % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().step_by(step).map(|&(x, y)| (x, y.min(y_hi))), c.stroke_width(1)))
            .map_err(PlotError::new)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperRight)
}

/// Draws a grouped bar chart into an SVG or PNG file: one group per
/// category (x axis), one bar per series in each group (`series`: name and
/// one value per category; missing values are not drawn).
pub fn bars_svg(
    path: &std::path::Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<(), PlotError> {
    let labels = (title, y_label);
    // Wide enough that the longest category label fits under its group.
    let longest = categories.iter().map(|c| c.chars().count()).max().unwrap_or(0) as u32;
    let width = (100 + categories.len() as u32 * (longest * 8 + 16)).clamp(900, 4000);
    canvas(path, (width, 480), |a| bars_on(a, labels, categories, series), |a| bars_on(a, labels, categories, series))
}

fn bars_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    (title, y_label): (&str, &str),
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<(), PlotError> {
    let y_hi = series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|y| y.is_finite()).fold(0.0f64, f64::max);
    if categories.is_empty() || series.is_empty() {
        return Err(PlotError("nothing to plot".into()));
    }
    let (n, k) = (categories.len(), series.len());
    let mut chart = linear_chart(&root, title, 0.0..n as f64, 0.0..(y_hi * 1.1).max(1e-9))?;
    let cats = categories.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.min(20) * 2 + 1)
        .x_label_formatter(&move |x: &f64| {
            // Label the middle of each group only.
            let i = x.floor();
            if (x - i - 0.5).abs() < 1e-6 {
                cats.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .draw()
        .map_err(PlotError::new)?;
    let width = 0.8 / k as f64;
    for (s, (name, values)) in series.iter().enumerate() {
        let c = COLOURS[s % COLOURS.len()];
        let bars = values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, &v)| {
            let x0 = i as f64 + 0.1 + s as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], c.filled())
        });
        chart
            .draw_series(bars)
            .map_err(PlotError::new)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperRight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_draw_as_svg_and_png_and_refuse_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cats = vec!["paper".to_string(), "controller".to_string()];
        let series = vec![("P1".to_string(), vec![25.0, 24.0]), ("P2".to_string(), vec![25.0, f64::NAN])];
        for name in ["b.svg", "b.png"] {
            let p = dir.path().join(name);
            bars_svg(&p, "t", "share %", &cats, &series).unwrap();
            assert!(std::fs::metadata(&p).unwrap().len() > 1000, "{name} is drawn");
            if let Ok(keep) = std::env::var("FAIRFEED_KEEP_PLOT") {
                std::fs::copy(&p, std::path::Path::new(&keep).join(name)).unwrap();
            }
        }
        let svg = std::fs::read_to_string(dir.path().join("b.svg")).unwrap();
        assert!(svg.contains("controller") && svg.contains("P2"), "categories and legend are labelled");
        assert!(bars_svg(&dir.path().join("c.svg"), "t", "y", &[], &series).is_err());
    }

    /// The demo's OML (150–600 µs) gets ticks where its data are, not only at
    /// 1,000 and 2,000; a wide range keeps ten labels at most.
    #[test]
    fn log_axes_tick_where_the_data_are() {
        let t = log_ticks(120.0, 750.0);
        assert_eq!(
            t,
            vec![200.0, 500.0]
                .into_iter()
                .filter(|_| false)
                .chain([150.0, 200.0, 300.0, 500.0, 700.0])
                .collect::<Vec<_>>()
        );
        assert_eq!(log_ticks(0.8, 1_250.0), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1_000.0]);
        assert!(log_ticks(0.001, 1e7).len() <= 10);
        assert!(!log_ticks(1e-9, 1e12).is_empty());
        assert_eq!(
            (tick_label(150.0), tick_label(0.02), tick_label(2.5), tick_label(20_000.0)),
            ("150".into(), "0.02".into(), "2.5".into(), "20k".into())
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("oml.svg");
        let series = vec![("tree".to_string(), (150..600).map(f64::from).collect::<Vec<_>>())];
        cdf_log_svg(&p, "OML", "µs", &series, 1.0).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        if let Ok(keep) = std::env::var("FAIRFEED_KEEP_PLOT") {
            std::fs::copy(&p, std::path::Path::new(&keep).join("oml.svg")).unwrap();
        }
        let texts: Vec<&str> = svg.split("</text>").filter_map(|t| t.rsplit('>').next()).map(str::trim).collect();
        for label in ["150", "200", "300", "500"] {
            assert!(texts.contains(&label), "tick {label} in the plot: {texts:?}");
        }
        assert!(!texts.contains(&"1000") && !texts.contains(&"2000"), "no ticks beyond the data: {texts:?}");
    }
}
