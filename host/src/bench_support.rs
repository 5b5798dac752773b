//! What the speed benchmarks in `host/examples/` share (`bench_*.rs`): the
//! clock they take figures with and the name of the CPU they ran on. Not
//! used by the runtime.
use std::time::Instant;

/// Best wall time of `f` over `reps` runs after one warm-up, in ms: on a
/// shared machine the minimum is the figure least disturbed by other work.
pub fn best_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// The CPU's `model name` from `/proc/cpuinfo` (x86 Linux), else the
/// architecture's name (aarch64 Linux lists no model name).
pub fn cpu_name() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, v)| v.trim().to_string()));
    model.unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The benchmarks named on the command line (all of `known` when none is);
/// an unknown name ends the process with status 2 and the list.
pub fn selected(known: &[&str]) -> Vec<String> {
    let names: Vec<String> = std::env::args().skip(1).collect();
    if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
        eprintln!("unknown benchmark {bad:?}; the benchmarks: {}", known.join(" "));
        std::process::exit(2);
    }
    if names.is_empty() {
        return known.iter().map(|n| n.to_string()).collect();
    }
    names
}
