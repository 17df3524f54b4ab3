//! Gated DeltaNet and its causal conv on CUDA (`gdn.cu`), the CPU's algorithms (docs/design.md §5).
//!
//! The chunked path works on "slabs": one per (value head, chunk), the chunk zero-padded to
//! `L` steps (padding with q = k = v = β = 0 and g = 0 changes no real row). Per slab, in
//! parallel over all of them: gather, decays as segment sums, `[q; k]·kᵀ` (one batched cuBLAS
//! product), masks, `(I + A)⁻¹` by forward substitution, `U = M(β⊙v)` and `W = M(β⊙e^G⊙k)`
//! (batched products). Then chunk by chunk, batched over heads: `[o; Δ] = [0; U] − [−e^G⊙q; W]·Sᵀ`
//! and `S ← e^(G_last)·S + Δᵀ·(k⊙e^(G_last − G))`; finally `o += P·Δ` for every slab at once and
//! the outputs are scattered back to `[T, Hv, Dv]`.

use super::blas::{Gemm, In, Operand};
use super::context::gpu;
use super::launch::{self, int};
use super::sources::GDN;
use super::{empty, f32_on_device, make_mut, ptr, zeros};
use crate::error::Result;
use crate::{DType, Error, Tensor};

pub(crate) fn gdn_gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    let op = "gdn_gate";
    let (a, a_log, dt_bias) = (
        f32_on_device(op, a)?,
        f32_on_device(op, a_log)?,
        f32_on_device(op, dt_bias)?,
    );
    let out = empty(a.shape(), DType::F32)?;
    if a.numel() > 0 {
        let (ap, lp, dp, op_) = (ptr(&a)?, ptr(&a_log)?, ptr(&dt_bias)?, ptr(&out)?);
        let (n, hv) = (a.numel() as i64, int(op, "value heads", a.dim(1))?);
        gpu()?.launch(
            &GDN,
            "gdn_gate",
            launch::elements(op, a.numel())?,
            &[&ap, &lp, &dp, &op_, &n, &hv],
        )?;
    }
    Ok(out)
}

/// The sizes of one call (shapes checked by `ops`).
struct Dims {
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
}

impl Dims {
    fn of(q: &Tensor, v: &Tensor) -> Result<Dims> {
        let d = Dims {
            t: q.dim(0),
            hk: q.dim(1),
            hv: v.dim(1),
            dk: q.dim(2),
            dv: v.dim(2),
        };
        if d.dk > launch::GDN_MAX_DK {
            return Err(Error::Unsupported {
                op: "Gated DeltaNet with key head dim > 256",
                backend: "cuda",
            });
        }
        Ok(d)
    }
}

impl Dims {
    /// T, Hk, Hv, Dk, Dv as the kernels' `int`s.
    fn ints(&self, op: &'static str) -> Result<[i32; 5]> {
        Ok([
            int(op, "tokens", self.t)?,
            int(op, "key heads", self.hk)?,
            int(op, "value heads", self.hv)?,
            int(op, "key dim", self.dk)?,
            int(op, "value dim", self.dv)?,
        ])
    }
}

/// What both recurrence paths start from: sizes, the five f32 inputs on the device (q, k, v,
/// g_log, beta), the state's address (written in place, copied first when shared) and the
/// output buffer.
struct Call {
    d: Dims,
    x: [Tensor; 5],
    state: u64,
    y: Tensor,
}

impl Call {
    fn new(op: &'static str, ts: [&Tensor; 5], state: &mut Tensor) -> Result<Call> {
        let d = Dims::of(ts[0], ts[2])?;
        let [q, k, v, g, b] = ts;
        let x = [
            f32_on_device(op, q)?,
            f32_on_device(op, k)?,
            f32_on_device(op, v)?,
            f32_on_device(op, g)?,
            f32_on_device(op, b)?,
        ];
        let state = make_mut(state)?;
        let y = empty(&[d.t, d.hv, d.dv], DType::F32)?;
        Ok(Call { d, x, state, y })
    }

