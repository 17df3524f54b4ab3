use kernels::Tensor;

/// What a Gated DeltaNet layer carries between forwards: the last `K − 1` inputs of its
/// depthwise causal conv (`[K−1, C]`) and the delta-rule state (`[Hv, Dv, Dk]`), both f32.
/// Unlike a KV cache it cannot be trimmed back to an earlier position, so speculative decoding
/// rolls back by cloning it beforehand (the tensors are copy-on-write, so a clone is a cheap
/// snapshot until the next write).
#[derive(Debug, Clone)]
pub struct RecurrentState {
    pub conv: Tensor,
    pub ssm: Tensor,
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
        }
    }
}
