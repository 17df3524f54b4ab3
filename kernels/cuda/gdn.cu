// Gated DeltaNet (docs/design.md section 5) and the depthwise causal conv that feeds it, mirroring
// kernels/src/cpu/gdn/. Shapes (one sequence): q, k [T, Hk, Dk]; v [T, Hv, Dv]; g_log, beta
// [T, Hv]; state [Hv, Dv, Dk]; y [T, Hv, Dv]; value head h reads key head h / (Hv / Hk).
//
// The chunked path runs on zero-padded chunks of L <= GDN_MAX_L steps laid out per
// (head, chunk) "slab" b = h * C + c, so the matrix products are strided-batched cuBLAS calls;
// the kernels here gather the slabs, compute the decays as direct segment sums, apply the
// masks, invert (I + A) by forward substitution and scatter the output. Padding rows have
// q = k = v = beta = 0 and g = 0 (no decay), which leaves every real row's result unchanged.

#define GDN_MAX_DK_PER_LANE 8  // Dk <= 256 (checked on the host)
#define GDN_MAX_L 64

// The decay gate in log space: g = -exp(A_log + ln softplus(a + dt_bias)) in f64, clamped at
// GATE_FLOOR (kernels/src/cpu/gdn/gate.rs). One thread per element of a [T, Hv].
#define GATE_FLOOR (-1e30f)
extern "C" __global__ void gdn_gate(const float* a, const float* a_log, const float* dt_bias,
                                    float* g, i64 n, int hv) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int h = (int)(i % hv);
    double x = (double)a[i] + (double)dt_bias[h];
    double ln_sp = x < -36.0 ? x : log(fmax(x, 0.0) + log1p(exp(-fabs(x))));
    double r = -exp((double)a_log[h] + ln_sp);
    g[i] = r < (double)GATE_FLOOR ? GATE_FLOOR : (float)r;
}

// Per-step recurrence: S <- e^g S; delta = beta (v - S k); S <- S + delta k^T; y = S q.
// Block: 128 threads = 4 warps; warp w owns state row r = 4 * blockIdx.y + w of value head
// h = blockIdx.x, held in registers (lane l keeps elements l, l + 32, ...) across all T steps.
// Grid: (Hv, ceil(Dv / 4)).
extern "C" __global__ void gdn_recurrent(const float* q, const float* k, const float* v,
                                         const float* g, const float* beta, float* state,
                                         float* y, int t_len, int hk, int hv, int dk, int dv) {
    int h = blockIdx.x;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.y * 4 + warp;
    if (r >= dv) return;  // the whole warp leaves together
    int kh = h / (hv / hk);
    float* row = state + ((i64)h * dv + r) * dk;
    float s[GDN_MAX_DK_PER_LANE];
    for (int e = 0; e < GDN_MAX_DK_PER_LANE; e++) {
        int i = lane + WARP * e;
        s[e] = i < dk ? row[i] : 0.0f;
    }
    for (int t = 0; t < t_len; t++) {
        const float* kt = k + ((i64)t * hk + kh) * dk;
        const float* qt = q + ((i64)t * hk + kh) * dk;
        i64 at = (i64)t * hv + h;
        float decay = expf(g[at]);
        float b = beta[at];
        float vt = v[at * dv + r];
        float dot = 0.0f;
        for (int e = 0; e < GDN_MAX_DK_PER_LANE; e++) {
            int i = lane + WARP * e;
            if (i < dk) {
                s[e] *= decay;
                dot += s[e] * kt[i];
            }
        }
        float delta = b * (vt - warp_sum(dot));
        float o = 0.0f;
        for (int e = 0; e < GDN_MAX_DK_PER_LANE; e++) {
            int i = lane + WARP * e;
            if (i < dk) {
                s[e] += delta * kt[i];
                o += s[e] * qt[i];
            }
        }
        o = warp_sum(o);
        if (lane == 0) y[at * dv + r] = o;
    }
    for (int e = 0; e < GDN_MAX_DK_PER_LANE; e++) {
        int i = lane + WARP * e;
        if (i < dk) row[i] = s[e];
    }
}

