//! Every op of `kernels::ops` except matmul/embedding, against naive f64 references written
//! here from each op's mathematical definition; bad inputs must give `Err`, and every op must
//! give the same bits in thread pools of 1 and 2 threads.

use half::{bf16, f16};
use kernels::ops::{self, AttnParams, RopeLayout};
use kernels::Settings;
use kernels::{DType, Device, Tensor};

/// splitmix64: small, deterministic, good enough to pick shapes and values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f32 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (lo + (hi - lo) * u) as f32
    }
    fn vec(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(-scale, scale)).collect()
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.int(0, xs.len() - 1)]
    }
}

fn tensor(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::from_f32(shape, data).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.f32s().unwrap().to_vec()
}

/// NMSE = Σ(got − want)² / Σwant² over the finite reference entries; every non-finite
/// reference entry must be matched exactly (same infinity, or NaN for NaN), and a finite
/// reference entry must not come out non-finite.
fn check(what: &str, got: &[f32], want: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_finite() {
            assert!(g.is_finite(), "{what}: [{i}] = {g}, want {w}");
            num += (g as f64 - w).powi(2);
            den += w * w;
        } else {
            let same = (w.is_nan() && g.is_nan()) || g as f64 == w;
            assert!(same, "{what}: [{i}] = {g}, want {w}");
        }
    }
    let nmse = if den == 0.0 { num } else { num / den };
    assert!(nmse <= tol, "{what}: NMSE {nmse:e} > {tol:e}");
    nmse
}

const ELEMENTWISE: f64 = 1e-7;

// ---------------------------------------------------------------- rms_norm

fn rms_norm_ref(x: &[f32], n: usize, w: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
        let r = 1.0 / (ms + eps).sqrt();
        for (i, &v) in row.iter().enumerate() {
            out.push(v as f64 * r * w.map_or(1.0, |w| w[i]));
        }
    }
    out
}

/// A weight tensor of `dtype` and the exact values it holds, widened to f64.
fn weight(rng: &mut Rng, n: usize, dtype: DType) -> (Tensor, Vec<f64>) {
    let raw: Vec<f32> = (0..n).map(|_| 1.0 + rng.uniform(-0.5, 0.5)).collect();
    match dtype {
        DType::F32 => (
            tensor(&[n], raw.clone()),
            raw.iter().map(|&v| v as f64).collect(),
        ),
        DType::BF16 => {
            let w: Vec<bf16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
            let t = Tensor::from_slice(&[n], DType::BF16, &w).unwrap();
            (t, w.iter().map(|v| v.to_f64()).collect())
        }
        DType::F16 => {
            let w: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
            let t = Tensor::from_slice(&[n], DType::F16, &w).unwrap();
            (t, w.iter().map(|v| v.to_f64()).collect())
        }
        other => unreachable!("{other:?}"),
    }
}

#[test]
fn rms_norm_matches_reference() {
    let mut rng = Rng(1);
    for case in 0..30 {
        let rows = rng.int(1, 9);
        let n = rng.pick(&[1, 2, 7, 31, 64, 127, 300, 1025]);
        // Magnitudes far from 1 catch a missing or misplaced square root.
        let mag = rng.pick(&[1e-3, 1.0, 40.0, 1e3]);
        let x = rng.vec(rows * n, mag);
        let eps = rng.pick(&[1e-6f32, 1e-5]);
        let xt = tensor(&[rows, n], x.clone());
        let got = ops::rms_norm(&xt, None, eps).unwrap();
        let want = rms_norm_ref(&x, n, None, eps as f64);
        check(
            &format!("rms_norm {case} plain"),
            &values(&got),
            &want,
            ELEMENTWISE,
        );
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let (wt, wv) = weight(&mut rng, n, dtype);
            let got = ops::rms_norm(&xt, Some(&wt), eps).unwrap();
            let want = rms_norm_ref(&x, n, Some(&wv), eps as f64);
            check(
                &format!("rms_norm {case} {dtype:?}"),
                &values(&got),
                &want,
                ELEMENTWISE,
            );
        }
    }
}

#[test]
fn rms_norm_rejects_bad_inputs() {
    let x = tensor(&[2, 4], vec![1.0; 8]);
    assert!(ops::rms_norm(&x, Some(&tensor(&[3], vec![1.0; 3])), 1e-6).is_err());
    assert!(ops::rms_norm(&tensor(&[], vec![1.0]), None, 1e-6).is_err());
    assert!(ops::rms_norm(&x, None, -1.0).is_err());
    assert!(ops::rms_norm(&x, None, f32::NAN).is_err());
    let xb = Tensor::from_slice(&[2, 4], DType::BF16, &[bf16::ONE; 8]).unwrap();
    assert!(ops::rms_norm(&xb, None, 1e-6).is_err());
    let wu = Tensor::from_slice(&[4], DType::U32, &[1u32; 4]).unwrap();
    assert!(ops::rms_norm(&x, Some(&wu), 1e-6).is_err());
}

// ---------------------------------------------------------------- rope

