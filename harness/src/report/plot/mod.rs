//! Plots for reports, drawn without a plotting library or system fonts: a chart is laid out
//! once as a [`scene::Scene`], then written as SVG text and rasterised to PNG.

pub mod chart;
pub mod raster;
pub mod scene;
pub mod svg;

use std::path::Path;

use anyhow::{Context, Result};

pub use chart::{ChartPoint, ChartSeries, LineChart};

/// Writes `<stem>.svg` and `<stem>.png` into `dir`.
pub fn write_chart(chart: &LineChart, dir: &Path, stem: &str) -> Result<()> {
    let scene = chart.scene();
    let svg_path = dir.join(format!("{stem}.svg"));
    std::fs::write(&svg_path, svg::render(&scene))
        .with_context(|| format!("writing {}", svg_path.display()))?;
    raster::write_png(&scene, &dir.join(format!("{stem}.png")))
}
