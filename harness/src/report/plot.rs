//! Report plots drawn with `plotters`: one chart, rendered twice (SVG text, and a PNG raster
//! encoded with `png`), with text in DejaVu Sans embedded in the binary (the `dejavu` crate,
//! rasterised by `ab_glyph`), so no system font or font library is needed.
//!
//! A chart is lines with p10–p90 bars over log or linear axes, an optional dashed reference line
//! and a legend under the plot: one entry per series in columns, the canvas growing a row per
//! three series, so any number of paths stays readable. Series differ by colour (ten) and then
//! by marker shape (four), so forty are distinct.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, ensure, Context, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A point: `y` with a `lo..hi` range drawn as an error bar.
#[derive(Debug, Clone)]
pub struct ChartPoint {
    pub x: f64,
    pub y: f64,
    pub lo: f64,
    pub hi: f64,
}

#[derive(Debug, Clone)]
pub struct ChartSeries {
    pub name: String,
    pub points: Vec<ChartPoint>,
}

#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// The x axis (prompt length) is always log scale; y is log or linear.
    pub y_log: bool,
    pub series: Vec<ChartSeries>,
    /// A dashed horizontal line at this y, with its label.
    pub reference: Option<(f64, String)>,
}

/// Matplotlib's "tab10": distinct for the usual 2–4 series, and readable for colour-blind
/// viewers in its first pairs.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];
const AXIS: RGBColor = RGBColor(0x44, 0x44, 0x44);
const FONT: &str = "sans-serif";
const WIDTH: u32 = 960;
const PLOT_HEIGHT: u32 = 540;
const LEGEND_COLUMNS: usize = 3;
const LEGEND_ROW: u32 = 24;
const LEGEND_MAX_CHARS: usize = 40;
/// Axes span at most this many decades; sweeps are validated long before (TTFT in (0, 1e9] ms).
const MAX_DECADES: f64 = 24.0;

/// Writes `<stem>.svg` and `<stem>.png` into `dir`.
pub fn write_chart(chart: &LineChart, dir: &Path, stem: &str) -> Result<()> {
    register_font();
    let size = chart.size();
    let svg_path = dir.join(format!("{stem}.svg"));
    {
        let root = SVGBackend::new(&svg_path, size).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(drawing)?;
    }
    let png_path = dir.join(format!("{stem}.png"));
    let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(drawing)?;
    }
    write_png(&png_path, size, &rgb).with_context(|| format!("writing {}", png_path.display()))
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| panic!("the embedded DejaVu Sans is a valid font"));
    });
}

fn drawing(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

fn write_png(path: &Path, (w, h): (u32, u32), rgb: &[u8]) -> Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(())
}

/// The data range padded by `pad` of its span (in log space for log axes), widened when all
/// values are equal. Non-finite values, and non-positive ones on log axes, are left out.
fn padded_range(values: impl Iterator<Item = f64>, log: bool, pad: f64) -> Result<(f64, f64)> {
    let vals: Vec<f64> = values
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .collect();
    let (mut lo, mut hi) = vals
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    if vals.is_empty() {
        (lo, hi) = (1.0, 10.0);
    }
    if log {
        let (a, b) = (lo.log10(), hi.log10());
        ensure!(
            b - a <= MAX_DECADES,
            "values from {lo:e} to {hi:e} span more than {MAX_DECADES} decades: not a plottable measurement"
        );
        let span = (b - a).max(0.3);
        let mid = (a + b) / 2.0;
        let (a, b) = (a.min(mid - span / 2.0), b.max(mid + span / 2.0));
        Ok((10f64.powf(a - span * pad), 10f64.powf(b + span * pad)))
    } else {
        let span = if hi > lo {
            hi - lo
        } else {
            lo.abs().max(1.0) * 0.2
        };
        ensure!(
            span.is_finite(),
            "values from {lo:e} to {hi:e} overflow a linear axis"
        );
        Ok((lo - span * pad, hi + span * pad))
    }
}

/// Compact tick text: `4096`, `12.5`, `0.05`.
pub fn tick_text(v: f64) -> String {
    if v >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Round ticks of a log axis: 1-2-5 per decade, thinned or refined to 3..=10 marks. The range
/// is bounded by [`MAX_DECADES`], so the lists stay short.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let within = |mults: &[f64]| -> Vec<f64> {
        (e0..=e1)
            .flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect()
    };
    let t = within(&[1.0, 2.0, 5.0]);
    if t.len() > 10 {
        let all = within(&[1.0]);
        let stride = all.len().div_ceil(10);
        all.into_iter().step_by(stride).collect()
    } else if t.len() < 3 {
        within(&[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0])
    } else {
        t
    }
}

