//! Row-major matrix products on cuBLAS, which is column-major.
//!
//! A row-major matrix stored with leading dimension `ld` is, read column-major, its own
//! transpose. So the row-major product `C = op(A)·op(B)` is computed as the column-major
//! `Cᵀ = op(B)ᵀ·op(A)ᵀ`: cuBLAS gets B first and A second, each with its own transpose flag, and
//! `m`, `n` swapped. [`Gemm::cublas_call`] does that mapping; the tests check it against a
//! plain column-major evaluation of the cuBLAS call on the host.

use std::ffi::c_void;

use cudarc::cublas::{result as cublas, sys};

use super::context::{cuda_err, gpu};
use crate::error::Result;

/// Element type of an input operand (the output is always f32, accumulation f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum In {
    F32,
    BF16,
    F16,
}

/// A row-major operand: logical element `(r, c)` sits at `ptr[r·ld + c]`, or at `ptr[c·ld + r]`
/// when `trans` (the operand is the transpose of what is stored). `stride` (elements) separates
/// batch items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub ptr: u64,
    pub ld: usize,
    pub trans: bool,
    pub stride: usize,
}

impl Operand {
    pub fn rows(ptr: u64, ld: usize) -> Operand {
        Operand {
            ptr,
            ld,
            trans: false,
            stride: 0,
        }
    }

    pub fn t(self) -> Operand {
        Operand {
            trans: !self.trans,
            ..self
        }
    }

    pub fn batched(self, stride: usize) -> Operand {
        Operand { stride, ..self }
    }
}

/// `C = alpha·op(A)·op(B) + beta·C` for `batch` items, all row-major: `A` is `m × k`, `B` is
/// `k × n`, `C` is `m × n` (never transposed).
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub alpha: f32,
    pub beta: f32,
}

/// The column-major call cuBLAS receives (its own names: `a` is its first operand).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CublasCall {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
}

impl Gemm {
    /// `Cᵀ (n × m) = op(B)ᵀ (n × k) · op(A)ᵀ (k × m)`: a row-major operand read column-major is
    /// already transposed, so each keeps its own flag.
    pub fn cublas_call(&self) -> CublasCall {
        CublasCall {
            trans_a: self.b.trans,
            trans_b: self.a.trans,
            m: self.n,
            n: self.m,
            k: self.k,
            a: self.b,
            b: self.a,
            c: self.c,
        }
    }

