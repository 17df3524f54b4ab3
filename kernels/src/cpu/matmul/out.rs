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

/// `tree_sum` of each of 16 registers of 16 lanes, all at once: the registers fold level by
/// level (lanes `t` and `t + 8`, `t + 4`, `t + 2`, `t + 1`, the pairs `tree_sum` adds), two
/// registers into one per level, so 15 adds and 30 shuffles replace 16 scalar trees.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn trees16(v: &[std::arch::x86_64::__m512; 16]) -> [f32; 16] {
    use std::arch::x86_64::*;
    // Each level pairs registers: the low quarters (or words) of both, plus their high ones.
    let halves: [__m512; 8] = std::array::from_fn(|a| {
        let (p, q) = (v[2 * a], v[2 * a + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(p, q),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(p, q),
        )
    });
    let quarters: [__m512; 4] = std::array::from_fn(|b| {
        let (p, q) = (halves[2 * b], halves[2 * b + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(p, q),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(p, q),
        )
    });
    let pairs: [__m512; 2] = std::array::from_fn(|c| {
        let (p, q) = (quarters[2 * c], quarters[2 * c + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(p, q),
            _mm512_shuffle_ps::<0b11_10_11_10>(p, q),
        )
    });
    let sums = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(pairs[0], pairs[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(pairs[0], pairs[1]),
    );
    let mut lanes = [0.0f32; 16];
    // SAFETY: `lanes` holds 16 floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sums) };
    // Register g's sum ends in lane 4·(g % 4) + g / 4.
    std::array::from_fn(|g| lanes[4 * (g % 4) + g / 4])
}

/// `tree_sum` of one register of 16 lanes, in registers (lanes `t` and `t + 8`, `t + 4`,
/// `t + 2`, `t + 1`): for blocks with too few outputs to fill [`trees16`].
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tree16(v: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let eight = _mm256_add_ps(_mm512_castps512_ps256(v), high);
    let four = _mm_add_ps(
        _mm256_castps256_ps128(eight),
        _mm256_extractf128_ps::<1>(eight),
    );
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps::<1>(two, two)))
}

/// `tree_sum` of each of 8 registers of 8 lanes, all at once (AVX2): the registers fold level
/// by level (lanes `t` and `t + 4`, `t + 2`, `t + 1`, the pairs `tree_sum` adds), two registers
/// into one per level, so 7 adds and 14 shuffles replace 8 trees.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn trees8(v: &[std::arch::x86_64::__m256; 8]) -> [f32; 8] {
    use std::arch::x86_64::*;
    // t + 4: register 2a's four sums in the low 128 bits, 2a + 1's in the high.
    let halves: [__m256; 4] = std::array::from_fn(|a| {
        let (p, q) = (v[2 * a], v[2 * a + 1]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(p, q),
            _mm256_permute2f128_ps::<0x31>(p, q),
        )
    });
    // t + 2, within each 128 bits: words 0, 1 of the first register, then of the second.
    let pairs: [__m256; 2] = std::array::from_fn(|b| {
        let (p, q) = (halves[2 * b], halves[2 * b + 1]);
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(p, q),
            _mm256_shuffle_ps::<0b11_10_11_10>(p, q),
        )
    });
    // t + 1: one sum per word.
    let sums = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(pairs[0], pairs[1]),
        _mm256_shuffle_ps::<0b11_01_11_01>(pairs[0], pairs[1]),
    );
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
    // Register g's sum ends in lane 4·(g % 2) + g / 2.
    std::array::from_fn(|g| lanes[4 * (g % 2) + g / 2])
}

/// `tree_sum` of one register of 8 lanes, in registers: for blocks with too few outputs to
/// fill [`trees8`], and the AVX2 4- and 8-bit kernels' lane sums.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn tree8(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps::<1>(two, two)))
}
