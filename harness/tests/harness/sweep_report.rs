//! A small sweep through the CLI → jsonl → `harness report` → tables and plots, checked
//! against the jsonl's own numbers; joins of two files along commits; criterion's format.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use harness::machine::Machine;
use harness::report::{
    compare, criterion::read_criterion, stats, tables, Crossover, Sides, Verdict,
};
use harness::sweep::{read_jsonl, Measurement};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_harness");

fn harness(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("the harness binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Equal within `rel` of the larger magnitude.
fn close(a: f64, b: f64, rel: f64) -> bool {
    approx::relative_eq!(a, b, epsilon = 0.0, max_relative = rel)
}

/// The first number in a table cell such as `12.3 (11.9–12.8)`.
fn leading_number(cell: &str) -> f64 {
    cell.split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("no number in {cell:?}"))
}

#[test]
fn sweep_then_report_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let jsonl = tmp.path().join("sweep.jsonl");
    let out_dir = tmp.path().join("report");
    let (ok, _, err) = harness(&[
        "sweep",
        "--synth",
        "qwen3_5:tiny",
        "--lengths",
        "8,40",
        "--paths",
        "gdn=perstep,gdn=chunked",
        "--repeats",
        "1",
        "--max-repeats",
        "1",
        "--warmup",
        "0",
        "--max-tokens",
        "3",
        "--out",
        jsonl.to_str().unwrap(),
    ]);
    assert!(ok, "sweep failed: {err}");

    // One line per (length, path), paths interleaved inside each length, every field there.
    let lines: Vec<Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let order: Vec<(u64, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["prompt_tokens"].as_u64().unwrap(),
                l["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            (8, "gdn=perstep"),
            (8, "gdn=chunked"),
            (40, "gdn=perstep"),
            (40, "gdn=chunked")
        ]
    );
    for l in &lines {
        assert!(!l["machine"]["cpu"].as_str().unwrap().is_empty(), "{l}");
        assert!(l["machine"]["cores"].as_u64().unwrap() >= 1, "{l}");
        assert_eq!(l["backend"], "cpu");
        assert!(l.get("commit").is_some(), "{l}");
        assert_eq!(l["model"], "qwen3_5:tiny:f32:hf");
        assert_eq!(l["repeat"], 0);
        assert_eq!(l["generated_tokens"], 3);
        let ttft = l["ttft_ms"].as_f64().unwrap();
        assert!(ttft > 0.0);
        let len = l["prompt_tokens"].as_f64().unwrap();
        assert!(
            close(
                l["prefill_tokens_per_s"].as_f64().unwrap(),
                len / (ttft / 1e3),
                1e-6
            ),
            "{l}"
        );
        assert!(l["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
        let hash = l["output_sha256"].as_str().unwrap();
        assert!(
            hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()),
            "{hash}"
        );
    }
    let line = |len: u64, path: &str| {
        lines
            .iter()
            .find(|l| l["prompt_tokens"] == len && l["path"] == path)
            .unwrap()
    };

    let (ok, stdout, err) = harness(&[
        "report",
        jsonl.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(ok, "report failed: {err}");
    assert!(stdout.contains("gdn=perstep TTFT ms"), "{stdout}");
    for f in [
        "report.md",
        "report.csv",
        "report.json",
        "ttft.svg",
        "ttft.png",
        "speedup.svg",
        "speedup.png",
    ] {
        assert!(out_dir.join(f).is_file(), "{f} missing");
    }

    // JSON: medians of one measurement are that measurement; parity from the hashes.
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap())
            .unwrap();
    assert_eq!(doc["baseline"], "gdn=perstep");
    assert_eq!(doc["compare"], "gdn=chunked");
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let len = r["prompt_tokens"].as_u64().unwrap();
        let (b, c) = (line(len, "gdn=perstep"), line(len, "gdn=chunked"));
        let (tb, tc) = (
            b["ttft_ms"].as_f64().unwrap(),
            c["ttft_ms"].as_f64().unwrap(),
        );
        assert!(close(
            r["baseline"]["ttft_ms"]["median"].as_f64().unwrap(),
            tb,
            1e-12
        ));
        assert!(close(
            r["compare"]["ttft_ms"]["median"].as_f64().unwrap(),
            tc,
            1e-12
        ));
        assert!(close(r["speedup"].as_f64().unwrap(), tb / tc, 1e-12));
        let same = b["output_sha256"] == c["output_sha256"];
        assert_eq!(r["parity"], if same { "identical" } else { "differs" });
    }

    // CSV: the same numbers at full precision.
    let mut csv = csv::Reader::from_path(out_dir.join("report.csv")).unwrap();
    let header = csv.headers().unwrap().clone();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name}"))
    };
    for record in csv.records() {
        let fields = record.unwrap();
        assert_eq!(fields.len(), header.len());
        let field = |name: &str| &fields[col(name)];
        let len: u64 = fields[col("prompt_tokens")].parse().unwrap();
        let b: f64 = field("baseline_ttft_ms_median").parse().unwrap();
        let c: f64 = field("compare_ttft_ms_median").parse().unwrap();
        assert!(close(
            b,
            line(len, "gdn=perstep")["ttft_ms"].as_f64().unwrap(),
            1e-12
        ));
        assert!(close(
            c,
            line(len, "gdn=chunked")["ttft_ms"].as_f64().unwrap(),
            1e-12
        ));
    }

    // Markdown: the rounded medians and speedup in the table (three significant digits).
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    for len in [8u64, 40] {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| qwen3_5:tiny:f32:hf | {len} |")))
            .unwrap_or_else(|| panic!("no table row for {len}:\n{md}"));
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let (tb, tc) = (
            line(len, "gdn=perstep")["ttft_ms"].as_f64().unwrap(),
            line(len, "gdn=chunked")["ttft_ms"].as_f64().unwrap(),
        );
        assert!(close(leading_number(cells[2]), tb, 6e-3), "{row} vs {tb}");
        assert!(close(leading_number(cells[3]), tc, 6e-3), "{row} vs {tc}");
        approx::assert_abs_diff_eq!(leading_number(cells[4]), tb / tc, epsilon = 0.0051);
    }
    assert!(md.contains("**Crossover**"), "{md}");
    assert!(md.contains("![TTFT vs prompt length](ttft.svg)"));

    // SVG: the plots name every path in their legend, label their axes, and draw the 1.0 line.
    let svg = std::fs::read_to_string(out_dir.join("ttft.svg")).unwrap();
    for needle in [
        "gdn=perstep",
        "gdn=chunked",
        "prompt tokens (log scale)",
        "TTFT ms",
    ] {
        assert!(svg.contains(needle), "ttft.svg lacks {needle}");
    }
    let svg = std::fs::read_to_string(out_dir.join("speedup.svg")).unwrap();
    assert!(svg.contains("1.0 = same speed"));
    assert!(svg.contains("stroke-dasharray") || svg.matches("<line").count() > 4);

    // PNG: a real image of the laid-out size, in the series' colours (tab10 blue and orange).
    for png_name in ["ttft.png", "speedup.png"] {
        let decoder = png::Decoder::new(std::io::BufReader::new(
            std::fs::File::open(out_dir.join(png_name)).unwrap(),
        ));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        // The plot, then one legend row per three paths.
        assert_eq!((info.width, info.height), (960, 540 + 24 + 12));
        let px: Vec<[u8; 3]> = buf[..info.buffer_size()]
            .chunks(3)
            .map(|c| [c[0], c[1], c[2]])
            .collect();
        assert!(
            px.contains(&[0x1f, 0x77, 0xb4]),
            "{png_name}: no blue series pixels"
        );
        if png_name == "ttft.png" {
            assert!(
                px.contains(&[0xff, 0x7f, 0x0e]),
                "{png_name}: no orange series pixels"
            );
        }
    }
}