fn rope_ref(
    x: &[f32],
    (t_len, h, d): (usize, usize, usize),
    positions: &[usize],
    inv_freq: &[f32],
    layout: RopeLayout,
) -> Vec<f64> {
    let half = inv_freq.len();
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (t, &pos) in positions.iter().enumerate().take(t_len) {
        for hh in 0..h {
            let base = (t * h + hh) * d;
            for (i, &f) in inv_freq.iter().enumerate() {
                let (a, b) = match layout {
                    RopeLayout::HalfSplit => (i, i + half),
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                };
                let theta = pos as f64 * f as f64;
                let (x0, x1) = (x[base + a] as f64, x[base + b] as f64);
                out[base + a] = x0 * theta.cos() - x1 * theta.sin();
                out[base + b] = x1 * theta.cos() + x0 * theta.sin();
            }
        }
    }
    out
}

#[test]
fn rope_matches_reference() {
    let mut rng = Rng(2);
    for case in 0..40 {
        let (t_len, h) = (rng.int(1, 7), rng.int(1, 5));
        let d = rng.pick(&[2, 4, 6, 17, 64, 80, 128]);
        // Full rotary half the time, otherwise a partial one (Qwen3.5-style 25%, or random).
        let half = match case % 3 {
            0 => d / 2,
            1 => (d / 8).max(1),
            _ => rng.int(1, d / 2),
        };
        let base = rng.pick(&[10_000.0f64, 1_000_000.0]);
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| base.powf(-2.0 * i as f64 / (2 * half) as f64) as f32)
            .collect();
        let positions: Vec<usize> = (0..t_len).map(|_| rng.int(0, 200_000)).collect();
        let x = rng.vec(t_len * h * d, 2.0);
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            let got = ops::rope(
                &tensor(&[t_len, h, d], x.clone()),
                &positions,
                &inv_freq,
                layout,
            )
            .unwrap();
            let want = rope_ref(&x, (t_len, h, d), &positions, &inv_freq, layout);
            check(
                &format!("rope {case} {layout:?}"),
                &values(&got),
                &want,
                ELEMENTWISE,
            );
        }
    }
}

#[test]
fn rope_rejects_bad_inputs() {
    let x = tensor(&[2, 3, 8], vec![0.5; 48]);
    let f = [1.0f32, 0.1];
    let hs = RopeLayout::HalfSplit;
    assert!(ops::rope(&tensor(&[6, 8], vec![0.5; 48]), &[0, 1], &f, hs).is_err());
    assert!(ops::rope(&x, &[0], &f, hs).is_err());
    assert!(ops::rope(&x, &[0, 1], &[1.0; 5], hs).is_err());
    assert!(ops::rope(&x, &[0, 1], &f, hs).is_ok());
}

// ---------------------------------------------------------------- attention

struct AttnCase {
    t_len: usize,
    hq: usize,
    hk: usize,
    d: usize,
    cap: usize,
    p: AttnParams,
}