    /// Device addresses of q, k, v, g_log, beta.
    fn ptrs(&self) -> Result<[u64; 5]> {
        let [q, k, v, g, b] = &self.x;
        Ok([ptr(q)?, ptr(k)?, ptr(v)?, ptr(g)?, ptr(b)?])
    }
}

pub(crate) fn gdn_recurrent(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
) -> Result<Tensor> {
    let op = "gdn_recurrent";
    let c = Call::new(op, [q, k, v, g_log, beta], state)?;
    if c.d.t == 0 {
        return Ok(c.y);
    }
    let [qp, kp, vp, gp, bp] = c.ptrs()?;
    let yp = ptr(&c.y)?;
    let [t, hk, hv, dk, dv] = c.d.ints(op)?;
    gpu()?.launch(
        &GDN,
        "gdn_recurrent",
        launch::gdn_recurrent(c.d.hv, c.d.dv)?,
        &[
            &qp, &kp, &vp, &gp, &bp, &c.state, &yp, &t, &hk, &hv, &dk, &dv,
        ],
    )?;
    Ok(c.y)
}

/// Slab buffers of one chunked call; `b` slabs of `l` steps.
struct Slabs {
    b: usize,
    /// `[b, 2l, Dk]`: q rows over k rows.
    qk: Tensor,
    /// `[b, 2l, Dk]`: `−e^G⊙q` over `W`.
    qw: Tensor,
    /// `[b, l, Dk]` each: `β⊙e^G⊙k` and `k⊙e^(G_last − G)`.
    kw: Tensor,
    kt: Tensor,
    /// `[b, l, Dv]`: `β⊙v`.
    bv: Tensor,
    /// `[b, l]` each: gates, betas, head and tail decays.
    g: Tensor,
    beta: Tensor,
    head: Tensor,
    tail: Tensor,
    /// `[b, l, l]`: segment decays; `M = (I + A)⁻¹`.
    dec: Tensor,
    m: Tensor,
    /// `[b, 2l, l]`: `[q; k]·kᵀ`, then `P` over `A`.
    scores: Tensor,
    /// `[b, 2l, Dv]`: `[o; Δ]`, starting as `[0; U]`.
    od: Tensor,
}

