// Causal GQA attention with an optional sliding window and tanh soft-capping, one query row per
// block, folded over key tiles with an online softmax (the CPU reference's algorithm, without
// its task batching).
//
// q [T, Hq, D]; k, v caches [Hk, cap, D]; out [T, Hq, D]. Query row t sits at position
// q_start + t and sees keys p with p <= q_start + t and, when window > 0, p > q_start + t - window.
// Scores are scale * (q . k), then cap * tanh(s / cap) when softcap > 0.
//
// Block: ATTN_THREADS threads (4 warps) for query (t = blockIdx.x, head h = blockIdx.y). Per tile
// of ATTN_TILE keys, warp w scores keys w, w + 4, ... (lanes over D, a warp sum), then every
// thread folds the tile into the accumulator dims it owns: d = threadIdx.x + ATTN_THREADS * s.
// D <= ATTN_MAX_D (checked on the host).

#define ATTN_THREADS 128
#define ATTN_TILE 64
#define ATTN_MAX_D 512
#define ATTN_SLOTS (ATTN_MAX_D / ATTN_THREADS)

extern "C" __global__ void attention(const float* q, const float* k, const float* v, float* out,
                                     int hq, int hk, int d, int cap, int q_start, float scale,
                                     int window, float softcap) {
    __shared__ float qs[ATTN_MAX_D];
    __shared__ float p[ATTN_TILE];
    int t = blockIdx.x, h = blockIdx.y;
    int kh = h / (hq / hk);
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const float* qrow = q + ((i64)t * hq + h) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) qs[i] = qrow[i];
    __syncthreads();

    int pos = q_start + t;
    int hi = pos + 1;
    int lo = window > 0 ? max(0, pos + 1 - window) : 0;
    const float* kc = k + (i64)kh * cap * d;
    const float* vc = v + (i64)kh * cap * d;

    float acc[ATTN_SLOTS];
    for (int s = 0; s < ATTN_SLOTS; s++) acc[s] = 0.0f;
    float run_max = NEG_INF, run_sum = 0.0f;
    for (int j0 = lo; j0 < hi; j0 += ATTN_TILE) {
        int nk = min(ATTN_TILE, hi - j0);
        for (int j = warp; j < nk; j += ATTN_THREADS / WARP) {
            const float* kr = kc + (i64)(j0 + j) * d;
            float s = 0.0f;
            for (int i = lane; i < d; i += WARP) s += qs[i] * kr[i];
            s = warp_sum(s) * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            if (lane == 0) p[j] = s;
        }
        __syncthreads();
        // Every thread derives the same tile statistics from the shared scores.
        float tile_max = NEG_INF;
        for (int j = 0; j < nk; j++) tile_max = fmaxf(tile_max, p[j]);
        float new_max = fmaxf(run_max, tile_max);
        float corr = expf(run_max - new_max);  // 0 for the first tile (exp(-inf))
        for (int s = 0; s < ATTN_SLOTS; s++) acc[s] *= corr;
        float tile_sum = 0.0f;
        for (int j = 0; j < nk; j++) {
            float e = expf(p[j] - new_max);
            tile_sum += e;
            const float* vr = vc + (i64)(j0 + j) * d;
            for (int s = 0; s < ATTN_SLOTS; s++) {
                int i = threadIdx.x + ATTN_THREADS * s;
                if (i < d) acc[s] += e * vr[i];
            }
        }
        run_sum = run_sum * corr + tile_sum;
        run_max = new_max;
        __syncthreads();  // p is rewritten by the next tile
    }
    // Every row sees at least its own position, so run_sum >= 1 unless inputs are NaN.
    float inv = 1.0f / run_sum;
    float* orow = out + ((i64)t * hq + h) * d;
    for (int s = 0; s < ATTN_SLOTS; s++) {
        int i = threadIdx.x + ATTN_THREADS * s;
        if (i < d) orow[i] = acc[s] * inv;
    }
}
