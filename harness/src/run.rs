//! The main job: what an engine team runs before and after an optimisation. Each stage is the
//! same command a user would type (so the job and the CLI cannot drift apart); a failing stage
//! is recorded and the job goes on, then exits non-zero with a summary.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cli::run_words;

/// Run the main job: goldens, oracle conformance, per-step vs chunked parity, a short TTFT
/// sweep and a report (markdown, csv, json, svg/png plots) in --out. Built with
/// `--features mlx`, it also checks the MLX goldens, the oracle and CPU-vs-MLX parity on the
/// MLX backend, and sweeps MLX (chunked) beside the CPU paths.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where the report goes.
    #[arg(long, default_value = "reports/latest")]
    pub out: PathBuf,
    /// The model of the TTFT sweep (a synth spec).
    #[arg(long, default_value = "qwen3_5:bench:bf16")]
    pub sweep_model: String,
    /// Prompt lengths of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    pub lengths: Vec<usize>,
    /// Timed repetitions per length and path; the sweep adds more (see `harness sweep
    /// --help`) where a median is not yet known to ±5%, up to --max-repeats and --time-cap.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// The most repetitions of the TTFT sweep.
    #[arg(long, default_value_t = 12)]
    pub max_repeats: usize,
    /// Seconds of timed repetitions after which the TTFT sweep adds no more.
    #[arg(long, default_value_t = 120.0, value_name = "SECONDS")]
    pub time_cap: f64,
    /// The model of the LFM2 TTFT sweep (a synth spec), its own stage and report (`lfm2/`).
    #[arg(long, default_value = "lfm2:bench:bf16")]
    pub lfm2_model: String,
    /// A fast variant for tests and smoke checks: the sweeps run on qwen3_5:tiny and lfm2:tiny
    /// at 64,128 tokens with one repetition.
    #[arg(long)]
    pub quick: bool,
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs {
            out: PathBuf::from("reports/latest"),
            sweep_model: "qwen3_5:bench:bf16".into(),
            lfm2_model: "lfm2:bench:bf16".into(),
            lengths: vec![64, 256, 1024],
            repeats: 3,
            max_repeats: 12,
            time_cap: 120.0,
            quick: false,
        }
    }
}

struct Stage {
    name: String,
    result: Result<()>,
    secs: f64,
}

/// The `harness parity` arguments comparing the CPU and MLX backends on `spec`.
fn cpu_vs_mlx(spec: &str) -> Vec<&str> {
    vec![
        "parity",
        "--synth",
        spec,
        "--a",
        "backend=cpu",
        "--b",
        "backend=mlx",
    ]
}