    /// Runs the product on the GPU with inputs of type `input` (f32 output, f32 accumulation:
    /// `CUBLAS_COMPUTE_32F`, which never rounds inputs to TF32).
    pub fn run(&self, input: In) -> Result<()> {
        if self.m == 0 || self.n == 0 || self.batch == 0 {
            return Ok(());
        }
        let g = gpu()?;
        let call = self.cublas_call();
        let int = |v: usize, what| super::launch::int("matmul", what, v);
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let ty = match input {
            In::F32 => sys::cudaDataType::CUDA_R_32F,
            In::BF16 => sys::cudaDataType::CUDA_R_16BF,
            In::F16 => sys::cudaDataType::CUDA_R_16F,
        };
        let (alpha, beta) = (self.alpha, self.beta);
        // SAFETY: the caller's operands are live device buffers large enough for the strides
        // and batch given (checked by each op before it builds the Gemm); alpha/beta are host
        // scalars read during the call.
        unsafe {
            cublas::gemm_strided_batched_ex(
                g.blas,
                op(call.trans_a),
                op(call.trans_b),
                int(call.m, "m")?,
                int(call.n, "n")?,
                int(call.k, "k")?,
                (&alpha as *const f32).cast::<c_void>(),
                call.a.ptr as *const c_void,
                ty,
                int(call.a.ld, "lda")?,
                call.a.stride as i64,
                call.b.ptr as *const c_void,
                ty,
                int(call.b.ld, "ldb")?,
                call.b.stride as i64,
                (&beta as *const f32).cast::<c_void>(),
                call.c.ptr as *mut c_void,
                sys::cudaDataType::CUDA_R_32F,
                int(call.c.ld, "ldc")?,
                call.c.stride as i64,
                int(self.batch, "batch")?,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| cuda_err("matmul", format!("cuBLAS: {e:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What cuBLAS computes for `call`, evaluated column-major over `mem` (operand pointers are
    /// offsets into it): element `(i, j)` of a column-major matrix is `ptr[i + j·ld]`.
    fn eval_column_major(call: &CublasCall, batch: usize, alpha: f32, beta: f32, mem: &mut [f32]) {
        let at = |o: &Operand, bi: usize, i: usize, j: usize, trans: bool| {
            let (r, c) = if trans { (j, i) } else { (i, j) };
            o.ptr as usize + bi * o.stride + r + c * o.ld
        };
        for bi in 0..batch {
            for i in 0..call.m {
                for j in 0..call.n {
                    let mut s = 0.0f32;
                    for l in 0..call.k {
                        s += mem[at(&call.a, bi, i, l, call.trans_a)]
                            * mem[at(&call.b, bi, l, j, call.trans_b)];
                    }
                    let ci = at(&call.c, bi, i, j, false);
                    mem[ci] = alpha * s + beta * mem[ci];
                }
            }
        }
    }

    fn value(i: usize) -> f32 {
        ((i * 7919) % 23) as f32 - 11.0
    }

    /// Row-major `C = op(A)·op(B)` for every transpose combination and a batch of 2, through
    /// the cuBLAS mapping, against the plain definition.
    #[test]
    fn row_major_products_map_to_the_right_cublas_call() {
        let (m, n, k, batch) = (3usize, 5usize, 4usize, 2usize);
        for ta in [false, true] {
            for tb in [false, true] {
                // Stored shapes: A is m×k (or k×m when transposed), B is k×n (or n×k).
                let (lda, ldb) = (if ta { m + 1 } else { k + 2 }, if tb { k + 1 } else { n });
                let a_rows = if ta { k } else { m };
                let b_rows = if tb { n } else { k };
                let (a_len, b_len, c_len) = (a_rows * lda, b_rows * ldb, m * (n + 3));
                let (a0, b0) = (0, batch * a_len);
                let c0 = b0 + batch * b_len;
                let mut mem: Vec<f32> = (0..c0 + batch * c_len).map(value).collect();
                let a = Operand {
                    ptr: a0 as u64,
                    ld: lda,
                    trans: ta,
                    stride: a_len,
                };
                let b = Operand {
                    ptr: b0 as u64,
                    ld: ldb,
                    trans: tb,
                    stride: b_len,
                };
                let c = Operand::rows(c0 as u64, n + 3).batched(c_len);
                let want: Vec<f32> = (0..batch)
                    .flat_map(|bi| {
                        let mem = &mem;
                        (0..m * n).map(move |e| {
                            let (i, j) = (e / n, e % n);
                            let ae = |r: usize, col: usize| {
                                let (r, col) = if ta { (col, r) } else { (r, col) };
                                mem[a0 + bi * a_len + r * lda + col]
                            };
                            let be = |r: usize, col: usize| {
                                let (r, col) = if tb { (col, r) } else { (r, col) };
                                mem[b0 + bi * b_len + r * ldb + col]
                            };
                            let s: f32 = (0..k).map(|l| ae(i, l) * be(l, j)).sum();
                            2.0 * s + 0.5 * mem[c0 + bi * c_len + i * (n + 3) + j]
                        })
                    })
                    .collect();
                let g = Gemm {
                    m,
                    n,
                    k,
                    batch,
                    a,
                    b,
                    c,
                    alpha: 2.0,
                    beta: 0.5,
                };
                eval_column_major(&g.cublas_call(), batch, 2.0, 0.5, &mut mem);
                let got: Vec<f32> = (0..batch)
                    .flat_map(|bi| {
                        let mem = &mem;
                        (0..m * n).map(move |e| mem[c0 + bi * c_len + (e / n) * (n + 3) + e % n])
                    })
                    .collect();
                assert_eq!(got, want, "trans a {ta}, trans b {tb}");
            }
        }
    }
}
