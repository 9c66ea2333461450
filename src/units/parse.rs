//! Sizes and percentages as users type them.
//!
//! Suffixes: `B` (or none) for bytes; `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` for powers of
//! 1024 (nccl-tests and nvbandwidth read `64M` that way); `KB`, `MB`, `GB`, `TB` for powers of 1000.
//! Case is ignored, except that a lone `b` is still bytes.

use crate::{Error, Result};

/// Parses one size such as `64MiB`, `4K`, `1GB` or `4096`. Zero is refused: no test moves no bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let bad = || {
        Error::usage(format!(
            "bad size `{text}`: expected a number with an optional unit, such as 4096, 4K, 64MiB \
             or 1GB (K/M/G and KiB/MiB/GiB are powers of 1024, KB/MB/GB powers of 1000)"
        ))
    };
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    if number.is_empty() {
        return Err(bad());
    }
    let bytes = if number.contains('.') {
        let value: f64 = number.parse().map_err(|_| bad())?;
        let bytes = value * multiplier as f64;
        if bytes.fract() != 0.0 || bytes > u64::MAX as f64 {
            return Err(Error::usage(format!(
                "bad size `{text}`: it is not a whole number of bytes"
            )));
        }
        bytes as u64
    } else {
        let value: u64 = number.parse().map_err(|_| bad())?;
        value
            .checked_mul(multiplier)
            .ok_or_else(|| Error::usage(format!("size `{text}` is too large")))?
    };
    if bytes == 0 {
        return Err(Error::usage(format!(
            "size `{text}` is zero: give at least 1 byte"
        )));
    }
    Ok(bytes)
}

/// Parses a list of sizes: a range `4B..1GiB` (the start, then doubling while within the end) or a
/// comma-separated list `4K,64K,1M`. The result is sorted and free of duplicates.
pub fn parse_sizes(text: &str) -> Result<Vec<u64>> {
    let mut sizes = if let Some((start, end)) = text.split_once("..") {
        // `4B..`, `..4K` and `4B...8B` would otherwise be refused as a size that is empty or
        // fractional, words that do not point at the range.
        if start.trim().is_empty() || end.trim().is_empty() || end.starts_with('.') {
            return Err(Error::usage(format!(
                "bad size range `{text}`: a range is two sizes joined by two dots, such as 4B..1GiB"
            )));
        }
        let (start, end) = (parse_size(start)?, parse_size(end)?);
        if start > end {
            return Err(Error::usage(format!(
                "bad size range `{text}`: the start is larger than the end"
            )));
        }
        std::iter::successors(Some(start), |s| s.checked_mul(2))
            .take_while(|&s| s <= end)
            .collect()
    } else {
        if text.split(',').any(|entry| entry.trim().is_empty()) {
            return Err(Error::usage(format!(
                "bad size list `{text}`: an entry is empty; give sizes separated by commas, such \
                 as 4K,64K,1M"
            )));
        }
        text.split(',')
            .map(parse_size)
            .collect::<Result<Vec<u64>>>()?
    };
    sizes.sort_unstable();
    sizes.dedup();
    Ok(sizes)
}

/// A percentage as users type it after `flag` (`5`, `5%`, `2.5`): finite, not negative; else a
/// usage error that says what `flag` takes.
pub fn parse_percent(text: &str, flag: &str) -> Result<f64> {
    let number = text.trim().strip_suffix('%').unwrap_or(text.trim()).trim();
    match number.parse::<f64>() {
        Ok(pct) if pct.is_finite() && pct >= 0.0 => Ok(pct),
        _ => Err(Error::usage(format!(
            "bad {flag} `{text}`: expected a percentage, such as 5 or 2.5%"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4B").unwrap(), 4);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("64 mib").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
    }

    #[test]
    fn rejects_zero_junk_and_overflow_as_usage_errors() {
        for bad in [
            "0",
            "0MiB",
            "",
            "MiB",
            "4X",
            "-4K",
            "4..K",
            "0.3B",
            "99999999999T",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
        }
        assert!(parse_size("0").unwrap_err().to_string().contains("zero"));
    }

    #[test]
    fn ranges_double_and_lists_sort() {
        assert_eq!(parse_sizes("4B..64B").unwrap(), vec![4, 8, 16, 32, 64]);
        assert_eq!(parse_sizes("4B..100B").unwrap(), vec![4, 8, 16, 32, 64]);
        assert_eq!(parse_sizes("4B..1GiB").unwrap().len(), 29);
        assert_eq!(
            parse_sizes("1M,4K,64K,4K").unwrap(),
            vec![4096, 65536, 1 << 20]
        );
        assert_eq!(parse_sizes("1K..1B").unwrap_err().exit_code(), 2);
        assert_eq!(parse_sizes("4K,,1M").unwrap_err().exit_code(), 2);
    }

    #[test]
    fn a_malformed_range_or_list_is_named_as_one() {
        for bad in ["4B..", "..4K", "4B...8B", " .. "] {
            let err = parse_sizes(bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("bad size range `{bad}`")), "{err}");
        }
        for bad in ["", "4K,,8K", "4K,", ",4K"] {
            let err = parse_sizes(bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("bad size list `{bad}`")), "{err}");
        }
    }

    #[test]
    fn percentages_take_an_optional_percent_sign() {
        assert_eq!(parse_percent("5", "--tolerance").unwrap(), 5.0);
        assert_eq!(parse_percent(" 2.5% ", "--tolerance").unwrap(), 2.5);
        assert_eq!(parse_percent("0", "--threshold").unwrap(), 0.0);
        assert_eq!(parse_percent("150", "--threshold").unwrap(), 150.0);
        for bad in ["", "%", "-1", "five", "NaN", "inf", "5%%"] {
            let err = parse_percent(bad, "--tolerance").unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
            assert!(err.to_string().starts_with("bad --tolerance"), "{err}");
        }
    }
}
