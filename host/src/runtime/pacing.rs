//! Thermal pacing between optimizer steps: pause at Android thermal status
//! >= 2 or battery >= 40 C, resume at status <= 1 and battery <= 38 C (the
//! gap keeps a run from flapping around one threshold).
//!
//! Sources: the battery temperature in tenths of a degree from
//! `/sys/class/power_supply/battery/temp`, and the thermal status from a
//! file or a command whose output holds `Thermal Status: N` (on Android
//! `dumpsys thermalservice`; a file holding just `N` works too). Both are
//! overridable so tests and other devices can point elsewhere. A source that
//! does not exist is left out; one that cannot be read or parsed counts as
//! unknown for that reading and is reported, never guessed.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the thermal status comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThermalSource {
    /// No status source.
    None,
    /// A file: `Thermal Status: N` somewhere in it, or just `N`.
    File(PathBuf),
    /// A shell command printing `Thermal Status: N` (`dumpsys thermalservice`).
    Command(String),
}

/// Thresholds, sources and polling period.
#[derive(Clone, Debug)]
pub struct PacingConfig {
    /// Battery temperature file (tenths of a degree Celsius).
    pub battery_temp: Option<PathBuf>,
    /// Thermal status source.
    pub thermal: ThermalSource,
    /// Pause at this status or above.
    pub pause_status: u32,
    /// Resume at this status or below.
    pub resume_status: u32,
    /// Pause at this battery temperature (C) or above.
    pub pause_c: f32,
    /// Resume at this battery temperature (C) or below.
    pub resume_c: f32,
    /// How often to re-read the sources while paused.
    pub poll: Duration,
}

/// The Android battery temperature file.
pub const BATTERY_TEMP: &str = "/sys/class/power_supply/battery/temp";

impl Default for PacingConfig {
    /// The mission's thresholds; the battery file if it exists, and
    /// `dumpsys thermalservice` where `dumpsys` exists (Android).
    fn default() -> Self {
        let battery = Path::new(BATTERY_TEMP);
        let dumpsys = ["/system/bin/dumpsys", "/system/xbin/dumpsys"].iter().any(|p| Path::new(p).exists());
        PacingConfig {
            battery_temp: battery.exists().then(|| battery.to_path_buf()),
            thermal: if dumpsys { ThermalSource::Command("dumpsys thermalservice".into()) } else { ThermalSource::None },
            pause_status: 2,
            resume_status: 1,
            pause_c: 40.0,
            resume_c: 38.0,
            poll: Duration::from_secs(30),
        }
    }
}

impl PacingConfig {
    /// One line for the run log.
    pub fn describe(&self) -> String {
        let battery = self.battery_temp.as_ref().map_or("no battery temperature".to_string(), |p| format!("battery temperature from {}", p.display()));
        let status = match &self.thermal {
            ThermalSource::None => "no thermal status".to_string(),
            ThermalSource::File(p) => format!("thermal status from {}", p.display()),
            ThermalSource::Command(c) => format!("thermal status from `{c}`"),
        };
        format!(
            "thermal pacing: {battery}, {status}; pause at status >= {} or >= {} C, resume at <= {} and <= {} C",
            self.pause_status, self.pause_c, self.resume_status, self.resume_c
        )
    }
}

/// One look at the sources; `None` = unknown.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// Android thermal status (0 none .. 6 shutdown).
    pub status: Option<u32>,
    /// Battery temperature, C.
    pub battery_c: Option<f32>,
}

impl std::fmt::Display for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(s) => write!(f, "thermal status {s}")?,
            None => write!(f, "thermal status unknown")?,
        }
        match self.battery_c {
            Some(c) => write!(f, ", battery {c:.1} C"),
            None => write!(f, ", battery temperature unknown"),
        }
    }
}

/// The status in `dumpsys thermalservice` output (`Thermal Status: N`), or
/// a bare number.
pub fn parse_thermal_status(text: &str) -> Option<u32> {
    if let Some(rest) = text.lines().find_map(|l| l.trim().strip_prefix("Thermal Status:")) {
        return rest.trim().parse().ok();
    }
    text.trim().parse().ok()
}

