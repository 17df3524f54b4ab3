//! The op list as a backend implements it. `ops::*` checks its inputs (shapes, dtypes,
//! parameters), picks the backend from the devices of its inputs ([`on`]) and calls the method
//! of the same name. A backend implements every method: an op missing on a backend is a compile
//! error, and a backend without a kernel for an op says so in its method, as an error the caller
//! sees. Inputs reach the methods already checked.

use crate::params::{AttnParams, RopeLayout, Unary};
use crate::{Device, Result, Tensor, Weight};

pub(crate) trait Backend: Sync {
    /// `x @ wᵀ`.
    fn matmul(&self, x: &Tensor, w: &Weight) -> Result<Tensor>;
    /// [`Backend::matmul`] of one input against several weights, each result equal to its own
    /// matmul.
    fn matmul_many(&self, x: &Tensor, ws: &[&Weight]) -> Result<Vec<Tensor>>;
    /// `out[p] = x[rows[p]] · w[ids[p]]ᵀ` over the stacked experts of `w`.
    fn gather_matmul(
        &self,
        x: &Tensor,
        w: &Weight,
        experts: usize,
        rows: &[u32],
        ids: &[u32],
    ) -> Result<Tensor>;
    fn embedding(&self, w: &Weight, ids: &[u32]) -> Result<Tensor>;
    fn rms_norm(&self, x: &Tensor, w: Option<&Tensor>, eps: f32) -> Result<Tensor>;
    /// RoPE; `base` is `θ` where the caller knows it (a backend may derive the frequencies
    /// from it, as mlx-lm does) and `inv_freq` the frequencies themselves.
    fn rope(
        &self,
        x: &Tensor,
        positions: &[usize],
        inv_freq: &[f32],
        base: Option<f32>,
        layout: RopeLayout,
    ) -> Result<Tensor>;
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams) -> Result<Tensor>;
    fn attention_paged(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        table: (&[u32], usize),
        p: &AttnParams,
    ) -> Result<Tensor>;
    fn kv_write(&self, cache: &mut Tensor, new: &Tensor, pos: usize) -> Result<()>;
    fn softmax(&self, x: &Tensor) -> Result<Tensor>;
    fn log_softmax(&self, x: &Tensor) -> Result<Tensor>;
    fn unary(&self, x: &Tensor, f: Unary) -> Result<Tensor>;
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor>;
    fn argmax(&self, x: &Tensor) -> Result<Vec<u32>>;
    fn top_k(&self, x: &Tensor, k: usize) -> Result<Vec<(u32, f32)>>;
    fn all_finite(&self, x: &Tensor) -> Result<bool>;
    fn moe_combine(
        &self,
        y: &Tensor,
        weights: &[f32],
        top_k: usize,
        shared: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor>;
    fn gdn_gate(&self, a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor>;
    fn gdn_recurrent(&self, gdn: Gdn<'_>, state: &mut Tensor) -> Result<Tensor>;
    fn gdn_chunked(&self, gdn: Gdn<'_>, state: &mut Tensor, chunk: usize) -> Result<Tensor>;
    fn causal_conv1d(
        &self,
        x: &Tensor,
        weight: &Tensor,
        state: &mut Tensor,
        silu: bool,
    ) -> Result<Tensor>;
}

/// The inputs of one Gated DeltaNet call: `q, k` `[T, Hk, Dk]`, `v` `[T, Hv, Dv]`, `g_log`
/// and `beta` `[T, Hv]`.
#[derive(Clone, Copy)]
pub(crate) struct Gdn<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub g_log: &'a Tensor,
    pub beta: &'a Tensor,
}

/// The backend an op runs on: any input on a device moves the op there (host inputs are
/// copied in), else the CPU.
pub(crate) fn on(devices: impl IntoIterator<Item = Device>) -> &'static dyn Backend {
    let mut on = Device::Cpu;
    for d in devices {
        if d != Device::Cpu {
            on = d;
            break;
        }
    }
    backend(on)
}

/// Every backend this build has, by device: the one place the features are matched.
pub(crate) fn backend(device: Device) -> &'static dyn Backend {
    match device {
        Device::Cpu => &crate::cpu::Cpu,
        #[cfg(feature = "mlx")]
        Device::Mlx => &crate::mlx::Mlx,
        #[cfg(feature = "cuda")]
        Device::Cuda => &crate::cuda::Cuda,
    }
}

/// The devices of some tensors, for [`on`].
pub(crate) fn devices<'a>(ts: &'a [&'a Tensor]) -> impl Iterator<Item = Device> + 'a {
    ts.iter().map(|t| t.device())
}

/// [`Backend::gather_matmul`] from a backend's own ops, for backends without a gathered
/// product: for each used expert (ascending), gather its pairs' input rows, multiply by a view
/// of the expert's rows, and write the block into a buffer in expert order; one last gather
/// puts the pairs back in their own order. Each step is deterministic, so the result is too.
pub(crate) fn grouped_matmul(
    b: &dyn Backend,
    x: &Tensor,
    w: &Weight,
    experts: usize,
    rows: &[u32],
    ids: &[u32],
) -> Result<Tensor> {
    let n = w.rows() / experts;
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&p| ids[p]);
    // The input as a table of rows, so `embedding` gathers them on the input's device.
    let table = Weight::Dense(x.clone());
    let mut buf = Tensor::zeros(&[1, ids.len(), n]).to_device(x.device())?;
    let mut at = 0;
    while at < order.len() {
        let e = ids[order[at]] as usize;
        let len = order[at..]
            .iter()
            .take_while(|&&p| ids[p] as usize == e)
            .count();
        let picked: Vec<u32> = order[at..at + len].iter().map(|&p| rows[p]).collect();
        let xe = b.embedding(&table, &picked)?;
        let ye = b.matmul(&xe, &w.rows_view(e * n, n)?)?;
        b.kv_write(&mut buf, &ye.reshape(&[len, 1, n])?, at)?;
        at += len;
    }
    // Pair p sits at position inverse[p] of the expert-ordered buffer.
    let mut inverse = vec![0u32; order.len()];
    for (pos, &p) in order.iter().enumerate() {
        inverse[p] = pos as u32;
    }
    b.embedding(&Weight::Dense(buf.reshape(&[ids.len(), n])?), &inverse)
}
