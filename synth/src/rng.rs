//! Seeded random numbers for synthetic weights.
//!
//! Our own generator (SplitMix64) so the bytes of a checkpoint never change with a dependency
//! upgrade, and a normal sampler built from integer sums so that no libm function (whose last bit
//! can differ between platforms) touches the values: the same seed gives the same file on Linux,
//! macOS and any thread count.

/// The SplitMix64 generator (Steele, Lea & Flood 2014): one add and a 64-bit finaliser per draw.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// Approximately standard normal: the Irwin–Hall sum of four 16-bit uniforms, centred and
    /// scaled to unit variance. Bounded at ±√12 ≈ 3.46, which is fine for weights and keeps
    /// quantization ranges tame. Only integer adds and one f32 multiply, so bit-reproducible.
    pub fn normal(&mut self) -> f32 {
        let r = self.next_u64();
        let sum = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
        // Each part is (k + 0.5) / 65536 with k uniform in 0..65536: mean 1/2, variance ≈ 1/12.
        // The sum of four has mean 2 = 131070 / 65536 + 2 / 65536 · 1 in these units.
        const SCALE: f32 = (1.732_050_807_568_877_2_f64 / 65536.0) as f32;
        (sum as i64 - 131_070) as f32 * SCALE
    }

    /// Uniform in `0..n` (n > 0); the tiny modulo bias is irrelevant for picking tokens.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one named tensor: FNV-1a of the name mixed with the checkpoint seed, so a
/// tensor's values depend only on (seed, name), not on the order or thread that generates it.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h ^ mix64(seed))
}

/// The seed of the `index`-th fixed-size chunk of a tensor (chunks are generated in parallel).
pub fn chunk_seed(tensor_seed: u64, index: u64) -> u64 {
    mix64(tensor_seed ^ mix64(index.wrapping_add(GAMMA)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_sequence() {
        // First outputs of SplitMix64 seeded with 1234567, as published with the reference C
        // implementation (Vigna's splitmix64.c test vector).
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = SplitMix64::new(7);
        let n = 200_000;
        let (mut s1, mut s2) = (0f64, 0f64);
        for _ in 0..n {
            let x = r.normal() as f64;
            s1 += x;
            s2 += x * x;
        }
        let mean = s1 / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
    }
}
