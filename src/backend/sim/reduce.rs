//! The sums a simulated reduction writes: real arithmetic on the real bytes, so that a byte check
//! of an all-reduce means something on the simulator too.

use crate::backend::collective::DataType;

/// The element-wise sum of `inputs` (little-endian `dtype` elements, all of one length), added in
/// rank order. f32 adds in f32; bf16 accumulates in f32 and rounds once, to nearest, ties to even.
pub(super) fn sum(dtype: DataType, inputs: &[&[u8]]) -> Vec<u8> {
    let (first, rest) = inputs.split_first().expect("a reduction has inputs");
    match dtype {
        DataType::F32 => {
            let mut out = first.to_vec();
            for input in rest {
                for (acc, x) in out.chunks_exact_mut(4).zip(input.chunks_exact(4)) {
                    let total = f32_at(acc) + f32_at(x);
                    acc.copy_from_slice(&total.to_le_bytes());
                }
            }
            out
        }
        DataType::Bf16 => {
            let mut acc: Vec<f32> = first.chunks_exact(2).map(bf16_at).collect();
            for input in rest {
                for (a, x) in acc.iter_mut().zip(input.chunks_exact(2)) {
                    *a += bf16_at(x);
                }
            }
            acc.iter()
                .flat_map(|&x| bf16_from_f32(x).to_le_bytes())
                .collect()
        }
    }
}

fn f32_at(bytes: &[u8]) -> f32 {
    f32::from_le_bytes(bytes.try_into().expect("4 bytes"))
}

fn bf16_at(bytes: &[u8]) -> f32 {
    let bits = u16::from_le_bytes(bytes.try_into().expect("2 bytes"));
    f32::from_bits(u32::from(bits) << 16)
}

/// The bf16 nearest to `x`, ties to even; a NaN stays a (quiet) NaN.
pub(super) fn bf16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return (bits >> 16) as u16 | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    // No overflow: the largest non-NaN pattern, 0xff80_0000 (−∞), plus 0x8000 fits.
    ((bits + round) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn bf16s(values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| bf16_from_f32(v).to_le_bytes())
            .collect()
    }

    #[test]
    fn f32_sums_add_element_by_element() {
        let (a, b, c) = (
            f32s(&[1.0, -2.5, 1e30]),
            f32s(&[0.25, 2.5, 1e30]),
            f32s(&[3.0, 0.0, -1e30]),
        );
        assert_eq!(sum(DataType::F32, &[&a, &b, &c]), f32s(&[4.25, 0.0, 1e30]));
    }

    #[test]
    fn bf16_sums_accumulate_in_f32_and_round_once_to_nearest_even() {
        let one = bf16s(&[1.0, 1.0 + 1.0 / 128.0, 3.0]);
        // Rounding each partial sum to bf16 would drop every 2^-9 (a quarter step); in f32 the two
        // make 2^-8, half a step: 1 + 2^-8 rounds down to the even 1, 1 + 3·2^-8 up to 1 + 2^-6.
        let tiny = bf16s(&[1.0 / 512.0, 1.0 / 512.0, -1.0]);
        let want = bf16s(&[1.0, 1.0 + 1.0 / 64.0, 1.0]);
        assert_eq!(sum(DataType::Bf16, &[&one, &tiny, &tiny]), want);
    }

    #[test]
    fn rounding_to_bf16_is_to_nearest_ties_to_even() {
        assert_eq!(bf16_from_f32(1.0), 0x3f80);
        // Halfway between 1 and its successor 1 + 2^-7: to the even 1.
        assert_eq!(bf16_from_f32(1.0 + 1.0 / 256.0), 0x3f80);
        // Halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even one.
        assert_eq!(bf16_from_f32(1.0 + 3.0 / 256.0), 0x3f82);
        // Just above halfway rounds up.
        assert_eq!(bf16_from_f32(1.0 + 1.0 / 256.0 + 1.0 / 4096.0), 0x3f81);
        assert_eq!(bf16_from_f32(-2.0), 0xc000);
        assert_eq!(bf16_from_f32(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_from_f32(f32::MAX), 0x7f80, "overflows to infinity");
        assert!(f32::from_bits(u32::from(bf16_from_f32(f32::NAN)) << 16).is_nan());
    }
}