impl RunArgs {
    pub fn run(self) -> Result<()> {
        let (model, lfm2_model, lengths, repeats, max_repeats) = if self.quick {
            (
                "qwen3_5:tiny".to_string(),
                "lfm2:tiny".to_string(),
                vec![64, 128],
                1,
                1,
            )
        } else {
            (
                self.sweep_model.clone(),
                self.lfm2_model.clone(),
                self.lengths.clone(),
                self.repeats,
                self.max_repeats.max(self.repeats),
            )
        };
        std::fs::create_dir_all(&self.out)
            .with_context(|| format!("creating {}", self.out.display()))?;
        let out = self.out.to_string_lossy().into_owned();
        let sweep_file = self.out.join("sweep.jsonl");
        // The sweep appends; a fresh job starts a fresh file.
        if sweep_file.exists() {
            std::fs::remove_file(&sweep_file)
                .with_context(|| format!("removing {}", sweep_file.display()))?;
        }
        let sweep = sweep_file.to_string_lossy().into_owned();
        let lengths = lengths
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let repeats = repeats.to_string();
        let max_repeats = max_repeats.to_string();
        let time_cap = self.time_cap.to_string();
        let mlx = engine::Backend::Mlx.is_built();
        let sweep_paths = "gdn=perstep,gdn=chunked";
        // MLX's CPU device multiplies with the wheel's reference BLAS (~2 GFLOP/s): a 1024-token
        // prompt of the bench model takes minutes there, so the CPU-vs-MLX sweep is its own,
        // shorter stage (two lengths, one repetition) in its own file.
        let mlx_sweep = self.out.join("sweep-mlx.jsonl");
        if mlx_sweep.exists() {
            std::fs::remove_file(&mlx_sweep)
                .with_context(|| format!("removing {}", mlx_sweep.display()))?;
        }
        let mlx_sweep = mlx_sweep.to_string_lossy().into_owned();
        let mlx_lengths = if self.quick { "64,128" } else { "64,256" };
        // LFM2 has no alternative CPU path: its sweep times the CPU backend (and MLX beside it
        // when built) over the lengths the MLX sweep uses, in its own file and report.
        let lfm2_sweep = self.out.join("sweep-lfm2.jsonl");
        if lfm2_sweep.exists() {
            std::fs::remove_file(&lfm2_sweep)
                .with_context(|| format!("removing {}", lfm2_sweep.display()))?;
        }
        let lfm2_sweep = lfm2_sweep.to_string_lossy().into_owned();
        let lfm2_out = self.out.join("lfm2").to_string_lossy().into_owned();
        let lfm2_paths = if mlx {
            "backend=cpu,backend=mlx"
        } else {
            "default"
        };
        // The quick job proves each stage runs end to end; every golden and oracle case runs in
        // the test suite already (tests/harness/golden.rs, tests/harness/oracle_synth.rs), so here it checks
        // one format of every family: the tiny q4 folders.
        let checks = |words: &[&'static str]| {
            let mut w = words.to_vec();
            if self.quick {
                w.extend(["--filter", ":tiny:q4:"]);
            }
            w
        };
        let mut plan: Vec<(&str, Vec<&str>)> = vec![
            ("golden check (CPU)", checks(&["golden", "check"])),
            ("oracle check vs mlx-lm", checks(&["oracle", "check"])),
            (
                "parity gdn=perstep vs gdn=chunked (qwen3_5:tiny)",
                vec![
                    "parity",
                    "--synth",
                    "qwen3_5:tiny",
                    "--a",
                    "gdn=perstep",
                    "--b",
                    "gdn=chunked",
                ],
            ),
            (
                "parity gdn=perstep vs gdn=chunked (qwen3_5_moe:tiny)",
                vec![
                    "parity",
                    "--synth",
                    "qwen3_5_moe:tiny",
                    "--a",
                    "gdn=perstep",
                    "--b",
                    "gdn=chunked",
                ],
            ),
            (
                "parity default vs mtp=2 (qwen3_5:tiny:f32:hf)",
                vec![
                    "parity",
                    "--synth",
                    "qwen3_5:tiny:f32:hf",
                    "--a",
                    "default",
                    "--b",
                    "mtp=2",
                ],
            ),
            (
                "parity default vs kv=paged (gemma4:tiny)",
                vec![
                    "parity",
                    "--synth",
                    "gemma4:tiny",
                    "--a",
                    "default",
                    "--b",
                    "kv=paged",
                ],
            ),
            (
                "parity default vs batch=8+kv=paged (qwen3:tiny)",
                vec![
                    "parity",
                    "--synth",
                    "qwen3:tiny",
                    "--a",
                    "default",
                    "--b",
                    "batch=8+kv=paged",
                ],
            ),
            (
                "parity default vs session=reuse (qwen3_5:tiny:f32:hf)",
                vec![
                    "parity",
                    "--synth",
                    "qwen3_5:tiny:f32:hf",
                    "--a",
                    "default",
                    "--b",
                    "session=reuse",
                ],
            ),
            (
                "parity kv=flat vs kv=rotating (gemma4:tiny)",
                vec![
                    "parity",
                    "--synth",
                    "gemma4:tiny",
                    "--a",
                    "kv=flat",
                    "--b",
                    "kv=rotating",
                ],
            ),
        ];
        if mlx {
            plan.extend([
                (
                    "golden check (MLX)",
                    checks(&["golden", "check", "--backend", "mlx"]),
                ),
                (
                    "oracle check vs mlx-lm on MLX",
                    checks(&["oracle", "check", "--backend", "mlx"]),
                ),
                (
                    "parity backend=cpu vs backend=mlx (qwen3_5:tiny)",
                    cpu_vs_mlx("qwen3_5:tiny"),
                ),
                (
                    "parity backend=cpu vs backend=mlx (llama:tiny:q4)",
                    cpu_vs_mlx("llama:tiny:q4"),
                ),
                (
                    "parity backend=cpu vs backend=mlx (minicpm:tiny)",
                    cpu_vs_mlx("minicpm:tiny"),
                ),
                (
                    "parity backend=cpu vs backend=mlx (gemma4:tiny:q8)",
                    cpu_vs_mlx("gemma4:tiny:q8"),
                ),
                (
                    "parity backend=cpu vs backend=mlx (gemma4_moe:tiny:q4)",
                    cpu_vs_mlx("gemma4_moe:tiny:q4"),
                ),
                (
                    "parity backend=cpu vs backend=mlx (lfm2_moe:tiny:q4)",
                    cpu_vs_mlx("lfm2_moe:tiny:q4"),
                ),
                (
                    "parity backend=cpu vs backend=mlx (lfm2:tiny)",
                    vec![
                        "parity",
                        "--synth",
                        "lfm2:tiny",
                        "--a",
                        "backend=cpu",
                        "--b",
                        "backend=mlx",
                    ],
                ),
                (
                    "parity backend=cpu vs backend=mlx (qwen3_5_moe:tiny)",
                    vec![
                        "parity",
                        "--synth",
                        "qwen3_5_moe:tiny",
                        "--a",
                        "backend=cpu",
                        "--b",
                        "backend=mlx",
                    ],
                ),
            ]);
        }
        plan.extend([
            (
                "TTFT sweep",
                vec![
                    "sweep",
                    "--synth",
                    &model,
                    "--lengths",
                    &lengths,
                    "--paths",
                    sweep_paths,
                    "--repeats",
                    &repeats,
                    "--max-repeats",
                    &max_repeats,
                    "--time-cap",
                    &time_cap,
                    "--out",
                    &sweep,
                ],
            ),
            ("report", vec!["report", &sweep, "--out", &out]),
            (
                "TTFT sweep LFM2",
                vec![
                    "sweep",
                    "--synth",
                    &lfm2_model,
                    "--lengths",
                    mlx_lengths,
                    "--paths",
                    lfm2_paths,
                    "--repeats",
                    "1",
                    "--max-repeats",
                    "1",
                    "--out",
                    &lfm2_sweep,
                ],
            ),
            (
                "report LFM2",
                vec!["report", &lfm2_sweep, "--out", &lfm2_out],
            ),
        ]);
        let mlx_out = self.out.join("cpu-vs-mlx").to_string_lossy().into_owned();
        if mlx {
            plan.extend([
                (
                    "TTFT sweep CPU vs MLX (chunked)",
                    vec![
                        "sweep",
                        "--synth",
                        &model,
                        "--lengths",
                        mlx_lengths,
                        "--paths",
                        "gdn=chunked,backend=mlx+gdn=chunked",
                        "--repeats",
                        "1",
                        "--max-repeats",
                        "1",
                        "--warmup",
                        "0",
                        "--out",
                        &mlx_sweep,
                    ],
                ),
                (
                    "report CPU vs MLX (chunked)",
                    vec![
                        "report",
                        &mlx_sweep,
                        "--baseline",
                        "gdn=chunked",
                        "--compare",
                        "backend=mlx+gdn=chunked",
                        "--out",
                        &mlx_out,
                    ],
                ),
            ]);
        }
        let mut stages = Vec::new();
        for (name, words) in plan {
            println!("\n=== {name}: harness {}", words.join(" "));
            let start = Instant::now();
            let result = run_words(&words);
            if let Err(e) = &result {
                println!("!!! {name} failed: {e:#}");
            }
            stages.push(Stage {
                name: name.to_string(),
                result,
                secs: start.elapsed().as_secs_f64(),
            });
        }
        let summary = summary(&stages, &self.out);
        println!("\n{summary}");
        let path = self.out.join("summary.md");
        std::fs::write(&path, &summary).with_context(|| format!("writing {}", path.display()))?;
        let failed = stages.iter().filter(|s| s.result.is_err()).count();
        if failed > 0 {
            bail!(
                "{failed} of {} stages failed (see above and {})",
                stages.len(),
                path.display()
            );
        }
        Ok(())
    }
}

fn summary(stages: &[Stage], out: &std::path::Path) -> String {
    let mut s =
        String::from("# Main job summary\n\n| stage | verdict | seconds |\n|---|---|--:|\n");
    for st in stages {
        let verdict = match &st.result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("FAILED: {}", format!("{e:#}").replace('\n', " ")),
        };
        s.push_str(&format!("| {} | {verdict} | {:.1} |\n", st.name, st.secs));
    }
    s.push_str(&format!(
        "\nMachine: {} ({} cores), commit {}. Report: {}/report.md\n",
        crate::machine::cpu_model(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        crate::machine::commit().unwrap_or_else(|| "unknown".into()),
        out.display()
    ));
    s
}
