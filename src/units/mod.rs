//! Byte sizes and spans of time as reports print them, and rates; [`parse`] reads them as users type
//! them. Rates are always GB/s = 1e9 bytes/s.
//!
//! The formatting here imports nothing, so that the error type may print sizes with it while the
//! parsers, which return that error type, live in their own file.

pub mod parse;

/// A size for people: `4 B`, `64 KiB`, `1.5 MiB`, `1 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A span of time as a person reads it: `1.02 s`, `3.4 ms`, `87.0 µs`.
pub fn format_seconds(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else if seconds >= 1e-3 {
        format!("{:.1} ms", seconds * 1e3)
    } else {
        format!("{:.1} µs", seconds * 1e6)
    }
}

/// The largest figure a measurement can give, in GB/s or µs: no bandwidth reaches 10¹² GB/s and no
/// time 10¹² µs (eleven days). A document or profile holding more was not written by a measurement.
pub const LARGEST_FIGURE: f64 = 1e12;

/// A figure as a message shows it: in full, or in scientific notation where it has more digits
/// than a reader can count (`1e-300`, `1e308`).
pub fn shown_figure(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e15).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// GB/s (1e9 bytes per second) for `bytes` moved in `micros` microseconds.
pub fn gbps(bytes: u64, micros: f64) -> f64 {
    bytes as f64 / micros / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_of_time_read_in_seconds_milliseconds_or_microseconds() {
        assert_eq!(format_seconds(1.024), "1.02 s");
        assert_eq!(format_seconds(0.0034), "3.4 ms");
        assert_eq!(format_seconds(87e-6), "87.0 µs");
    }

    #[test]
    fn figures_in_messages_are_counted_easily() {
        assert_eq!(shown_figure(1e-300), "1e-300");
        assert_eq!(shown_figure(-1e308), "-1e308");
        assert_eq!(shown_figure(26.5), "26.5");
        assert_eq!(shown_figure(0.0), "0");
        assert_eq!(shown_figure(f64::NAN), "NaN");
    }

    #[test]
    fn formats_sizes_and_rates() {
        assert_eq!(format_bytes(4), "4 B");
        assert_eq!(format_bytes(64 << 20), "64 MiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(1 << 30), "1 GiB");
        // 1 GB in 1 ms is 1000 GB/s.
        assert!((gbps(1_000_000_000, 1_000.0) - 1_000.0).abs() < 1e-9);
    }
}
