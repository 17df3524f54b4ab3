//! Property tests for the numerically fragile pieces of Gated DeltaNet (docs/design.md §5, §7):
//! the triangular inverse, the log-space gate, chunked ≡ per-step, the per-step recurrence and
//! the causal conv against naive f64 code, carrying state across pieces of a sequence, and
//! bit-identical results for any thread count. Each trap has a companion test showing that the
//! naive version really fails on the same inputs, so the checks can fail.

use kernels::cpu::gdn::{unit_lower_inverse, GATE_FLOOR};
use kernels::{ops, DType, Tensor};
use proptest::prelude::*;

/// Error ratio bound for two f32 computations of the same GDN result (docs/design.md §7).
const PATH_TOL: f64 = 5e-3;

// ------------------------------------------------------------------------------------------
// Inputs
// ------------------------------------------------------------------------------------------

/// SplitMix64: the tests draw a seed from proptest and generate bulk data from it, which keeps
/// shrinking cheap and cases reproducible.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let u = 1.0 - self.uniform();
        let w = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()
    }

    fn normals(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal() as f32).collect()
    }
}

fn softplus64(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Scales each `d`-long row to L2 norm `scale` (what the model does to q and k).
fn normalize_rows(x: &mut [f32], d: usize, scale: f64) {
    for row in x.chunks_mut(d) {
        let n = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
        row.iter_mut()
            .for_each(|v| *v = (*v as f64 * scale / n) as f32);
    }
}

/// One GDN problem: inputs in the op layout and an initial state.
#[derive(Clone)]
struct Case {
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
}

impl Case {
    /// Realistic inputs: unit keys, queries scaled by `1/√Dk`, `β = sigmoid(normal)`, and the
    /// Qwen3.5 gate with `A = exp(A_log)` drawn from [1, 16] (decays from mild to strong).
    fn random(seed: u64, t: usize, hk: usize, ratio: usize, dk: usize, dv: usize) -> Case {
        let mut rng = Rng(seed);
        let hv = hk * ratio;
        let mut q = rng.normals(t * hk * dk);
        let mut k = rng.normals(t * hk * dk);
        normalize_rows(&mut q, dk, 1.0 / (dk as f64).sqrt());
        normalize_rows(&mut k, dk, 1.0);
        let v = rng.normals(t * hv * dv);
        let a_log: Vec<f64> = (0..hv).map(|_| (1.0 + 15.0 * rng.uniform()).ln()).collect();
        let g = (0..t * hv)
            .map(|i| (-a_log[i % hv].exp() * softplus64(rng.normal() - 1.0)) as f32)
            .collect();
        let beta = (0..t * hv)
            .map(|_| sigmoid64(rng.normal()) as f32)
            .collect();
        Case {
            t,
            hk,
            hv,
            dk,
            dv,
            q,
            k,
            v,
            g,
            beta,
            state: vec![0.0; hv * dv * dk],
        }
    }

    fn with_random_state(mut self, seed: u64) -> Case {
        let mut rng = Rng(seed ^ 0x5EED);
        self.state = rng.normals(self.state.len());
        self.state.iter_mut().for_each(|s| *s *= 0.5);
        self
    }

    /// Steps `t0..t1` as a case of their own (the state stays the initial one).
    fn slice(&self, t0: usize, t1: usize) -> Case {
        let (kw, vw, gw) = (self.hk * self.dk, self.hv * self.dv, self.hv);
        Case {
            t: t1 - t0,
            q: self.q[t0 * kw..t1 * kw].to_vec(),
            k: self.k[t0 * kw..t1 * kw].to_vec(),
            v: self.v[t0 * vw..t1 * vw].to_vec(),
            g: self.g[t0 * gw..t1 * gw].to_vec(),
            beta: self.beta[t0 * gw..t1 * gw].to_vec(),
            ..self.clone()
        }
    }

    fn tensors(&self) -> [Tensor; 5] {
        let f = |shape: &[usize], d: &[f32]| Tensor::from_f32(shape, d.to_vec()).unwrap();
        [
            f(&[self.t, self.hk, self.dk], &self.q),
            f(&[self.t, self.hk, self.dk], &self.k),
            f(&[self.t, self.hv, self.dv], &self.v),
            f(&[self.t, self.hv], &self.g),
            f(&[self.t, self.hv], &self.beta),
        ]
    }

    fn state_tensor(&self) -> Tensor {
        Tensor::from_f32(&[self.hv, self.dv, self.dk], self.state.clone()).unwrap()
    }
}

#[derive(Clone, Copy, Debug)]
enum Path {
    PerStep,
    Chunked(usize),
}

/// Runs one path from `state`; returns the output and the final state.
fn run(c: &Case, path: Path, state: &Tensor) -> (Vec<f32>, Vec<f32>) {
    let [q, k, v, g, b] = c.tensors();
    let mut s = state.clone();
    let y = match path {
        Path::PerStep => ops::gdn_recurrent(&q, &k, &v, &g, &b, &mut s),
        Path::Chunked(l) => ops::gdn_chunked(&q, &k, &v, &g, &b, &mut s, l),
    }
    .unwrap();
    (y.f32s().unwrap().to_vec(), s.f32s().unwrap().to_vec())
}

/// The per-step rule written out plainly in f64: the reference every path answers to.
fn reference(c: &Case) -> (Vec<f64>, Vec<f64>) {
    let (dk, dv) = (c.dk, c.dv);
    let mut s: Vec<f64> = c.state.iter().map(|&x| x as f64).collect();
    let mut y = vec![0.0f64; c.t * c.hv * dv];
    for t in 0..c.t {
        for h in 0..c.hv {
            let kh = h / (c.hv / c.hk);
            let k = &c.k[(t * c.hk + kh) * dk..][..dk];
            let q = &c.q[(t * c.hk + kh) * dk..][..dk];
            let at = t * c.hv + h;
            let decay = (c.g[at] as f64).exp();
            let beta = c.beta[at] as f64;
            let sh = &mut s[h * dv * dk..(h + 1) * dv * dk];
            for r in 0..dv {
                let row = &mut sh[r * dk..(r + 1) * dk];
                row.iter_mut().for_each(|x| *x *= decay);
                let sk: f64 = row.iter().zip(k).map(|(a, &b)| a * b as f64).sum();
                let delta = beta * (c.v[at * dv + r] as f64 - sk);
                row.iter_mut()
                    .zip(k)
                    .for_each(|(x, &kk)| *x += delta * kk as f64);
                y[at * dv + r] = row.iter().zip(q).map(|(a, &b)| a * b as f64).sum();
            }
        }
    }
    (y, s)
}

/// `rms(a − b) / rms(a)` with `a` the reference; infinite when `b` has a NaN or inf.
fn err_ratio(a: &[f64], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    if b.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let diff: f64 = a.iter().zip(b).map(|(x, &y)| (x - y as f64).powi(2)).sum();
    let norm: f64 = a.iter().map(|x| x * x).sum();
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

// ------------------------------------------------------------------------------------------
// 1. The triangular inverse
// ------------------------------------------------------------------------------------------

/// The strictly lower `A` of one chunk, built the way the chunked kernel builds it: keys that
/// share a direction (`spread` is the noise around it), `β` in (0, 1], and per-step log-decays
/// drawn from `[−strength, 0]`.
fn chunk_system(seed: u64, n: usize, spread: f64, strength: f64, beta_one: bool) -> Vec<f32> {
    let mut rng = Rng(seed);
    let dk = 64;
    let base = rng.normals(dk);
    let mut k: Vec<f32> = (0..n * dk)
        .map(|i| base[i % dk] + (spread * rng.normal()) as f32)
        .collect();
    normalize_rows(&mut k, dk, 1.0);
    let beta: Vec<f64> = (0..n)
        .map(|_| {
            if beta_one {
                1.0
            } else {
                1.0 - 0.99 * rng.uniform()
            }
        })
        .collect();
    let g: Vec<f64> = (0..n).map(|_| -strength * rng.uniform()).collect();
    let mut a = vec![0.0f32; n * n];
    for i in 0..n {
        for j in 0..i {
            let kk: f64 = (0..dk)
                .map(|d| k[i * dk + d] as f64 * k[j * dk + d] as f64)
                .sum();
            let seg: f64 = g[j + 1..=i].iter().sum();
            a[i * n + j] = (beta[i] * kk * seg.exp()) as f32;
        }
    }
    a
}

/// `(I + A)⁻¹` in f64 (forward substitution on the f32 entries widened exactly).
fn inverse_f64(a: &[f32], n: usize) -> Vec<f64> {
    let mut m = vec![0.0f64; n * n];
    for i in 0..n {
        m[i * n + i] = 1.0;
        for c in 0..i {
            let s: f64 = (c..i).map(|j| a[i * n + j] as f64 * m[j * n + c]).sum();
            m[i * n + c] = -s;
        }
    }
    m
}

/// `max |(I + A) M − I|`, in f64.
fn residual(a: &[f32], m: &[f32], n: usize) -> f64 {
    let mut worst = 0.0f64;
    for i in 0..n {
        for c in 0..n {
            let mut s = m[i * n + c] as f64 - if i == c { 1.0 } else { 0.0 };
            for j in 0..i {
                s += a[i * n + j] as f64 * m[j * n + c] as f64;
            }
            worst = worst.max(s.abs());
        }
    }
    worst
}

/// The naive inverse: `(I + A)⁻¹ = Σ_p N^p = Π_s (I + N^(2^s))` with `N = −A`, all in f32.
fn inverse_by_squaring(a: &[f32], n: usize) -> Vec<f32> {
    let mul = |x: &[f32], y: &[f32]| {
        let mut z = vec![0.0f32; n * n];
        for i in 0..n {
            for j in 0..n {
                z[i * n + j] = (0..n).map(|l| x[i * n + l] * y[l * n + j]).sum();
            }
        }
        z
    };
    let eye_plus = |x: &[f32]| {
        let mut z = x.to_vec();
        (0..n).for_each(|i| z[i * n + i] += 1.0);
        z
    };
    let mut power: Vec<f32> = a.iter().map(|v| -v).collect();
    let mut result = eye_plus(&power);
    let mut span = 2;
    while span < n {
        power = mul(&power, &power);
        result = mul(&result, &eye_plus(&power));
        span *= 2;
    }
    result
}

fn rel_frobenius(reference: &[f64], got: &[f32]) -> f64 {
    err_ratio(reference, got)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn triangular_inverse_is_finite_and_accurate(
        seed in any::<u64>(),
        n in prop::sample::select(vec![16usize, 32, 64]),
        spread in prop::sample::select(vec![0.02f64, 0.1, 0.5, 2.0]),
        strength in prop::sample::select(vec![0.0f64, 0.05, 1.0, 30.0, 1e4]),
        beta_one in any::<bool>(),
    ) {
        let a = chunk_system(seed, n, spread, strength, beta_one);
        let mut m = vec![0.0f32; n * n];
        unit_lower_inverse(&a, n, &mut m);
        prop_assert!(m.iter().all(|v| v.is_finite()));
        let res = residual(&a, &m, n);
        prop_assert!(res <= 1e-5, "residual {res}");
        let err = rel_frobenius(&inverse_f64(&a, n), &m);
        prop_assert!(err <= 1e-5, "error vs f64 inverse {err}");
    }
}

/// The trap the forward substitution avoids: on the same kind of chunk (L = 64, keys sharing a
/// direction, `β = 1`, no decay) repeated squaring forms powers whose entries reach ~1e17 and
/// cancel, so the f32 result is garbage (or inf/NaN), while the forward substitution is exact
/// to a few ulp.
#[test]
fn triangular_inverse_by_repeated_squaring_fails_in_f32() {
    for seed in 0..4u64 {
        let n = 64;
        let a = chunk_system(seed, n, 0.02, 0.0, true);
        let exact = inverse_f64(&a, n);
        let naive = inverse_by_squaring(&a, n);
        let naive_err = rel_frobenius(&exact, &naive);
        assert!(
            naive_err.is_nan() || naive_err >= 1.0,
            "seed {seed}: squaring unexpectedly accurate ({naive_err:e})"
        );
        let mut m = vec![0.0f32; n * n];
        unit_lower_inverse(&a, n, &mut m);
        let err = rel_frobenius(&exact, &m);
        assert!(
            err < 1e-5,
            "seed {seed}: forward substitution error {err:e}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// 2. The log-space gate
// ------------------------------------------------------------------------------------------

/// Ordinary values most of the time, sometimes magnitudes up to 1e30 of either sign.
fn wide() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => -20.0f32..20.0,
        1 => -120.0f32..120.0,
        1 => (-30i32..=30, -1.0f32..1.0).prop_map(|(e, m)| m * 10f32.powi(e)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn gate_is_finite_and_matches_f64(
        triples in prop::collection::vec((wide(), wide(), wide()), 1..48),
    ) {
        let hv = triples.len();
        let t = |f: fn(&(f32, f32, f32)) -> f32| {
            Tensor::from_f32(&[hv], triples.iter().map(f).collect()).unwrap()
        };
        let (a_log, a, dt) = (t(|x| x.0), t(|x| x.1), t(|x| x.2));
        let g = ops::gdn_gate(&a.reshape(&[1, hv]).unwrap(), &a_log, &dt).unwrap();
        for (&got, &(al, av, db)) in g.f32s().unwrap().iter().zip(&triples) {
            prop_assert!(got.is_finite() && got <= 0.0, "gate({al}, {av}, {db}) = {got}");
            let want = -(al as f64).exp() * softplus64(av as f64 + db as f64);
            if want.is_nan() {
                // inf · 0 even in f64: only the range is checkable.
                continue;
            }
            if want < GATE_FLOOR as f64 {
                prop_assert_eq!(got, GATE_FLOOR);
            } else {
                let err = (got as f64 - want).abs();
                prop_assert!(
                    err <= 1e-6 * want.abs() + 3e-45,
                    "gate({al}, {av}, {db}) = {got}, want {want}"
                );
            }
        }
    }
}

/// Decay through the gate op at both extremes: 30% of the steps forget everything
/// (`a` from 1e3 to 1e35, so `g_log = −a` and `e^g = 0` in f32), the rest decay mildly
/// (`g ≈ −0.3`). After a strong step the cumulative log-decay is huge, so a version that
/// differences cumulative sums loses the mild decays to cancellation, and one that goes
/// through `log(exp(g))` gets `−inf − (−inf) = NaN`.
fn strong_decay_case(seed: u64) -> Case {
    let mut c = Case::random(seed, 150, 2, 2, 32, 32).with_random_state(seed);
    let mut rng = Rng(seed ^ 0xDECA1);
    let a: Vec<f32> = (0..c.t * c.hv)
        .map(|_| {
            if rng.uniform() < 0.3 {
                10f64.powf(3.0 + 32.0 * rng.uniform()) as f32
            } else {
                (rng.normal() - 1.0) as f32
            }
        })
        .collect();
    let a = Tensor::from_f32(&[c.t, c.hv], a).unwrap();
    let zeros = Tensor::from_f32(&[c.hv], vec![0.0; c.hv]).unwrap();
    c.g = ops::gdn_gate(&a, &zeros, &zeros)
        .unwrap()
        .f32s()
        .unwrap()
        .to_vec();
    c
}

/// The naive way to get a chunk's decays: keep the gate as `exp(g)`, take `log` of it and
/// difference cumulative sums. Returns `e^(G_i − G_j)` (`j ≤ i`) for the first chunk of head 0.
fn naive_chunk_decays(c: &Case, n: usize) -> Vec<f32> {
    let gate: Vec<f32> = (0..n).map(|t| c.g[t * c.hv].exp()).collect();
    let mut cum = vec![0.0f32; n];
    let mut s = 0.0f32;
    for (i, &x) in gate.iter().enumerate() {
        s += x.ln();
        cum[i] = s;
    }
    let mut d = vec![0.0f32; n * n];
    for i in 0..n {
        for j in 0..=i {
            d[i * n + j] = (cum[i] - cum[j]).exp();
        }
    }
    d
}

#[test]
fn chunked_survives_decay_that_breaks_the_naive_gate() {
    for seed in 0..3u64 {
        let c = strong_decay_case(seed);
        assert!(c.g.iter().all(|g| g.is_finite()));
        // The trap is really there: the naive decays of the same inputs hold NaN.
        assert!(naive_chunk_decays(&c, 64).iter().any(|d| d.is_nan()));
        let (y_ref, s_ref) = reference(&c);
        let (y, s) = run(&c, Path::Chunked(64), &c.state_tensor());
        let (ey, es) = (err_ratio(&y_ref, &y), err_ratio(&s_ref, &s));
        assert!(
            ey <= PATH_TOL && es <= PATH_TOL,
            "seed {seed}: output {ey:e}, state {es:e}"
        );
        let (y, s) = run(&c, Path::PerStep, &c.state_tensor());
        let (ey, es) = (err_ratio(&y_ref, &y), err_ratio(&s_ref, &s));
        assert!(
            ey <= 1e-4 && es <= 1e-4,
            "seed {seed}: per step {ey:e}, {es:e}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// 3. Chunked ≡ per step
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(28))]

    #[test]
    fn chunked_matches_per_step(
        seed in any::<u64>(),
        t in prop::sample::select(vec![1usize, 63, 64, 65, 127, 128, 300]),
        dk in prop::sample::select(vec![32usize, 64, 128]),
        dv in prop::sample::select(vec![32usize, 64, 128]),
        ratio in prop::sample::select(vec![1usize, 2, 4]),
        hk in 1usize..=2,
        initial_state in any::<bool>(),
    ) {
        let mut c = Case::random(seed, t, hk, ratio, dk, dv);
        if initial_state {
            c = c.with_random_state(seed);
        }
        let s0 = c.state_tensor();
        let (y_step, s_step) = run(&c, Path::PerStep, &s0);
        let (y_chunk, s_chunk) = run(&c, Path::Chunked(64), &s0);
        let ey = err_ratio(&widen(&y_step), &y_chunk);
        let es = err_ratio(&widen(&s_step), &s_chunk);
        prop_assert!(ey <= PATH_TOL, "output error ratio {ey:e}");
        prop_assert!(es <= PATH_TOL, "state error ratio {es:e}");
    }

    /// Odd head sizes (lane remainders) and odd chunk lengths, both paths against f64.
    #[test]
    fn both_paths_match_f64_at_odd_sizes(
        seed in any::<u64>(),
        t in 1usize..90,
        dk in prop::sample::select(vec![1usize, 8, 20, 36]),
        dv in prop::sample::select(vec![1usize, 8, 24, 40]),
        ratio in 1usize..=3,
        chunk in prop::sample::select(vec![1usize, 7, 16, 64]),
    ) {
        let c = Case::random(seed, t, 1, ratio, dk, dv).with_random_state(seed);
        let (y_ref, s_ref) = reference(&c);
        let (y, s) = run(&c, Path::PerStep, &c.state_tensor());
        prop_assert!(err_ratio(&y_ref, &y) <= 1e-4 && err_ratio(&s_ref, &s) <= 1e-4);
        let (y, s) = run(&c, Path::Chunked(chunk), &c.state_tensor());
        let (ey, es) = (err_ratio(&y_ref, &y), err_ratio(&s_ref, &s));
        prop_assert!(ey <= PATH_TOL && es <= PATH_TOL, "chunked {ey:e}, {es:e}");
    }
}

// ------------------------------------------------------------------------------------------
// 4. Per step and conv against f64; state carried across pieces
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn per_step_matches_f64(
        seed in any::<u64>(),
        t in 1usize..100,
        dk in prop::sample::select(vec![16usize, 32, 64]),
        dv in prop::sample::select(vec![16usize, 48, 64]),
        ratio in prop::sample::select(vec![1usize, 2, 4]),
    ) {
        let c = Case::random(seed, t, 2, ratio, dk, dv).with_random_state(seed);
        let (y_ref, s_ref) = reference(&c);
        let (y, s) = run(&c, Path::PerStep, &c.state_tensor());
        let (ey, es) = (err_ratio(&y_ref, &y), err_ratio(&s_ref, &s));
        prop_assert!(ey <= 1e-5 && es <= 1e-5, "output {ey:e}, state {es:e}");
    }

    /// Feeding a sequence in pieces, state carried, equals feeding it whole: bit for bit per
    /// step, and for chunked when the cuts fall on chunk boundaries; within tolerance at any
    /// cut (the chunks then fall differently).
    #[test]
    fn pieces_with_carried_state_equal_one_piece(
        seed in any::<u64>(),
        t in 2usize..200,
        cut in 0.0f64..1.0,
        chunk_cut in 1usize..3,
    ) {
        let c = Case::random(seed, t, 2, 2, 32, 32).with_random_state(seed);
        let s0 = c.state_tensor();
        let cut = 1 + ((t - 1) as f64 * cut) as usize;
        for (path, at) in [
            (Path::PerStep, cut),
            (Path::Chunked(16), cut),
            (Path::Chunked(16), (16 * chunk_cut).min(t)),
        ] {
            let (y_whole, s_whole) = run(&c, path, &s0);
            let (head, tail) = (c.slice(0, at), c.slice(at, t));
            let (mut y, s1) = run(&head, path, &s0);
            let s1 = Tensor::from_f32(s0.shape(), s1).unwrap();
            let (y2, s2) = run(&tail, path, &s1);
            y.extend(y2);
            let exact = matches!(path, Path::PerStep) || at % 16 == 0;
            if exact {
                prop_assert_eq!(bits(&y), bits(&y_whole), "{:?} cut at {}", path, at);
                prop_assert_eq!(bits(&s2), bits(&s_whole));
            } else {
                prop_assert!(err_ratio(&widen(&y_whole), &y) <= PATH_TOL);
                prop_assert!(err_ratio(&widen(&s_whole), &s2) <= PATH_TOL);
            }
        }
    }

    #[test]
    fn causal_conv1d_matches_f64_and_carries_state(
        seed in any::<u64>(),
        t in 1usize..40,
        c in 1usize..70,
        kw in 1usize..=5,
        silu in any::<bool>(),
        cut in 0.0f64..1.0,
    ) {
        let mut rng = Rng(seed);
        let x = rng.normals(t * c);
        let w = rng.normals(c * kw);
        let st = rng.normals((kw - 1) * c);
        // [state; x] row r, then the sliding window in f64.
        let full = |r: usize| if r < kw - 1 { &st[r * c..(r + 1) * c] } else { &x[(r + 1 - kw) * c..(r + 2 - kw) * c] };
        let mut want = vec![0.0f64; t * c];
        for i in 0..t {
            for ch in 0..c {
                let s: f64 = (0..kw).map(|j| w[ch * kw + j] as f64 * full(i + j)[ch] as f64).sum();
                want[i * c + ch] = if silu { s * sigmoid64(s) } else { s };
            }
        }
        let want_state: Vec<f32> = (t..t + kw - 1).flat_map(|r| full(r).to_vec()).collect();

        let xt = Tensor::from_f32(&[t, c], x.clone()).unwrap();
        let wt = Tensor::from_f32(&[c, kw], w).unwrap();
        let s0 = Tensor::from_f32(&[kw - 1, c], st.clone()).unwrap();
        let mut s = s0.clone();
        let y = ops::causal_conv1d(&xt, &wt, &mut s, silu).unwrap();
        prop_assert!(err_ratio(&want, y.f32s().unwrap()) <= 1e-6);
        prop_assert_eq!(s.f32s().unwrap(), &want_state[..]);

        // In two pieces.
        let at = ((t as f64 * cut) as usize).min(t);
        let mut s = s0.clone();
        let mut y2 = ops::causal_conv1d(&xt.narrow0(0, at).unwrap(), &wt, &mut s, silu).unwrap().to_vec_f32().unwrap();
        y2.extend(ops::causal_conv1d(&xt.narrow0(at, t - at).unwrap(), &wt, &mut s, silu).unwrap().to_vec_f32().unwrap());
        prop_assert_eq!(bits(&y2), bits(y.f32s().unwrap()));
        prop_assert_eq!(s.f32s().unwrap(), &want_state[..]);
    }
}

// ------------------------------------------------------------------------------------------
// 5. Determinism across thread counts
// ------------------------------------------------------------------------------------------

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn results_are_bit_identical_for_one_and_two_threads() {
    // Large enough that every op takes its parallel branch.
    let c = Case::random(7, 150, 2, 2, 64, 64).with_random_state(7);
    let s0 = c.state_tensor();
    let all = || {
        let mut out = Vec::new();
        for path in [Path::PerStep, Path::Chunked(64)] {
            let (y, s) = run(&c, path, &s0);
            out.push(bits(&y));
            out.push(bits(&s));
        }
        let x = Tensor::from_f32(&[150, 640], Rng(3).normals(150 * 640)).unwrap();
        let w = Tensor::from_f32(&[640, 4], Rng(4).normals(640 * 4)).unwrap();
        let mut s = Tensor::zeros(&[3, 640]);
        out.push(bits(
            ops::causal_conv1d(&x, &w, &mut s, true)
                .unwrap()
                .f32s()
                .unwrap(),
        ));
        let a = Tensor::from_f32(&[150, 4], Rng(5).normals(600)).unwrap();
        let ones = Tensor::from_f32(&[4], vec![1.0; 4]).unwrap();
        out.push(bits(
            ops::gdn_gate(&a, &ones, &ones).unwrap().f32s().unwrap(),
        ));
        out
    };
    let one = in_pool(1, all);
    let two = in_pool(2, all);
    assert!(one == two, "results differ between 1 and 2 threads");
}

// ------------------------------------------------------------------------------------------
// Input checks
// ------------------------------------------------------------------------------------------

#[test]
fn bad_inputs_are_errors_not_panics() {
    let c = Case::random(1, 5, 2, 2, 8, 8);
    let [q, k, v, g, b] = c.tensors();
    let mut s = c.state_tensor();
    // Hv = 4 is not a multiple of Hk = 3.
    let q3 = Tensor::zeros(&[5, 3, 8]);
    assert!(ops::gdn_recurrent(&q3, &q3, &v, &g, &b, &mut s).is_err());
    // State of the wrong shape, chunk length 0.
    let mut bad = Tensor::zeros(&[4, 8, 7]);
    assert!(ops::gdn_chunked(&q, &k, &v, &g, &b, &mut bad, 64).is_err());
    assert!(ops::gdn_chunked(&q, &k, &v, &g, &b, &mut s, 0).is_err());
    // A bf16 activation names the tensor.
    let half = Tensor::from_slice(&[5, 4], DType::BF16, &[0u16; 20]).unwrap();
    let err = ops::gdn_recurrent(&q, &k, &v, &g, &half, &mut s).unwrap_err();
    assert!(err.to_string().contains("beta"), "{err}");
    // Conv state that does not hold K − 1 rows.
    let x = Tensor::zeros(&[3, 6]);
    let w = Tensor::zeros(&[6, 4]);
    assert!(ops::causal_conv1d(&x, &w, &mut Tensor::zeros(&[2, 6]), false).is_err());
    // Gate parameters of the wrong length.
    assert!(ops::gdn_gate(&g, &Tensor::zeros(&[3]), &Tensor::zeros(&[4])).is_err());
}