/// At most ~12 x ticks: the measured lengths themselves when few, else every other one.
fn x_ticks(xs: &[f64]) -> Vec<f64> {
    let stride = xs.len().div_ceil(12).max(1);
    xs.iter().step_by(stride).copied().collect()
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= LEGEND_MAX_CHARS {
        s.to_string()
    } else {
        let head: String = s.chars().take(LEGEND_MAX_CHARS - 1).collect();
        format!("{head}…")
    }
}

/// Colour and marker of series `i`.
fn style_of(i: usize) -> (RGBColor, usize) {
    (PALETTE[i % PALETTE.len()], (i / PALETTE.len()) % 4)
}

/// Runs `$draw` with `$m` bound to a marker of shape `$kind` (disc, triangle, square, cross) at
/// `$at`: the shapes are different types, so each gets its own arm.
macro_rules! with_marker {
    ($kind:expr, $at:expr, $color:expr, |$m:ident| $draw:expr) => {
        match $kind {
            0 => {
                let $m = EmptyElement::at($at) + Circle::new((0, 0), 4, $color.filled());
                $draw
            }
            1 => {
                let $m = EmptyElement::at($at) + TriangleMarker::new((0, 0), 5, $color.filled());
                $draw
            }
            2 => {
                let $m =
                    EmptyElement::at($at) + Rectangle::new([(-4, -4), (4, 4)], $color.filled());
                $draw
            }
            _ => {
                let $m = EmptyElement::at($at) + Cross::new((0, 0), 4, $color.stroke_width(2));
                $draw
            }
        }
    };
}

impl LineChart {
    fn legend_rows(&self) -> u32 {
        self.series.len().div_ceil(LEGEND_COLUMNS) as u32
    }

    /// Canvas size: the plot, then one legend row per three series.
    pub fn size(&self) -> (u32, u32) {
        (WIDTH, PLOT_HEIGHT + self.legend_rows() * LEGEND_ROW + 12)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        root.fill(&WHITE).map_err(drawing)?;
        let (plot, legend) = root.split_vertically(PLOT_HEIGHT);
        let pts = || self.series.iter().flat_map(|s| s.points.iter());
        let mut xs: Vec<f64> = pts().map(|p| p.x).filter(|x| x.is_finite()).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let (x0, x1) = padded_range(xs.iter().copied(), true, 0.06)?;
        let ys = pts()
            .flat_map(|p| [p.y, p.lo, p.hi])
            .chain(self.reference.as_ref().map(|r| r.0));
        let (y0, y1) = padded_range(ys, self.y_log, 0.08)?;
        let x = (x0..x1).log_scale().with_key_points(x_ticks(&xs));
        if self.y_log {
            let y = (y0..y1).log_scale().with_key_points(log_ticks(y0, y1));
            self.plot(&plot, x, y)?;
        } else {
            self.plot(&plot, x, y0..y1)?;
        }
        self.draw_legend(&legend)
    }