fn attention_ref(c: &AttnCase, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    let (hq, d, cap) = (c.hq, c.d, c.cap);
    let group = hq / c.hk;
    let mut out = vec![0.0f64; c.t_len * hq * d];
    for t in 0..c.t_len {
        let pos = c.p.q_start + t;
        let lo = c.p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..hq {
            let kv = (h / group) * cap * d;
            let qr = &q[(t * hq + h) * d..][..d];
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| {
                    let kr = &k[kv + j * d..][..d];
                    let s = c.p.scale as f64
                        * qr.iter()
                            .zip(kr)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>();
                    c.p.softcap
                        .map_or(s, |cap| cap as f64 * (s / cap as f64).tanh())
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let o = &mut out[(t * hq + h) * d..][..d];
            for (j, w) in (lo..=pos).zip(&e) {
                for (o, &x) in o.iter_mut().zip(&v[kv + j * d..][..d]) {
                    *o += w / z * x as f64;
                }
            }
        }
    }
    out
}

/// A cache `[hk, cap, d]` whose first `kv_len` positions hold values and whose spare
/// capacity holds NaN, so any read past `kv_len` poisons the result.
fn cache(rng: &mut Rng, hk: usize, cap: usize, kv_len: usize, d: usize, scale: f64) -> Vec<f32> {
    let mut c = rng.vec(hk * cap * d, scale);
    for h in 0..hk {
        c[(h * cap + kv_len) * d..(h + 1) * cap * d].fill(f32::NAN);
    }
    c
}

fn run_attention(rng: &mut Rng, c: &AttnCase, what: &str) -> f64 {
    // Large q so that scores spread over tens of units: the softmax is peaked, softcap bites.
    let q = rng.vec(c.t_len * c.hq * c.d, 10.0);
    let k = cache(rng, c.hk, c.cap, c.p.kv_len, c.d, 1.0);
    let v = cache(rng, c.hk, c.cap, c.p.kv_len, c.d, 1.0);
    let got = ops::attention(
        &tensor(&[c.t_len, c.hq, c.d], q.clone()),
        &tensor(&[c.hk, c.cap, c.d], k.clone()),
        &tensor(&[c.hk, c.cap, c.d], v.clone()),
        &c.p,
    )
    .unwrap();
    check(
        what,
        &values(&got),
        &attention_ref(c, &q, &k, &v),
        ATTENTION,
    )
}

/// Far tighter than the 5e-4 conformance bound: f32 with f32 accumulation lands near 1e-13.
const ATTENTION: f64 = 1e-10;

#[test]
fn attention_matches_reference() {
    let mut rng = Rng(3);
    let mut worst = 0.0f64;
    for case in 0..60 {
        let group = [1, 2, 4][case % 3];
        let hk = rng.int(1, 3);
        let d = rng.pick(&[1, 8, 17, 64, 128]);
        // Prefill from 0, decode (one query at the end), chunked prefill against a cache,
        // and a cache holding keys past the last query.
        let (t_len, q_start, extra) = match (case / 3) % 4 {
            0 => (rng.int(1, 80), 0, 0),
            1 => (1, rng.int(0, 300), 0),
            2 => (rng.int(2, 70), rng.int(1, 300), 0),
            _ => (rng.int(1, 40), rng.int(0, 50), rng.int(1, 9)),
        };
        let kv_len = q_start + t_len + extra;
        let cap = kv_len + rng.pick(&[0, 1, 5, 64]);
        let window = match case % 5 {
            0 | 1 => Some(rng.int(1, kv_len + 3)),
            _ => None,
        };
        let softcap = (case % 4 == 3).then(|| rng.uniform(5.0, 30.0));
        let c = AttnCase {
            t_len,
            hq: hk * group,
            hk,
            d,
            cap,
            p: AttnParams {
                q_start,
                kv_len,
                scale: 1.0 / (d as f32).sqrt(),
                window,
                softcap,
            },
        };
        let what = format!(
            "attention {case}: T={t_len} q_start={q_start} kv_len={kv_len} cap={cap} \
             Hq={} Hk={hk} D={d} window={window:?} softcap={softcap:?}",
            c.hq
        );
        worst = worst.max(run_attention(&mut rng, &c, &what));
    }
    eprintln!("attention: worst NMSE {worst:e}");
}

#[test]
fn attention_long_prefill_crosses_tiles() {
    // Long enough for several key tiles and query blocks, with a window that starts mid-tile.
    let mut rng = Rng(4);
    for (t_len, q_start, window) in [(300, 0, None), (257, 40, Some(100)), (1, 600, None)] {
        let kv_len = q_start + t_len;
        let c = AttnCase {
            t_len,
            hq: 4,
            hk: 2,
            d: 32,
            cap: kv_len + 3,
            p: AttnParams {
                q_start,
                kv_len,
                scale: 0.2,
                window,
                softcap: None,
            },
        };
        run_attention(
            &mut rng,
            &c,
            &format!("attention T={t_len} q_start={q_start}"),
        );
    }
}

/// Lays a flat cache `[hk, kv_len, d]` out in a pool of `blocks` blocks of `b` positions, in
/// the blocks `table` names; every other slot is NaN, so a read through a wrong slot shows.
fn paged(
    flat: &[f32],
    (hk, kv_len, d): (usize, usize, usize),
    table: &[u32],
    b: usize,
    blocks: usize,
) -> Vec<f32> {
    let cap = blocks * b;
    let mut pool = vec![f32::NAN; hk * cap * d];
    for h in 0..hk {
        for j in 0..kv_len {
            let slot = table[j / b] as usize * b + j % b;
            pool[(h * cap + slot) * d..][..d].copy_from_slice(&flat[(h * kv_len + j) * d..][..d]);
        }
    }
    pool
}

/// Decode-sized calls (up to 5 query positions, the most an MTP verification runs) take their
/// own kernels. Each output row must be one function of its position: the same bits alone as
/// alongside other rows (so verifying drafts rounds like decoding them one by one), and the
/// same at every ISA level. Closeness to the f64 reference is `attention_matches_reference`'s.
#[test]
fn decode_attention_rows_are_independent_and_isa_invariant() {
    let mut rng = Rng(21);
    let bits = |t: Tensor| -> Vec<u32> { values(&t).iter().map(|v| v.to_bits()).collect() };
    for case in 0..24 {
        let group = [1, 2, 4, 8][case % 4];
        let hk = rng.int(1, 3);
        let d = rng.pick(&[1, 8, 17, 64, 100, 128, 256]);
        let t_len = rng.int(2, 5);
        // Long enough for several key tiles of 256.
        let q_start = rng.int(0, 700);
        let kv_len = q_start + t_len;
        let cap = kv_len + rng.pick(&[0, 3]);
        let window = (case % 3 == 0).then(|| rng.int(1, kv_len + 3));
        let softcap = (case % 5 == 4).then(|| rng.uniform(5.0, 30.0));
        let p = AttnParams {
            q_start,
            kv_len,
            scale: 1.0 / (d as f32).sqrt(),
            window,
            softcap,
        };
        let hq = hk * group;
        let q = rng.vec(t_len * hq * d, 10.0);
        let k = tensor(&[hk, cap, d], cache(&mut rng, hk, cap, kv_len, d, 1.0));
        let v = tensor(&[hk, cap, d], cache(&mut rng, hk, cap, kv_len, d, 1.0));
        let what = format!("case {case}: T={t_len} q_start={q_start} Hq={hq} Hk={hk} D={d}");
        let at = |level: &str, q: &[f32], rows: usize, p: &AttnParams| {
            let cap = Settings {
                isa_cap: Some(level.parse().unwrap()),
                ..Settings::default()
            };
            kernels::run(Device::Cpu, cap, || {
                bits(ops::attention(&tensor(&[rows, hq, d], q.to_vec()), &k, &v, p).unwrap())
            })
        };
        let all = at("native", &q, t_len, &p);
        for level in crate::common::isa_levels() {
            assert!(
                at(level, &q, t_len, &p) == all,
                "{what}: ISA level {level} differs from native"
            );
        }
        let width = hq * d;
        for t in 0..t_len {
            let one = AttnParams {
                q_start: q_start + t,
                ..p
            };
            let alone = at("native", &q[t * width..(t + 1) * width], 1, &one);
            assert!(
                alone[..] == all[t * width..(t + 1) * width],
                "{what}: row {t} differs alone and in a call of {t_len}"
            );
        }
    }
}

#[test]
fn paged_attention_equals_flat_bit_for_bit() {
    let mut rng = Rng(9);
    // Decode, short and long prefills (several key tiles), windows, GQA, odd block sizes.
    for (case, (t_len, q_start, b, window)) in [
        (1usize, 40usize, 16usize, None::<usize>),
        (7, 0, 16, None),
        (300, 0, 16, Some(100)),
        (60, 230, 5, None),
        (1, 517, 16, Some(64)),
        (33, 100, 1, None),
    ]
    .into_iter()
    .enumerate()
    {
        let (hk, hq, d) = (2, 2 * rng.int(1, 2), 24);
        let kv_len = q_start + t_len;
        let used = kv_len.div_ceil(b);
        let blocks = used * 2 + 3;
        // A scattered table: blocks in a shuffled order over a pool twice the size needed.
        let mut free: Vec<u32> = (0..blocks as u32).collect();
        let table: Vec<u32> = (0..used)
            .map(|_| free.swap_remove(rng.int(0, free.len() - 1)))
            .collect();
        let q = rng.vec(t_len * hq * d, 3.0);
        let k = rng.vec(hk * kv_len * d, 1.0);
        let v = rng.vec(hk * kv_len * d, 1.0);
        let p = AttnParams {
            q_start,
            kv_len,
            scale: 0.3,
            window,
            softcap: (case % 2 == 1).then_some(20.0),
        };
        let q = tensor(&[t_len, hq, d], q);
        let flat = ops::attention(
            &q,
            &tensor(&[hk, kv_len, d], k.clone()),
            &tensor(&[hk, kv_len, d], v.clone()),
            &p,
        )
        .unwrap();
        let pool = |x: &[f32]| {
            tensor(
                &[hk, blocks * b, d],
                paged(x, (hk, kv_len, d), &table, b, blocks),
            )
        };
        let got = ops::attention_paged(&q, &pool(&k), &pool(&v), (&table, b), &p).unwrap();
        assert_eq!(
            values(&got),
            values(&flat),
            "case {case}: paged attention differs from flat (T={t_len}, q_start={q_start}, block {b})"
        );
    }
}

#[test]
fn paged_attention_rejects_bad_tables() {
    let q = tensor(&[1, 2, 8], vec![0.1; 16]);
    let pool = tensor(&[1, 32, 8], vec![0.1; 256]);
    let p = AttnParams {
        q_start: 19,
        kv_len: 20,
        scale: 1.0,
        window: None,
        softcap: None,
    };
    assert!(ops::attention_paged(&q, &pool, &pool, (&[1, 0], 16), &p).is_ok());
    for (table, b) in [
        (&[1u32][..], 16),       // too short for kv_len
        (&[1, 2][..], 16),       // block 2 is outside a 2-block pool
        (&[1, 0][..], 0),        // no block size
        (&[1, 0, 3, 4][..], 10), // 32 slots are not whole blocks of 10
    ] {
        assert!(
            ops::attention_paged(&q, &pool, &pool, (table, b), &p).is_err(),
            "{table:?} in blocks of {b}"
        );
    }
}

#[test]
fn attention_rejects_bad_inputs() {
    let q = tensor(&[2, 4, 8], vec![0.1; 64]);
    let kv = tensor(&[2, 5, 8], vec![0.1; 80]);
    let p = AttnParams {
        q_start: 0,
        kv_len: 2,
        scale: 1.0,
        window: None,
        softcap: None,
    };
    assert!(ops::attention(&q, &kv, &kv, &p).is_ok());
    let bad = |q: &Tensor, k: &Tensor, v: &Tensor, p: AttnParams| {
        assert!(
            ops::attention(q, k, v, &p).is_err(),
            "{q:?} {k:?} {v:?} {p:?}"
        );
    };
    bad(&tensor(&[2, 3, 8], vec![0.1; 48]), &kv, &kv, p); // Hq not a multiple of Hk
    bad(&tensor(&[8, 8], vec![0.1; 64]), &kv, &kv, p);
    bad(&q, &tensor(&[2, 5, 4], vec![0.1; 40]), &kv, p);
    bad(&q, &kv, &tensor(&[2, 4, 8], vec![0.1; 64]), p);
    bad(&q, &kv, &kv, AttnParams { kv_len: 6, ..p }); // past capacity
    bad(&q, &kv, &kv, AttnParams { q_start: 1, ..p }); // queries past kv_len
    bad(
        &q,
        &kv,
        &kv,
        AttnParams {
            window: Some(0),
            ..p
        },
    );
    for c in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        bad(
            &q,
            &kv,
            &kv,
            AttnParams {
                softcap: Some(c),
                ..p
            },
        );
    }
}

