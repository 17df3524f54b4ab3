// Elementwise ops, copies between layouts, and the finiteness check. Every kernel here runs
// one thread per output element, 256 threads per block, grid ceil(n / 256).

#define UNARY_SILU 0
#define UNARY_GELU_TANH 1
#define UNARY_SIGMOID 2
#define UNARY_SOFTPLUS 3
#define UNARY_SCALE 4
#define UNARY_SOFTCAP 5

extern "C" __global__ void unary(const float* x, float* y, i64 n, int op, float s) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    switch (op) {
        case UNARY_SILU: v = silu_f(v); break;
        case UNARY_GELU_TANH: v = gelu_tanh_f(v); break;
        case UNARY_SIGMOID: v = sigmoid_f(v); break;
        case UNARY_SOFTPLUS: v = softplus_f(v); break;
        case UNARY_SOFTCAP: v = s * tanhf(v / s); break;
        default: v = v * s; break;
    }
    y[i] = v;
}

#define BINARY_ADD 0
#define BINARY_MUL 1
#define BINARY_SWIGLU 2

// `b` broadcasts over leading dims: its nb elements repeat along a (nb divides n).
extern "C" __global__ void binary(const float* a, const float* b, float* y, i64 n, i64 nb, int op) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p = a[i], q = b[i % nb];
    float v;
    switch (op) {
        case BINARY_ADD: v = p + q; break;
        case BINARY_MUL: v = p * q; break;
        default: v = silu_f(p) * q; break;
    }
    y[i] = v;
}

// dst [outer, len, inner] = src [outer, d, inner] narrowed to start..start+len along the middle.
extern "C" __global__ void narrow_copy(const float* src, float* dst, i64 outer, i64 d, i64 start,
                                       i64 len, i64 inner) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= outer * len * inner) return;
    i64 e = i % inner, j = (i / inner) % len, o = i / (inner * len);
    dst[i] = src[(o * d + start + j) * inner + e];
}

// cache [Hk, cap, D] at positions pos..pos+T  <-  new [T, Hk, D].
extern "C" __global__ void kv_write(float* cache, const float* src, int t_len, int hk, int d,
                                    int cap, int pos) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)t_len * hk * d) return;
    int e = (int)(i % d);
    int h = (int)((i / d) % hk);
    int t = (int)(i / ((i64)d * hk));
    cache[((i64)h * cap + pos + t) * d + e] = src[i];
}

// *flag becomes nonzero when any element is NaN or infinite (*flag starts at 0).
extern "C" __global__ void any_nonfinite(const float* x, i64 n, u32* flag) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    // All-ones exponent bits: infinity or NaN.
    if (i < n && (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) atomicOr(flag, 1u);
}

// Sparse MoE combine: y [T*k, n] rows of each token's k experts, w [T*k] their weights;
// out [T, n] = sum_j w[t*k+j] * y[t*k+j] (j in order, as the CPU sums), plus scale[t] * shared[t]
// when has_shared (shared [T, n], scale [T]).
extern "C" __global__ void moe_combine(const float* y, const float* w, const float* shared,
                                       const float* scale, float* out, i64 tokens, int k, int n,
                                       int has_shared) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tokens * n) return;
    i64 t = i / n, c = i % n;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
        i64 p = t * k + j;
        acc = acc + __fmul_rn(y[p * n + c], w[p]);
    }
    if (has_shared) acc = acc + __fmul_rn(scale[t], shared[i]);
    out[i] = acc;
}