    fn plot<DB, X, Y>(&self, area: &DrawingArea<DB, Shift>, x: X, y: Y) -> Result<()>
    where
        DB: DrawingBackend,
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, (FONT, 22))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(76)
            .build_cartesian_2d(x, y)
            .map_err(drawing)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .x_label_formatter(&|v| tick_text(*v))
            .y_label_formatter(&|v| tick_text(*v))
            .bold_line_style(RGBColor(0xe3, 0xe3, 0xe3))
            .light_line_style(WHITE)
            .axis_style(AXIS)
            .draw()
            .map_err(drawing)?;

        let (xr, yr) = (chart.x_range(), chart.y_range());
        if let Some((ry, label)) = &self.reference {
            chart
                .draw_series(DashedLineSeries::new(
                    [(xr.start, *ry), (xr.end, *ry)],
                    6,
                    4,
                    AXIS.stroke_width(2),
                ))
                .map_err(drawing)?;
            chart
                // Just under the line at the left edge, where data points rarely are.
                .draw_series([EmptyElement::at((xr.start, *ry))
                    + Text::new(label.clone(), (6, 5), (FONT, 13).into_font().color(&AXIS))])
                .map_err(drawing)?;
        }
        let n = self.series.len();
        for (i, s) in self.series.iter().enumerate() {
            let (color, kind) = style_of(i);
            let mut points: Vec<&ChartPoint> = s
                .points
                .iter()
                .filter(|p| p.y.is_finite() && yr.contains(&p.y))
                .collect();
            points.sort_by(|a, b| a.x.total_cmp(&b.x));
            // Bars of different series at one x sit a little apart so all stay visible.
            let dodge = if n > 1 {
                (i as f64 / (n - 1) as f64 - 0.5) * 0.04
            } else {
                0.0
            };
            let style = color.stroke_width(2);
            for p in &points {
                if p.lo.is_finite() && p.hi.is_finite() && p.hi > p.lo {
                    let (lo, hi) = (p.lo.max(yr.start), p.hi.min(yr.end));
                    let bx = p.x * (1.0 + dodge);
                    chart
                        .draw_series([PathElement::new(vec![(bx, lo), (bx, hi)], style)])
                        .map_err(drawing)?;
                    for end in [lo, hi] {
                        chart
                            .draw_series([EmptyElement::at((bx, end))
                                + PathElement::new(vec![(-4, 0), (4, 0)], style)])
                            .map_err(drawing)?;
                    }
                }
            }
            chart
                .draw_series(LineSeries::new(points.iter().map(|p| (p.x, p.y)), style))
                .map_err(drawing)?;
            for p in &points {
                with_marker!(kind, (p.x, p.y), color, |m| chart
                    .draw_series([m])
                    .map_err(drawing)?);
            }
        }
        Ok(())
    }

    fn draw_legend<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<()> {
        let column = WIDTH as i32 / LEGEND_COLUMNS as i32;
        for (i, s) in self.series.iter().enumerate() {
            let (color, kind) = style_of(i);
            let x = 24 + column * (i % LEGEND_COLUMNS) as i32;
            let y = 12 + LEGEND_ROW as i32 * (i / LEGEND_COLUMNS) as i32;
            area.draw(&PathElement::new(
                vec![(x, y), (x + 28, y)],
                color.stroke_width(2),
            ))
            .map_err(drawing)?;
            with_marker!(kind, (x + 14, y), color, |m| area
                .draw(&m)
                .map_err(drawing)?);
            let font =
                TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
            area.draw(&Text::new(shorten(&s.name), (x + 36, y), font))
                .map_err(drawing)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_numbers_inside_the_range() {
        assert_eq!(
            log_ticks(0.9, 120.0),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(log_ticks(0.5, 5000.0), vec![1.0, 10.0, 100.0, 1000.0]);
        assert!(log_ticks(1e-9, 1e12).len() <= 10);
        assert_eq!(tick_text(4096.0), "4096");
        assert_eq!(tick_text(0.05), "0.05");
        assert_eq!(tick_text(2.5), "2.5");
    }

    #[test]
    fn ranges_refuse_what_no_axis_can_show() {
        assert!(padded_range([1e-300, 1e300].into_iter(), true, 0.1).is_err());
        assert!(padded_range([-f64::MAX, f64::MAX].into_iter(), false, 0.1).is_err());
        let (lo, hi) = padded_range([5.0, 5.0].into_iter(), true, 0.1).unwrap();
        assert!(lo < 5.0 && hi > 5.0);
    }

    #[test]
    fn many_series_grow_the_legend_not_the_plot() {
        let series = |n: usize| LineChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            y_log: true,
            series: (0..n)
                .map(|i| ChartSeries {
                    name: format!("path-{i}"),
                    points: vec![ChartPoint {
                        x: 64.0,
                        y: 1.0 + i as f64,
                        lo: 1.0,
                        hi: 2.0 + i as f64,
                    }],
                })
                .collect(),
            reference: None,
        };
        assert_eq!(series(2).size(), (WIDTH, PLOT_HEIGHT + LEGEND_ROW + 12));
        assert_eq!(
            series(30).size(),
            (WIDTH, PLOT_HEIGHT + 10 * LEGEND_ROW + 12)
        );
        // Forty series, forty different looks.
        let looks: std::collections::HashSet<_> = (0..40)
            .map(|i| {
                (
                    style_of(i).0 .0,
                    style_of(i).0 .1,
                    style_of(i).0 .2,
                    style_of(i).1,
                )
            })
            .collect();
        assert_eq!(looks.len(), 40);
        let dir = tempfile::tempdir().unwrap();
        write_chart(&series(30), dir.path(), "many").unwrap();
        let svg = std::fs::read_to_string(dir.path().join("many.svg")).unwrap();
        assert!(svg.contains("path-29"), "every series is in the legend");
    }
}
