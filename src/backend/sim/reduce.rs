//! The results a simulated reduction writes: real arithmetic on the real bytes, so that a byte
//! check of an all-reduce means something on the simulator too.

use crate::backend::collective::{DataType, Reduction};

/// The element-wise reduction of `inputs` (little-endian `dtype` elements, all of one length), as
/// the kernels compute it: each element's sum added in rank order in f32 (16-bit types widened),
/// multiplied by `op.scale(ranks)` (1 for a sum) and rounded once to `dtype`, to nearest, ties to
/// even.
pub(super) fn reduce(dtype: DataType, op: Reduction, inputs: &[&[u8]]) -> Vec<u8> {
    let (first, rest) = inputs.split_first().expect("a reduction has inputs");
    let size = dtype.size();
    let mut acc: Vec<f32> = first.chunks_exact(size).map(|e| dtype.to_f32(e)).collect();
    for input in rest {
        for (a, e) in acc.iter_mut().zip(input.chunks_exact(size)) {
            *a += dtype.to_f32(e);
        }
    }
    let scale = op.scale(inputs.len());
    let mut out = Vec::with_capacity(first.len());
    for a in acc {
        dtype.push_rounded(a * scale, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn rounded(dtype: DataType, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &v in values {
            dtype.push_rounded(v, &mut out);
        }
        out
    }

    fn bf16s(values: &[f32]) -> Vec<u8> {
        rounded(DataType::Bf16, values)
    }

    fn f16s(values: &[f32]) -> Vec<u8> {
        rounded(DataType::F16, values)
    }

    #[test]
    fn f32_sums_add_element_by_element() {
        let (a, b, c) = (
            f32s(&[1.0, -2.5, 1e30]),
            f32s(&[0.25, 2.5, 1e30]),
            f32s(&[3.0, 0.0, -1e30]),
        );
        assert_eq!(
            reduce(DataType::F32, Reduction::Sum, &[&a, &b, &c]),
            f32s(&[4.25, 0.0, 1e30])
        );
    }

    #[test]
    fn bf16_sums_accumulate_in_f32_and_round_once_to_nearest_even() {
        let one = bf16s(&[1.0, 1.0 + 1.0 / 128.0, 3.0]);
        // Rounding each partial sum to bf16 would drop every 2^-9 (a quarter step); in f32 the two
        // make 2^-8, half a step: 1 + 2^-8 rounds down to the even 1, 1 + 3·2^-8 up to 1 + 2^-6.
        let tiny = bf16s(&[1.0 / 512.0, 1.0 / 512.0, -1.0]);
        let want = bf16s(&[1.0, 1.0 + 1.0 / 64.0, 1.0]);
        assert_eq!(
            reduce(DataType::Bf16, Reduction::Sum, &[&one, &tiny, &tiny]),
            want
        );
    }

    #[test]
    fn averages_over_2_4_and_8_ranks_are_the_exact_means_of_small_integers() {
        for ranks in [2, 4, 8] {
            // Odd counts: 1, 3 and 5 elements, in every type.
            for elements in [1, 3, 5] {
                let value = |r: usize, e: usize| ((e * 7 + r * 13) % 33) as f32 - 16.0;
                let mean = |e| (0..ranks).map(|r| value(r, e)).sum::<f32>() / ranks as f32;
                for (dtype, encode) in [
                    (DataType::F32, f32s as fn(&[f32]) -> Vec<u8>),
                    (DataType::Bf16, bf16s),
                    (DataType::F16, f16s),
                ] {
                    let inputs: Vec<Vec<u8>> = (0..ranks)
                        .map(|r| encode(&(0..elements).map(|e| value(r, e)).collect::<Vec<_>>()))
                        .collect();
                    let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                    let want = encode(&(0..elements).map(mean).collect::<Vec<_>>());
                    let got = reduce(dtype, Reduction::Average, &views);
                    assert_eq!(got, want, "{dtype}, {ranks} ranks, {elements} elements");
                }
            }
        }
    }

    #[test]
    fn an_average_is_the_f32_sum_times_the_f32_reciprocal_rounded_once() {
        // Over 3 ranks, 1 + 2 + 4 = 7: NCCL's average multiplies by the f32 nearest 1/3, and
        // 7 × that is not the f32 nearest 7 / 3; the kernels compute the product.
        let third = 1.0f32 / 3.0;
        let product = 7.0 * third;
        assert_ne!(product, 7.0 / 3.0);
        let f32_inputs = [f32s(&[1.0]), f32s(&[2.0]), f32s(&[4.0])];
        let views: Vec<&[u8]> = f32_inputs.iter().map(Vec::as_slice).collect();
        assert_eq!(
            reduce(DataType::F32, Reduction::Average, &views),
            f32s(&[product])
        );
        assert_eq!(reduce(DataType::F32, Reduction::Sum, &views), f32s(&[7.0]));
        let bf16_inputs = [bf16s(&[1.0]), bf16s(&[2.0]), bf16s(&[4.0])];
        let views: Vec<&[u8]> = bf16_inputs.iter().map(Vec::as_slice).collect();
        assert_eq!(
            reduce(DataType::Bf16, Reduction::Average, &views),
            bf16s(&[product])
        );
        let f16_inputs = [f16s(&[1.0]), f16s(&[2.0]), f16s(&[4.0])];
        let views: Vec<&[u8]> = f16_inputs.iter().map(Vec::as_slice).collect();
        // 2.333… is 0x40aa or 0x40ab in f16: the product rounds to the nearer, 0x40ab.
        assert_eq!(
            reduce(DataType::F16, Reduction::Average, &views),
            0x40abu16.to_le_bytes()
        );
    }
}
