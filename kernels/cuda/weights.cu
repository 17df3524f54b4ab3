// Weight matrices in every stored format, decoded per element exactly as the CPU does
// (kernels/src/cpu/dequant.rs, kernels/src/cpu/minifloat.rs), and the kernels that read them:
// the decode-shaped matvec, the prefill-shaped tiled matmul for quantized weights, the
// embedding lookup, and the activation casts feeding cuBLAS.
//
// A weight is `[rows, cols]` (out features x in features). Its buffers:
// - dense: `data` holds f32, bf16 or f16 values row-major;
// - affine (bits 2..8): `data` is u32 words, each row a little-end-first stream of `bits`-wide
//   codes (a code may straddle two words); `scales`, `biases` f32 `[rows, cols/group]`;
//   w = scale * q + bias;
// - mxfp4 / nvfp4: 8 E2M1 codes per word, lowest nibble first; u8 scale codes per 32 (E8M0)
//   or per 16 (E4M3);
// - mxfp8: 4 E4M3 codes per word, lowest byte first; u8 E8M0 scale codes per 32.
// Rows start on word and group boundaries (cols * bits % 32 == 0, cols % group == 0: checked
// on the host), so element (r, c) is element r * cols + c of one flat stream.

#define FMT_F32 0
#define FMT_BF16 1
#define FMT_F16 2
#define FMT_AFFINE 3
#define FMT_MXFP4 4
#define FMT_NVFP4 5
#define FMT_MXFP8 6

struct WeightRef {
    const void* data;
    const void* scales;
    const float* biases;
    int cols;
    int bits;
    int group;
};

// E2M1: sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_to_f32(u32 code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7u];
    return (code & 8u) ? -v : v;
}

