//! Elementwise ops, layout copies and the finiteness check on CUDA (`elementwise.cu`).

use super::context::gpu;
use super::launch::{elements, int};
use super::sources::ELEMENTWISE;
use super::{empty, f32_on_device, make_mut, on_device, ptr, read_back, zeros};
use crate::error::{shape_err, Result};
use crate::params::Unary;
use crate::{DType, Tensor};

/// The unary kernel, its ops numbered as `elementwise.cu`'s `UNARY_*`.
pub(crate) fn unary(x: &Tensor, op: Unary) -> Result<Tensor> {
    let x = f32_on_device("unary", x)?;
    let out = empty(x.shape(), DType::F32)?;
    let (code, s) = match op {
        Unary::Silu => (0i32, 0.0f32),
        Unary::GeluTanh => (1, 0.0),
        Unary::Sigmoid => (2, 0.0),
        Unary::Softplus => (3, 0.0),
        Unary::Scale(s) => (4, s),
        Unary::Softcap(c) => (5, c),
    };
    let n = x.numel() as i64;
    if n > 0 {
        let (xp, op_) = (ptr(&x)?, ptr(&out)?);
        gpu()?.launch(
            &ELEMENTWISE,
            "unary",
            elements("unary", x.numel())?,
            &[&xp, &op_, &n, &code, &s],
        )?;
    }
    Ok(out)
}

/// `f(a, b)` with `b`'s shape a suffix of `a`'s (broadcast over the leading dims).
fn binary(op: &'static str, code: i32, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !a.shape().ends_with(b.shape()) {
        return shape_err(
            op,
            format!("cannot broadcast {:?} onto {:?}", b.shape(), a.shape()),
        );
    }
    let (a, b) = (f32_on_device(op, a)?, f32_on_device(op, b)?);
    let out = empty(a.shape(), DType::F32)?;
    let (n, nb) = (a.numel() as i64, b.numel() as i64);
    if n > 0 {
        let (ap, bp, op_) = (ptr(&a)?, ptr(&b)?, ptr(&out)?);
        gpu()?.launch(
            &ELEMENTWISE,
            "binary",
            elements(op, a.numel())?,
            &[&ap, &bp, &op_, &n, &nb, &code],
        )?;
    }
    Ok(out)
}

pub(crate) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("add", 0, a, b)
}

pub(crate) fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("mul", 1, a, b)
}

/// `silu(gate)·up` (same shapes, checked by `ops`).
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    binary("swiglu", 2, gate, up)
}

/// `start..start+len` along `dim` (not a leading run of ones: those are views) into a new
/// buffer.
pub(crate) fn narrow(x: &Tensor, dim: usize, start: usize, len: usize) -> Result<Tensor> {
    let shape = x.shape();
    let outer = shape[..dim].iter().product::<usize>() as i64;
    let inner = shape[dim + 1..].iter().product::<usize>() as i64;
    let mut out_shape = shape.to_vec();
    out_shape[dim] = len;
    if x.dtype() != DType::F32 {
        return Err(crate::Error::DType {
            op: "narrow",
            dtype: x.dtype(),
            msg: "GPU tensors are narrowed along inner dimensions only as f32".into(),
        });
    }
    let out = empty(&out_shape, DType::F32)?;
    if out.numel() > 0 {
        let (d, s, l) = (shape[dim] as i64, start as i64, len as i64);
        let (xp, op_) = (ptr(x)?, ptr(&out)?);
        gpu()?.launch(
            &ELEMENTWISE,
            "narrow_copy",
            elements("narrow", out.numel())?,
            &[&xp, &op_, &outer, &d, &s, &l, &inner],
        )?;
    }
    Ok(out)
}

/// Writes `new` `[T, Hk, D]` into `cache` `[Hk, Cap, D]` at `pos..` (shapes checked by `ops`);
/// a host cache moves to the device first.
pub(crate) fn kv_write(cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()> {
    let new = f32_on_device("kv_write", new)?;
    let dst = make_mut(cache)?;
    if new.numel() == 0 {
        return Ok(());
    }
    let (t, hk, d) = (new.dim(0), new.dim(1), new.dim(2));
    let op = "kv_write";
    let args = (
        int(op, "tokens", t)?,
        int(op, "kv heads", hk)?,
        int(op, "head dim", d)?,
        int(op, "capacity", cache.dim(1))?,
        int(op, "position", pos)?,
    );
    let src = ptr(&new)?;
    gpu()?.launch(
        &ELEMENTWISE,
        "kv_write",
        elements(op, new.numel())?,
        &[&dst, &src, &args.0, &args.1, &args.2, &args.3, &args.4],
    )
}

/// Whether every element is finite, reduced on the device (one flag comes back).
pub(crate) fn all_finite(x: &Tensor) -> Result<bool> {
    let x = on_device(x)?;
    if x.numel() == 0 {
        return Ok(true);
    }
    let flag = zeros(&[1], DType::U32)?;
    let (xp, fp, n) = (ptr(&x)?, ptr(&flag)?, x.numel() as i64);
    gpu()?.launch(
        &ELEMENTWISE,
        "any_nonfinite",
        elements("all_finite", x.numel())?,
        &[&xp, &n, &fp],
    )?;
    Ok(read_back::<u32>(&flag)?[0] == 0)
}

/// The sparse MoE combine (see `ops::moe_combine`): weights come from the host (routing ran
/// there); without a shared expert its pointers are the output's, never read.
pub(crate) fn moe_combine(
    y: &Tensor,
    weights: &[f32],
    top_k: usize,
    shared: Option<(&Tensor, &Tensor)>,
) -> Result<Tensor> {
    let op = "moe_combine";
    let y = on_device(y)?;
    let n = y.dim(1);
    let tokens = y.dim(0) / top_k;
    let out = empty(&[tokens, n], DType::F32)?;
    let w = super::upload_slice(&[weights.len()], DType::F32, weights)?;
    let shared = match shared {
        Some((s, g)) => Some((f32_on_device(op, s)?, f32_on_device(op, g)?)),
        None => None,
    };
    if tokens * n > 0 {
        let (yp, wp, op_) = (ptr(&y)?, ptr(&w)?, ptr(&out)?);
        let (sp, gp) = match &shared {
            Some((s, g)) => (ptr(s)?, ptr(g)?),
            None => (op_, op_),
        };
        let (t, k, n_) = (tokens as i64, int(op, "k", top_k)?, int(op, "n", n)?);
        let has = shared.is_some() as i32;
        gpu()?.launch(
            &ELEMENTWISE,
            "moe_combine",
            elements(op, tokens * n)?,
            &[&yp, &wp, &sp, &gp, &op_, &t, &k, &n_, &has],
        )?;
    }
    Ok(out)
}
