//! Path parity: verdict boundaries, a path against itself, and per-step vs chunked Gated
//! DeltaNet on a tiny Qwen3.5.

use engine::Pipeline;
use harness::backends::Loaded;
use harness::parity::{builtin_prompts, classify, run, Verdict, EARLY_DIVERGE_TOKENS};
use harness::paths::parse_path;
use synth::cached as synth_cached;
use synth::SynthSpec;

/// `n` tokens of agreement, then one different token, then more.
fn diverging_at(n: usize) -> (Vec<u32>, Vec<u32>) {
    let a: Vec<u32> = (0..32).collect();
    let mut b = a.clone();
    b[n] = 1000;
    (a, b)
}

#[test]
fn verdict_boundaries() {
    assert_eq!(EARLY_DIVERGE_TOKENS, 16);
    let same: Vec<u32> = (0..32).collect();
    assert_eq!(classify(&same, &same), Verdict::Identical);
    assert_eq!(classify(&[], &[]), Verdict::Identical);
    let (a, b) = diverging_at(0);
    assert_eq!(classify(&a, &b), Verdict::EarlyDiverge(0));
    let (a, b) = diverging_at(15);
    assert_eq!(classify(&a, &b), Verdict::EarlyDiverge(15));
    assert_eq!(classify(&a, &b).to_string(), "EARLY-DIVERGE@15");
    let (a, b) = diverging_at(16);
    assert_eq!(classify(&a, &b), Verdict::LateDrift(16));
    assert_eq!(classify(&a, &b).to_string(), "late-drift@16");
    let (a, b) = diverging_at(31);
    assert_eq!(classify(&a, &b), Verdict::LateDrift(31));
    // One side stopping early counts as a difference where it stopped.
    assert_eq!(classify(&same[..10], &same), Verdict::EarlyDiverge(10));
    assert_eq!(classify(&same, &same[..20]), Verdict::LateDrift(20));
}

fn pipeline(spec: &str) -> Loaded {
    Loaded::from_cpu(
        Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap(),
    )
}

#[test]
fn a_path_against_itself_is_identical_with_zero_nmse() {
    let p = pipeline("qwen3:tiny");
    let prompts = builtin_prompts(p.first().unwrap(), 6).unwrap();
    assert!(prompts.iter().any(|p| p.len() > 64));
    let d = parse_path("default").unwrap();
    let report = run(&p, "qwen3:tiny", &prompts, d, d, 20, |_| {}).unwrap();
    assert_eq!(report.results.len(), 6);
    for r in &report.results {
        assert_eq!(r.verdict, Verdict::Identical, "prompt {}", r.index);
        assert_eq!(r.logits_nmse, 0.0, "prompt {}", r.index);
        assert_eq!(r.tokens_a.len(), 20);
    }
    assert!(report.passed());
}

/// Forced MTP drafts (the `drafts` path key): full and zero acceptance give plain decoding's
/// tokens and logits, bit for bit, on the hybrid with its MTP head.
#[test]
fn forced_mtp_drafts_equal_plain_decoding() {
    let spec = "qwen3_5:tiny:f32:hf";
    let p = pipeline(spec);
    let prompts = builtin_prompts(p.first().unwrap(), 3).unwrap();
    let plain = parse_path("default").unwrap();
    for b in ["mtp=2+drafts=correct", "mtp=3+drafts=wrong"] {
        let b = parse_path(b).unwrap();
        let report = run(&p, spec, &prompts, plain, b, 16, |_| {}).unwrap();
        for r in &report.results {
            assert_eq!(r.verdict, Verdict::Identical, "{b}, prompt {}", r.index);
        }
    }
    // The drafts really are forced: every one kept, or none.
    let direct = Pipeline::load(&synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap()).unwrap();
    for (b, all) in [
        ("mtp=2+drafts=correct", true),
        ("mtp=2+drafts=wrong", false),
    ] {
        let b = parse_path(b).unwrap();
        let mut opts = engine::RequestOptions {
            max_tokens: Some(16),
            temperature: Some(0.0),
            ignore_eos: true,
            ..Default::default()
        };
        b.apply(&mut opts);
        let req = direct.request(prompts[0].clone(), &opts);
        let m = b
            .generate(direct.model.as_ref(), &req)
            .unwrap()
            .mtp
            .unwrap();
        let want = if all { m.drafted } else { 0 };
        assert!(m.drafted > 0 && m.accepted == want, "{b}: {m:?}");
    }
}

#[test]
fn perstep_and_chunked_gdn_do_not_diverge_early() {
    perstep_vs_chunked("qwen3_5:tiny");
}

#[test]
fn perstep_and_chunked_gdn_do_not_diverge_early_with_moe() {
    perstep_vs_chunked("qwen3_5_moe:tiny");
}