// ---------------------------------------------------------------- kv_write

#[test]
fn kv_write_places_rows() {
    let mut rng = Rng(5);
    for _ in 0..20 {
        let (hk, d, cap) = (rng.int(1, 4), rng.int(1, 9), rng.int(1, 20));
        let t_len = rng.int(0, cap);
        let pos = rng.int(0, cap - t_len);
        let old = rng.vec(hk * cap * d, 1.0);
        let new = rng.vec(t_len * hk * d, 1.0);
        let mut c = tensor(&[hk, cap, d], old.clone());
        ops::kv_write(&mut c, &tensor(&[t_len, hk, d], new.clone()), pos).unwrap();
        let mut want = old;
        for t in 0..t_len {
            for h in 0..hk {
                for i in 0..d {
                    want[(h * cap + pos + t) * d + i] = new[(t * hk + h) * d + i];
                }
            }
        }
        assert_eq!(values(&c), want);
    }
}

#[test]
fn kv_write_rejects_bad_inputs_and_leaves_cache() {
    let before = vec![7.0f32; 2 * 4 * 3];
    let mut c = tensor(&[2, 4, 3], before.clone());
    let new = tensor(&[2, 2, 3], vec![1.0; 12]);
    assert!(ops::kv_write(&mut c, &new, 3).is_err()); // past capacity
    assert!(ops::kv_write(&mut c, &tensor(&[2, 1, 3], vec![1.0; 6]), 0).is_err());
    assert!(ops::kv_write(&mut c, &tensor(&[2, 2, 2], vec![1.0; 8]), 0).is_err());
    assert!(ops::kv_write(&mut c, &tensor(&[4, 3], vec![1.0; 12]), 0).is_err());
    let half = Tensor::from_slice(&[2, 2, 3], DType::BF16, &[bf16::ONE; 12]).unwrap();
    assert!(ops::kv_write(&mut c, &half, 0).is_err());
    assert_eq!(values(&c), before);
}

