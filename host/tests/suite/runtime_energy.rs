//! Energy counters from fake sysfs trees: RAPL package zones with
//! wrap-around (subzones not double counted), the battery's current x
//! voltage integrated over time, and "not available" with the reason.
use hexlora::runtime::energy::{EnergyMeter, EnergyRoots, Sampler};
use std::path::Path;
use std::time::Duration;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn roots(dir: &Path) -> EnergyRoots {
    EnergyRoots { powercap: dir.join("powercap"), power_supply: dir.join("power_supply") }
}

#[test]
fn rapl_sums_package_zones_and_handles_wrap_around() {
    let dir = tempfile::tempdir().unwrap();
    let pc = dir.path().join("powercap");
    write(&pc.join("intel-rapl:0/energy_uj"), "1000000\n");
    write(&pc.join("intel-rapl:0/max_energy_range_uj"), "262143328850\n");
    write(&pc.join("intel-rapl:1/energy_uj"), "262143000000\n");
    write(&pc.join("intel-rapl:1/max_energy_range_uj"), "262143328850\n");
    write(&pc.join("intel-rapl:0:0/energy_uj"), "5\n"); // core subzone: inside package 0
    write(&pc.join("intel-rapl:0:0/max_energy_range_uj"), "262143328850\n");
    let mut m = EnergyMeter::open(&roots(dir.path())).unwrap();
    assert_eq!(m.source, "RAPL intel-rapl:0 + intel-rapl:1");
    write(&pc.join("intel-rapl:0/energy_uj"), "3500000\n"); // +2.5 J
    write(&pc.join("intel-rapl:1/energy_uj"), "671150\n"); // wrapped: +328850 + 671150 uJ = 1 J
    write(&pc.join("intel-rapl:0:0/energy_uj"), "999999999\n");
    m.sample().unwrap();
    assert!((m.joules() - 3.5).abs() < 1e-9, "{}", m.joules());
}

#[test]
fn battery_power_is_integrated_over_time() {
    let dir = tempfile::tempdir().unwrap();
    let bat = dir.path().join("power_supply/BAT0");
    write(&bat.join("type"), "Battery\n");
    write(&bat.join("status"), "Discharging\n");
    write(&bat.join("current_now"), "-500000\n"); // 0.5 A (sign varies by driver)
    write(&bat.join("voltage_now"), "4000000\n"); // 4 V -> 2 W
    let m = EnergyMeter::open(&roots(dir.path())).unwrap();
    assert!(m.source.contains("BAT0"), "{}", m.source);
    let sampler = Sampler::start(m, Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(300));
    let j = sampler.joules().unwrap();
    // 2 W for >= 0.3 s; the upper bound only guards against nonsense on a loaded machine.
    assert!((0.6..3.0).contains(&j), "{j} J");
}

#[test]
fn no_counters_means_not_available_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let err = EnergyMeter::open(&roots(dir.path())).err().unwrap();
    assert!(err.contains("powercap") && err.contains("power_supply"), "{err}");
    let bat = dir.path().join("power_supply/battery");
    write(&bat.join("current_now"), "800000\n");
    write(&bat.join("voltage_now"), "4100000\n");
    write(&bat.join("status"), "Charging\n");
    let err = EnergyMeter::open(&roots(dir.path())).err().unwrap();
    assert!(err.contains("Charging"), "{err}");
    write(&bat.join("status"), "Discharging\n");
    write(&bat.join("voltage_now"), "n/a\n");
    let err = EnergyMeter::open(&roots(dir.path())).err().unwrap();
    assert!(err.contains("voltage_now") && err.contains("not a number"), "{err}");
}
