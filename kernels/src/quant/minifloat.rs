//! The small float codes of MLX's fp quantization modes: E2M1 (fp4 values), E4M3 (fp8 values
//! and nvfp4 scales) and E8M0 (power-of-two scales of the mx modes). Decoding follows the OCP
//! microscaling spec as MLX reads it; encoding reproduces MLX's own rounding (see each fn).

/// The 16 E2M1 values: sign bit 3, then magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// E2M1 code (low 4 bits of `code`) to f32.
#[inline(always)]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_VALUES[(code & 0xF) as usize]
}

/// E4M3 (bias 7, no infinities, `S.1111.111` is NaN, largest finite 448) to f32.
pub const fn e4m3_to_f32(code: u8) -> f32 {
    let sign = ((code as u32) & 0x80) << 24;
    let e = ((code >> 3) & 0xF) as u32;
    let m = (code & 0x7) as u32;
    if e == 0xF && m == 0x7 {
        return f32::NAN;
    }
    if e == 0 {
        // Subnormal: m · 2^-9, exact in f32.
        let v = m as f32 * (1.0 / 512.0);
        return if sign != 0 { -v } else { v };
    }
    f32::from_bits(sign | ((e + 120) << 23) | (m << 20))
}

/// Every E4M3 code decoded, so the fp8 kernels do one table load per value.
pub static E4M3_TABLE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_to_f32(i as u8);
        i += 1;
    }
    t
};

/// f32 to E4M3 the way MLX's CPU `to_fp8` does it: round to nearest even, and every
/// magnitude from 448 up (infinities and NaN included) saturates to ±448 (`0x7E`).
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = f32::from_bits(bits & 0x7FFF_FFFF);
    if a >= 448.0 || a.is_nan() {
        return 0x7E | sign;
    }
    if a < 1.0 / 64.0 {
        // Below the smallest normal (2^-6) the code is the count of 2^-9 steps; code 8 is 2^-6.
        return (a * 512.0).round_ties_even() as u8 | sign;
    }
    let abits = a.to_bits();
    let exp = (abits >> 23) as i32 - 127;
    let mant = abits & 0x7F_FFFF;
    let (keep, rest) = (mant >> 20, mant & 0xF_FFFF);
    let up = rest > 0x8_0000 || (rest == 0x8_0000 && keep & 1 == 1);
    // A mantissa carry rolls into the exponent field, which is exactly what rounding up means.
    let code = (((exp + 7) as u32) << 3) + keep + up as u32;
    code as u8 | sign
}

/// E8M0 scale code to f32: `2^(code - 127)`. Like MLX, code 0 reads as 2^-127 and 255 as +inf
/// (the spec's NaN).
#[inline(always)]
pub fn e8m0_to_f32(code: u8) -> f32 {
    if code == 0 {
        f32::from_bits(0x0040_0000)
    } else {
        f32::from_bits((code as u32) << 23)
    }
}

/// E8M0 code of the power-of-two exponent `e`, stored as MLX does (`(e + 127)` cast to u8).
pub fn e8m0_from_exponent(e: i32) -> u8 {
    (e + 127) as u8
}
