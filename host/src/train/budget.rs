//! The activation budget: `min(configured cap, MemAvailable)`. Layers whose
//! saved activations would not fit keep only their input and recompute
//! their forward during the backward pass (through the projections' forward
//! direction), which leaves gradients bit-identical.
use crate::{Error, Result};

/// `MemAvailable` from `/proc/meminfo`, in bytes (`None` where the file is
/// missing, e.g. not Linux).
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text).ok()
}

fn parse_mem_available(text: &str) -> Result<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:")).ok_or_else(|| Error::format("/proc/meminfo", "no MemAvailable line"))?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::format("/proc/meminfo", format!("unreadable line {line:?}")))?;
    Ok(kb * 1024)
}

/// Which of `layers` layers recompute: the first ones are kept while their
/// activations (`bytes_per_layer` each) fit in `budget`, the rest recompute.
pub fn plan_recompute(layers: usize, bytes_per_layer: u64, budget: u64) -> Vec<bool> {
    let keep = if bytes_per_layer == 0 { layers } else { (budget / bytes_per_layer).min(layers as u64) as usize };
    (0..layers).map(|l| l >= keep).collect()
}

/// The budget in bytes: the cap if given, bounded by what the OS says is
/// available (half of it: the rest is for weights, gradients, the OS).
pub fn budget(cap: Option<u64>) -> u64 {
    let avail = mem_available().map(|a| a / 2).unwrap_or(u64::MAX);
    cap.unwrap_or(u64::MAX).min(avail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo_and_plans_layers() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(text).unwrap(), 2048 * 1024);
        assert!(parse_mem_available("MemTotal: 1 kB\n").is_err());
        assert_eq!(plan_recompute(4, 10, 25), vec![false, false, true, true]);
        assert_eq!(plan_recompute(3, 10, 1000), vec![false; 3]);
        assert_eq!(plan_recompute(2, 10, 0), vec![true; 2]);
        assert!(mem_available().is_some_and(|m| m > 0));
    }
}