fn perstep_vs_chunked(spec: &str) {
    let p = pipeline(spec);
    let prompts = builtin_prompts(p.first().unwrap(), 8).unwrap();
    assert!(
        prompts.iter().any(|p| p.len() > 128),
        "some prompt spans several chunks"
    );
    let a = parse_path("gdn=perstep").unwrap();
    let b = parse_path("gdn=chunked").unwrap();
    let report = run(&p, spec, &prompts, a, b, 24, |r| {
        eprintln!(
            "prompt {} ({} tokens): {} NMSE {:.3e}",
            r.index, r.prompt_tokens, r.verdict, r.logits_nmse
        )
    })
    .unwrap();
    for r in &report.results {
        assert!(!r.verdict.is_early(), "prompt {}: {}", r.index, r.verdict);
        // The design's tolerance for GDN against its reference.
        assert!(
            r.logits_nmse <= 5e-4,
            "prompt {}: logits NMSE {}",
            r.index,
            r.logits_nmse
        );
    }
    // The two paths really are different code: their float rounding differs somewhere.
    assert!(
        report.results.iter().any(|r| r.logits_nmse > 0.0),
        "per-step and chunked gave bit-identical logits on every prompt: is the path applied?"
    );
}

/// The CPU backend against another backend, per synthetic family and format: no early
/// divergence, last-position logits within the design's NMSE for the family (5e-4), and the
/// other side really ran there (its logits differ in rounding somewhere).
#[cfg(any(feature = "mlx", feature = "cuda"))]
mod cpu_vs_backend {
    use super::*;
    use engine::Backend;

    /// The formats each device backend is checked in: every format of tiny Qwen3, and a dense
    /// and two quantized ones of tiny Qwen3.5 (on both GDN paths).
    pub const QWEN3_FORMATS: [&str; 7] = [
        "f32:hf",
        "bf16:hf",
        "q4:mlx",
        "q8:mlx",
        "mxfp4:mlx",
        "nvfp4:mlx",
        "mxfp8:mlx",
    ];
    pub const QWEN3_5_FORMATS: [&str; 4] = ["f32:hf", "bf16:mlx", "q4:mlx", "nvfp4:mlx"];
    /// The attention-only families after Qwen3 (biases, scaled and proportional RoPE given as
    /// explicit frequencies, sliding layers, μP scales, Gemma 4's KV sharing, per-layer inputs
    /// and soft cap): a dense and two quantized formats each.
    pub const LLAMA_FAMILIES: [&str; 6] = [
        "qwen2",
        "llama",
        "minicpm",
        "gemma3",
        "gemma4",
        "gemma4_moe",
    ];
    pub const LLAMA_FORMATS: [&str; 4] = ["f32:hf", "bf16:mlx", "q4:mlx", "mxfp4:mlx"];
    /// Tiny LFM2 in every format (both layouts of the float ones).
    pub const LFM2_FORMATS: [&str; 9] = [
        "f32:hf",
        "f32:mlx",
        "bf16:hf",
        "bf16:mlx",
        "q4:mlx",
        "q8:mlx",
        "mxfp4:mlx",
        "nvfp4:mlx",
        "mxfp8:mlx",
    ];

    pub fn cpu_vs(backend: Backend, spec: &str, gdn: &str) {
        backend.activate().unwrap();
        let dir = synth_cached(&SynthSpec::parse(spec).unwrap()).unwrap();
        let a = parse_path(&format!("backend=cpu+{gdn}")).unwrap();
        let b = parse_path(&format!("backend={backend}+{gdn}")).unwrap();
        let models = Loaded::for_paths(&dir, &[a, b]).unwrap();
        let prompts = builtin_prompts(models.first().unwrap(), 5).unwrap();
        let report = run(&models, spec, &prompts, a, b, 20, |r| {
            eprintln!(
                "{spec} {gdn} prompt {} ({} tokens): {} NMSE {:.3e}",
                r.index, r.prompt_tokens, r.verdict, r.logits_nmse
            )
        })
        .unwrap();
        for r in &report.results {
            assert!(
                !r.verdict.is_early(),
                "{spec} prompt {}: {}",
                r.index,
                r.verdict
            );
            assert!(
                r.logits_nmse <= 5e-4,
                "{spec} prompt {}: logits NMSE {}",
                r.index,
                r.logits_nmse
            );
        }
        assert!(
            report.results.iter().any(|r| r.logits_nmse > 0.0),
            "{spec}: CPU and {backend} bit-identical everywhere: did that side run on {backend}?"
        );
    }
}

/// The CPU backend against the MLX backend (MLX's CPU device here).
#[cfg(feature = "mlx")]
mod cpu_vs_mlx {
    use super::cpu_vs_backend::{
        cpu_vs, LFM2_FORMATS, LLAMA_FAMILIES, LLAMA_FORMATS, QWEN3_5_FORMATS, QWEN3_FORMATS,
    };
    use engine::Backend;

    fn cpu_vs_mlx(spec: &str, gdn: &str) {
        cpu_vs(Backend::Mlx, spec, gdn)
    }

    #[test]
    fn qwen3_cpu_and_mlx_agree_in_every_format() {
        for f in QWEN3_FORMATS {
            cpu_vs_mlx(&format!("qwen3:tiny:{f}"), "gdn=auto");
        }
    }

