//! Sampling: the seeded draw follows the filtered softmax (checked against frequencies computed
//! from an f64 reference), filters behave at their limits, and request values win over
//! generation_config.json, which wins over the built-in defaults.

use std::path::{Path, PathBuf};

use engine::generate::{Sampler, SamplingParams};
use engine::{Pipeline, RequestOptions};
use kernels::Tensor;

fn logits(v: &[f32]) -> Tensor {
    Tensor::from_f32(&[1, v.len()], v.to_vec()).unwrap()
}

fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
    }
}

/// Reference probabilities: softmax(l/T) over the top-k, renormalised over the smallest
/// prefix reaching top-p, in f64.
fn reference(l: &[f32], t: f64, k: usize, p: f64) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(if k == 0 { l.len() } else { k });
    let m = l[idx[0]] as f64;
    let w: Vec<f64> = idx.iter().map(|&i| ((l[i] as f64 - m) / t).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut keep = idx.len();
    let mut acc = 0.0;
    for (j, x) in w.iter().enumerate() {
        acc += x / z;
        if acc >= p {
            keep = j + 1;
            break;
        }
    }
    let z2: f64 = w[..keep].iter().sum();
    let mut probs = vec![0.0; l.len()];
    for j in 0..keep {
        probs[idx[j]] = w[j] / z2;
    }
    probs
}

fn frequencies(l: &[f32], p: SamplingParams, n: usize) -> Vec<f64> {
    let mut s = Sampler::new(p);
    let t = logits(l);
    let mut counts = vec![0usize; l.len()];
    for _ in 0..n {
        counts[s.sample(&t).unwrap() as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

const L: [f32; 6] = [2.0, 1.5, 0.3, -1.0, 1.9, 0.0];

#[test]
fn draws_follow_the_filtered_softmax() {
    let n = 40_000;
    for (t, k, p) in [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (1.0, 4, 0.6)] {
        let got = frequencies(&L, params(t, k, p, 11), n);
        let want = reference(&L, t as f64, k, p as f64);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Four standard deviations of a binomial frequency.
            let tol = 4.0 * (w * (1.0 - w) / n as f64).sqrt() + 1e-9;
            assert!(
                approx::abs_diff_eq!(*g, *w, epsilon = tol),
                "T={t} k={k} p={p} token {i}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn limits_and_seeds() {
    let greedy = 0; // argmax of L
    for p in [
        params(0.0, 0, 1.0, 1),
        params(1.0, 1, 1.0, 2),
        params(1.0, 0, 1e-6, 3),
    ] {
        assert!(frequencies(&L, p, 200)
            .iter()
            .enumerate()
            .all(|(i, &f)| (i == greedy) == (f == 1.0)));
    }
    let a: Vec<u32> = {
        let mut s = Sampler::new(params(1.0, 0, 1.0, 7));
        (0..50).map(|_| s.sample(&logits(&L)).unwrap()).collect()
    };
    let b: Vec<u32> = {
        let mut s = Sampler::new(params(1.0, 0, 1.0, 7));
        (0..50).map(|_| s.sample(&logits(&L)).unwrap()).collect()
    };
    let c: Vec<u32> = {
        let mut s = Sampler::new(params(1.0, 0, 1.0, 8));
        (0..50).map(|_| s.sample(&logits(&L)).unwrap()).collect()
    };
    assert_eq!(a, b, "same seed, same draws");
    assert_ne!(a, c, "another seed, other draws");
    assert!(params(-1.0, 0, 1.0, 0).validate().is_err());
    assert!(params(1.0, 0, 0.0, 0).validate().is_err());
    assert!(params(f32::NAN, 0, 1.0, 0).validate().is_err());
}

fn fixture_with_generation_config(tmp: &Path, gen: &str) -> PathBuf {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlx-written/qwen3-bf16");
    let dir = tmp.join("m");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    std::fs::write(dir.join("generation_config.json"), gen).unwrap();
    dir
}

#[test]
fn request_beats_generation_config_beats_builtin() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_with_generation_config(
        tmp.path(),
        r#"{"eos_token_id": [7, 511], "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_new_tokens": 9}"#,
    );
    let p = Pipeline::load(&dir).unwrap();
    // config.json eos (511) ∪ generation_config eos (7, 511).
    assert_eq!(p.stop_ids(), vec![7, 511]);
    let r = p.request(vec![1], &RequestOptions::default());
    assert_eq!(
        (
            r.sampling.temperature,
            r.sampling.top_k,
            r.sampling.top_p,
            r.max_tokens
        ),
        (0.6, 20, 0.95, 9)
    );
    let o = RequestOptions {
        temperature: Some(0.0),
        top_k: Some(3),
        top_p: Some(0.5),
        max_tokens: Some(4),
        ..Default::default()
    };
    let r = p.request(vec![1], &o);
    assert_eq!(
        (
            r.sampling.temperature,
            r.sampling.top_k,
            r.sampling.top_p,
            r.max_tokens
        ),
        (0.0, 3, 0.5, 4)
    );
    assert!(p
        .request(
            vec![1],
            &RequestOptions {
                ignore_eos: true,
                ..Default::default()
            }
        )
        .stop_ids
        .is_empty());

    // do_sample false means greedy even with a temperature; nothing given means built-ins.
    let dir = fixture_with_generation_config(
        &tmp.path().join("b"),
        r#"{"do_sample": false, "temperature": 0.6}"#,
    );
    let r = Pipeline::load(&dir)
        .unwrap()
        .request(vec![1], &RequestOptions::default());
    assert_eq!(r.sampling.temperature, 0.0);
    let dir = fixture_with_generation_config(&tmp.path().join("c"), "{}");
    let r = Pipeline::load(&dir)
        .unwrap()
        .request(vec![1], &RequestOptions::default());
    assert_eq!(
        (
            r.sampling.temperature,
            r.sampling.top_k,
            r.sampling.top_p,
            r.max_tokens
        ),
        (0.0, 0, 1.0, engine::pipeline::DEFAULT_MAX_TOKENS)
    );
}