impl Slabs {
    fn new(b: usize, l: usize, dk: usize, dv: usize) -> Result<Slabs> {
        let f = |shape: &[usize]| empty(shape, DType::F32);
        Ok(Slabs {
            b,
            qk: f(&[b, 2 * l, dk])?,
            qw: f(&[b, 2 * l, dk])?,
            kw: f(&[b, l, dk])?,
            kt: f(&[b, l, dk])?,
            bv: f(&[b, l, dv])?,
            g: f(&[b, l])?,
            beta: f(&[b, l])?,
            head: f(&[b, l])?,
            tail: f(&[b, l])?,
            dec: f(&[b, l, l])?,
            m: f(&[b, l, l])?,
            scores: f(&[b, 2 * l, l])?,
            od: zeros(&[b, 2 * l, dv], DType::F32)?,
        })
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn gdn_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_log: &Tensor,
    beta: &Tensor,
    state: &mut Tensor,
    chunk: usize,
) -> Result<Tensor> {
    let op = "gdn_chunked";
    let call = Call::new(op, [q, k, v, g_log, beta], state)?;
    let (d, sp) = (&call.d, call.state);
    if d.t == 0 {
        return Ok(call.y);
    }
    // Any chunk length computes the same values; the slab kernels hold at most GDN_MAX_L rows.
    let l = chunk.min(launch::GDN_MAX_L).min(d.t);
    let chunks = d.t.div_ceil(l);
    let s = Slabs::new(d.hv * chunks, l, d.dk, d.dv)?;
    let gpu = gpu()?;
    let [ti, hki, hvi, dki, dvi] = d.ints(op)?;
    let (ci, li) = (int(op, "chunks", chunks)?, l as i32);
    let slabs = s.b as i64;
    let p = |t: &Tensor| ptr(t);

    // Gather the slabs.
    let [qp, kp, vp, gp, bp] = call.ptrs()?;
    let (qkp, sgp, sbp, bvp) = (p(&s.qk)?, p(&s.g)?, p(&s.beta)?, p(&s.bv)?);
    gpu.launch(
        &GDN,
        "gdn_gather_qk",
        launch::elements(op, s.b * l * d.dk)?,
        &[&qp, &kp, &qkp, &ti, &hki, &hvi, &dki, &ci, &li],
    )?;
    gpu.launch(
        &GDN,
        "gdn_gather_v",
        launch::elements(op, s.b * l * d.dv)?,
        &[&vp, &gp, &bp, &sgp, &sbp, &bvp, &ti, &hvi, &dvi, &ci, &li],
    )?;

    // Decays, scores, masks, inverse.
    let (hp, tp, dp, mp, scp) = (
        p(&s.head)?,
        p(&s.tail)?,
        p(&s.dec)?,
        p(&s.m)?,
        p(&s.scores)?,
    );
    gpu.launch(
        &GDN,
        "gdn_decays",
        launch::slabs(s.b, l)?,
        &[&sgp, &hp, &tp, &dp, &li],
    )?;
    // [q; k]·kᵀ: (2l × Dk)·(Dk × l) per slab.
    let slab = |ptr: u64, ld: usize, elems: usize| Operand::rows(ptr, ld).batched(elems);
    gemm(
        s.b,
        (2 * l, l, d.dk),
        slab(qkp, d.dk, 2 * l * d.dk),
        slab(at(qkp, l * d.dk), d.dk, 2 * l * d.dk).t(),
        slab(scp, l, 2 * l * l),
        (1.0, 0.0),
    )?;
    gpu.launch(
        &GDN,
        "gdn_masks",
        launch::elements(op, s.b * l * l)?,
        &[&scp, &dp, &sbp, &li, &slabs],
    )?;
    gpu.launch(
        &GDN,
        "gdn_inverse",
        launch::slabs(s.b, l)?,
        &[&scp, &mp, &li],
    )?;

    // kw, kt and −e^G⊙q; then U = M·(β⊙v) into od's lower half and W = M·kw into qw's.
    let (kwp, ktp, qwp, odp) = (p(&s.kw)?, p(&s.kt)?, p(&s.qw)?, p(&s.od)?);
    gpu.launch(
        &GDN,
        "gdn_prep",
        launch::elements(op, s.b * l * d.dk)?,
        &[&qkp, &sbp, &hp, &tp, &kwp, &ktp, &qwp, &dki, &li, &slabs],
    )?;
    let m_op = slab(mp, l, l * l);
    gemm(
        s.b,
        (l, d.dv, l),
        m_op,
        slab(bvp, d.dv, l * d.dv),
        slab(at(odp, l * d.dv), d.dv, 2 * l * d.dv),
        (1.0, 0.0),
    )?;
    gemm(
        s.b,
        (l, d.dk, l),
        m_op,
        slab(kwp, d.dk, l * d.dk),
        slab(at(qwp, l * d.dk), d.dk, 2 * l * d.dk),
        (1.0, 0.0),
    )?;

    // Chunk by chunk, batched over the value heads: head h's slab of chunk c is h·chunks + c,
    // so chunk c starts at slab c and heads are `chunks` slabs apart.
    let per_head = d.dv * d.dk;
    let state_rows = Operand::rows(sp, d.dk).batched(per_head);
    let (n_state, per_head_i) = ((d.hv * per_head) as i64, per_head as i64);
    for c in 0..chunks {
        let of_chunk = |base: u64, ld: usize, slab_elems: usize| {
            Operand::rows(at(base, c * slab_elems), ld).batched(chunks * slab_elems)
        };
        let od_c = of_chunk(odp, d.dv, 2 * l * d.dv);
        // [o; Δ] = [0; U] − [−e^G⊙q; W]·Sᵀ.
        gemm(
            d.hv,
            (2 * l, d.dv, d.dk),
            of_chunk(qwp, d.dk, 2 * l * d.dk),
            state_rows.t(),
            od_c,
            (-1.0, 1.0),
        )?;
        // S ← e^(G_last)·S, then S += Δᵀ·(k⊙e^(G_last − G)).
        let cc = c as i32;
        gpu.launch(
            &GDN,
            "gdn_decay_state",
            launch::elements(op, d.hv * per_head)?,
            &[&sp, &hp, &cc, &ci, &li, &per_head_i, &n_state],
        )?;
        let delta = Operand {
            ptr: at(od_c.ptr, l * d.dv),
            ..od_c
        };
        gemm(
            d.hv,
            (d.dv, d.dk, l),
            delta.t(),
            of_chunk(ktp, d.dk, l * d.dk),
            state_rows,
            (1.0, 1.0),
        )?;
    }

    // o += P·Δ for every slab, then back to [T, Hv, Dv].
    gemm(
        s.b,
        (l, d.dv, l),
        slab(scp, l, 2 * l * l),
        slab(at(odp, l * d.dv), d.dv, 2 * l * d.dv),
        slab(odp, d.dv, 2 * l * d.dv),
        (1.0, 1.0),
    )?;
    let yp = ptr(&call.y)?;
    gpu.launch(
        &GDN,
        "gdn_scatter",
        launch::elements(op, d.t * d.hv * d.dv)?,
        &[&odp, &yp, &ti, &hvi, &dvi, &ci, &li],
    )?;
    Ok(call.y)
}

/// The address `elems` f32 elements past `base`.
fn at(base: u64, elems: usize) -> u64 {
    base + (elems * std::mem::size_of::<f32>()) as u64
}

/// `C = alpha·A·B + beta·C` in f32 for `batch` items of `m × k` by `k × n` (see [`Gemm`]).
fn gemm(
    batch: usize,
    (m, n, k): (usize, usize, usize),
    a: Operand,
    b: Operand,
    c: Operand,
    (alpha, beta): (f32, f32),
) -> Result<()> {
    Gemm {
        m,
        n,
        k,
        batch,
        a,
        b,
        c,
        alpha,
        beta,
    }
    .run(In::F32)
}

pub(crate) fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    state: &mut Tensor,
    silu: bool,
) -> Result<Tensor> {
    let op = "causal_conv1d";
    let x = f32_on_device(op, x)?;
    let w = f32_on_device(op, weight)?;
    let st = f32_on_device(op, state)?;
    let (t, c, kw) = (x.dim(0), x.dim(1), w.dim(1));
    let out = empty(&[t, c], DType::F32)?;
    let next = empty(st.shape(), DType::F32)?;
    let (xp, wp, sp, op_, np) = (ptr(&x)?, ptr(&w)?, ptr(&st)?, ptr(&out)?, ptr(&next)?);
    let (ti, ci, ki, si) = (
        int(op, "tokens", t)?,
        int(op, "channels", c)?,
        int(op, "kernel", kw)?,
        silu as i32,
    );
    let g = gpu()?;
    if t * c > 0 {
        g.launch(
            &GDN,
            "conv1d",
            launch::elements(op, t * c)?,
            &[&xp, &wp, &sp, &op_, &ti, &ci, &ki, &si],
        )?;
    }
    if next.numel() > 0 {
        g.launch(
            &GDN,
            "conv1d_state",
            launch::elements(op, next.numel())?,
            &[&xp, &sp, &np, &ti, &ci, &ki],
        )?;
    }
    *state = next;
    Ok(out)
}
