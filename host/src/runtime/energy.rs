//! Energy of a run from the machine's own counters: Linux RAPL
//! (`/sys/class/powercap/intel-rapl:N/energy_uj`, package zones only, with
//! wrap-around at `max_energy_range_uj`) or, on a phone, the battery's
//! `current_now` (uA) x `voltage_now` (uV) integrated over time. Where
//! neither is readable the summary says "not available" and why; no figure
//! is ever estimated.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where to look (overridable for tests and unusual devices).
#[derive(Clone, Debug)]
pub struct EnergyRoots {
    /// Usually `/sys/class/powercap`.
    pub powercap: PathBuf,
    /// Usually `/sys/class/power_supply`.
    pub power_supply: PathBuf,
}

impl Default for EnergyRoots {
    fn default() -> Self {
        EnergyRoots { powercap: "/sys/class/powercap".into(), power_supply: "/sys/class/power_supply".into() }
    }
}

struct RaplZone {
    energy: PathBuf,
    /// Counter range in uJ (the counter wraps to 0 past it).
    range_uj: u64,
    last_uj: u64,
}

enum Counter {
    Rapl(Vec<RaplZone>),
    Battery { current: PathBuf, voltage: PathBuf, last: Option<(Instant, f64)> },
}

/// An open energy counter; [`EnergyMeter::sample`] accumulates joules.
pub struct EnergyMeter {
    counter: Counter,
    joules: f64,
    /// What is measured, for the summary.
    pub source: String,
}

fn read_u64(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.trim().parse().map_err(|_| format!("{}: {:?} is not a counter", path.display(), text.trim()))
}

fn read_i64(path: &Path) -> Result<i64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.trim().parse().map_err(|_| format!("{}: {:?} is not a number", path.display(), text.trim()))
}

/// Top-level RAPL zones (`intel-rapl:N`, not the `intel-rapl:N:M` subzones,
/// which the package zone already counts).
fn rapl_zones(root: &Path) -> Result<Vec<RaplZone>, String> {
    let entries = std::fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("intel-rapl:") && n.matches(':').count() == 1))
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        return Err(format!("no intel-rapl:N zones under {}", root.display()));
    }
    dirs.iter()
        .map(|d| {
            let energy = d.join("energy_uj");
            Ok(RaplZone { last_uj: read_u64(&energy)?, range_uj: read_u64(&d.join("max_energy_range_uj"))?, energy })
        })
        .collect()
}

/// The battery supply directory: `battery`, else the first of type Battery.
fn battery_dir(root: &Path) -> Result<PathBuf, String> {
    let named = root.join("battery");
    if named.join("current_now").exists() {
        return Ok(named);
    }
    let entries = std::fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    dirs.sort();
    dirs.into_iter()
        .find(|d| std::fs::read_to_string(d.join("type")).is_ok_and(|t| t.trim() == "Battery") && d.join("current_now").exists())
        .ok_or_else(|| format!("no battery with current_now under {}", root.display()))
}

fn battery_watts(current: &Path, voltage: &Path) -> Result<f64, String> {
    // Drivers disagree on the sign of current_now while discharging.
    Ok(read_i64(current)?.unsigned_abs() as f64 * 1e-6 * read_i64(voltage)? as f64 * 1e-6)
}

impl EnergyMeter {
    /// Opens RAPL, else the battery; `Err` says why neither is available.
    pub fn open(roots: &EnergyRoots) -> Result<Self, String> {
        let rapl_err = match rapl_zones(&roots.powercap) {
            Ok(zones) => {
                let names: Vec<String> = zones.iter().filter_map(|z| z.energy.parent()?.file_name()?.to_str().map(String::from)).collect();
                return Ok(EnergyMeter { source: format!("RAPL {}", names.join(" + ")), counter: Counter::Rapl(zones), joules: 0.0 });
            }
            Err(e) => e,
        };
        let battery_err = match battery_dir(&roots.power_supply) {
            Ok(dir) => {
                let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
                if matches!(status.trim(), "Charging" | "Full") {
                    format!("{}: battery is {} (its current is not the device's draw)", dir.display(), status.trim())
                } else {
                    let (current, voltage) = (dir.join("current_now"), dir.join("voltage_now"));
                    match battery_watts(&current, &voltage) {
                        Ok(w) => {
                            let source = format!("battery {} current_now x voltage_now", dir.display());
                            return Ok(EnergyMeter { source, counter: Counter::Battery { current, voltage, last: Some((Instant::now(), w)) }, joules: 0.0 });
                        }
                        Err(e) => e,
                    }
                }
            }
            Err(e) => e,
        };
        Err(format!("{rapl_err}; {battery_err}"))
    }

    /// Reads the counters and adds the energy since the last sample. RAPL
    /// needs a sample at least once per counter range (minutes to hours);
    /// the battery's power is integrated with the trapezoid rule, so sample
    /// it often ([`Sampler`]).
    pub fn sample(&mut self) -> Result<(), String> {
        match &mut self.counter {
            Counter::Rapl(zones) => {
                for z in zones {
                    let now = read_u64(&z.energy)?;
                    let delta = if now >= z.last_uj { now - z.last_uj } else { z.range_uj - z.last_uj + now };
                    self.joules += delta as f64 * 1e-6;
                    z.last_uj = now;
                }
            }
            Counter::Battery { current, voltage, last } => {
                let (t, w) = (Instant::now(), battery_watts(current, voltage)?);
                if let Some((t0, w0)) = *last {
                    self.joules += 0.5 * (w0 + w) * t.duration_since(t0).as_secs_f64();
                }
                *last = Some((t, w));
            }
        }
        Ok(())
    }

    /// Joules accumulated so far.
    pub fn joules(&self) -> f64 {
        self.joules
    }
}

/// An [`EnergyMeter`] sampled on its own thread every `period`.
pub struct Sampler {
    meter: Arc<Mutex<EnergyMeter>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    error: Arc<Mutex<Option<String>>>,
}

impl Sampler {
    /// Starts sampling.
    pub fn start(meter: EnergyMeter, period: Duration) -> Self {
        let meter = Arc::new(Mutex::new(meter));
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let (m, s, err) = (meter.clone(), stop.clone(), error.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                if let Err(e) = m.lock().expect("not poisoned").sample() {
                    *err.lock().expect("not poisoned") = Some(e);
                    return;
                }
            }
        });
        Sampler { meter, stop, thread: Some(thread), error }
    }

    /// Joules so far (takes a fresh sample first); `Err` if a read failed
    /// during the run, since the total would then be incomplete.
    pub fn joules(&self) -> Result<f64, String> {
        if let Some(e) = self.error.lock().expect("not poisoned").clone() {
            return Err(e);
        }
        let mut m = self.meter.lock().expect("not poisoned");
        m.sample()?;
        Ok(m.joules())
    }

    /// What is measured.
    pub fn source(&self) -> String {
        self.meter.lock().expect("not poisoned").source.clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
