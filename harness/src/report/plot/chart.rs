//! A line chart with error bars, log or linear axes, a legend and an optional reference line,
//! laid out as a [`Scene`].

use super::scene::{Anchor, Rgb, Scene, Shape, TextSize};

/// A point: `y` with a `lo..hi` range drawn as an error bar, and the SVG tooltip.
#[derive(Debug, Clone)]
pub struct ChartPoint {
    pub x: f64,
    pub y: f64,
    pub lo: f64,
    pub hi: f64,
    pub tip: String,
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
    pub x_log: bool,
    pub y_log: bool,
    pub series: Vec<ChartSeries>,
    /// A dashed horizontal line at this y, with its label.
    pub reference: Option<(f64, String)>,
}

/// Matplotlib's "tab10": distinct for the usual 2–4 series, and readable for colour-blind
/// viewers in its first pairs.
const PALETTE: [Rgb; 8] = [
    Rgb(0x1f, 0x77, 0xb4),
    Rgb(0xff, 0x7f, 0x0e),
    Rgb(0x2c, 0xa0, 0x2c),
    Rgb(0xd6, 0x27, 0x28),
    Rgb(0x94, 0x67, 0xbd),
    Rgb(0x8c, 0x56, 0x4b),
    Rgb(0xe3, 0x77, 0xc2),
    Rgb(0x7f, 0x7f, 0x7f),
];
const GRID: Rgb = Rgb(0xe3, 0xe3, 0xe3);
const AXIS: Rgb = Rgb(0x44, 0x44, 0x44);
const WIDTH: u32 = 960;
const HEIGHT: u32 = 560;
const LEGEND_MAX_CHARS: usize = 34;

/// One axis: data range → pixel range, linear or log10.
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
    px0: f64,
    px1: f64,
}

impl Axis {
    fn t(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }

    fn map(&self, v: f64) -> f64 {
        let (a, b) = (self.t(self.lo), self.t(self.hi));
        self.px0 + (self.t(v) - a) / (b - a) * (self.px1 - self.px0)
    }
}

/// The data range padded by `pad` of its span (in log space for log axes), widened when all
/// values are equal.
fn padded_range(values: impl Iterator<Item = f64>, log: bool, pad: f64) -> (f64, f64) {
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
        let span = (b - a).max(0.3);
        let mid = (a + b) / 2.0;
        let (a, b) = (a.min(mid - span / 2.0), b.max(mid + span / 2.0));
        (10f64.powf(a - span * pad), 10f64.powf(b + span * pad))
    } else {
        let span = if hi > lo {
            hi - lo
        } else {
            lo.abs().max(1.0) * 0.2
        };
        (lo - span * pad, hi + span * pad)
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
        within(&[1.0])
    } else if t.len() < 3 {
        within(&[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0])
    } else {
        t
    }
}

fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let raw = (hi - lo) / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while v <= hi + step * 1e-9 {
        out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
        v += step;
    }
    out
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
        let head: String = s.chars().take(LEGEND_MAX_CHARS - 2).collect();
        format!("{head}..")
    }
}

