//! [`Scene`] → RGB pixels → PNG, in pure Rust with no system fonts: shapes are anti-aliased by
//! distance to the pixel centre, text is blitted from the Noto Sans Mono glyphs that the
//! `noto-sans-mono-bitmap` crate embeds pre-rendered.

use std::path::Path;

use anyhow::{Context, Result};
use noto_sans_mono_bitmap::{get_raster, get_raster_width, FontWeight, RasterHeight};

use super::scene::{Anchor, Rgb, Scene, Shape, TextSize};

fn raster_height(size: TextSize) -> RasterHeight {
    match size {
        TextSize::Small => RasterHeight::Size16,
        TextSize::Normal => RasterHeight::Size20,
        TextSize::Title => RasterHeight::Size24,
    }
}

pub fn char_width(size: TextSize) -> usize {
    get_raster_width(FontWeight::Regular, raster_height(size))
}

/// An RGB image with float channels in 0..=1 for blending.
pub struct Canvas {
    pub width: usize,
    pub height: usize,
    px: Vec<[f32; 3]>,
}

impl Canvas {
    fn new(width: usize, height: usize) -> Canvas {
        Canvas {
            width,
            height,
            px: vec![[1.0; 3]; width * height],
        }
    }

    fn blend(&mut self, x: i64, y: i64, color: Rgb, alpha: f32) {
        if alpha <= 0.0 || x < 0 || y < 0 || x >= self.width as i64 || y >= self.height as i64 {
            return;
        }
        let p = &mut self.px[y as usize * self.width + x as usize];
        let c = [color.0, color.1, color.2].map(|v| v as f32 / 255.0);
        let a = alpha.min(1.0);
        for i in 0..3 {
            p[i] = p[i] * (1.0 - a) + c[i] * a;
        }
    }

    /// Blends `color` through a coverage mask over the pixel box `[x0, x1) × [y0, y1)`, where
    /// `cover(px, py)` gives the coverage of the pixel whose centre is (px, py). One mask per
    /// shape, so overlapping segments of a polyline do not darken their joints.
    fn fill_coverage(
        &mut self,
        bbox: (f64, f64, f64, f64),
        color: Rgb,
        cover: impl Fn(f64, f64) -> f32,
    ) {
        let x0 = bbox.0.floor().max(0.0) as i64;
        let y0 = bbox.1.floor().max(0.0) as i64;
        let x1 = (bbox.2.ceil() as i64).min(self.width as i64);
        let y1 = (bbox.3.ceil() as i64).min(self.height as i64);
        for y in y0..y1 {
            for x in x0..x1 {
                let a = cover(x as f64 + 0.5, y as f64 + 0.5);
                self.blend(x, y, color, a);
            }
        }
    }

    pub fn to_rgb8(&self) -> Vec<u8> {
        self.px
            .iter()
            .flat_map(|p| p.map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8))
            .collect()
    }
}

fn dist_to_segment(p: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    let t = if len2 == 0.0 {
        0.0
    } else {
        (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0)
    };
    let (qx, qy) = (a.0 + t * dx, a.1 + t * dy);
    ((p.0 - qx).powi(2) + (p.1 - qy).powi(2)).sqrt()
}

/// Splits a polyline into its visible dashes.
fn dash_segments(points: &[(f64, f64)], on: f64, off: f64) -> Vec<((f64, f64), (f64, f64))> {
    let mut out = Vec::new();
    let (mut drawing, mut left) = (true, on);
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        let len = ((b.0 - a.0).powi(2) + (b.1 - a.1).powi(2)).sqrt();
        let mut t = 0.0;
        while t < len {
            let step = left.min(len - t);
            let p = |s: f64| (a.0 + (b.0 - a.0) * s / len, a.1 + (b.1 - a.1) * s / len);
            if drawing {
                out.push((p(t), p(t + step)));
            }
            t += step;
            left -= step;
            if left <= 1e-9 {
                drawing = !drawing;
                left = if drawing { on } else { off };
            }
        }
    }
    out
}

fn draw_text(
    canvas: &mut Canvas,
    at: (f64, f64),
    text: &str,
    size: TextSize,
    anchor: Anchor,
    color: Rgb,
    vertical: bool,
) {
    let rh = raster_height(size);
    let cw = char_width(size) as f64;
    let h = rh.val() as f64;
    let total = cw * text.chars().count() as f64;
    let start = match anchor {
        Anchor::Start => 0.0,
        Anchor::Middle => -total / 2.0,
        Anchor::End => -total,
    };
    for (i, c) in text.chars().enumerate() {
        let glyph = get_raster(c, FontWeight::Regular, rh)
            .or_else(|| get_raster('?', FontWeight::Regular, rh))
            .expect("the font has `?`");
        // Offset of the glyph box along the text direction, and the box's top edge across it.
        let along = start + cw * i as f64;
        for (gy, row) in glyph.rows().enumerate() {
            for (gx, &v) in row.iter().enumerate() {
                if v == 0 {
                    continue;
                }
                let (x, y) = if vertical {
                    // Rotated a quarter turn counter-clockwise about `at`: text runs upwards.
                    (at.0 - h / 2.0 + gy as f64, at.1 - along - gx as f64 - 1.0)
                } else {
                    (at.0 + along + gx as f64, at.1 - h / 2.0 + gy as f64)
                };
                canvas.blend(x.round() as i64, y.round() as i64, color, v as f32 / 255.0);
            }
        }
    }
}

