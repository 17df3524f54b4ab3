//! Joins measurements into a comparison: baseline rows against compare rows on every other key
//! (model, prompt length, and the dimensions not compared), like llama.cpp's
//! compare-llama-bench.py.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use serde::Serialize;

use super::select::{Dim, Selector};
use super::stats::{median_interval, ratio_interval, Crossover, Interval, Summary, Verdict};
use crate::sweep::Measurement;

/// The timings of one side of one table row.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub ttft_ms: Summary,
    /// The 95% bootstrap interval of the median TTFT (none under three runs).
    pub ttft_ms_ci: Option<Interval>,
    /// The TTFT of every run, for the speedup's interval.
    #[serde(skip)]
    pub ttft_runs: Vec<f64>,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// Distinct output hashes among the side's measurements (sorted).
    pub output_sha256: Vec<String>,
}

impl Side {
    fn of(rows: &[&Measurement]) -> Side {
        let median = |f: fn(&Measurement) -> f64| {
            Summary::of(&mut rows.iter().map(|r| f(r)).collect::<Vec<_>>()).median
        };
        let hashes: BTreeSet<String> = rows
            .iter()
            .filter_map(|r| r.output_sha256.clone())
            .collect();
        let ttft_runs: Vec<f64> = rows.iter().map(|r| r.ttft_ms).collect();
        Side {
            ttft_ms: Summary::of(&mut ttft_runs.clone()),
            ttft_ms_ci: median_interval(&ttft_runs),
            ttft_runs,
            prefill_tokens_per_s: median(|r| r.prefill_tokens_per_s),
            decode_tokens_per_s: median(|r| r.decode_tokens_per_s),
            output_sha256: hashes.into_iter().collect(),
        }
    }
}

/// Whether both sides generated the same tokens, judged from the output hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Parity {
    Identical,
    Differs,
    /// A side has no hashes (criterion rows).
    Unknown,
}

impl Parity {
    pub fn name(self) -> &'static str {
        match self {
            Parity::Identical => "identical",
            Parity::Differs => "differs",
            Parity::Unknown => "unknown",
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub model: String,
    pub prompt_tokens: usize,
    /// The values of the dimensions not compared (all of them; the table shows those that vary).
    pub keys: BTreeMap<Dim, String>,
    pub baseline: Option<Side>,
    pub compare: Option<Side>,
    /// baseline median TTFT / compare median TTFT: above 1 means compare is faster.
    pub speedup: Option<f64>,
    /// The speedup's 95% bootstrap interval (none while a side has under three runs).
    pub speedup_ci: Option<Interval>,
    /// What the interval says: faster, slower, no difference detected, too few runs.
    pub verdict: Option<Verdict>,
    pub parity: Option<Parity>,
}

/// Rows sharing a model and every non-compared key: one curve in the plots, one crossover.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// Model plus the keys that vary between groups, e.g. `qwen3_5:bench:bf16:hf · machine=...`.
    pub name: String,
    /// Indices into [`Comparison::rows`], by increasing prompt length.
    pub rows: Vec<usize>,
    pub crossover: Option<Crossover>,
}

/// Median TTFT per prompt length of one value along the compared dimension within one group.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(usize, Summary)>,
}

/// The whole comparison, ready for the writers and plots.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub dim: Dim,
    pub baseline: String,
    pub compare: Option<String>,
    /// Non-compared dimensions that differ between rows: shown as table columns.
    pub key_columns: Vec<Dim>,
    /// Non-compared dimensions with one value throughout (shown once above the table), and
    /// the model when there is only one.
    pub constant: Vec<(String, String)>,
    pub rows: Vec<Row>,
    pub groups: Vec<Group>,
    /// TTFT curves for every value along the compared dimension (not only the two sides).
    pub ttft_series: Vec<Series>,
}

/// `--baseline`/`--compare` as given (either may be absent).
#[derive(Debug, Clone, Default)]
pub struct Sides {
    pub baseline: Option<String>,
    pub compare: Option<String>,
}

