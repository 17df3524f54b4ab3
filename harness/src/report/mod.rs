//! `harness report`: sweep measurements (and criterion's) → a comparison of two sides along one
//! dimension (paths by default; commits, machines, backends or labels on request) as markdown,
//! CSV and JSON tables, TTFT and speedup plots (SVG + PNG), and the crossover length from which
//! the compare side wins (docs/design.md §8).

pub mod cli;
pub mod compare;
pub mod criterion;
pub mod plot;
pub mod select;
pub mod stats;
pub mod tables;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use compare::{compare, Comparison, Parity, Row, Side, Sides};
use plot::{ChartPoint, ChartSeries, LineChart};

pub use stats::{Crossover, Interval, Summary, Verdict};

/// The TTFT-vs-length chart: one curve per value along the compared dimension (and group).
pub fn ttft_chart(c: &Comparison) -> LineChart {
    let series = c
        .ttft_series
        .iter()
        .map(|s| ChartSeries {
            name: s.name.clone(),
            points: s
                .points
                .iter()
                .map(|(len, t)| ChartPoint {
                    x: *len as f64,
                    y: t.median,
                    lo: t.p10,
                    hi: t.p90,
                })
                .collect(),
        })
        .collect();
    LineChart {
        title: "Time to first token vs prompt length".into(),
        x_label: "prompt tokens (log scale)".into(),
        y_label: "TTFT ms (median, p10-p90; log)".into(),
        y_log: true,
        series,
        reference: None,
    }
}

/// The speedup-vs-length chart, one curve per group, with the 1.0 line. Bars span the
/// speedup's 95% bootstrap interval (none drawn under three runs a side).
pub fn speedup_chart(c: &Comparison) -> Option<LineChart> {
    let compare = c.compare.as_ref()?;
    let series: Vec<ChartSeries> = c
        .groups
        .iter()
        .map(|g| ChartSeries {
            name: if g.name.is_empty() {
                format!("{compare} vs {}", c.baseline)
            } else {
                g.name.clone()
            },
            points: g
                .rows
                .iter()
                .filter_map(|&i| {
                    let r = &c.rows[i];
                    let s = r.speedup?;
                    let ci = r.speedup_ci.unwrap_or(Interval { lo: s, hi: s });
                    Some(ChartPoint {
                        x: r.prompt_tokens as f64,
                        y: s,
                        lo: ci.lo,
                        hi: ci.hi,
                    })
                })
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    (!series.is_empty()).then(|| LineChart {
        title: format!("Speedup of {compare} over {}", c.baseline),
        x_label: "prompt tokens (log scale)".into(),
        y_label: "speedup (baseline TTFT / compare TTFT)".into(),
        y_log: false,
        series,
        reference: Some((1.0, "1.0 = same speed".into())),
    })
}

/// The files a report wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
}

/// Writes report.md, report.csv, report.json, ttft.svg/png and (with two sides)
/// speedup.svg/png into `dir`, each replaced atomically (written beside, then renamed).
pub fn write_report(c: &Comparison, dir: &Path) -> Result<Written> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = Vec::new();
    let mut plots = vec![("TTFT vs prompt length", "ttft.svg")];
    let staging = dir.join(".report-tmp");
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    plot::write_chart(&ttft_chart(c), &staging, "ttft")?;
    let mut names = vec!["ttft.svg", "ttft.png"];
    if let Some(chart) = speedup_chart(c) {
        plot::write_chart(&chart, &staging, "speedup")?;
        plots.push(("Speedup vs prompt length", "speedup.svg"));
        names.extend(["speedup.svg", "speedup.png"]);
    }
    for (name, text) in [
        ("report.md", tables::markdown(c, &plots)),
        ("report.csv", tables::csv(c)),
        ("report.json", tables::json(c)),
    ] {
        let p = staging.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        names.push(name);
    }
    for name in names {
        let dest = dir.join(name);
        std::fs::rename(staging.join(name), &dest)
            .with_context(|| format!("moving {name} into {}", dir.display()))?;
        files.push(dest);
    }
    let _ = std::fs::remove_dir(&staging);
    Ok(Written {
        dir: dir.to_path_buf(),
        files,
    })
}
