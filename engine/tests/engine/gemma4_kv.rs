//! Gemma 4's sliding-window KV cache: the rotating cache (memory bounded by the window) against
//! the flat one (every position, masked), on the tiny model whose window is 32, with a 300-token
//! prompt prefilled whole and in pieces that straddle the wrap, then decoded. The flat cache is
//! the reference (it is what the goldens and the mlx-lm references were first checked with).

use engine::cache::{LayerState, ModelState};
use engine::generate::{self, GenerateRequest, SamplingParams};
use engine::layers::GdnPath;
use engine::models::{self, CausalLm};
use synth::cached as synth_cached;
use synth::{Format, Size, SynthSpec};

const WINDOW: usize = 32;
/// Pieces summing to 300 that end before, on and after multiples of the window, one of them
/// longer than two windows.
const PIECES: [usize; 9] = [5, 27, 1, 31, 33, 64, 100, 8, 31];

fn model(format: Format) -> Box<dyn CausalLm> {
    let dir = synth_cached(&SynthSpec::new("gemma4", Size::Tiny, format)).unwrap();
    models::load(&dir).unwrap()
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 193 + 11) % 1021).collect()
}

/// Last-position logits after prefilling `ids` in `pieces` (whole when empty).
fn prefill(m: &dyn CausalLm, ids: &[u32], pieces: &[usize], flat: bool) -> (Vec<f32>, ModelState) {
    let mut s = m.new_state();
    if flat {
        s = s.with_flat_kv().unwrap();
    }
    let mut logits = None;
    let mut at = 0;
    for &p in pieces
        .iter()
        .chain(std::iter::once(&(ids.len() - pieces.iter().sum::<usize>())))
    {
        if p == 0 {
            continue;
        }
        logits = Some(m.forward(&ids[at..at + p], &mut s, false).unwrap());
        at += p;
    }
    (logits.unwrap().to_vec_f32().unwrap(), s)
}

fn greedy(m: &dyn CausalLm, ids: &[u32], step: Option<usize>, flat: bool) -> Vec<Vec<(u32, f32)>> {
    let req = GenerateRequest {
        prompt_ids: ids.to_vec(),
        max_tokens: 40,
        sampling: SamplingParams::greedy(),
        stop_ids: vec![],
        top_logprobs: 4,
        prefill_step: step,
        gdn_path: GdnPath::Auto,
        flat_kv: flat,
        mtp: None,
        paged_kv: None,
        kernels: Default::default(),
    };
    let out = generate::generate(m, &req, |_| {}).unwrap();
    assert_eq!(out.tokens.len(), 40);
    out.top_logprobs.unwrap()
}

#[test]
fn rotating_cache_is_bit_identical_to_the_flat_one_whole_in_pieces_and_in_decode() {
    assert_eq!(PIECES.iter().sum::<usize>(), 300);
    let ids = prompt(300);
    for format in [Format::F32, Format::Q4] {
        let m = model(format);
        assert!(m.info().layer_kinds[0].contains(&format!("({WINDOW})")));
        for pieces in [&[][..], &PIECES[..]] {
            let (rot, _) = prefill(m.as_ref(), &ids, pieces, false);
            let (flat, _) = prefill(m.as_ref(), &ids, pieces, true);
            assert!(
                rot == flat,
                "{format:?}, pieces {pieces:?}: rotating logits differ from flat"
            );
        }
        // Whole and pieced prefill agree on the token and closely on the logits (different
        // matmul shapes round differently, so not bit for bit).
        let (whole, _) = prefill(m.as_ref(), &ids, &[], false);
        let (pieced, _) = prefill(m.as_ref(), &ids, &PIECES, false);
        let argmax = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
        assert_eq!(argmax(&whole), argmax(&pieced), "{format:?}");
        let worst = whole
            .iter()
            .zip(&pieced)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-3,
            "{format:?}: whole vs pieces differ by {worst}"
        );
        // Decoding 40 tokens past several wraps: every step's top-4 log-probs equal.
        for step in [None, Some(33)] {
            assert_eq!(
                greedy(m.as_ref(), &ids, step, false),
                greedy(m.as_ref(), &ids, step, true),
                "{format:?}, prefill step {step:?}"
            );
        }
        let whole_tokens: Vec<u32> = greedy(m.as_ref(), &ids, None, false)
            .iter()
            .map(|s| s[0].0)
            .collect();
        let pieced_tokens: Vec<u32> = greedy(m.as_ref(), &ids, Some(33), false)
            .iter()
            .map(|s| s[0].0)
            .collect();
        assert_eq!(whole_tokens, pieced_tokens, "{format:?}");
    }
}

#[test]
fn kv_shared_layers_hold_no_cache_and_sliding_caches_stay_within_twice_the_window() {
    let m = model(Format::F32);
    let kinds = m.info().layer_kinds.clone();
    let shared: Vec<usize> = (0..kinds.len())
        .filter(|&i| kinds[i].contains("kv-shared"))
        .collect();
    assert_eq!(shared, [4, 5], "{kinds:?}");
    let ids = prompt(300);
    let (_, mut rot) = prefill(m.as_ref(), &ids, &PIECES, false);
    let (_, mut flat) = prefill(m.as_ref(), &ids, &PIECES, true);
    for _ in 0..45 {
        m.forward(&[7], &mut rot, false).unwrap();
        m.forward(&[7], &mut flat, false).unwrap();
    }
    let pos = 345;
    for (i, (layer, kind)) in rot.layers.iter().zip(&kinds).enumerate() {
        let LayerState::Kv(c) = layer else {
            panic!("layer {i}: {}", layer.kind())
        };
        if shared.contains(&i) {
            assert_eq!((c.capacity(), c.len, c.bytes()), (0, 0, 0), "layer {i}");
        } else if kind.starts_with("sliding") {
            assert!(c.capacity() <= 2 * WINDOW, "layer {i}: {}", c.capacity());
            assert!(c.len >= WINDOW - 1 && c.pos() == pos, "layer {i}");
        } else {
            assert_eq!(
                (c.start, c.len),
                (0, pos),
                "layer {i}: full layers keep everything"
            );
        }
    }
    let (r, f) = (rot.kv_bytes(), flat.kv_bytes());
    assert!(r < f, "rotating {r} bytes, flat {f}");
}
