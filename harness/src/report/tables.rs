//! The comparison as markdown (for people), CSV and JSON (for other tools).

use std::fmt::Write as _;

use super::compare::{Comparison, Row, Side};
use super::stats::{Verdict, TARGET_HALF_WIDTH};

/// Milliseconds to three significant digits (no decimals from 100 up, at most six below 1,
/// so a sub-millisecond TTFT keeps its digits too).
pub fn fmt_ms(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let decimals = match x.abs() > 0.0 {
        true => (2 - x.abs().log10().floor() as i64).clamp(0, 6) as usize,
        false => 2,
    };
    format!("{x:.decimals$}")
}

/// Whether a side's median is known to ±[`TARGET_HALF_WIDTH`] (false under three runs).
pub fn narrow(s: &Side) -> bool {
    s.ttft_ms_ci
        .is_some_and(|ci| ci.is_narrow(s.ttft_ms.median))
}

fn fmt_side(s: Option<&Side>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s.ttft_ms.n == 1 => fmt_ms(s.ttft_ms.median),
        Some(s) => format!(
            "{} ({}–{}){}",
            fmt_ms(s.ttft_ms.median),
            fmt_ms(s.ttft_ms.p10),
            fmt_ms(s.ttft_ms.p90),
            if narrow(s) { "" } else { " †" }
        ),
    }
}

/// An interval bound to two decimals, or three where two would print an exclusive bound as
/// 1.00 (the verdict hangs on which side of 1 it lies).
fn fmt_bound(x: f64) -> String {
    let two = format!("{x:.2}");
    if two == "1.00" && x != 1.0 {
        format!("{x:.3}")
    } else {
        two
    }
}

/// The speedup with its 95% interval, e.g. `1.31 [1.22–1.40]`.
fn fmt_speedup(r: &Row) -> String {
    match (r.speedup, r.speedup_ci) {
        (None, _) => "-".into(),
        (Some(s), None) => format!("{s:.2}"),
        (Some(s), Some(ci)) => format!("{s:.2} [{}–{}]", fmt_bound(ci.lo), fmt_bound(ci.hi)),
    }
}

/// How the repeats ended, from the cells' median intervals: all narrow enough, or which were
/// not (their sweep hit its cap, or had too few runs for an interval).
fn repeats_note(c: &Comparison) -> String {
    let sides: Vec<&Side> = c
        .rows
        .iter()
        .flat_map(|r| [&r.baseline, &r.compare])
        .filter_map(|s| s.as_ref())
        .collect();
    let wide = sides.iter().filter(|s| !narrow(s)).count();
    let pct = TARGET_HALF_WIDTH * 100.0;
    if wide == 0 {
        format!(
            "Repeats: every cell's median TTFT is known to ±{pct:.0}% (95% interval): narrow enough.\n"
        )
    } else {
        format!(
            "Repeats: {wide} of {} cells (marked †) have a 95% interval of their median wider than \
             ±{pct:.0}%: the sweep stopped at its repeat or time cap before they narrowed (or they had \
             under 3 runs). Their verdicts stand as computed, but read them with that in mind.\n",
            sides.len()
        )
    }
}

/// One sentence per group naming the crossover (prefixed by the group when there are several).
pub fn crossover_notes(c: &Comparison) -> Vec<String> {
    let Some(compare) = &c.compare else {
        return Vec::new();
    };
    c.groups
        .iter()
        .filter_map(|g| {
            let sentence = g.crossover?.describe(compare, &c.baseline);
            Some(if g.name.is_empty() {
                sentence
            } else {
                format!("{}: {sentence}", g.name)
            })
        })
        .collect()
}

pub fn markdown(c: &Comparison, plots: &[(&str, &str)]) -> String {
    let mut md = String::from("# TTFT report\n\n");
    if !c.constant.is_empty() {
        let parts: Vec<String> = c
            .constant
            .iter()
            .map(|(k, v)| format!("{k}: `{v}`"))
            .collect();
        let _ = writeln!(md, "{}\n", parts.join(" · "));
    }
    let runs: Vec<usize> = c
        .rows
        .iter()
        .flat_map(|r| [&r.baseline, &r.compare])
        .filter_map(|s| s.as_ref().map(|s| s.ttft_ms.n))
        .collect();
    let (lo, hi) = (
        runs.iter().min().copied().unwrap_or(0),
        runs.iter().max().copied().unwrap_or(0),
    );
    let n = if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}–{hi}")
    };
    match &c.compare {
        Some(comp) => {
            let _ = writeln!(
                md,
                "Baseline `{}`, compared with `{comp}`. TTFT in ms: median (p10–p90) over {n} runs; \
                 speedup = baseline median / compare median (above 1: `{comp}` is faster) with its \
                 95% bootstrap interval; verdict: faster or slower where the interval excludes 1, \
                 else no difference detected; parity from the generated tokens' sha256.\n",
                c.baseline
            );
        }
        None => {
            let _ = writeln!(
                md,
                "Only `{}` was measured. TTFT in ms: median (p10–p90) over {n} runs.\n",
                c.baseline
            );
        }
    }

    let mut header = vec!["model".to_string(), "prompt tokens".to_string()];
    header.extend(c.key_columns.iter().map(|d| d.name().to_string()));
    header.push(format!("{} TTFT ms", c.baseline));
    let mut align = vec!["---", "--:"];
    align.extend(c.key_columns.iter().map(|_| "---"));
    align.push("--:");
    if let Some(comp) = &c.compare {
        header.extend([
            format!("{comp} TTFT ms"),
            "speedup [95% CI]".into(),
            "verdict".into(),
            "parity".into(),
        ]);
        align.extend(["--:", "--:", "---", "---"]);
    }
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let _ = writeln!(md, "|{}|", align.join("|"));
    for r in &c.rows {
        let mut cells = vec![r.model.clone(), r.prompt_tokens.to_string()];
        cells.extend(c.key_columns.iter().map(|d| r.keys[d].clone()));
        cells.push(fmt_side(r.baseline.as_ref()));
        if c.compare.is_some() {
            cells.push(fmt_side(r.compare.as_ref()));
            cells.push(fmt_speedup(r));
            cells.push(r.verdict.map_or("-", Verdict::name).to_string());
            cells.push(r.parity.map_or("-", |p| p.name()).to_string());
        }
        let _ = writeln!(md, "| {} |", cells.join(" | "));
    }
    if c.rows
        .iter()
        .any(|r| r.baseline.is_some() || r.compare.is_some())
    {
        md.push('\n');
        md.push_str(&repeats_note(c));
    }
    let notes = crossover_notes(c);
    if !notes.is_empty() {
        md.push_str("\n**Crossover** (smallest prompt length from which the compare side is significantly faster, its 95% interval above 1, at every longer length):\n\n");
        for n in notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    if !plots.is_empty() {
        md.push('\n');
        for (title, file) in plots {
            let _ = writeln!(md, "![{title}]({file})\n");
        }
    }
    md
}

