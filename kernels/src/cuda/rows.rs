//! Row-wise ops (`rows.cu`: RMSNorm, softmax, log-softmax, argmax, top-k, RoPE) and attention
//! (`attention.cu`) on CUDA. Shapes were checked by `ops`.

use super::context::gpu;
use super::launch::{self, int, Launch};
use super::sources::{ATTENTION, ROWS};
use super::{copy, empty, f32_on_device, ptr, read_back, upload_slice};
use crate::error::{invalid, Result};
use crate::params::{AttnParams, RopeLayout};
use crate::{DType, Error, Tensor};

/// Rows and width of a row-wise op over the last dimension.
fn row_shape(op: &'static str, x: &Tensor) -> Result<(usize, i32)> {
    let n = x.dim(-1);
    Ok((x.numel() / n.max(1), int(op, "row length", n)?))
}

/// Runs a `(x, out, n)` row kernel into a new f32 tensor of `x`'s shape.
fn per_row(op: &'static str, kernel: &'static str, x: &Tensor) -> Result<Tensor> {
    let x = f32_on_device(op, x)?;
    let out = empty(x.shape(), DType::F32)?;
    let (rows, n) = row_shape(op, &x)?;
    if rows > 0 && n > 0 {
        let (xp, op_) = (ptr(&x)?, ptr(&out)?);
        gpu()?.launch(&ROWS, kernel, launch::rows(op, rows)?, &[&xp, &op_, &n])?;
    }
    Ok(out)
}

pub(crate) fn softmax(x: &Tensor) -> Result<Tensor> {
    per_row("softmax", "softmax", x)
}

pub(crate) fn log_softmax(x: &Tensor) -> Result<Tensor> {
    per_row("log_softmax", "log_softmax", x)
}

pub(crate) fn rms_norm(x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let op = "rms_norm";
    let x = f32_on_device(op, x)?;
    let w = w.map(|w| f32_on_device(op, w)).transpose()?;
    let out = empty(x.shape(), DType::F32)?;
    let (rows, n) = row_shape(op, &x)?;
    if rows > 0 && n > 0 {
        let (xp, op_) = (ptr(&x)?, ptr(&out)?);
        // A null gain pointer selects the weightless variant.
        let wp = w.as_ref().map(ptr).transpose()?.unwrap_or(0);
        gpu()?.launch(
            &ROWS,
            "rms_norm",
            launch::rows(op, rows)?,
            &[&xp, &wp, &op_, &n, &eps],
        )?;
    }
    Ok(out)
}

/// One index per row; only the indices come back to the host.
pub(crate) fn argmax(x: &Tensor) -> Result<Vec<u32>> {
    let op = "argmax";
    let x = f32_on_device(op, x)?;
    let (rows, n) = row_shape(op, &x)?;
    if n == 0 {
        return invalid(op, format!("empty last dimension in {:?}", x.shape()));
    }
    let out = empty(&[rows], DType::U32)?;
    if rows == 0 {
        return Ok(Vec::new());
    }
    let (xp, op_) = (ptr(&x)?, ptr(&out)?);
    gpu()?.launch(&ROWS, "argmax", launch::rows(op, rows)?, &[&xp, &op_, &n])?;
    read_back(&out)
}