impl LineChart {
    pub fn scene(&self) -> Scene {
        let mut sc = Scene::new(WIDTH, HEIGHT);
        let cw = TextSize::Normal.char_width();
        let legend_chars = self
            .series
            .iter()
            .map(|s| shorten(&s.name).chars().count())
            .max()
            .unwrap_or(0);
        let legend_w = (legend_chars as f64 * cw + 56.0).max(120.0);
        let (left, top) = (86.0, 52.0);
        let (right, bottom) = (WIDTH as f64 - legend_w - 24.0, HEIGHT as f64 - 66.0);

        let pts = || self.series.iter().flat_map(|s| s.points.iter());
        let mut xs: Vec<f64> = pts().map(|p| p.x).filter(|x| x.is_finite()).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let (xlo, xhi) = padded_range(xs.iter().copied(), self.x_log, 0.06);
        let ys = pts()
            .flat_map(|p| [p.y, p.lo, p.hi])
            .chain(self.reference.as_ref().map(|r| r.0));
        let (ylo, yhi) = padded_range(ys, self.y_log, 0.08);
        let x = Axis {
            log: self.x_log,
            lo: xlo,
            hi: xhi,
            px0: left,
            px1: right,
        };
        let y = Axis {
            log: self.y_log,
            lo: ylo,
            hi: yhi,
            px0: bottom,
            px1: top,
        };
        // Pixel-centred positions keep 1-px grid lines crisp in the PNG.
        let crisp = |v: f64| v.round() + 0.5;

        let y_ticks = if self.y_log {
            log_ticks(ylo, yhi)
        } else {
            linear_ticks(ylo, yhi)
        };
        for &t in &y_ticks {
            let py = crisp(y.map(t));
            sc.line(vec![(left, py), (right, py)], GRID, 1.0);
            sc.text((left - 8.0, py), tick_text(t), TextSize::Small, Anchor::End);
        }
        for &t in &x_ticks(&xs) {
            let px = crisp(x.map(t));
            sc.line(vec![(px, top), (px, bottom)], GRID, 1.0);
            sc.text(
                (px, bottom + 14.0),
                tick_text(t),
                TextSize::Small,
                Anchor::Middle,
            );
        }
        sc.shapes.push(Shape::Rect {
            x: left.round() + 0.5,
            y: top.round() + 0.5,
            w: (right - left).round(),
            h: (bottom - top).round(),
            fill: None,
            stroke: Some(AXIS),
        });

        if let Some((ry, label)) = &self.reference {
            let py = y.map(*ry);
            sc.dashed(vec![(left, py), (right, py)], AXIS, 1.5, (6.0, 4.0));
            sc.shapes.push(Shape::Text {
                // Under the line at the left edge, where data points rarely are.
                at: (left + 6.0, py + 11.0),
                text: label.clone(),
                size: TextSize::Small,
                anchor: Anchor::Start,
                color: AXIS,
                vertical: false,
            });
        }

        for (i, s) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let mut points: Vec<&ChartPoint> =
                s.points.iter().filter(|p| p.y.is_finite()).collect();
            points.sort_by(|a, b| a.x.total_cmp(&b.x));
            // Bars of different series at one x sit a few pixels apart so both stay visible.
            let dodge = (i as f64 - (self.series.len() as f64 - 1.0) / 2.0) * 5.0;
            for p in &points {
                let px = x.map(p.x) + dodge;
                if p.lo.is_finite() && p.hi.is_finite() && p.hi > p.lo {
                    let (a, b) = (y.map(p.lo), y.map(p.hi));
                    sc.line(vec![(px, a), (px, b)], color, 1.5);
                    sc.line(vec![(px - 4.0, a), (px + 4.0, a)], color, 1.5);
                    sc.line(vec![(px - 4.0, b), (px + 4.0, b)], color, 1.5);
                }
            }
            sc.line(
                points.iter().map(|p| (x.map(p.x), y.map(p.y))).collect(),
                color,
                2.0,
            );
            for p in &points {
                sc.shapes.push(Shape::Dot {
                    center: (x.map(p.x), y.map(p.y)),
                    radius: 4.0,
                    color,
                    tip: Some(p.tip.clone()),
                });
            }
            // Legend entry: a line with a dot, then the name.
            let ly = top + 12.0 + 28.0 * i as f64;
            let lx = right + 20.0;
            sc.line(vec![(lx, ly), (lx + 28.0, ly)], color, 2.0);
            sc.shapes.push(Shape::Dot {
                center: (lx + 14.0, ly),
                radius: 4.0,
                color,
                tip: Some(s.name.clone()),
            });
            sc.text(
                (lx + 36.0, ly),
                shorten(&s.name),
                TextSize::Normal,
                Anchor::Start,
            );
        }

        sc.text(
            (WIDTH as f64 / 2.0, 24.0),
            &self.title,
            TextSize::Title,
            Anchor::Middle,
        );
        sc.text(
            ((left + right) / 2.0, HEIGHT as f64 - 22.0),
            &self.x_label,
            TextSize::Normal,
            Anchor::Middle,
        );
        sc.shapes.push(Shape::Text {
            at: (22.0, (top + bottom) / 2.0),
            text: self.y_label.clone(),
            size: TextSize::Normal,
            anchor: Anchor::Middle,
            color: Rgb::BLACK,
            vertical: true,
        });
        sc
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
        assert_eq!(
            linear_ticks(0.0, 3.0),
            vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
        );
        assert_eq!(tick_text(4096.0), "4096");
        assert_eq!(tick_text(0.05), "0.05");
        assert_eq!(tick_text(2.5), "2.5");
    }
}