// Depthwise causal conv: out[t, c] = sum_j w[c, j] * [state; x][t + j, c], then SiLU when asked.
// state [K-1, C] holds the inputs before x. One thread per (t, c), 256 per block.
extern "C" __global__ void conv1d(const float* x, const float* w, const float* state, float* out,
                                  int t_len, int c_len, int kw, int silu) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (i64)t_len * c_len) return;
    int c = (int)(id % c_len);
    int t = (int)(id / c_len);
    int hist = kw - 1;
    float acc = 0.0f;
    for (int j = 0; j < kw; j++) {
        int src = t + j;
        float xv = src < hist ? state[(i64)src * c_len + c] : x[(i64)(src - hist) * c_len + c];
        acc += w[(i64)c * kw + j] * xv;
    }
    out[id] = silu ? silu_f(acc) : acc;
}

// The conv's new history: the last K-1 rows of [state; x], into a new buffer. One thread per
// element of [K-1, C].
extern "C" __global__ void conv1d_state(const float* x, const float* state, float* next,
                                        int t_len, int c_len, int kw) {
    int hist = kw - 1;
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (i64)hist * c_len) return;
    int c = (int)(id % c_len);
    int r = (int)(id / c_len) + t_len;  // row of [state; x]
    next[id] = r < hist ? state[(i64)r * c_len + c] : x[(i64)(r - hist) * c_len + c];
}

// ---- chunked path: slab kernels ----------------------------------------------------------

// qk [B, 2L, Dk]: rows 0..L the chunk's q, rows L..2L its k (key head of h), zero past T.
// One thread per element of [B, L, Dk].
extern "C" __global__ void gdn_gather_qk(const float* q, const float* k, float* qk, int t_len,
                                         int hk, int hv, int dk, int chunks, int l) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (i64)hv * chunks * l * dk) return;
    int e = (int)(id % dk);
    int i = (int)((id / dk) % l);
    i64 b = id / ((i64)dk * l);
    int h = (int)(b / chunks), c = (int)(b % chunks);
    int t = c * l + i;
    int kh = h / (hv / hk);
    float qv = 0.0f, kv = 0.0f;
    if (t < t_len) {
        i64 at = ((i64)t * hk + kh) * dk + e;
        qv = q[at];
        kv = k[at];
    }
    qk[(b * 2 * l + i) * dk + e] = qv;
    qk[(b * 2 * l + l + i) * dk + e] = kv;
}

// g, beta [B, L] and bv = beta * v [B, L, Dv], zero past T. One thread per element of
// [B, L, Dv] (the d == 0 threads also write g and beta).
extern "C" __global__ void gdn_gather_v(const float* v, const float* g, const float* beta,
                                        float* gs, float* bs, float* bv, int t_len, int hv,
                                        int dv, int chunks, int l) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (i64)hv * chunks * l * dv) return;
    int e = (int)(id % dv);
    int i = (int)((id / dv) % l);
    i64 b = id / ((i64)dv * l);
    int h = (int)(b / chunks), c = (int)(b % chunks);
    int t = c * l + i;
    float gv = 0.0f, be = 0.0f, vv = 0.0f;
    if (t < t_len) {
        i64 at = (i64)t * hv + h;
        gv = g[at];
        be = beta[at];
        vv = v[at * dv + e];
    }
    bv[id] = be * vv;
    if (e == 0) {
        gs[b * l + i] = gv;
        bs[b * l + i] = be;
    }
}

// Decays of each slab as exp of direct segment sums of g (never differences of cumulative sums):
// head[i] = e^(g_0 + .. + g_i), tail[j] = e^(g_{j+1} + .. + g_{L-1}) summed from the end,
// dec[i, j] = e^(g_{j+1} + .. + g_i) for j < i, 1 on the diagonal, 0 above. The sums run in the
// CPU's order. Block: L threads (thread i or j) per slab; grid B.
extern "C" __global__ void gdn_decays(const float* g, float* head, float* tail, float* dec, int l) {
    i64 b = blockIdx.x;
    int j = threadIdx.x;
    if (j >= l) return;
    const float* gb = g + b * l;
    float sum = 0.0f;
    for (int t = 0; t <= j; t++) sum += gb[t];
    head[b * l + j] = expf(sum);
    sum = 0.0f;
    for (int t = l - 1; t > j; t--) sum += gb[t];
    tail[b * l + j] = expf(sum);
    float* d = dec + b * l * l;
    for (int i = 0; i < j; i++) d[(i64)i * l + j] = 0.0f;
    d[(i64)j * l + j] = 1.0f;
    sum = 0.0f;
    for (int i = j + 1; i < l; i++) {
        sum += gb[i];
        d[(i64)i * l + j] = expf(sum);
    }
}

