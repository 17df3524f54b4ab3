// Row-wise ops over the last dimension (RMSNorm, softmax, log-softmax, argmax, top-k candidates)
// and RoPE. Row kernels run one block of 256 threads per row; each thread strides over the
// row, then the block reduces. Sums accumulate in f64 as the CPU reference does.

#define ROW_THREADS 256

// out = x / sqrt(mean(x^2) + eps) * w (w optional). Grid: one block per row.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int n, float eps) {
    __shared__ double scratch[32];
    const float* row = x + (i64)blockIdx.x * n;
    float* o = out + (i64)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)row[i] * (double)row[i];
    double ms = block_reduce(ss, scratch, Add()) / (double)n;
    float r = (float)(1.0 / sqrt(ms + (double)eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        o[i] = w ? row[i] * r * w[i] : row[i] * r;
}

// The row's largest value, NaN ignored (fmaxf, like f32::max); every thread gets it.
__device__ float row_max(const float* row, int n, float* scratch) {
    float m = NEG_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i]);
    return block_reduce(m, scratch, Max());
}

// Whether the row holds a NaN; every thread gets it.
__device__ int row_has_nan(const float* row, int n, int* flag) {
    int nan = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) nan |= row[i] != row[i];
    return block_any(nan, flag);
}

// Softmax; a row of only -inf (and no NaN) gives zeros. Grid: one block per row.
extern "C" __global__ void softmax(const float* x, float* out, int n) {
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    __shared__ int flag;
    const float* row = x + (i64)blockIdx.x * n;
    float* o = out + (i64)blockIdx.x * n;
    float m = row_max(row, n, fscratch);
    int nan = row_has_nan(row, n, &flag);
    if (m == NEG_INF && !nan) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += (double)expf(row[i] - m);
    sum = block_reduce(sum, dscratch, Add());
    float inv = (float)(1.0 / sum);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = expf(row[i] - m) * inv;
}

// Log-softmax in f64; a row of only -inf (and no NaN) stays -inf. Grid: one block per row.
extern "C" __global__ void log_softmax(const float* x, float* out, int n) {
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    __shared__ int flag;
    const float* row = x + (i64)blockIdx.x * n;
    float* o = out + (i64)blockIdx.x * n;
    float mf = row_max(row, n, fscratch);
    int nan = row_has_nan(row, n, &flag);
    if (mf == NEG_INF && !nan) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = NEG_INF;
        return;
    }
    double m = (double)mf;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += exp((double)row[i] - m);
    double log_sum = log(block_reduce(sum, dscratch, Add()));
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (float)(((double)row[i] - m) - log_sum);
}

// The CPU's ranking (kernels/src/cpu/select.rs): larger values first, NaN below everything
// (even -inf), then the lower index. Index -1 marks "no candidate" and loses to everything.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    bool na = va != va, nb = vb != vb;
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

// The block's best (value, index) under ranks_before; every thread gets it. `sv`, `si` hold
// blockDim.x entries.
__device__ void block_best(float* v, int* i, float* sv, int* si) {
    sv[threadIdx.x] = *v;
    si[threadIdx.x] = *i;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s && ranks_before(sv[threadIdx.x + s], si[threadIdx.x + s],
                                            sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    *v = sv[0];
    *i = si[0];
    __syncthreads();
}

// Index of each row's best element (ties to the lower index, NaN never wins unless the whole
// row is NaN, then 0). Grid: one block of ROW_THREADS per row.
extern "C" __global__ void argmax(const float* x, u32* out, int n) {
    __shared__ float sv[ROW_THREADS];
    __shared__ int si[ROW_THREADS];
    const float* row = x + (i64)blockIdx.x * n;
    float bv = 0.0f;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (ranks_before(row[i], i, bv, bi)) {
            bv = row[i];
            bi = i;
        }
    block_best(&bv, &bi, sv, si);
    if (threadIdx.x == 0) out[blockIdx.x] = (u32)bi;
}

// Top-k candidates of a 1-D x: block b takes elements [b * chunk, (b+1) * chunk) and writes its
// own best k (in rank order; index -1 pads a short chunk) to idx/val [b * k ..]. The global
// top k is among the union, which the host ranks again. Grid: ceil(n / chunk) blocks of
// ROW_THREADS; chunk <= TOPK_CHUNK, k <= chunk.
#define TOPK_CHUNK 4096
extern "C" __global__ void topk_candidates(const float* x, int n, int chunk, int k, int* idx,
                                           float* val) {
    __shared__ float sv[ROW_THREADS];
    __shared__ int si[ROW_THREADS];
    __shared__ u8 taken[TOPK_CHUNK];
    int base = blockIdx.x * chunk;
    int len = min(chunk, n - base);
    for (int i = threadIdx.x; i < chunk; i += blockDim.x) taken[i] = 0;
    __syncthreads();
    for (int r = 0; r < k; r++) {
        float bv = 0.0f;
        int bi = -1;
        for (int i = threadIdx.x; i < len; i += blockDim.x)
            if (!taken[i] && ranks_before(x[base + i], base + i, bv, bi)) {
                bv = x[base + i];
                bi = base + i;
            }
        block_best(&bv, &bi, sv, si);
        if (threadIdx.x == 0) {
            idx[(i64)blockIdx.x * k + r] = bi;
            val[(i64)blockIdx.x * k + r] = bv;
            if (bi >= 0) taken[bi - base] = 1;
        }
        __syncthreads();
    }
}

// RoPE on x [T, H, D] in place (the caller copies x first): pair i < half of each head is
// rotated by positions[t] * inv_freq[i], the angle taken in f64 and cos/sin rounded once, as on
// the CPU. `interleaved` picks pairs (2i, 2i+1) instead of (i, i + half). One thread per
// (t, h, i), 256 per block.
extern "C" __global__ void rope(float* x, const int* positions, const float* inv_freq, int t_len,
                                int heads, int d, int half, int interleaved) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (i64)t_len * heads * half) return;
    int i = (int)(id % half);
    i64 th = id / half;  // t * heads + h
    int t = (int)(th / heads);
    double a = (double)positions[t] * (double)inv_freq[i];
    float c = (float)cos(a), s = (float)sin(a);
    float* head = x + th * d;
    int ia = interleaved ? 2 * i : i;
    int ib = interleaved ? 2 * i + 1 : i + half;
    float x0 = head[ia], x1 = head[ib];
    head[ia] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    head[ib] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}
