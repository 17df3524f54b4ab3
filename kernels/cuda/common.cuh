// Shared device helpers. The Rust side prepends this file to every kernel file before NVRTC
// compiles it (one translation unit per .cu file), so kernels need no #include and NVRTC needs
// no CUDA headers: only the compiler's built-in declarations are used.
//
// Conventions for every kernel in kernels/cuda/:
// - activations, caches and states are f32; `i64` is used for every flat index that multiplies
//   two sizes (a 150k x 4096 table overflows 32 bits);
// - each kernel documents its thread-block layout in one line above it, and checks bounds
//   itself, so a grid rounded up to whole blocks is always safe;
// - arithmetic mirrors the CPU reference (kernels/src/cpu/); where the CPU rounds a product
//   before adding it (weight decoding, RoPE), the __fmul_rn/__fadd_rn intrinsics keep NVRTC from
//   fusing them into an FMA, so decoded weights are bit-identical to the CPU's.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;

#define NEG_INF (-__int_as_float(0x7f800000))
#define WARP 32

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ u16 f32_to_f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

struct Add {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// `f` over the 32 lanes of a warp, in a fixed butterfly order; every lane gets the result.
template <typename T, typename F>
__device__ __forceinline__ T warp_reduce(T v, F f) {
    for (int o = WARP / 2; o > 0; o /= 2) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Add()); }

// `f` over the whole block (blockDim.x a multiple of 32, at most 1024), warps first, then the
// warps' results in warp order; every thread gets the result. `scratch` holds 32 values and is
// free again when the function returns.
template <typename T, typename F>
__device__ T block_reduce(T v, T* scratch, F f) {
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_reduce(v, f);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    T r = scratch[0];
    for (int i = 1; i < nw; i++) r = f(r, scratch[i]);
    __syncthreads();
    return r;
}

// Any-thread flag over the block: nonzero when any thread passed a nonzero value.
__device__ int block_any(int v, int* scratch) {
    __syncthreads();
    if (threadIdx.x == 0) *scratch = 0;
    __syncthreads();
    if (v) atomicOr(scratch, 1);
    __syncthreads();
    int r = *scratch;
    __syncthreads();
    return r;
}

// The CPU's activations (kernels/src/cpu/unary.rs), same formulas and the same explicit limits.
__device__ __forceinline__ float sigmoid_f(float x) {
    float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

__device__ __forceinline__ float silu_f(float x) {
    if (x == NEG_INF) return -0.0f;
    return x * sigmoid_f(x);
}

__device__ __forceinline__ float softplus_f(float x) {
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

__device__ __forceinline__ float gelu_tanh_f(float x) {
    const float two_c = 1.595769f;  // 2 * sqrt(2 / pi)
    if (x == NEG_INF) return -0.0f;
    return x * sigmoid_f(two_c * (x + 0.044715f * x * x * x));
}
