//! Thermal pacing against fake sources: a battery temperature file in tenths
//! of a degree and a thermal status file or command, changed by another
//! thread while the pacer waits.
use hexlora::runtime::pacing::{parse_thermal_status, Pacer, PacingConfig, Reading, ThermalSource};
use std::path::Path;
use std::time::{Duration, Instant};

fn config(battery: &Path, thermal: ThermalSource) -> PacingConfig {
    PacingConfig { battery_temp: Some(battery.to_path_buf()), thermal, poll: Duration::from_millis(5), ..PacingConfig::default() }
}

/// Replaces a fake source's content in one step, as a sysfs node reads: a
/// plain `fs::write` truncates first, and the pacer polling in between would
/// read an empty file as "unknown" and resume early (a CI failure once).
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Writes `steps` (battery tenths, status file text) to the fake sources
/// `gap` apart, on another thread.
fn play(battery: &Path, status: &Path, steps: Vec<(&'static str, &'static str)>, gap: Duration) -> std::thread::JoinHandle<()> {
    let (battery, status) = (battery.to_path_buf(), status.to_path_buf());
    std::thread::spawn(move || {
        for (b, s) in steps {
            std::thread::sleep(gap);
            replace(&battery, b);
            replace(&status, s);
        }
    })
}

#[test]
fn dumpsys_status_lines_and_bare_numbers_parse() {
    let dumpsys = "IsStatusOverride: false\nThermalEventListeners:\n\tcallbacks: 1\nThermal Status: 3\nCached temperatures:\n";
    assert_eq!(parse_thermal_status(dumpsys), Some(3));
    assert_eq!(parse_thermal_status(" 0\n"), Some(0));
    assert_eq!(parse_thermal_status("Thermal Status: hot"), None);
    assert_eq!(parse_thermal_status("nothing here"), None);
}

#[test]
fn hot_battery_pauses_until_it_cools_past_the_hysteresis() {
    let dir = tempfile::tempdir().unwrap();
    let (battery, status) = (dir.path().join("temp"), dir.path().join("status"));
    std::fs::write(&battery, "405").unwrap();
    std::fs::write(&status, "Thermal Status: 0").unwrap();
    let mut pacer = Pacer::new(config(&battery, ThermalSource::File(status.clone())));
    assert_eq!(pacer.read(), Reading { status: Some(0), battery_c: Some(40.5) });
    // 39.0 C is below the pause line but above the resume line: still paused.
    let writer = play(&battery, &status, vec![("390", "Thermal Status: 0"), ("380", "Thermal Status: 0")], Duration::from_millis(150));
    let start = Instant::now();
    let paused = pacer.wait_until_cool(7, &|| false);
    writer.join().unwrap();
    assert!(paused >= 0.25 && start.elapsed().as_secs_f64() >= 0.25, "resumed at 39.0 C after {paused} s");
    assert_eq!(pacer.pauses.len(), 1);
    assert_eq!(pacer.pauses[0].before_step, 7);
    assert!(pacer.pauses[0].reason.contains("battery 40.5 C"), "{:?}", pacer.pauses[0]);
    // Cool now: no pause, nothing recorded.
    assert_eq!(pacer.wait_until_cool(8, &|| false), 0.0);
    assert_eq!(pacer.pauses.len(), 1);
    assert!((pacer.paused_seconds() - paused).abs() < 1e-9);
}

#[test]
fn thermal_status_from_a_command_pauses_at_two_and_resumes_at_one() {
    let dir = tempfile::tempdir().unwrap();
    let (battery, status) = (dir.path().join("temp"), dir.path().join("dumpsys.txt"));
    std::fs::write(&battery, "300").unwrap();
    std::fs::write(&status, "Thermal Status: 1\n").unwrap();
    let command = ThermalSource::Command(format!("cat '{}'", status.display()));
    let mut pacer = Pacer::new(config(&battery, command));
    assert_eq!(pacer.wait_until_cool(1, &|| false), 0.0, "status 1 does not pause");
    replace(&status, "Thermal Status: 2\n");
    let reading = pacer.read();
    assert!(pacer.hot(&reading));
    let writer = play(&battery, &status, vec![("300", "Thermal Status: 2\n"), ("300", "Thermal Status: 1\n")], Duration::from_millis(100));
    let paused = pacer.wait_until_cool(2, &|| false);
    writer.join().unwrap();
    assert!(paused >= 0.15, "{paused}");
    assert!(pacer.pauses[0].reason.contains("thermal status 2"));
}

#[test]
fn a_stop_request_ends_a_pause_and_missing_sources_never_pause() {
    let dir = tempfile::tempdir().unwrap();
    let battery = dir.path().join("temp");
    std::fs::write(&battery, "450").unwrap();
    let mut pacer = Pacer::new(config(&battery, ThermalSource::None));
    let start = Instant::now();
    pacer.wait_until_cool(3, &|| start.elapsed() > Duration::from_millis(50));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(pacer.pauses.len(), 1);

    let mut blind = Pacer::new(config(&dir.path().join("absent"), ThermalSource::File(dir.path().join("absent2"))));
    assert_eq!(blind.read(), Reading { status: None, battery_c: None });
    assert_eq!(blind.wait_until_cool(1, &|| false), 0.0);
    std::fs::write(&battery, "warm").unwrap();
    let mut garbled = Pacer::new(config(&battery, ThermalSource::None));
    assert_eq!(garbled.read().battery_c, None, "an unparsable file is unknown, not a guess");
}