fn read_battery(path: &Path) -> Result<f32, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let tenths: i32 = text.trim().parse().map_err(|_| format!("{}: {:?} is not a temperature in tenths of a degree", path.display(), text.trim()))?;
    Ok(tenths as f32 / 10.0)
}

fn read_status(source: &ThermalSource) -> Result<Option<u32>, String> {
    let (text, what) = match source {
        ThermalSource::None => return Ok(None),
        ThermalSource::File(p) => (std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?, p.display().to_string()),
        ThermalSource::Command(c) => {
            let out = std::process::Command::new("sh").arg("-c").arg(c).output().map_err(|e| format!("`{c}`: {e}"))?;
            if !out.status.success() {
                return Err(format!("`{c}` exited with {}", out.status));
            }
            (String::from_utf8_lossy(&out.stdout).into_owned(), format!("`{c}`"))
        }
    };
    parse_thermal_status(&text).map(Some).ok_or_else(|| format!("{what}: no `Thermal Status: N` in its output"))
}

/// One pause, for the run summary.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Pause {
    /// The optimizer step that waited (1-based).
    pub before_step: u64,
    /// Seconds paused.
    pub seconds: f64,
    /// What triggered it.
    pub reason: String,
}

/// Applies [`PacingConfig`] between steps and remembers the pauses.
pub struct Pacer {
    config: PacingConfig,
    /// Pauses so far.
    pub pauses: Vec<Pause>,
    /// Last source error, so a broken source is reported once, not every poll.
    last_error: Option<String>,
}

impl Pacer {
    /// A pacer with no pauses yet.
    pub fn new(config: PacingConfig) -> Self {
        Pacer { config, pauses: Vec::new(), last_error: None }
    }

    /// Reads both sources (unknown on error, reported once).
    pub fn read(&mut self) -> Reading {
        let battery = self.config.battery_temp.as_ref().map(|p| read_battery(p));
        let status = read_status(&self.config.thermal);
        let errors: Vec<String> = [battery.as_ref().and_then(|b| b.as_ref().err()).cloned(), status.as_ref().err().cloned()].into_iter().flatten().collect();
        let error = (!errors.is_empty()).then(|| errors.join("; "));
        if error.is_some() && error != self.last_error {
            eprintln!("thermal pacing: cannot read {} (treated as unknown)", error.as_deref().unwrap_or_default());
        }
        self.last_error = error;
        Reading { status: status.ok().flatten(), battery_c: battery.and_then(|b| b.ok()) }
    }

    /// Too hot to start a step.
    pub fn hot(&self, r: &Reading) -> bool {
        r.status.is_some_and(|s| s >= self.config.pause_status) || r.battery_c.is_some_and(|c| c >= self.config.pause_c)
    }

    /// Cool enough to resume (an unknown source does not hold a run back).
    pub fn cool(&self, r: &Reading) -> bool {
        r.status.is_none_or(|s| s <= self.config.resume_status) && r.battery_c.is_none_or(|c| c <= self.config.resume_c)
    }

    /// Called before optimizer step `next_step`: if it is hot, logs and
    /// waits until it is cool again or `stop()` turns true. Returns the
    /// seconds paused (0 when it did not pause).
    pub fn wait_until_cool(&mut self, next_step: u64, stop: &dyn Fn() -> bool) -> f64 {
        let first = self.read();
        if !self.hot(&first) {
            return 0.0;
        }
        let start = Instant::now();
        eprintln!("thermal pacing: pausing before step {next_step} ({first})");
        let mut last = first;
        while !self.cool(&last) && !stop() {
            std::thread::sleep(self.config.poll);
            last = self.read();
        }
        let seconds = start.elapsed().as_secs_f64();
        eprintln!("thermal pacing: resuming at step {next_step} after {seconds:.1} s ({last})");
        self.pauses.push(Pause { before_step: next_step, seconds, reason: first.to_string() });
        seconds
    }

    /// Seconds paused in total.
    pub fn paused_seconds(&self) -> f64 {
        self.pauses.iter().map(|p| p.seconds).sum()
    }
}