/// Distinct values in order of first appearance.
fn distinct(values: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// The one value along `sel.dim` the selector means: an exact match if any, else the single
/// prefix/substring match.
fn resolve(sel: &Selector, rows: &[Measurement], values: &[String]) -> Result<String> {
    if values.contains(&sel.value) {
        return Ok(sel.value.clone());
    }
    let hits = distinct(
        rows.iter()
            .filter(|r| sel.matches(r))
            .map(|r| sel.dim.value(r)),
    );
    match hits.len() {
        1 => Ok(hits[0].clone()),
        0 => bail!(
            "no measurements with {} `{}`; the files hold: {}",
            sel.dim,
            sel.value,
            values.join(", ")
        ),
        _ => bail!(
            "{} `{}` is ambiguous: it matches {}",
            sel.dim,
            sel.value,
            hits.join(", ")
        ),
    }
}

pub fn compare(rows: &[Measurement], sides: &Sides) -> Result<Comparison> {
    if rows.is_empty() {
        bail!("no measurements to report (the input files are empty)");
    }
    let base_sel = sides.baseline.as_deref().map(Selector::parse).transpose()?;
    let comp_sel = sides.compare.as_deref().map(Selector::parse).transpose()?;
    let dim = match (&base_sel, &comp_sel) {
        (Some(b), Some(c)) if b.dim != c.dim => {
            bail!(
                "--baseline compares along {} but --compare along {}: name the same dimension",
                b.dim,
                c.dim
            )
        }
        (Some(s), _) | (_, Some(s)) => s.dim,
        (None, None) => Dim::Path,
    };
    let values = distinct(rows.iter().map(|r| dim.value(r)));
    let baseline = match &base_sel {
        Some(s) => resolve(s, rows, &values)?,
        None => {
            let taken = comp_sel
                .as_ref()
                .map(|s| resolve(s, rows, &values))
                .transpose()?;
            values
                .iter()
                .find(|v| Some(*v) != taken.as_ref())
                .cloned()
                .unwrap_or_else(|| values[0].clone())
        }
    };
    let compare = match &comp_sel {
        Some(s) => Some(resolve(s, rows, &values)?),
        None => values.iter().find(|v| **v != baseline).cloned(),
    };
    if compare.as_ref() == Some(&baseline) {
        bail!("--baseline and --compare both select {dim} `{baseline}`");
    }

    // The backend column follows from the path (`backend=mlx+…` rows run on MLX), so along
    // paths it is not a key of its own: otherwise a CPU path and an MLX path never meet.
    let others: Vec<Dim> = Dim::ALL
        .into_iter()
        .filter(|d| *d != dim && !(dim == Dim::Path && *d == Dim::Backend))
        .collect();
    let keys_of = |r: &Measurement| -> BTreeMap<Dim, String> {
        others.iter().map(|d| (*d, d.value(r))).collect()
    };

    // (model, keys) → prompt length → value along dim → measurements
    type Cells<'a> = BTreeMap<
        (String, BTreeMap<Dim, String>),
        BTreeMap<usize, BTreeMap<String, Vec<&'a Measurement>>>,
    >;
    let mut cells: Cells = BTreeMap::new();
    for r in rows {
        cells
            .entry((r.model.clone(), keys_of(r)))
            .or_default()
            .entry(r.prompt_tokens)
            .or_default()
            .entry(dim.value(r))
            .or_default()
            .push(r);
    }

    // Keys that vary between groups name the groups and become table columns.
    let key_columns: Vec<Dim> = others
        .iter()
        .copied()
        .filter(|d| {
            cells
                .keys()
                .map(|(_, k)| &k[d])
                .collect::<BTreeSet<_>>()
                .len()
                > 1
        })
        .collect();
    let models: BTreeSet<&String> = cells.keys().map(|(m, _)| m).collect();
    let mut constant: Vec<(String, String)> = Vec::new();
    if models.len() == 1 {
        constant.push(("model".into(), models.iter().next().unwrap().to_string()));
    }
    let (_, first_keys) = cells.keys().next().expect("rows is not empty");
    for d in &others {
        if !key_columns.contains(d) && first_keys[d] != "-" {
            constant.push((d.name().into(), first_keys[d].clone()));
        }
    }
    let group_name = |model: &str, keys: &BTreeMap<Dim, String>| -> String {
        let mut parts: Vec<String> = Vec::new();
        if models.len() > 1 {
            parts.push(model.to_string());
        }
        parts.extend(key_columns.iter().map(|d| format!("{d}={}", keys[d])));
        parts.join(" · ")
    };

    let mut out_rows = Vec::new();
    let mut groups = Vec::new();
    let mut ttft_series = Vec::new();
    for ((model, keys), by_len) in &cells {
        let gname = group_name(model, keys);
        let mut idx = Vec::new();
        for (&len, by_value) in by_len {
            let side = |v: Option<&String>| v.and_then(|v| by_value.get(v)).map(|rs| Side::of(rs));
            let b = side(Some(&baseline));
            let c = side(compare.as_ref());
            if b.is_none() && c.is_none() {
                continue;
            }
            let (speedup, speedup_ci) = match (&b, &c) {
                (Some(b), Some(c)) => (
                    Some(b.ttft_ms.median / c.ttft_ms.median),
                    ratio_interval(&b.ttft_runs, &c.ttft_runs),
                ),
                _ => (None, None),
            };
            let verdict = speedup.map(|_| Verdict::of(speedup_ci));
            let parity = match (&b, &c) {
                (Some(b), Some(c)) if b.output_sha256.is_empty() || c.output_sha256.is_empty() => {
                    Some(Parity::Unknown)
                }
                (Some(b), Some(c)) => Some(
                    if b.output_sha256.len() == 1 && b.output_sha256 == c.output_sha256 {
                        Parity::Identical
                    } else {
                        Parity::Differs
                    },
                ),
                _ => None,
            };
            idx.push(out_rows.len());
            out_rows.push(Row {
                model: model.clone(),
                prompt_tokens: len,
                keys: keys.clone(),
                baseline: b,
                compare: c,
                speedup,
                speedup_ci,
                verdict,
                parity,
            });
        }
        let points: Vec<(usize, Verdict)> = idx
            .iter()
            .filter_map(|&i| Some((out_rows[i].prompt_tokens, out_rows[i].verdict?)))
            .collect();
        let crossover = (!points.is_empty()).then(|| Crossover::find(&points));
        if !idx.is_empty() {
            groups.push(Group {
                name: gname.clone(),
                rows: idx,
                crossover,
            });
        }
        for v in &values {
            let points: Vec<(usize, Summary)> = by_len
                .iter()
                .filter_map(|(&len, by_value)| Some((len, Side::of(by_value.get(v)?).ttft_ms)))
                .collect();
            if !points.is_empty() {
                let name = if gname.is_empty() {
                    v.clone()
                } else {
                    format!("{gname} · {v}")
                };
                ttft_series.push(Series { name, points });
            }
        }
    }

    let label = |v: &String| match dim {
        Dim::Path => v.clone(),
        d => format!("{d}={v}"),
    };
    Ok(Comparison {
        dim,
        baseline: label(&baseline),
        compare: compare.as_ref().map(label),
        key_columns,
        constant,
        rows: out_rows,
        groups,
        ttft_series,
    })
}
