//! `(I + A)⁻¹` for a strictly lower-triangular `A`, the one inverse the chunked Gated DeltaNet
//! needs.
//!
//! Forward substitution, row by row: row `i` of `M = (I + A)⁻¹` is `e_i − Σ_{j<i} A_ij M_j`.
//! Every row is built from rows already exact to rounding, so the error stays at the level of
//! the entries themselves. The tempting alternative, the Neumann product
//! `Π (I + N^(2^s))` with `N = −A`, forms powers of `N` whose entries grow like binomial
//! coefficients and then cancel; in f32 at L = 64 those products overflow or lose every digit
//! (the property tests show both).

/// Writes `M = (I + A)⁻¹` into `m` (row-major `n × n`). Only the strictly lower triangle of `a`
/// (row-major `n × n`) is read; `m` comes out unit lower-triangular with exact zeros above the
/// diagonal. Panics if either slice is shorter than `n²` (a caller bug, not an input error).
pub fn unit_lower_inverse(a: &[f32], n: usize, m: &mut [f32]) {
    let (a, m) = (&a[..n * n], &mut m[..n * n]);
    m.fill(0.0);
    for i in 0..n {
        let (done, rest) = m.split_at_mut(i * n);
        let row = &mut rest[..n];
        row[i] = 1.0;
        // Row j of M is zero past column j, so the update touches columns 0..=j only. The
        // order over j is fixed, so the bits never depend on anything but the inputs.
        for j in 0..i {
            let aij = a[i * n + j];
            let mj = &done[j * n..j * n + j + 1];
            for (r, &x) in row[..=j].iter_mut().zip(mj) {
                *r -= aij * x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverts_a_small_matrix_exactly() {
        // I + A = [[1,0,0],[2,1,0],[3,4,1]]; its inverse is [[1,0,0],[-2,1,0],[5,-4,1]].
        let a = [0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 3.0, 4.0, 0.0];
        let mut m = [9.0f32; 9];
        unit_lower_inverse(&a, 3, &mut m);
        assert_eq!(m, [1.0, 0.0, 0.0, -2.0, 1.0, 0.0, 5.0, -4.0, 1.0]);
    }

    #[test]
    fn ignores_the_diagonal_and_upper_triangle() {
        let a = [7.0, 8.0, 0.5, 7.0];
        let mut m = [0.0f32; 4];
        unit_lower_inverse(&a, 2, &mut m);
        assert_eq!(m, [1.0, 0.0, -0.5, 1.0]);
    }
}
