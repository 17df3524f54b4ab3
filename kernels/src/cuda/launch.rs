//! Launch geometry of every kernel as plain functions of the problem shape, so it is checked
//! without a GPU. Each function states the block layout its kernel documents in
//! `kernels/cuda/*.cu`; the constants shared with the CUDA side are compared with the sources'
//! `#define`s in the tests below.

use crate::error::{invalid, Result};

/// Grid and block of one launch (no kernel here uses dynamic shared memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
}

/// Threads per block of the one-thread-per-element kernels.
pub const ELEMENT_THREADS: u32 = 256;
/// Threads per block of the one-block-per-row kernels (`rows.cu`'s `ROW_THREADS`).
pub const ROW_THREADS: u32 = 256;
/// Input rows the decode matvec handles (`MATVEC_MAX_M`); more take the prefill path.
pub const MATVEC_MAX_M: usize = 4;
/// Weight rows per matvec block, one per warp (`MATVEC_ROWS_PER_BLOCK`).
pub const MATVEC_ROWS_PER_BLOCK: usize = 4;
/// Output tile of the tiled quantized matmul (`GEMM_TM` = `GEMM_TN`).
pub const GEMM_TILE: usize = 64;
/// Largest head dimension of the attention kernel (`ATTN_MAX_D`).
pub const ATTN_MAX_D: usize = 512;
/// Threads per attention block (`ATTN_THREADS`).
pub const ATTN_THREADS: u32 = 128;
/// Largest key dimension of the per-step Gated DeltaNet kernel (32 lanes x
/// `GDN_MAX_DK_PER_LANE`).
pub const GDN_MAX_DK: usize = 256;
/// Longest chunk of the chunked Gated DeltaNet (`GDN_MAX_L`).
pub const GDN_MAX_L: usize = 64;
/// Elements scanned per top-k candidate block (`TOPK_CHUNK`).
pub const TOPK_CHUNK: usize = 4096;
/// Largest `k` the device top-k handles; larger `k` ranks the whole row on the host.
pub const TOPK_MAX_K: usize = 64;

/// CUDA's limits on grid dimensions.
const MAX_GRID_X: usize = (1 << 31) - 1;
const MAX_GRID_YZ: usize = 65_535;

fn grid_dim(op: &'static str, what: &str, v: usize, max: usize) -> Result<u32> {
    if v > max {
        return invalid(
            op,
            format!("{what} = {v} exceeds the CUDA grid limit {max}; split the call"),
        );
    }
    Ok(v as u32)
}

/// A size as the `int` kernels take; a clear error instead of a silent wrap past 2³¹.
pub fn int(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| crate::Error::Invalid {
        op,
        msg: format!("{what} = {v} does not fit the CUDA kernels' 32-bit sizes"),
    })
}

/// One thread per element, [`ELEMENT_THREADS`] per block.
pub fn elements(op: &'static str, n: usize) -> Result<Launch> {
    let blocks = n.div_ceil(ELEMENT_THREADS as usize).max(1);
    Ok(Launch {
        grid: (grid_dim(op, "blocks", blocks, MAX_GRID_X)?, 1, 1),
        block: (ELEMENT_THREADS, 1, 1),
    })
}

/// One block of [`ROW_THREADS`] per row.
pub fn rows(op: &'static str, rows: usize) -> Result<Launch> {
    Ok(Launch {
        grid: (grid_dim(op, "rows", rows.max(1), MAX_GRID_X)?, 1, 1),
        block: (ROW_THREADS, 1, 1),
    })
}

/// The decode matvec: one warp per weight row, [`MATVEC_ROWS_PER_BLOCK`] warps per block.
pub fn matvec(n: usize) -> Result<Launch> {
    let blocks = n.div_ceil(MATVEC_ROWS_PER_BLOCK).max(1);
    Ok(Launch {
        grid: (grid_dim("matmul", "blocks", blocks, MAX_GRID_X)?, 1, 1),
        block: (32 * MATVEC_ROWS_PER_BLOCK as u32, 1, 1),
    })
}

/// The tiled matmul: 16 x 16 threads per [`GEMM_TILE`]² output tile, grid (N tiles, M tiles).
pub fn tiled(m: usize, n: usize) -> Result<Launch> {
    Ok(Launch {
        grid: (
            grid_dim("matmul", "column tiles", n.div_ceil(GEMM_TILE), MAX_GRID_X)?,
            grid_dim("matmul", "row tiles", m.div_ceil(GEMM_TILE), MAX_GRID_YZ)?,
            1,
        ),
        block: (16, 16, 1),
    })
}

