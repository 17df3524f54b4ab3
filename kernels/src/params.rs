//! Parameter types every backend reads, and the constants they share. The op list
//! (`ops`) re-exports them; backends import them from here, never from `ops`, which calls
//! the backends.

/// RoPE pair layout: `HalfSplit` rotates (x[i], x[i + r/2]) (NeoX/Qwen/Llama in HF layout),
/// `Interleaved` rotates (x[2i], x[2i+1]) (GPT-J style).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    HalfSplit,
    Interleaved,
}

/// Causal attention parameters. Query row `t` sits at absolute position `q_start + t` and
/// sees keys at positions `p` with `p <= q_start + t` and, with a window `w`,
/// `p > q_start + t - w`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    pub q_start: usize,
    pub kv_len: usize,
    pub scale: f32,
    pub window: Option<usize>,
    /// `tanh` soft-capping of the scores (`cap·tanh(s/cap)`), as some families use.
    pub softcap: Option<f32>,
}

/// The most negative gate produced. `exp` of it is exactly 0 in f32 and f64 alike, so clamping
/// changes no decay, while sums of millions of such terms (a chunk's cumulative decay) stay
/// finite.
pub const GATE_FLOOR: f32 = -1e30;

/// The elementwise activations of the op list (`ops::silu`, `ops::sigmoid`, ...), as every
/// backend's `unary` takes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
    Sigmoid,
    Softplus,
    /// `x · s`.
    Scale(f32),
    /// `c·tanh(x/c)`.
    Softcap(f32),
}