// scores [B, 2L, L] = [q; k] k^T. Top half becomes P = (q k^T) * dec, inclusive lower triangle;
// bottom half becomes A = beta_i (k k^T) * dec, strictly lower. Entries outside are written as
// plain zeros (a select, never a product). One thread per element of [B, L, L].
extern "C" __global__ void gdn_masks(float* scores, const float* dec, const float* beta, int l,
                                     i64 slabs) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= slabs * l * l) return;
    int j = (int)(id % l);
    int i = (int)((id / l) % l);
    i64 b = id / ((i64)l * l);
    float dv = dec[id];
    float* p = scores + b * 2 * l * l;
    float* a = p + (i64)l * l;
    i64 ij = (i64)i * l + j;
    p[ij] = j <= i ? p[ij] * dv : 0.0f;
    a[ij] = j < i ? beta[b * l + i] * a[ij] * dv : 0.0f;
}

// m = (I + A)^-1 by forward substitution, row by row: m_i = e_i - sum_{j<i} A_ij m_j (A is the
// bottom half of each scores slab). Column c of row i only collects j >= c, in ascending j as
// on the CPU. Block: L threads (one per column), the slab's rows built in shared memory; grid B.
extern "C" __global__ void gdn_inverse(const float* scores, float* m, int l) {
    __shared__ float ms[GDN_MAX_L * GDN_MAX_L];
    i64 b = blockIdx.x;
    int c = threadIdx.x;
    const float* a = scores + b * 2 * l * l + (i64)l * l;
    for (int i = 0; i < l; i++) {
        if (c < l) {
            float r = c == i ? 1.0f : 0.0f;
            if (c < i)
                for (int j = c; j < i; j++) r -= a[(i64)i * l + j] * ms[j * GDN_MAX_L + c];
            ms[i * GDN_MAX_L + c] = r;
        }
        __syncthreads();
    }
    if (c < l)
        for (int i = 0; i < l; i++) m[(b * l + i) * l + c] = ms[i * GDN_MAX_L + c];
}

// From qk and the decays: kw = beta * head * k (W's right-hand side), kt = tail * k (the state
// update's), and the top half of qw = -head * q. One thread per element of [B, L, Dk].
extern "C" __global__ void gdn_prep(const float* qk, const float* bs, const float* head,
                                    const float* tail, float* kw, float* kt, float* qw, int dk,
                                    int l, i64 slabs) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= slabs * l * dk) return;
    int e = (int)(id % dk);
    int i = (int)((id / dk) % l);
    i64 b = id / ((i64)dk * l);
    i64 bi = b * l + i;
    float qv = qk[(b * 2 * l + i) * dk + e];
    float kv = qk[(b * 2 * l + l + i) * dk + e];
    kw[id] = (bs[bi] * head[bi]) * kv;
    kt[id] = tail[bi] * kv;
    qw[(b * 2 * l + i) * dk + e] = qv * -head[bi];
}

// state[h] *= head[h, c, L-1] (e^(G_last) of chunk c) before the chunk's rank-L update. One
// thread per element of [Hv, Dv * Dk].
extern "C" __global__ void gdn_decay_state(float* state, const float* head, int chunk,
                                           int chunks, int l, i64 per_head, i64 n) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n) return;
    i64 h = id / per_head;
    state[id] *= head[(h * chunks + chunk) * l + l - 1];
}

// y [T, Hv, Dv] <- the top (output) half of od [B, 2L, Dv], dropping padded rows. One thread
// per element of y.
extern "C" __global__ void gdn_scatter(const float* od, float* y, int t_len, int hv, int dv,
                                       int chunks, int l) {
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (i64)t_len * hv * dv) return;
    int e = (int)(id % dv);
    int h = (int)((id / dv) % hv);
    int t = (int)(id / ((i64)dv * hv));
    int c = t / l, i = t % l;
    i64 b = (i64)h * chunks + c;
    y[id] = od[(b * 2 * l + i) * dv + e];
}
