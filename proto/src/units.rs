//! Human-friendly sizes for flags: `64MiB`, `4KiB`, `1G`, `512`.

/// Parses a byte size: a number optionally followed by `B`, `K`/`KB`/`KiB`,
/// `M`/`MB`/`MiB`, `G`/`GB`/`GiB` or `T`/`TB`/`TiB` (all powers of 1024; case
/// ignored). Returns a message a person understands on failure.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("{text:?} is not a size (try 64MiB, 4KiB, 1GiB)"));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?}: number too large"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?}: size too large"))
}

/// Formats a byte count with a binary unit, e.g. `64.0 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("512").expect("ok"), 512);
        assert_eq!(parse_size("4KiB").expect("ok"), 4096);
        assert_eq!(parse_size("64MiB").expect("ok"), 64 << 20);
        assert_eq!(parse_size("1g").expect("ok"), 1 << 30);
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(100), "100 B");
        assert_eq!(format_size(64 << 20), "64.0 MiB");
    }
}