/// Attention: one block per (query row, query head).
pub fn attention(t: usize, heads: usize) -> Result<Launch> {
    Ok(Launch {
        grid: (
            grid_dim("attention", "query rows", t, MAX_GRID_X)?,
            grid_dim("attention", "query heads", heads, MAX_GRID_YZ)?,
            1,
        ),
        block: (ATTN_THREADS, 1, 1),
    })
}

/// The per-step Gated DeltaNet: one warp per state row, 4 per block, grid (Hv, ⌈Dv/4⌉).
pub fn gdn_recurrent(hv: usize, dv: usize) -> Result<Launch> {
    Ok(Launch {
        grid: (
            grid_dim("gdn_recurrent", "value heads", hv, MAX_GRID_X)?,
            grid_dim("gdn_recurrent", "row blocks", dv.div_ceil(4), MAX_GRID_YZ)?,
            1,
        ),
        block: (128, 1, 1),
    })
}

/// Chunked Gated DeltaNet slab kernels (decays, inverse): one block of `l` threads per slab.
pub fn slabs(slabs: usize, l: usize) -> Result<Launch> {
    Ok(Launch {
        grid: (grid_dim("gdn_chunked", "slabs", slabs, MAX_GRID_X)?, 1, 1),
        block: (l as u32, 1, 1),
    })
}

/// Top-k candidates: blocks of [`TOPK_CHUNK`] elements each keep their best `k`.
pub fn topk(n: usize) -> Result<(Launch, usize)> {
    let blocks = n.div_ceil(TOPK_CHUNK).max(1);
    Ok((
        Launch {
            grid: (grid_dim("top_k", "blocks", blocks, MAX_GRID_X)?, 1, 1),
            block: (ROW_THREADS, 1, 1),
        },
        blocks,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::sources;

    /// The value of `#define NAME value` in a CUDA source.
    fn define(src: &str, name: &str) -> usize {
        let line = src
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("no #define {name}"));
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    }

    #[test]
    fn constants_agree_with_the_cuda_sources() {
        let w = sources::WEIGHTS.text;
        assert_eq!(define(w, "MATVEC_MAX_M"), MATVEC_MAX_M);
        assert_eq!(define(w, "MATVEC_ROWS_PER_BLOCK"), MATVEC_ROWS_PER_BLOCK);
        assert_eq!(define(w, "GEMM_TM"), GEMM_TILE);
        assert_eq!(define(w, "GEMM_TN"), GEMM_TILE);
        let a = sources::ATTENTION.text;
        assert_eq!(define(a, "ATTN_MAX_D"), ATTN_MAX_D);
        assert_eq!(define(a, "ATTN_THREADS"), ATTN_THREADS as usize);
        let r = sources::ROWS.text;
        assert_eq!(define(r, "ROW_THREADS"), ROW_THREADS as usize);
        assert_eq!(define(r, "TOPK_CHUNK"), TOPK_CHUNK);
        let g = sources::GDN.text;
        assert_eq!(define(g, "GDN_MAX_DK_PER_LANE") * 32, GDN_MAX_DK);
        assert_eq!(define(g, "GDN_MAX_L"), GDN_MAX_L);
    }

    #[test]
    fn element_grids_cover_every_element_once_rounded_up() {
        for n in [0usize, 1, 255, 256, 257, 1 << 20] {
            let l = elements("t", n).unwrap();
            let threads = l.grid.0 as usize * l.block.0 as usize;
            assert!(
                threads >= n && threads < n.max(1) + ELEMENT_THREADS as usize,
                "{n}"
            );
        }
    }

    #[test]
    fn matmul_grids_cover_the_output() {
        let l = matvec(1025).unwrap();
        assert_eq!((l.grid.0, l.block.0), (257, 128));
        let l = tiled(65, 129).unwrap();
        assert_eq!((l.grid.0, l.grid.1, l.block), (3, 2, (16, 16, 1)));
        let l = gdn_recurrent(16, 128).unwrap();
        assert_eq!(l.grid, (16, 32, 1));
        let (l, blocks) = topk(151_936).unwrap();
        assert_eq!((l.grid.0 as usize, blocks), (38, 38));
    }

    #[test]
    fn sizes_past_the_limits_are_errors_not_wraps() {
        assert!(attention(4, 70_000).is_err());
        assert!(tiled(64 * 70_000, 64).is_err());
        assert!(int("t", "n", 1 << 31).is_err());
        assert_eq!(int("t", "n", (1 << 31) - 1).unwrap(), i32::MAX);
    }
}