fn num(x: f64) -> String {
    if x.is_finite() {
        // `{}` prints the shortest text that reads back as the same f64.
        format!("{x}")
    } else {
        String::new()
    }
}

fn side_fields(s: Option<&Side>) -> Vec<String> {
    match s {
        None => vec![String::new(); 8],
        Some(s) => vec![
            s.ttft_ms.n.to_string(),
            num(s.ttft_ms.median),
            s.ttft_ms_ci.map(|i| num(i.lo)).unwrap_or_default(),
            s.ttft_ms_ci.map(|i| num(i.hi)).unwrap_or_default(),
            num(s.ttft_ms.p10),
            num(s.ttft_ms.p90),
            num(s.prefill_tokens_per_s),
            num(s.decode_tokens_per_s),
        ],
    }
}

/// Every key column (not only those that vary), both sides' statistics at full precision.
pub fn csv(c: &Comparison) -> String {
    let dims: Vec<_> = c
        .rows
        .first()
        .map(|r| r.keys.keys().copied().collect())
        .unwrap_or_default();
    let mut header = vec!["model".to_string(), "prompt_tokens".to_string()];
    header.extend(
        dims.iter()
            .map(|d: &super::select::Dim| d.name().to_string()),
    );
    header.extend(["baseline".into(), "compare".into()]);
    for side in ["baseline", "compare"] {
        for f in [
            "n",
            "ttft_ms_median",
            "ttft_ms_median_ci_lo",
            "ttft_ms_median_ci_hi",
            "ttft_ms_p10",
            "ttft_ms_p90",
            "prefill_tokens_per_s",
            "decode_tokens_per_s",
        ] {
            header.push(format!("{side}_{f}"));
        }
    }
    header.extend([
        "speedup".into(),
        "speedup_ci_lo".into(),
        "speedup_ci_hi".into(),
        "verdict".into(),
        "parity".into(),
    ]);
    // In memory: a write to a Vec cannot fail, and csv quotes what needs quoting.
    let mut out = csv::Writer::from_writer(Vec::new());
    out.write_record(&header).expect("writing to memory");
    for r in &c.rows {
        let mut f = vec![r.model.clone(), r.prompt_tokens.to_string()];
        f.extend(dims.iter().map(|d| r.keys[d].clone()));
        f.push(c.baseline.clone());
        f.push(c.compare.clone().unwrap_or_default());
        f.extend(side_fields(r.baseline.as_ref()));
        f.extend(side_fields(r.compare.as_ref()));
        f.push(r.speedup.map(num).unwrap_or_default());
        f.push(r.speedup_ci.map(|i| num(i.lo)).unwrap_or_default());
        f.push(r.speedup_ci.map(|i| num(i.hi)).unwrap_or_default());
        f.push(r.verdict.map(|v| v.name().to_string()).unwrap_or_default());
        f.push(r.parity.map(|p| p.name().to_string()).unwrap_or_default());
        out.write_record(&f).expect("writing to memory");
    }
    String::from_utf8(out.into_inner().expect("writing to memory")).expect("fields are UTF-8")
}

/// The comparison as one JSON document, with the crossover sentences.
pub fn json(c: &Comparison) -> String {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        #[serde(flatten)]
        comparison: &'a Comparison,
        crossover_notes: Vec<String>,
    }
    let doc = Doc {
        comparison: c,
        crossover_notes: crossover_notes(c),
    };
    serde_json::to_string_pretty(&doc).expect("a comparison always serialises") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_and_escape() {
        assert_eq!(fmt_ms(1234.56), "1235");
        assert_eq!(fmt_ms(12.345), "12.3");
        assert_eq!(fmt_ms(1.2345), "1.23");
        // Below a millisecond: still three significant digits (was 0.78 for 0.784872).
        assert_eq!(fmt_ms(0.784872), "0.785");
        assert_eq!(fmt_ms(0.0123456), "0.0123");
        assert_eq!(fmt_ms(0.0), "0.00");
        assert_eq!(fmt_ms(f64::NAN), "-");
        assert_eq!(num(0.1), "0.1");
    }
}