// ---------------------------------------------------------------- softmax family

fn softmax_ref(x: &[f32], n: usize, log: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let m = row
            .iter()
            .map(|&v| v as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let log_sum = row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        out.extend(row.iter().map(|&v| {
            let l = (v as f64 - m) - log_sum;
            if log {
                l
            } else {
                l.exp()
            }
        }));
    }
    out
}

#[test]
fn softmax_and_log_softmax_match_reference() {
    let mut rng = Rng(6);
    for case in 0..40 {
        let rows = rng.int(1, 6);
        let n = rng.pick(&[1, 2, 3, 17, 100, 401, 4099]);
        let mag = rng.pick(&[1.0, 10.0, 60.0]);
        let mut x = rng.vec(rows * n, mag);
        // Masked entries, never a whole row here (that case has its own test).
        for row in x.chunks_mut(n).filter(|_| n > 1) {
            for _ in 0..rng.int(0, n - 1) {
                row[rng.int(1, n - 1)] = f32::NEG_INFINITY;
            }
        }
        let xt = tensor(&[rows, n], x.clone());
        let what = format!("case {case} [{rows}, {n}]");
        let sm = ops::softmax(&xt).unwrap();
        check(
            &format!("softmax {what}"),
            &values(&sm),
            &softmax_ref(&x, n, false),
            ELEMENTWISE,
        );
        let ls = ops::log_softmax(&xt).unwrap();
        check(
            &format!("log_softmax {what}"),
            &values(&ls),
            &softmax_ref(&x, n, true),
            ELEMENTWISE,
        );
    }
}

#[test]
fn softmax_edge_rows() {
    let ninf = f32::NEG_INFINITY;
    let x = tensor(
        &[3, 3],
        vec![ninf, ninf, ninf, 0.0, f32::NAN, 1.0, 1e30, -1e30, 1e30],
    );
    let sm = values(&ops::softmax(&x).unwrap());
    assert_eq!(&sm[..3], &[0.0; 3], "fully masked row");
    assert!(
        sm[3..6].iter().all(|v| v.is_nan()),
        "NaN must not be hidden: {sm:?}"
    );
    assert_eq!(&sm[6..], &[0.5, 0.0, 0.5]);
    let ls = values(&ops::log_softmax(&x).unwrap());
    assert_eq!(&ls[..3], &[ninf; 3]);
    assert!(ls[3..6].iter().all(|v| v.is_nan()));
    assert_eq!(ls[7], -2e30);
    approx::assert_abs_diff_eq!(ls[6], -std::f32::consts::LN_2, epsilon = 1e-7);
    // Empty rows and a scalar.
    assert_eq!(
        ops::softmax(&tensor(&[2, 0], vec![])).unwrap().shape(),
        &[2, 0]
    );
    assert!(ops::softmax(&tensor(&[], vec![1.0])).is_err());
    assert!(ops::log_softmax(&tensor(&[], vec![1.0])).is_err());
}

// ---------------------------------------------------------------- activations

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

type Unary = (
    &'static str,
    fn(&Tensor) -> kernels::Result<Tensor>,
    fn(f64) -> f64,
);