#[test]
fn sweep_errors_name_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.jsonl");
    let (ok, _, err) = harness(&[
        "sweep",
        "--synth",
        "qwen3_5:tiny",
        "--lengths",
        "8",
        "--paths",
        "gdn=fast",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("`fast`") && err.contains("perstep"),
        "{err}"
    );
    let (ok, _, err) = harness(&[
        "sweep",
        "--synth",
        "qwen3_5:tiny",
        "--lengths",
        "8,10000000",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("prompt length 10000000") && err.contains("context"),
        "{err}"
    );
    assert!(
        !out.exists() || std::fs::read_to_string(&out).unwrap().is_empty(),
        "nothing is measured before validation"
    );
}

fn row(commit: &str, cpu: &str, len: usize, ttft_ms: f64, hash: &str) -> Measurement {
    Measurement {
        machine: Machine {
            cpu: cpu.into(),
            cores: 8,
        },
        backend: "cpu".into(),
        commit: Some(commit.into()),
        label: None,
        model: "qwen3_5:bench:bf16:hf".into(),
        path: "gdn=chunked".into(),
        prompt_tokens: len,
        repeat: 0,
        prompt_seed: 0,
        max_tokens: 8,
        generated_tokens: 8,
        ttft_ms,
        prefill_tokens_per_s: len as f64 / ttft_ms * 1e3,
        decode_tokens_per_s: 50.0,
        output_sha256: Some(hash.into()),
    }
}

fn write_jsonl(path: &Path, rows: &[Measurement]) {
    let text: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn two_files_from_different_commits_join_on_the_other_keys() {
    // Old commit: 10 ms per 64 tokens. New commit: slower at 64, faster from 128 on, beyond
    // both sides' spread (so the intervals of the speedups exclude 1).
    let old: Vec<Measurement> = [(64, 10.0), (128, 20.0), (256, 40.0)]
        .iter()
        .flat_map(|&(len, t)| [t, t * 1.1, t * 0.9].map(|x| row("aaa1111", "EPYC", len, x, "h1")))
        .collect();
    let new: Vec<Measurement> = [(64, 12.5), (128, 16.0), (256, 20.0)]
        .iter()
        .flat_map(|&(len, t)| {
            [t, t * 1.02, t * 0.98].map(|x| {
                row(
                    "bbb2222",
                    "EPYC",
                    len,
                    x,
                    if len == 256 { "h2" } else { "h1" },
                )
            })
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("old.jsonl"), tmp.path().join("new.jsonl"));
    write_jsonl(&a, &old);
    write_jsonl(&b, &new);
    let out_dir = tmp.path().join("r");
    let (ok, stdout, err) = harness(&[
        "report",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--baseline",
        "commit=aaa",
        "--compare",
        "commit=bbb",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let header = stdout.lines().find(|l| l.starts_with("| model")).unwrap();
    // The path is the same on both sides: a note above the table, not a column.
    assert_eq!(header, "| model | prompt tokens | commit=aaa1111 TTFT ms | commit=bbb2222 TTFT ms | speedup [95% CI] | verdict | parity |");
    assert!(stdout.contains("path: `gdn=chunked`"), "{stdout}");
    let table: BTreeMap<usize, Vec<String>> = stdout
        .lines()
        .filter(|l| l.starts_with("| qwen3_5"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect();
            (cells[1].parse().unwrap(), cells)
        })
        .collect();
    // Medians of (t, 1.1t, 0.9t) are t; p10–p90 interpolate between 0.9t and t, t and 1.1t.
    // The bootstrap medians of three runs are the runs themselves, so the 95% interval of
    // this median is [0.9t, 1.1t]: wider than ±5%, marked.
    assert_eq!(table[&64][2], "10.0 (9.20–10.8) †");
    // The speedup intervals: the extreme ratios of the two sides' runs (each side's bootstrap
    // median takes each of its three values with probability at least 7/27).
    assert_eq!(
        table[&64][4],
        format!("0.80 [{:.2}–{:.2}]", 9.0 / 12.75, 11.0 / 12.25)
    );
    assert_eq!(
        table[&128][4],
        format!("1.25 [{:.2}–{:.2}]", 18.0 / 16.32, 22.0 / 15.68)
    );
    assert_eq!(
        table[&256][4],
        format!("2.00 [{:.2}–{:.2}]", 36.0 / 20.4, 44.0 / 19.6)
    );
    assert_eq!(table[&64][5], "slower");
    assert_eq!(table[&128][5], "faster");
    assert_eq!(table[&64][6], "identical");
    assert_eq!(table[&256][6], "differs");
    assert!(stdout.contains("(marked †)"), "{stdout}");
    assert!(
        stdout.contains("commit=bbb2222 is faster than commit=aaa1111 from 128 prompt tokens up"),
        "{stdout}"
    );

    // Through the library: the same join, and a machine column once machines differ.
    let mut rows = old.clone();
    rows.extend(new.clone());
    let c = compare(
        &rows,
        &Sides {
            baseline: Some("commit=aaa".into()),
            compare: Some("commit=bbb".into()),
        },
    )
    .unwrap();
    assert_eq!(c.groups.len(), 1);
    assert_eq!(c.groups[0].crossover, Some(Crossover::From(128)));
    rows.extend(old.iter().map(|r| Measurement {
        machine: Machine {
            cpu: "Apple M3".into(),
            cores: 8,
        },
        ..r.clone()
    }));
    rows.extend(new.iter().map(|r| Measurement {
        machine: Machine {
            cpu: "Apple M3".into(),
            cores: 8,
        },
        ttft_ms: r.ttft_ms * 4.0,
        ..r.clone()
    }));
    let c = compare(
        &rows,
        &Sides {
            baseline: Some("commit=aaa".into()),
            compare: Some("commit=bbb".into()),
        },
    )
    .unwrap();
    let md = tables::markdown(&c, &[]);
    assert!(
        md.contains("| model | prompt tokens | machine | commit=aaa1111 TTFT ms"),
        "{md}"
    );
    let crossovers: Vec<_> = c
        .groups
        .iter()
        .map(|g| (g.name.clone(), g.crossover))
        .collect();
    assert!(
        crossovers.contains(&("machine=Apple M3 (8 cores)".into(), Some(Crossover::Never))),
        "{crossovers:?}"
    );
    assert!(
        crossovers.contains(&("machine=EPYC (8 cores)".into(), Some(Crossover::From(128)))),
        "{crossovers:?}"
    );

    // Selectors that match nothing or too much are errors naming what exists.
    let e = compare(
        &rows,
        &Sides {
            baseline: Some("commit=ccc".into()),
            compare: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("no measurements with commit `ccc`") && e.contains("aaa1111"),
        "{e}"
    );
    let e = compare(
        &rows,
        &Sides {
            baseline: Some("machine=8 cores".into()),
            compare: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("ambiguous"), "{e}");
}

#[test]
fn criterion_samples_become_measurements() {
    let tmp = tempfile::tempdir().unwrap();
    let bench = |path: &str, len: usize, times: &[f64]| {
        let dir = tmp
            .path()
            .join("ttft_qwen3_5_bench")
            .join(path.replace('=', "_"))
            .join(len.to_string())
            .join("new");
        std::fs::create_dir_all(&dir).unwrap();
        let b = serde_json::json!({"group_id": "ttft/qwen3_5:bench:bf16:hf", "function_id": path, "value_str": len.to_string(),
            "throughput": {"Elements": len}, "full_id": "x", "directory_name": "x", "title": "x"});
        std::fs::write(dir.join("benchmark.json"), b.to_string()).unwrap();
        let s = serde_json::json!({"sampling_mode": "Flat", "iters": vec![2.0; times.len()], "times": times});
        std::fs::write(dir.join("sample.json"), s.to_string()).unwrap();
    };
    // 2 iterations per sample: per-request times are 5, 6, 7 ms and 2, 2, 2 ms.
    bench("gdn=perstep", 64, &[10e6, 12e6, 14e6]);
    bench("gdn=chunked", 64, &[4e6, 4e6, 4e6]);
    // A `base` folder (an older run) is ignored.
    let base = tmp.path().join("ttft_qwen3_5_bench/old/64/base");
    std::fs::create_dir_all(&base).unwrap();
    std::fs::write(base.join("benchmark.json"), "not json").unwrap();

    let rows = read_criterion(tmp.path()).unwrap();
    assert_eq!(rows.len(), 6);
    let c = compare(
        &rows,
        &Sides {
            baseline: Some("gdn=perstep".into()),
            compare: Some("gdn=chunked".into()),
        },
    )
    .unwrap();
    let r = &c.rows[0];
    assert_eq!(r.prompt_tokens, 64);
    assert_eq!(r.baseline.as_ref().unwrap().ttft_ms.median, 6.0);
    assert_eq!(r.compare.as_ref().unwrap().ttft_ms.median, 2.0);
    assert_eq!(r.speedup, Some(3.0));
    assert_eq!(r.parity.map(|p| p.name()), Some("unknown"));
    assert!(read_criterion(&tmp.path().join("missing")).is_err());
}

/// A CPU path against an MLX path (`backend=mlx+…`): the rows' backend column differs with the
/// path, and they still meet in one table row per length with a speedup.
#[test]
fn a_cpu_path_and_an_mlx_path_join_per_length() {
    let mut rows = Vec::new();
    for (len, cpu_ms, mlx_ms) in [(64, 600.0, 1200.0), (256, 1800.0, 3600.0)] {
        rows.push(row("aaa1111", "EPYC", len, cpu_ms, "h1"));
        rows.push(Measurement {
            backend: "mlx-cpu".into(),
            path: "backend=mlx+gdn=chunked".into(),
            ..row("aaa1111", "EPYC", len, mlx_ms, "h1")
        });
    }
    let c = compare(
        &rows,
        &Sides {
            baseline: Some("gdn=chunked".into()),
            compare: Some("backend=mlx+gdn=chunked".into()),
        },
    )
    .unwrap();
    assert_eq!(c.groups.len(), 1, "{:?}", c.groups);
    let md = tables::markdown(&c, &[]);
    let speedups: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| qwen3_5"))
        .map(|l| l.trim_matches('|').split('|').nth(4).unwrap().trim())
        .collect();
    assert_eq!(speedups, ["0.50", "0.50"], "{md}");
}

/// The main job's old claim, "chunked is faster from 1024 tokens, 1.30x", came from medians
/// whose p10-p90 ranges overlapped almost entirely. With intervals, such a speedup is "no
/// difference detected" and names no crossover, while the same medians with tight runs do.
#[test]
fn a_speedup_inside_the_noise_claims_no_crossover() {
    let rows_with = |spread: f64| -> Vec<Measurement> {
        let mut rows = Vec::new();
        for (len, base) in [(256, 100.0), (1024, 400.0)] {
            // Baseline 1.3x slower in median; the runs of both sides spread by `spread`.
            for k in [-2.0, -1.0, 0.0, 1.0, 2.0] {
                rows.push(Measurement {
                    path: "gdn=perstep".into(),
                    ..row(
                        "aaa1111",
                        "EPYC",
                        len,
                        1.3 * base * (1.0 + spread * k),
                        "h1",
                    )
                });
                rows.push(row("aaa1111", "EPYC", len, base * (1.0 - spread * k), "h1"));
            }
        }
        rows
    };
    let sides = Sides {
        baseline: Some("gdn=perstep".into()),
        compare: Some("gdn=chunked".into()),
    };
    let noisy = compare(&rows_with(0.2), &sides).unwrap();
    for r in &noisy.rows {
        approx::assert_relative_eq!(r.speedup.unwrap(), 1.3, max_relative = 1e-12);
        let ci = r.speedup_ci.unwrap();
        assert!(ci.lo < 1.0 && ci.hi > 1.3, "{ci:?}");
        assert_eq!(r.verdict, Some(Verdict::NoDifference));
    }
    assert_eq!(noisy.groups[0].crossover, Some(Crossover::Never));
    let md = tables::markdown(&noisy, &[]);
    assert!(md.contains("no difference detected"), "{md}");
    assert!(!md.contains("from 1024 prompt tokens up"), "{md}");

    let tight = compare(&rows_with(0.01), &sides).unwrap();
    for r in &tight.rows {
        let ci = r.speedup_ci.unwrap();
        assert!(ci.lo > 1.2 && ci.hi < 1.4, "{ci:?}");
        assert_eq!(r.verdict, Some(Verdict::Faster));
    }
    assert_eq!(tight.groups[0].crossover, Some(Crossover::Everywhere(256)));
    assert!(tables::markdown(&tight, &[]).contains("narrow enough"));
}

/// Past --repeats, a sweep repeats only while some median is wider than ±5%, and never past
/// --max-repeats; it says which ended it.
#[test]
fn sweep_repeats_adapt_up_to_the_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let jsonl = tmp.path().join("sweep.jsonl");
    let (ok, _, err) = harness(&[
        "sweep",
        "--synth",
        "qwen3_5:tiny",
        "--lengths",
        "8,24",
        "--paths",
        "gdn=perstep,gdn=chunked",
        "--repeats",
        "3",
        "--max-repeats",
        "5",
        "--warmup",
        "0",
        "--max-tokens",
        "2",
        "--out",
        jsonl.to_str().unwrap(),
    ]);
    assert!(ok, "sweep failed: {err}");
    let rows = read_jsonl(&jsonl).unwrap();
    let mut counts: BTreeMap<(usize, String), usize> = BTreeMap::new();
    for r in &rows {
        *counts.entry((r.prompt_tokens, r.path.clone())).or_default() += 1;
    }
    assert_eq!(counts.len(), 4);
    for ((len, _), n) in &counts {
        assert!((3..=5).contains(n), "{counts:?}");
        // The paths of one length repeat together.
        assert_eq!(
            counts[&(*len, "gdn=perstep".to_string())],
            counts[&(*len, "gdn=chunked".to_string())]
        );
    }
    // A length got a repetition past the third only while one of its paths' medians (over
    // the runs so far) was wider than ±5%; and the stop message matches the runs.
    let wide = |len: usize, path: &str, k: usize| {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|r| r.prompt_tokens == len && r.path == path && r.repeat < k)
            .map(|r| r.ttft_ms)
            .collect();
        let ci = stats::median_interval(&v).unwrap();
        ci.relative_half_width(stats::Summary::of(&mut v).median) > stats::TARGET_HALF_WIDTH
    };
    for len in [8, 24] {
        let n = counts[&(len, "gdn=perstep".to_string())];
        for k in 3..n {
            assert!(
                wide(len, "gdn=perstep", k) || wide(len, "gdn=chunked", k),
                "{len}: {k}"
            );
        }
        if err.contains("every median TTFT is known to ±5%") {
            assert!(
                !wide(len, "gdn=perstep", n) && !wide(len, "gdn=chunked", n),
                "{err}"
            );
        }
    }
    if !err.contains("every median TTFT is known to ±5%") {
        assert!(err.contains("stopped at --max-repeats 5"), "{err}");
        assert!(counts.values().any(|n| *n == 5), "{counts:?}");
    }
}

#[test]
fn extreme_or_non_positive_timings_are_refused_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    for (ttft, len, needle) in [
        (0.0, 64, "`ttft_ms` = 0"),
        (-3.0, 64, "`ttft_ms` = -3"),
        (1e300, 64, "`ttft_ms` = 1"),
        (5.0, 0, "`prompt_tokens` = 0"),
    ] {
        let path = tmp.path().join("bad.jsonl");
        let mut rows = vec![row("abc1234", "EPYC", 64, 10.0, "h")];
        let mut bad = row("abc1234", "EPYC", len, ttft, "h");
        bad.path = "gdn=perstep".into();
        // (len / 0 would be written as null, failing on the parse instead of the check)
        bad.prefill_tokens_per_s = 1.0;
        rows.push(bad);
        write_jsonl(&path, &rows);
        let out = tmp.path().join("report");
        let (ok, _, err) = harness(&[
            "report",
            path.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!ok, "{ttft} ms accepted");
        assert!(err.contains("bad.jsonl:2") && err.contains(needle), "{err}");
    }
    // Valid but far apart (1 µs and 11 days): reported, with bounded axes.
    let path = tmp.path().join("wide.jsonl");
    let mut rows = vec![
        row("abc1234", "EPYC", 64, 1e-3, "h"),
        row("abc1234", "EPYC", 4096, 1e9, "h"),
    ];
    rows[1].path = "gdn=perstep".into();
    write_jsonl(&path, &rows);
    let out = tmp.path().join("wide");
    let (ok, _, err) = harness(&[
        "report",
        path.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.join("ttft.png").is_file());
}
