//! `--backend mlx` end to end: checkpoints written by mlx-lm itself (qwen3 and qwen3_5 tiny
//! fixtures), loaded once for the CPU and once with every weight moved to MLX, must give the
//! same greedy tokens (≥ 16) and last-position logits within the attention/GDN NMSE (5e-4).
//! Without the feature, `--backend mlx` must refuse with a message that says how to rebuild.

#[cfg(not(feature = "mlx"))]
#[test]
fn backend_mlx_without_the_feature_says_how_to_rebuild() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mlx-written/qwen3-bf16");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args(["--prompt-ids", "1,2", "--backend", "mlx"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--features mlx"), "{err}");
}

#[cfg(feature = "mlx")]
mod on_mlx {
    use std::path::PathBuf;

    use engine::cache::{LayerState, ModelState};
    use engine::generate::{self, GenerateRequest, SamplingParams};
    use engine::layers::GdnPath;
    use engine::models::{self, CausalLm};
    use kernels::Device;

    const TOKENS: usize = 20;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mlx-written")
            .join(name)
    }

    /// A fixed prompt of `n` ids below the fixtures' vocabulary of 512.
    fn prompt(n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| (i * 197 + 31) % 509).collect()
    }

    fn greedy(m: &dyn CausalLm, ids: &[u32], step: Option<usize>) -> Vec<u32> {
        let req = GenerateRequest {
            prompt_ids: ids.to_vec(),
            max_tokens: TOKENS,
            sampling: SamplingParams::greedy(),
            stop_ids: vec![],
            top_logprobs: 0,
            prefill_step: step,
            gdn_path: GdnPath::Auto,
            flat_kv: false,
            mtp: None,
            paged_kv: None,
            kernels: Default::default(),
        };
        generate::generate(m, &req, |_| {}).unwrap().tokens
    }

    fn nmse(reference: &[f32], got: &[f32]) -> f64 {
        assert_eq!(reference.len(), got.len());
        let mut num = 0.0f64;
        let mut den = 0.0f64;
        for (&a, &b) in reference.iter().zip(got) {
            assert!(a.is_finite() && b.is_finite(), "non-finite logit");
            num += (a as f64 - b as f64).powi(2);
            den += (a as f64).powi(2);
        }
        num / den.max(f64::MIN_POSITIVE)
    }

    /// Whether the state's caches were written by MLX ops (so the forward really ran there).
    fn state_on_mlx(s: &ModelState) -> bool {
        s.layers.iter().all(|l| match l {
            LayerState::Kv(c) => c.k.device() == Device::Mlx && c.v.device() == Device::Mlx,
            LayerState::Recurrent(r) => {
                r.ssm.device() == Device::Mlx && r.conv.device() == Device::Mlx
            }
            LayerState::Conv(c) => c.device() == Device::Mlx,
        })
    }

    fn check_folder(name: &str) {
        let dir = fixture(name);
        let cpu = models::load(&dir).unwrap();
        let mut mlx = models::load(&dir).unwrap();
        mlx.to_device(Device::Mlx).unwrap();

        // One prefill forward: logits close, and the state lives on MLX afterwards.
        let ids = prompt(70);
        let (mut sc, mut sm) = (cpu.new_state(), mlx.new_state());
        let lc = cpu.forward(&ids, &mut sc, false).unwrap();
        let lm = mlx.forward(&ids, &mut sm, false).unwrap();
        assert_eq!(
            lm.device(),
            Device::Cpu,
            "{name}: logits come back to the host"
        );
        let e = nmse(&lc.to_vec_f32().unwrap(), &lm.to_vec_f32().unwrap());
        assert!(e <= 5e-4, "{name}: prefill logits NMSE {e:e}");
        assert!(state_on_mlx(&sm), "{name}: the forward did not run on MLX");

        // Greedy decoding, whole-prompt prefill and prefill in pieces.
        for step in [None, Some(16)] {
            let want = greedy(cpu.as_ref(), &ids, step);
            let got = greedy(mlx.as_ref(), &ids, step);
            assert_eq!(want.len(), TOKENS, "{name}");
            assert_eq!(got, want, "{name}: greedy tokens, prefill step {step:?}");
        }
    }

    /// Every weight format the fixtures hold: float, MLX affine, and the fp formats.
    const FORMATS: [&str; 7] = ["f32", "bf16", "q4", "q8", "mxfp4", "nvfp4", "mxfp8"];

    #[test]
    fn qwen3_mlx_written_folders_match_the_cpu_backend() {
        for f in FORMATS {
            check_folder(&format!("qwen3-{f}"));
        }
    }

    #[test]
    fn qwen3_5_mlx_written_folders_match_the_cpu_backend() {
        for f in FORMATS {
            check_folder(&format!("qwen3_5-{f}"));
        }
    }

    /// LFM2's short conv (with and without biases) and attention blocks on MLX.
    #[test]
    fn lfm2_mlx_written_folders_match_the_cpu_backend() {
        for f in FORMATS {
            check_folder(&format!("lfm2-{f}"));
        }
    }
}