/// The `k` best of a 1-D `x`: each block of the device keeps the best `k` of its share, the
/// host ranks those candidates again (the global top `k` is among them). Large `k` ranks the
/// whole row on the host instead.
pub(crate) fn top_k(x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
    let op = "top_k";
    if x.dims() != 1 {
        return crate::error::shape_err(op, format!("expected a 1-D tensor, got {:?}", x.shape()));
    }
    let n = x.numel();
    let k = k.min(n);
    if k == 0 {
        return Ok(Vec::new());
    }
    if k > launch::TOPK_MAX_K {
        return crate::select::top_k(&x.to_device(crate::Device::Cpu)?, k);
    }
    let x = f32_on_device(op, x)?;
    let (l, blocks) = launch::topk(n)?;
    let idx = empty(&[blocks * k], DType::I32)?;
    let val = empty(&[blocks * k], DType::F32)?;
    let (xp, ip, vp) = (ptr(&x)?, ptr(&idx)?, ptr(&val)?);
    let (ni, chunk, ki) = (
        int(op, "length", n)?,
        launch::TOPK_CHUNK as i32,
        int(op, "k", k)?,
    );
    gpu()?.launch(
        &ROWS,
        "topk_candidates",
        l,
        &[&xp, &ni, &chunk, &ki, &ip, &vp],
    )?;
    let (idx, val) = (read_back::<i32>(&idx)?, read_back::<f32>(&val)?);
    let cands: Vec<(u32, f32)> = idx
        .into_iter()
        .zip(val)
        .filter(|&(i, _)| i >= 0)
        .map(|(i, v)| (i as u32, v))
        .collect();
    Ok(crate::select::best_of(cands, k))
}

pub(crate) fn rope(
    x: &Tensor,
    positions: &[usize],
    inv_freq: &[f32],
    layout: RopeLayout,
) -> Result<Tensor> {
    let op = "rope";
    let x = f32_on_device(op, x)?;
    let out = copy(&x)?;
    let (t, h, d, half) = (x.dim(0), x.dim(1), x.dim(2), inv_freq.len());
    if t * h * half == 0 {
        return Ok(out);
    }
    let pos = positions
        .iter()
        .map(|&p| int(op, "position", p))
        .collect::<Result<Vec<i32>>>()?;
    let pos = upload_slice(&[t], DType::I32, &pos)?;
    let freq = upload_slice(&[half], DType::F32, inv_freq)?;
    let interleaved = (layout == RopeLayout::Interleaved) as i32;
    let (op_, pp, fp) = (ptr(&out)?, ptr(&pos)?, ptr(&freq)?);
    let dims = (
        int(op, "tokens", t)?,
        int(op, "heads", h)?,
        int(op, "head dim", d)?,
        int(op, "pairs", half)?,
    );
    gpu()?.launch(
        &ROWS,
        "rope",
        launch::elements(op, t * h * half)?,
        &[
            &op_,
            &pp,
            &fp,
            &dims.0,
            &dims.1,
            &dims.2,
            &dims.3,
            &interleaved,
        ],
    )?;
    Ok(out)
}

pub(crate) fn attention(q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor> {
    let op = "attention";
    let (t, hq, d) = (q.dim(0), q.dim(1), q.dim(2));
    if d > launch::ATTN_MAX_D {
        return Err(Error::Unsupported {
            op: "attention with head_dim > 512",
            backend: "cuda",
        });
    }
    let (q, k, v) = (
        f32_on_device(op, q)?,
        f32_on_device(op, k)?,
        f32_on_device(op, v)?,
    );
    let out = empty(q.shape(), DType::F32)?;
    if t * hq * d == 0 {
        return Ok(out);
    }
    let l: Launch = launch::attention(t, hq)?;
    let (qp, kp, vp, op_) = (ptr(&q)?, ptr(&k)?, ptr(&v)?, ptr(&out)?);
    let dims = (
        int(op, "query heads", hq)?,
        int(op, "kv heads", k.dim(0))?,
        int(op, "head dim", d)?,
        int(op, "capacity", k.dim(1))?,
        int(op, "q_start", p.q_start)?,
    );
    // 0 means "none" for both (ops rejects a zero window and a non-positive cap).
    let window = int(op, "window", p.window.unwrap_or(0))?;
    let softcap = p.softcap.unwrap_or(0.0);
    gpu()?.launch(
        &ATTENTION,
        "attention",
        l,
        &[
            &qp, &kp, &vp, &op_, &dims.0, &dims.1, &dims.2, &dims.3, &dims.4, &p.scale, &window,
            &softcap,
        ],
    )?;
    Ok(out)
}
