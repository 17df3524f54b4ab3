//! The main job end to end (quick variant): every stage passes and the report holds the sweep.

#[test]
fn quick_main_job_passes_and_writes_a_report() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("latest");
    harness::cli::run_words(&["run", "--quick", "--out", out.to_str().unwrap()]).unwrap();
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for stage in [
        "golden check",
        "oracle check",
        "parity",
        "TTFT sweep",
        "report",
        "TTFT sweep LFM2",
        "report LFM2",
    ] {
        let line = summary
            .lines()
            .find(|l| l.contains(stage))
            .unwrap_or_else(|| panic!("no {stage} in {summary}"));
        assert!(line.contains("| ok |"), "{line}");
    }
    // Two paths x two lengths x one repeat, and the report's table names both lengths.
    let rows = harness::sweep::read_jsonl(&out.join("sweep.jsonl")).unwrap();
    assert_eq!(rows.len(), 4);
    // An MLX build adds a CPU-vs-MLX sweep (2 paths x 2 lengths) and its report.
    if engine::Backend::Mlx.is_built() {
        let rows = harness::sweep::read_jsonl(&out.join("sweep-mlx.jsonl")).unwrap();
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().any(|r| r.backend.starts_with("mlx")));
        let cmp = std::fs::read_to_string(out.join("cpu-vs-mlx/report.md")).unwrap();
        assert!(
            cmp.contains("backend=mlx+gdn=chunked") && cmp.contains("| 128 |"),
            "{cmp}"
        );
    }
    // The LFM2 sweep: one line per length and backend.
    let rows = harness::sweep::read_jsonl(&out.join("sweep-lfm2.jsonl")).unwrap();
    let backends = if engine::Backend::Mlx.is_built() {
        2
    } else {
        1
    };
    assert_eq!(rows.len(), 2 * backends);
    assert!(
        rows.iter().all(|r| r.model.starts_with("lfm2:tiny")),
        "{rows:?}"
    );
    assert!(out.join("lfm2/report.md").metadata().unwrap().len() > 0);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("| 64 |") && report.contains("| 128 |"),
        "{report}"
    );
    for f in [
        "ttft.svg",
        "ttft.png",
        "speedup.svg",
        "speedup.png",
        "report.csv",
        "report.json",
    ] {
        assert!(out.join(f).metadata().unwrap().len() > 0, "{f}");
    }
}