const ACTIVATIONS: [Unary; 6] = [
    ("silu", ops::silu, |x| x * sigmoid_ref(x)),
    ("sigmoid", ops::sigmoid, sigmoid_ref),
    ("softplus", ops::softplus, |x| {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }),
    // ½(1 + tanh u) = sigmoid(2u) exactly; the sigmoid form keeps f64's precision on the
    // negative tail, where 1 + tanh u cancels.
    ("gelu_tanh", ops::gelu_tanh, |x| {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
        x * sigmoid_ref(2.0 * u)
    }),
    // Gemma's final-logit cap c·tanh(x/c), at its real cap (30) and at a small one where
    // most inputs saturate.
    (
        "softcap 30",
        |x| ops::softcap(x, 30.0),
        |x| 30.0 * (x / 30.0).tanh(),
    ),
    (
        "softcap 2",
        |x| ops::softcap(x, 2.0),
        |x| 2.0 * (x / 2.0).tanh(),
    ),
];

#[test]
fn activations_match_reference() {
    let mut rng = Rng(7);
    for (name, op, f) in ACTIVATIONS {
        for scale in [0.5, 4.0, 20.0] {
            let n = rng.int(1, 5000);
            let x = rng.vec(n, scale);
            let got = op(&tensor(&[n], x.clone())).unwrap();
            let want: Vec<f64> = x.iter().map(|&v| f(v as f64)).collect();
            check(
                &format!("{name} ±{scale}"),
                &values(&got),
                &want,
                ELEMENTWISE,
            );
        }
    }
}

#[test]
fn activations_keep_tails_and_limits() {
    let inf = f32::INFINITY;
    // Tails where the value is tiny but representable must keep relative precision (the
    // exponential amplifies f32 rounding of its argument, hence the looser 5e-5).
    let tails = [
        -80.0f32, -50.0, -20.0, -8.0, -5.0, -3.0, 5.0, 20.0, 50.0, 1e4, 3e38,
    ];
    for (name, op, f) in ACTIVATIONS {
        let got = values(&op(&tensor(&[tails.len()], tails.to_vec())).unwrap());
        for (&x, &g) in tails.iter().zip(&got) {
            let want = f(x as f64);
            let tiny = want.abs() < 1e-37; // below f32's normal range: only absolute error
            let err = (g as f64 - want).abs();
            let ok = if tiny {
                err < 1e-37
            } else {
                err <= 5e-5 * want.abs()
            };
            assert!(ok, "{name}({x}) = {g:e}, want {want:e}");
        }
        if name.starts_with("softcap") {
            continue; // its limits are ±c: softcap_saturates_and_keeps_tiny_values
        }
        let lim = values(&op(&tensor(&[3], vec![-inf, inf, f32::NAN])).unwrap());
        let want_hi = if name == "sigmoid" { 1.0 } else { inf };
        assert_eq!(lim[0], 0.0, "{name}(-inf)");
        assert_eq!(lim[1], want_hi, "{name}(inf)");
        assert!(lim[2].is_nan(), "{name}(NaN)");
    }
}

#[test]
fn softcap_saturates_and_keeps_tiny_values() {
    let inf = f32::INFINITY;
    let x = vec![-inf, inf, f32::NAN, 0.0, -0.0, 1e-30, -3e-8, 1e30];
    let got = values(&ops::softcap(&tensor(&[x.len()], x), 30.0).unwrap());
    assert_eq!((got[0], got[1]), (-30.0, 30.0));
    assert!(got[2].is_nan());
    assert_eq!(
        (got[3].to_bits(), got[4].to_bits()),
        (0.0f32.to_bits(), (-0.0f32).to_bits())
    );
    // Near 0 tanh(y) ≈ y: no cancellation may eat the value.
    assert!((got[5] / 1e-30 - 1.0).abs() < 1e-6, "{:e}", got[5]);
    assert!((got[6] / -3e-8 - 1.0).abs() < 1e-6, "{:e}", got[6]);
    assert_eq!(got[7], 30.0);
    assert!(ops::softcap(&tensor(&[1], vec![1.0]), 0.0).is_err());
}

#[test]
fn scale_multiplies() {
    let mut rng = Rng(8);
    let x = rng.vec(777, 3.0);
    let got = ops::scale(&tensor(&[7, 111], x.clone()), -0.37).unwrap();
    assert_eq!(got.shape(), &[7, 111]);
    let want: Vec<f64> = x.iter().map(|&v| v as f64 * -0.37f32 as f64).collect();
    check("scale", &values(&got), &want, ELEMENTWISE);
}

// ---------------------------------------------------------------- binary

#[test]
fn add_mul_swiglu_match_reference() {
    let mut rng = Rng(9);
    let silu = |g: f64| g * sigmoid_ref(g);
    for case in 0..30 {
        let a_shape: Vec<usize> = (0..rng.int(1, 3)).map(|_| rng.int(1, 40)).collect();
        // Same shape, or a suffix of it (broadcast over leading dims), or a scalar.
        let keep = rng.int(0, a_shape.len());
        let b_shape = a_shape[a_shape.len() - keep..].to_vec();
        let (na, nb) = (
            a_shape.iter().product::<usize>(),
            b_shape.iter().product::<usize>(),
        );
        let a = rng.vec(na, 5.0);
        let b = rng.vec(nb, 5.0);
        let (at, bt) = (tensor(&a_shape, a.clone()), tensor(&b_shape, b.clone()));
        let pairs = || (0..na).map(|i| (a[i] as f64, b[i % nb] as f64));
        let what = format!("case {case} {a_shape:?} ∘ {b_shape:?}");
        let sum = ops::add(&at, &bt).unwrap();
        assert_eq!(sum.shape(), &a_shape[..]);
        let want: Vec<f64> = pairs().map(|(x, y)| x + y).collect();
        check(&format!("add {what}"), &values(&sum), &want, ELEMENTWISE);
        let prod = ops::mul(&at, &bt).unwrap();
        let want: Vec<f64> = pairs().map(|(x, y)| x * y).collect();
        check(&format!("mul {what}"), &values(&prod), &want, ELEMENTWISE);
        if keep == a_shape.len() {
            let sw = ops::swiglu(&at, &bt).unwrap();
            let want: Vec<f64> = pairs().map(|(g, u)| silu(g) * u).collect();
            check(&format!("swiglu {what}"), &values(&sw), &want, ELEMENTWISE);
        }
    }
}