// E4M3: bias 7, no infinities, S.1111.111 is NaN, subnormals m * 2^-9.
__device__ __forceinline__ float e4m3_to_f32(u32 code) {
    u32 sign = (code & 0x80u) << 24;
    u32 e = (code >> 3) & 0xFu, m = code & 7u;
    if (e == 0xFu && m == 7u) return __int_as_float(0x7fc00000);
    if (e == 0u) {
        float v = (float)m * (1.0f / 512.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

// E8M0: 2^(code - 127); like MLX, code 0 reads as 2^-127 and 255 as +inf.
__device__ __forceinline__ float e8m0_to_f32(u32 code) {
    return code == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(code << 23);
}

template <int FMT>
__device__ __forceinline__ float weight_at(const WeightRef& w, i64 r, int c) {
    i64 idx = r * (i64)w.cols + c;
    if (FMT == FMT_F32) return ((const float*)w.data)[idx];
    if (FMT == FMT_BF16) return bf16_to_f32(((const u16*)w.data)[idx]);
    if (FMT == FMT_F16) return f16_to_f32(((const u16*)w.data)[idx]);
    const u32* words = (const u32*)w.data;
    if (FMT == FMT_AFFINE) {
        i64 bit = idx * w.bits;
        i64 wi = bit / 32;
        u32 sh = (u32)(bit % 32);
        unsigned long long pair = words[wi];
        if (sh + (u32)w.bits > 32u) pair |= ((unsigned long long)words[wi + 1]) << 32;
        u32 q = (u32)(pair >> sh) & ((1u << w.bits) - 1u);
        i64 g = idx / w.group;
        float s = ((const float*)w.scales)[g];
        // The CPU rounds s * q before adding the bias (no FMA): so do we.
        return __fadd_rn(__fmul_rn(s, (float)q), w.biases[g]);
    }
    const u8* sc = (const u8*)w.scales;
    if (FMT == FMT_MXFP8) {
        u32 code = (words[idx / 4] >> (8 * (u32)(idx % 4))) & 0xFFu;
        return e4m3_to_f32(code) * e8m0_to_f32(sc[idx / 32]);
    }
    u32 code = (words[idx / 8] >> (4 * (u32)(idx % 8))) & 0xFu;
    float s = FMT == FMT_NVFP4 ? e4m3_to_f32(sc[idx / 16]) : e8m0_to_f32(sc[idx / 32]);
    return e2m1_to_f32(code) * s;
}

// Decode-shaped matmul: out[i, n] = sum_c x[i, c] * w[n, c] for m <= MATVEC_MAX_M input rows.
// Block: 128 threads = 4 warps; warp w of block b computes weight row n = 4b + w for every
// input row, its lanes striding over the columns (coalesced weight reads), then a warp sum.
#define MATVEC_MAX_M 4
#define MATVEC_ROWS_PER_BLOCK 4
template <int FMT>
__device__ void matvec(WeightRef w, const float* x, float* out, int m, int n, int k) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int row = blockIdx.x * MATVEC_ROWS_PER_BLOCK + warp;
    if (row >= n) return;  // the whole warp leaves together
    float acc[MATVEC_MAX_M];
    for (int i = 0; i < MATVEC_MAX_M; i++) acc[i] = 0.0f;
    for (int c = lane; c < k; c += WARP) {
        float wv = weight_at<FMT>(w, row, c);
        for (int i = 0; i < MATVEC_MAX_M; i++)
            if (i < m) acc[i] += wv * x[(i64)i * k + c];
    }
    for (int i = 0; i < MATVEC_MAX_M; i++) {
        if (i >= m) break;
        float s = warp_sum(acc[i]);
        if (lane == 0) out[(i64)i * n + row] = s;
    }
}

// Prefill-shaped matmul for quantized weights: out[M, N] = x[M, K] . w[N, K]^T, weights decoded
// into shared memory one K-tile at a time. Block: 16 x 16 threads computing a 64 x 64 output
// tile; thread (tx, ty) owns rows ty + 16i and columns tx + 16j (i, j < 4). Grid:
// (ceil(N / 64), ceil(M / 64)).
#define GEMM_TM 64
#define GEMM_TN 64
#define GEMM_TK 16
template <int FMT>
__device__ void tiled(WeightRef w, const float* x, float* out, int m, int n, int k) {
    __shared__ float xs[GEMM_TK][GEMM_TM + 1];
    __shared__ float ws[GEMM_TK][GEMM_TN + 1];
    int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
    int m0 = blockIdx.y * GEMM_TM, n0 = blockIdx.x * GEMM_TN;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += GEMM_TK) {
        for (int e = tid; e < GEMM_TM * GEMM_TK; e += 256) {
            int mm = e / GEMM_TK, kk = e % GEMM_TK;
            int gm = m0 + mm, gk = k0 + kk;
            xs[kk][mm] = (gm < m && gk < k) ? x[(i64)gm * k + gk] : 0.0f;
        }
        for (int e = tid; e < GEMM_TN * GEMM_TK; e += 256) {
            int nn = e / GEMM_TK, kk = e % GEMM_TK;
            int gn = n0 + nn, gk = k0 + kk;
            ws[kk][nn] = (gn < n && gk < k) ? weight_at<FMT>(w, gn, gk) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < GEMM_TK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = xs[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = ws[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int gm = m0 + ty + 16 * i;
        if (gm >= m) continue;
        for (int j = 0; j < 4; j++) {
            int gn = n0 + tx + 16 * j;
            if (gn < n) out[(i64)gm * n + gn] = acc[i][j];
        }
    }
}

// Rows `ids` of the table, widened to f32: out[i, c] = w[ids[i], c]. One thread per output
// element, 256 per block, grid ceil(count * cols / 256). Ids are checked on the host.
template <int FMT>
__device__ void embedding(WeightRef w, const u32* ids, float* out, i64 total) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    i64 t = i / w.cols;
    int c = (int)(i % w.cols);
    out[i] = weight_at<FMT>(w, ids[t], c);
}

#define WEIGHT_KERNELS(NAME, FMT)                                                               \
    extern "C" __global__ void matvec_##NAME(const void* data, const void* scales,            \
                                             const float* biases, int bits, int group,        \
                                             const float* x, float* out, int m, int n, int k) { \
        WeightRef w = {data, scales, biases, k, bits, group};                                  \
        matvec<FMT>(w, x, out, m, n, k);                                                       \
    }                                                                                          \
    extern "C" __global__ void embedding_##NAME(const void* data, const void* scales,         \
                                                const float* biases, int bits, int group,     \
                                                int cols, const u32* ids, float* out,         \
                                                i64 total) {                                   \
        WeightRef w = {data, scales, biases, cols, bits, group};                               \
        embedding<FMT>(w, ids, out, total);                                                    \
    }

#define TILED_KERNEL(NAME, FMT)                                                                 \
    extern "C" __global__ void tiled_##NAME(const void* data, const void* scales,             \
                                            const float* biases, int bits, int group,         \
                                            const float* x, float* out, int m, int n, int k) {  \
        WeightRef w = {data, scales, biases, k, bits, group};                                  \
        tiled<FMT>(w, x, out, m, n, k);                                                        \
    }

WEIGHT_KERNELS(f32, FMT_F32)
WEIGHT_KERNELS(bf16, FMT_BF16)
WEIGHT_KERNELS(f16, FMT_F16)
WEIGHT_KERNELS(affine, FMT_AFFINE)
WEIGHT_KERNELS(mxfp4, FMT_MXFP4)
WEIGHT_KERNELS(nvfp4, FMT_NVFP4)
WEIGHT_KERNELS(mxfp8, FMT_MXFP8)
// Dense weights take cuBLAS for prefill; only the quantized formats need the tiled kernel.
TILED_KERNEL(affine, FMT_AFFINE)
TILED_KERNEL(mxfp4, FMT_MXFP4)
TILED_KERNEL(nvfp4, FMT_NVFP4)
TILED_KERNEL(mxfp8, FMT_MXFP8)

// Activations rounded to the weight's 16-bit type for cuBLAS (round to nearest even). One
// thread per element, 256 per block.
extern "C" __global__ void cast_f32_bf16(const float* x, u16* y, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f32_to_bf16(x[i]);
}

extern "C" __global__ void cast_f32_f16(const float* x, u16* y, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f32_to_f16(x[i]);
}
