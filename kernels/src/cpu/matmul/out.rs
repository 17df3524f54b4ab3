//! What the matmul dispatcher and its kernels share: the decode row bound, the pointer to the
//! output that parallel tiles write disjoint parts of, and the 4-bit weights' prefetch.

/// Inputs with at most this many rows take the fused decode kernel: one decode token, the up
/// to 5 rows an MTP verification runs (4 drafts after the last token), or a batched decode
/// step of up to 8 sequences, so speculative and batched decoding round like plain decoding
/// and cost about one weight read per step.
pub const DECODE_MAX_M: usize = 8;
/// The output buffer shared by tiles that write disjoint elements of it.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: every tile writes only its own columns (a disjoint set of elements), and the buffer
// outlives the parallel loop that uses it.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Element `i` of the buffer. Going through a method (not the field) makes closures capture
    /// the whole `Send` wrapper rather than the raw pointer inside it.
    #[inline(always)]
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Asks for the codes [`crate::cpu::PREFETCH_BYTES`] past the start of row `r` (of `k` columns)
/// of an affine weight, one row's worth, to be loaded into L2.
#[inline(always)]
pub(crate) fn prefetch_affine<const BITS: usize>(
    w: &crate::quant::decode::Affine<BITS>,
    r: usize,
    k: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let row_bytes = k * BITS / 8;
        crate::cpu::prefetch_l2(
            w.packed,
            r * row_bytes + crate::cpu::PREFETCH_BYTES,
            row_bytes,
        );
    }
    let _ = (w, r, k);
}