#[test]
fn binary_rejects_bad_shapes() {
    let a = tensor(&[2, 4], vec![1.0; 8]);
    for b in [
        tensor(&[3], vec![1.0; 3]),
        tensor(&[2], vec![1.0; 2]),
        tensor(&[1, 2, 4], vec![1.0; 8]),
    ] {
        assert!(ops::add(&a, &b).is_err(), "{b:?}");
        assert!(ops::mul(&a, &b).is_err(), "{b:?}");
    }
    assert!(ops::swiglu(&a, &tensor(&[4], vec![1.0; 4])).is_err());
    assert!(ops::swiglu(&a, &tensor(&[8], vec![1.0; 8])).is_err());
    let half = Tensor::from_slice(&[2, 4], DType::BF16, &[bf16::ONE; 8]).unwrap();
    assert!(ops::add(&a, &half).is_err());
    assert!(ops::mul(&half, &a).is_err());
}

// ---------------------------------------------------------------- argmax / top_k

/// Values with many exact ties, signed zeros and NaN.
fn tie_row(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.int(0, 9) {
            0 => f32::NAN,
            1 => -0.0,
            2 => 0.0,
            3 => f32::NEG_INFINITY,
            _ => rng.int(0, 4) as f32 - 2.0,
        })
        .collect()
}

/// Indices best first: value descending (NaN after everything, `-0.0 == 0.0`), then index.
fn ranking(x: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| {
        let (p, q) = (x[a], x[b]);
        match (p.is_nan(), q.is_nan()) {
            (false, false) => q.partial_cmp(&p).unwrap(),
            (pn, qn) => pn.cmp(&qn),
        }
        .then(a.cmp(&b))
    });
    idx
}

#[test]
fn argmax_takes_lowest_index_of_the_max() {
    let mut rng = Rng(10);
    for _ in 0..40 {
        let (rows, n) = (rng.int(1, 5), rng.int(1, 60));
        let x: Vec<f32> = (0..rows).flat_map(|_| tie_row(&mut rng, n)).collect();
        let got = ops::argmax(&tensor(&[rows, n], x.clone())).unwrap();
        let want: Vec<u32> = x.chunks(n).map(|r| ranking(r)[0] as u32).collect();
        // An all-NaN row has no max; the op documents index 0 (as `ranking` gives).
        assert_eq!(got, want, "{x:?}");
    }
    assert_eq!(
        ops::argmax(&tensor(&[3], vec![f32::NAN; 3])).unwrap(),
        vec![0]
    );
    assert_eq!(
        ops::argmax(&tensor(&[3], vec![-0.0, 0.0, -1.0])).unwrap(),
        vec![0]
    );
    assert!(ops::argmax(&tensor(&[], vec![1.0])).is_err());
    assert!(ops::argmax(&tensor(&[2, 0], vec![])).is_err());
}

#[test]
fn top_k_orders_ties_by_index() {
    let mut rng = Rng(11);
    for _ in 0..60 {
        let n = rng.int(1, 80);
        let x = tie_row(&mut rng, n);
        let xt = tensor(&[n], x.clone());
        for k in [0, 1, 3, n / 2, n, n + 5] {
            let got = ops::top_k(&xt, k).unwrap();
            let want: Vec<(u32, u32)> = ranking(&x)
                .into_iter()
                .take(k)
                .map(|i| (i as u32, x[i].to_bits()))
                .collect();
            let got: Vec<(u32, u32)> = got.into_iter().map(|(i, v)| (i, v.to_bits())).collect();
            assert_eq!(got, want, "k={k} x={x:?}");
        }
    }
    assert!(ops::top_k(&tensor(&[2, 2], vec![1.0; 4]), 1).is_err());
    assert!(ops::top_k(&tensor(&[0], vec![]), 3).unwrap().is_empty());
}