    #[test]
    fn qwen3_5_cpu_and_mlx_agree_on_both_gdn_paths() {
        for f in QWEN3_5_FORMATS {
            for gdn in ["gdn=perstep", "gdn=chunked"] {
                cpu_vs_mlx(&format!("qwen3_5:tiny:{f}"), gdn);
            }
        }
    }

    #[test]
    fn attention_families_cpu_and_mlx_agree() {
        for family in LLAMA_FAMILIES {
            for f in LLAMA_FORMATS {
                cpu_vs_mlx(&format!("{family}:tiny:{f}"), "gdn=auto");
            }
        }
    }

    #[test]
    fn lfm2_cpu_and_mlx_agree_in_every_format() {
        for f in LFM2_FORMATS {
            cpu_vs_mlx(&format!("lfm2:tiny:{f}"), "gdn=auto");
        }
    }

    /// LFM2-MoE: the sigmoid router with its selection bias, then MLX's gathered matmuls, in
    /// both layouts (per-expert originals stacked at load) and two quantized formats.
    #[test]
    fn lfm2_moe_cpu_and_mlx_agree() {
        for f in LLAMA_FORMATS {
            cpu_vs_mlx(&format!("lfm2_moe:tiny:{f}"), "gdn=auto");
        }
    }

    /// MoE: MLX's gather_mm / gather_qmm against the CPU's grouped matmuls.
    #[test]
    fn qwen3_5_moe_cpu_and_mlx_agree_on_both_gdn_paths() {
        for f in QWEN3_5_FORMATS {
            for gdn in ["gdn=perstep", "gdn=chunked"] {
                cpu_vs_mlx(&format!("qwen3_5_moe:tiny:{f}"), gdn);
            }
        }
    }
}

/// The same on the Metal GPU (macOS only; the macOS CI job runs it).
#[cfg(feature = "metal")]
mod cpu_vs_metal {
    use super::cpu_vs_backend::cpu_vs;
    use engine::Backend;

    #[test]
    fn qwen3_and_qwen3_5_cpu_and_metal_agree() {
        for f in ["bf16:hf", "q4:mlx", "mxfp4:mlx"] {
            cpu_vs(Backend::Metal, &format!("qwen3:tiny:{f}"), "gdn=auto");
            for gdn in ["gdn=perstep", "gdn=chunked"] {
                cpu_vs(Backend::Metal, &format!("qwen3_5:tiny:{f}"), gdn);
            }
            for family in [
                "lfm2",
                "lfm2_moe",
                "qwen2",
                "gemma3",
                "llama",
                "minicpm",
                "gemma4",
                "gemma4_moe",
            ] {
                cpu_vs(Backend::Metal, &format!("{family}:tiny:{f}"), "gdn=auto");
            }
        }
    }
}

/// The same on the native CUDA backend: every weight format of tiny Qwen3, and tiny Qwen3.5 on
/// both GDN paths. Without a usable GPU it says why and passes (`ci/gpu-check.sh` sets
/// `CUDA_CONFORMANCE_REQUIRED=1`, which makes that a failure).
#[cfg(feature = "cuda")]
mod cpu_vs_cuda {
    use super::cpu_vs_backend::{
        cpu_vs, LFM2_FORMATS, LLAMA_FAMILIES, LLAMA_FORMATS, QWEN3_5_FORMATS, QWEN3_FORMATS,
    };
    use engine::Backend;

    fn gpu_here() -> bool {
        match kernels::cuda::probe() {
            Ok(_) => true,
            Err(why) => {
                assert!(
                    std::env::var("CUDA_CONFORMANCE_REQUIRED").as_deref() != Ok("1"),
                    "no GPU: {why}"
                );
                eprintln!("SKIPPED: CPU vs CUDA parity: {why}");
                false
            }
        }
    }

    #[test]
    fn qwen3_and_qwen3_5_cpu_and_cuda_agree() {
        if !gpu_here() {
            return;
        }
        for f in QWEN3_FORMATS {
            cpu_vs(Backend::Cuda, &format!("qwen3:tiny:{f}"), "gdn=auto");
        }
        for f in QWEN3_5_FORMATS {
            for gdn in ["gdn=perstep", "gdn=chunked"] {
                cpu_vs(Backend::Cuda, &format!("qwen3_5:tiny:{f}"), gdn);
            }
        }
        for family in LLAMA_FAMILIES {
            for f in LLAMA_FORMATS {
                cpu_vs(Backend::Cuda, &format!("{family}:tiny:{f}"), "gdn=auto");
            }
        }
    }

    #[test]
    fn lfm2_cpu_and_cuda_agree() {
        if !gpu_here() {
            return;
        }
        for f in LFM2_FORMATS {
            cpu_vs(Backend::Cuda, &format!("lfm2:tiny:{f}"), "gdn=auto");
        }
        for f in LLAMA_FORMATS {
            cpu_vs(Backend::Cuda, &format!("lfm2_moe:tiny:{f}"), "gdn=auto");
        }
    }
}