pub fn render(scene: &Scene) -> Canvas {
    let mut canvas = Canvas::new(scene.width as usize, scene.height as usize);
    for shape in &scene.shapes {
        match shape {
            Shape::Line {
                points,
                color,
                width,
                dash,
            } => {
                let segs = match dash {
                    Some((on, off)) => dash_segments(points, *on, *off),
                    None => points.windows(2).map(|w| (w[0], w[1])).collect(),
                };
                if segs.is_empty() {
                    continue;
                }
                let pad = width / 2.0 + 1.0;
                let b = segs
                    .iter()
                    .fold((f64::MAX, f64::MAX, f64::MIN, f64::MIN), |b, (p, q)| {
                        (
                            b.0.min(p.0).min(q.0),
                            b.1.min(p.1).min(q.1),
                            b.2.max(p.0).max(q.0),
                            b.3.max(p.1).max(q.1),
                        )
                    });
                let bbox = (b.0 - pad, b.1 - pad, b.2 + pad, b.3 + pad);
                let half = width / 2.0;
                canvas.fill_coverage(bbox, *color, |x, y| {
                    let d = segs
                        .iter()
                        .map(|(a, b)| dist_to_segment((x, y), *a, *b))
                        .fold(f64::MAX, f64::min);
                    (half + 0.5 - d).clamp(0.0, 1.0) as f32
                });
            }
            Shape::Dot {
                center,
                radius,
                color,
                ..
            } => {
                let (cx, cy, r) = (center.0, center.1, *radius);
                canvas.fill_coverage(
                    (cx - r - 1.0, cy - r - 1.0, cx + r + 1.0, cy + r + 1.0),
                    *color,
                    |x, y| {
                        let d = ((x - cx).powi(2) + (y - cy).powi(2)).sqrt();
                        (r + 0.5 - d).clamp(0.0, 1.0) as f32
                    },
                );
            }
            Shape::Rect {
                x,
                y,
                w,
                h,
                fill,
                stroke,
            } => {
                if let Some(fill) = fill {
                    canvas.fill_coverage((*x, *y, x + w, y + h), *fill, |_, _| 1.0);
                }
                if let Some(stroke) = stroke {
                    let outline = [(*x, *y), (x + w, *y), (x + w, y + h), (*x, y + h), (*x, *y)];
                    let segs: Vec<_> = outline.windows(2).map(|s| (s[0], s[1])).collect();
                    canvas.fill_coverage(
                        (x - 2.0, y - 2.0, x + w + 2.0, y + h + 2.0),
                        *stroke,
                        |px, py| {
                            let d = segs
                                .iter()
                                .map(|(a, b)| dist_to_segment((px, py), *a, *b))
                                .fold(f64::MAX, f64::min);
                            (1.0 - d).clamp(0.0, 1.0) as f32
                        },
                    );
                }
            }
            Shape::Text {
                at,
                text,
                size,
                anchor,
                color,
                vertical,
            } => draw_text(&mut canvas, *at, text, *size, *anchor, *color, *vertical),
        }
    }
    canvas
}

/// Renders the scene and writes it as an 8-bit RGB PNG.
pub fn write_png(scene: &Scene, path: &Path) -> Result<()> {
    let canvas = render(scene);
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, canvas.width as u32, canvas.height as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().context("encoding PNG")?;
        w.write_image_data(&canvas.to_rgb8())
            .context("encoding PNG")?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dashes_alternate_along_the_whole_polyline() {
        let d = dash_segments(&[(0.0, 0.0), (10.0, 0.0), (10.0, 10.0)], 4.0, 2.0);
        // Along the path: on 0–4 and 6–10 (the corner), then 12–16 and 18–20 on the second leg.
        let lens: Vec<f64> = d
            .iter()
            .map(|(a, b)| (b.0 - a.0).abs() + (b.1 - a.1).abs())
            .collect();
        assert_eq!(d[0], ((0.0, 0.0), (4.0, 0.0)));
        assert_eq!(d[1], ((6.0, 0.0), (10.0, 0.0)));
        assert_eq!(d[2], ((10.0, 2.0), (10.0, 6.0)));
        assert_eq!(d[3], ((10.0, 8.0), (10.0, 10.0)));
        assert_eq!(lens, vec![4.0, 4.0, 4.0, 2.0]);
    }

    #[test]
    fn a_thick_line_covers_its_pixels() {
        let mut s = Scene::new(10, 10);
        s.line(vec![(0.0, 5.0), (10.0, 5.0)], Rgb::BLACK, 2.0);
        let c = render(&s);
        let rgb = c.to_rgb8();
        let at = |x: usize, y: usize| rgb[(y * 10 + x) * 3];
        assert_eq!(at(5, 4), 0); // pixel centre 4.5: distance 0.5, inside the 2-px line
        assert_eq!(at(5, 5), 0);
        assert_eq!(at(5, 1), 255);
    }
}