// ---------------------------------------------------------------- determinism

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn every_op_is_bit_identical_across_thread_counts() {
    let mut rng = Rng(12);
    // Sizes past every parallel threshold (2^14 elements per row op, 2^15 per map).
    let (rows, n) = (64, 1031);
    let x = tensor(&[rows, n], rng.vec(rows * n, 4.0));
    let y = tensor(&[rows, n], rng.vec(rows * n, 4.0));
    let bias = tensor(&[n], rng.vec(n, 1.0));
    let (w, _) = weight(&mut rng, n, DType::BF16);
    let (t_len, h, d) = (300, 8, 64);
    let heads = tensor(&[t_len, h, d], rng.vec(t_len * h * d, 2.0));
    let positions: Vec<usize> = (0..t_len).map(|t| 7 * t + 3).collect();
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|i| 10_000f32.powf(-((2 * i) as f32) / d as f32))
        .collect();
    let (hk, cap) = (4, t_len + 20);
    let k = tensor(&[hk, cap, d], rng.vec(hk * cap * d, 1.0));
    let v = tensor(&[hk, cap, d], rng.vec(hk * cap * d, 1.0));
    let p = AttnParams {
        q_start: 10,
        kv_len: t_len + 10,
        scale: 0.125,
        window: Some(200),
        softcap: Some(30.0),
    };
    let decode = AttnParams {
        q_start: t_len + 9,
        ..p
    };
    let q1 = heads.narrow0(0, 1).unwrap();

    let run = || -> Vec<Vec<u32>> {
        let bits = |t: Tensor| t.f32s().unwrap().iter().map(|v| v.to_bits()).collect();
        let mut out: Vec<Vec<u32>> = vec![
            bits(ops::rms_norm(&x, Some(&w), 1e-6).unwrap()),
            bits(ops::rope(&heads, &positions, &inv_freq, RopeLayout::HalfSplit).unwrap()),
            bits(ops::rope(&heads, &positions, &inv_freq[..8], RopeLayout::Interleaved).unwrap()),
            bits(ops::attention(&heads, &k, &v, &p).unwrap()),
            bits(ops::attention(&q1, &k, &v, &decode).unwrap()),
            bits(ops::softmax(&x).unwrap()),
            bits(ops::log_softmax(&x).unwrap()),
            bits(ops::silu(&x).unwrap()),
            bits(ops::gelu_tanh(&x).unwrap()),
            bits(ops::sigmoid(&x).unwrap()),
            bits(ops::softplus(&x).unwrap()),
            bits(ops::scale(&x, 0.3).unwrap()),
            bits(ops::add(&x, &y).unwrap()),
            bits(ops::add(&x, &bias).unwrap()),
            bits(ops::mul(&x, &y).unwrap()),
            bits(ops::mul(&x, &bias).unwrap()),
            bits(ops::swiglu(&x, &y).unwrap()),
            ops::argmax(&x).unwrap(),
        ];
        let flat = x.reshape(&[rows * n]).unwrap();
        out.push(
            ops::top_k(&flat, 50)
                .unwrap()
                .iter()
                .flat_map(|&(i, v)| [i, v.to_bits()])
                .collect(),
        );
        let mut c = tensor(&[hk, cap, d], vec![0.0; hk * cap * d]);
        ops::kv_write(&mut c, &heads.narrow(1, 0, hk).unwrap(), 5).unwrap();
        out.push(bits(c));
        out
    };
    let one = in_pool(1, run);
    let two = in_pool(2, run);
    for (i, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(a == b, "op #{i} differs between 1 and 2 threads");
    }
}

// ---------------------------------------------------------------- causal_conv1d

/// `out[t][c] = Σ_j w[c][j] · [state; x][t + j][c]`, optionally through SiLU, from the
/// definition (the last tap multiplies the current position).
fn causal_conv1d_ref(x: &[f32], w: &[f32], state: &[f32], c: usize, silu: bool) -> Vec<f64> {
    let k = w.len() / c;
    let full: Vec<f32> = state.iter().chain(x).copied().collect();
    let t = x.len() / c;
    let mut out = Vec::with_capacity(t * c);
    for i in 0..t {
        for ch in 0..c {
            let y: f64 = (0..k)
                .map(|j| w[ch * k + j] as f64 * full[(i + j) * c + ch] as f64)
                .sum();
            out.push(if silu { y * sigmoid_ref(y) } else { y });
        }
    }
    out
}

/// Both activations (LFM2's short conv has none, Gated DeltaNet's applies SiLU), kernels of 1
/// to 4 taps, fed whole and in pieces: every piece matches the reference over the whole
/// sequence, and the carried state ends as the last `K − 1` inputs.
#[test]
fn causal_conv1d_matches_reference_whole_and_in_pieces() {
    let mut rng = Rng(31);
    for silu in [false, true] {
        for k in 1..=4 {
            let (c, t) = (rng.int(1, 40), rng.int(1, 30));
            let (w, x, s0) = (
                rng.vec(c * k, 1.0),
                rng.vec(t * c, 2.0),
                rng.vec((k - 1) * c, 2.0),
            );
            let want = causal_conv1d_ref(&x, &w, &s0, c, silu);
            let wt = tensor(&[c, k], w.clone());
            let mut state = tensor(&[k - 1, c], s0.clone());
            let cut = rng.int(0, t);
            let mut got = Vec::new();
            for (a, b) in [(0, cut), (cut, t)] {
                if a == b {
                    continue;
                }
                let piece = tensor(&[b - a, c], x[a * c..b * c].to_vec());
                got.extend(values(
                    &ops::causal_conv1d(&piece, &wt, &mut state, silu).unwrap(),
                ));
            }
            let what = format!("causal_conv1d silu={silu} K={k} C={c} T={t} cut {cut}");
            check(&what, &got, &want, ELEMENTWISE);
            let full: Vec<f32> = s0.iter().chain(&x).copied().collect();
            let tail = &full[full.len() - (k - 1) * c..];
            assert_eq!(values(&state), tail, "{what}: carried state");
        }
    }
}
