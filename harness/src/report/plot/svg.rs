//! [`Scene`] → SVG text. Fonts are named, not embedded: viewers substitute any monospace font,
//! whose advance (0.6 em) matches the layout's character width.

use std::fmt::Write as _;

use super::scene::{Anchor, Scene, Shape, TextSize};

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The font size whose monospace advance equals the raster font's character width.
fn font_px(size: TextSize) -> f64 {
    size.char_width() / 0.6
}

fn points_attr(points: &[(f64, f64)]) -> String {
    points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn render(scene: &Scene) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Noto Sans Mono, DejaVu Sans Mono, Menlo, Consolas, monospace">"#,
        w = scene.width,
        h = scene.height
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for shape in &scene.shapes {
        match shape {
            Shape::Line {
                points,
                color,
                width,
                dash,
            } => {
                let dash = dash.map_or(String::new(), |(on, off)| {
                    format!(r#" stroke-dasharray="{on} {off}""#)
                });
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="{width}" stroke-linejoin="round" stroke-linecap="round"{dash}/>"#,
                    points_attr(points),
                    color.hex()
                );
            }
            Shape::Dot {
                center,
                radius,
                color,
                tip,
            } => {
                let title = tip
                    .as_ref()
                    .map_or(String::new(), |t| format!("<title>{}</title>", escape(t)));
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="{radius}" fill="{}">{title}</circle>"#,
                    center.0,
                    center.1,
                    color.hex()
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
                let fill = fill.map_or("none".to_string(), |c| c.hex());
                let stroke = stroke.map_or(String::new(), |c| format!(r#" stroke="{}""#, c.hex()));
                let _ = writeln!(
                    s,
                    r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}"{stroke}/>"#
                );
            }
            Shape::Text {
                at,
                text,
                size,
                anchor,
                color,
                vertical,
            } => {
                let anchor = match anchor {
                    Anchor::Start => "start",
                    Anchor::Middle => "middle",
                    Anchor::End => "end",
                };
                let rotate = if *vertical {
                    format!(r#" transform="rotate(-90 {:.1} {:.1})""#, at.0, at.1)
                } else {
                    String::new()
                };
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" font-size="{:.1}" text-anchor="{anchor}" dominant-baseline="central" fill="{}"{rotate}>{}</text>"#,
                    at.0,
                    at.1,
                    font_px(*size),
                    color.hex(),
                    escape(text)
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
