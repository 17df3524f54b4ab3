use anyhow::{ensure, Result};
use kernels::{ops, Tensor};

/// What a Gated DeltaNet layer carries between forwards: the last `K − 1` inputs of its
/// depthwise causal conv (`[K−1, C]`) and the delta-rule state (`[Hv, Dv, Dk]`), both f32.
/// Unlike a KV cache it cannot be trimmed back to an earlier position. Speculative decoding
/// either records what a verification forward fed the layer ([`Record`]) and recomputes the
/// state at a kept position from it, or rolls back to a clone taken beforehand (the tensors
/// are copy-on-write, so a clone is a cheap snapshot until the next write) and replays.
#[derive(Debug, Clone)]
pub struct RecurrentState {
    pub conv: Tensor,
    pub ssm: Tensor,
    /// Set by [`crate::cache::ModelState::record_steps`] for the next forward.
    pub record: Option<Record>,
}

/// Whether a Gated DeltaNet layer records its next forward, and what it recorded.
#[derive(Debug, Clone)]
pub enum Record {
    /// The next forward records.
    Armed,
    /// One forward was recorded.
    Ran(Box<Recorded>),
    /// Nothing usable: more than one forward ran, or the tensors live on a device (host
    /// tensors only are recorded). The caller replays instead.
    Unusable,
}

/// What a recorded forward fed a Gated DeltaNet layer: enough to rebuild its state after any
/// of the forward's positions without the model's weights (the conv state is the last
/// `K − 1` conv inputs; the delta rule needs only its inputs).
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The state before the forward.
    pub conv: Tensor,
    pub ssm: Tensor,
    /// Its conv inputs `[T, C]` and delta-rule inputs q, k `[T, Hk, Dk]`, v `[T, Hv, Dv]`,
    /// `g_log` and `beta` `[T, Hv]`.
    pub qkv: Tensor,
    pub delta: [Tensor; 5],
}

impl RecurrentState {
    /// The zero state of a sequence's start.
    pub fn new(
        conv_kernel: usize,
        conv_channels: usize,
        v_heads: usize,
        v_dim: usize,
        k_dim: usize,
    ) -> RecurrentState {
        RecurrentState {
            conv: Tensor::zeros(&[conv_kernel.saturating_sub(1), conv_channels]),
            ssm: Tensor::zeros(&[v_heads, v_dim, k_dim]),
            record: None,
        }
    }

    /// Whether the forward about to run, whose conv inputs are `qkv`, is to be recorded; one
    /// that cannot be (a second forward, tensors on a device) marks the record unusable.
    pub fn arms_record(&mut self, qkv: &Tensor) -> bool {
        let host = [qkv, &self.conv, &self.ssm]
            .iter()
            .all(|t| t.device() == kernels::Device::Cpu);
        match self.record {
            Some(Record::Armed) if host => true,
            Some(_) => {
                self.record = Some(Record::Unusable);
                false
            }
            None => false,
        }
    }

    /// How many positions the recorded forward ran (`None` when nothing usable was recorded).
    pub fn recorded(&self) -> Option<usize> {
        match &self.record {
            Some(Record::Ran(r)) => Some(r.qkv.dim(0)),
            _ => None,
        }
    }

    /// The state after the first `n` positions of the recorded forward: the conv inputs'
    /// last `K − 1` rows, and the per-step delta rule run again over those positions from the
    /// state before (the same kernel on the same inputs, so the bits of running them alone).
    /// Recording stops.
    pub fn keep_recorded(&mut self, n: usize) -> Result<()> {
        let Some(Record::Ran(r)) = self.record.take() else {
            anyhow::bail!("internal: no recorded forward to keep positions of");
        };
        let Recorded {
            conv,
            mut ssm,
            qkv,
            delta,
        } = *r;
        let t = qkv.dim(0);
        ensure!(n <= t, "keeping {n} positions of a recorded forward of {t}");
        if n == t {
            return Ok(());
        }
        let k1 = conv.dim(0);
        let inputs = Tensor::cat0(&[&conv, &qkv.narrow0(0, n)?])?;
        self.conv = Tensor::cat0(&[&inputs.narrow0(n, k1)?])?;
        let [q, k, v, g_log, beta] = delta.map(|x| x.narrow0(0, n));
        ops::gdn_recurrent(&q?, &k?, &v?, &g_log?, &beta?, &mut ssm)?;
        self.ssm = ssm;
        Ok(())
    }
}
