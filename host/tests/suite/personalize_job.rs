//! `hexlora personalize` end to end on the tiny Llama fixture: two runs give
//! bit-identical losses and adapters (CPU path and in-process DSP service);
//! a thermal pause (fake battery file) changes nothing but the wall clock;
//! SIGTERM stops after a committed step and a rerun finishes bit-identical
//! to an uninterrupted run.
use crate::support;
use hexlora::train::commit::TrainState;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training/llama/model")
}

fn write_data(path: &Path) {
    let lines: Vec<String> = (0..6u32)
        .map(|i| {
            let ids: Vec<u32> = (0..16).map(|t| (i * 7 + t * 3) % 128).collect();
            let labels: Vec<i64> = ids.iter().enumerate().map(|(t, &x)| if t < 4 { -100 } else { x as i64 }).collect();
            serde_json::json!({"input_ids": ids, "labels": labels}).to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n")).unwrap();
}

/// The job on `device` with fake (empty) energy roots and no thermal sources.
fn job(data: &Path, out: &Path, device: &str, steps: u32, sys: &Path) -> Command {
    job_at(data, out, device, "f16", steps, sys)
}

fn job_at(data: &Path, out: &Path, device: &str, precision: &str, steps: u32, sys: &Path) -> Command {
    job_on(&model_dir(), "q_proj,v_proj,down_proj", data, out, device, precision, steps, sys)
}

#[allow(clippy::too_many_arguments)]
fn job_on(model: &Path, targets: &str, data: &Path, out: &Path, device: &str, precision: &str, steps: u32, sys: &Path) -> Command {
    let mut c = support::hexlora();
    c.args(["personalize", "--quiet", "--rank", "4", "--alpha", "8", "--lr", "5e-3", "--seed", "3", "--targets", targets]);
    // The fixture's widths (48, 80) are not multiples of 32, so Q8_0 cannot
    // hold them; FP16 puts the projections on the service.
    c.args(["--device", device, "--precision", precision, "--buckets", "16,32", "--steps", &steps.to_string()]);
    c.arg("--model").arg(model).arg("--data").arg(data).arg("--out").arg(out);
    c.arg("--powercap-root").arg(sys.join("powercap")).arg("--power-supply-root").arg(sys.join("power_supply"));
    c.arg("--battery-temp").arg(sys.join("battery_temp")).arg("--pacing-poll").arg("0.02");
    c.arg("--plan-cache").arg(sys.join("plan-cache"));
    c
}

fn run_ok(mut c: Command) -> String {
    let Output { status, stdout, stderr } = c.output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&stdout).into_owned(), String::from_utf8_lossy(&stderr).into_owned());
    assert!(status.success(), "{out}\n{err}");
    out + &err
}

fn assert_same_run(a: &Path, b: &Path) {
    let (sa, sb) = (TrainState::load(a).unwrap().unwrap(), TrainState::load(b).unwrap().unwrap());
    let losses = |s: &TrainState| s.history.iter().map(|r| r.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(losses(&sa), losses(&sb));
    assert_eq!(sa.adapter, sb.adapter);
    assert_eq!((sa.adamw.m, sa.adamw.v), (sb.adamw.m, sb.adamw.v));
    let bytes = |d: &Path| std::fs::read(d.join("adapter/adapter_model.safetensors")).unwrap();
    assert_eq!(bytes(a), bytes(b));
}

#[test]
fn two_runs_are_bit_identical_on_the_cpu_and_on_the_in_process_service() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    std::fs::write(dir.path().join("battery_temp"), "300").unwrap();
    for device in ["cpu", "dsp"] {
        let (a, b) = (dir.path().join(format!("{device}-a")), dir.path().join(format!("{device}-b")));
        let log = run_ok(job(&data, &a, device, 8, dir.path()));
        run_ok(job(&data, &b, device, 8, dir.path()));
        assert_same_run(&a, &b);
        let routes: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(a.join("routes.json")).unwrap()).unwrap();
        let routes = routes["routes"].as_array().unwrap();
        let on_dsp = routes.iter().filter(|r| r["on_dsp"] == true).count();
        // 2 layers x 7 projections x 2 directions x 2 buckets.
        assert_eq!(routes.len(), 56);
        assert!(log.contains(&format!("planner: {on_dsp} of 56 routes on the DSP")), "{log}");
        if device == "cpu" {
            assert_eq!(on_dsp, 0);
        } else {
            assert_eq!(on_dsp, 56, "every FP16 probe passes on the fixture: {log}");
        }
        assert!(log.contains("energy: not available"), "{log}");
        assert!(log.contains("resident weights") && log.contains("all FP16"), "{log}");
        assert_eq!(std::fs::read_to_string(a.join("runtime.jsonl")).unwrap().lines().count(), 8);
    }
}

#[test]
fn a_second_run_takes_its_routes_from_the_plan_cache_and_a_corrupt_cache_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    std::fs::write(dir.path().join("battery_temp"), "300").unwrap();
    let run = |name: &str| {
        let out = dir.path().join(name);
        let log = run_ok(job(&data, &out, "dsp", 2, dir.path()));
        (out.clone(), log, std::fs::read_to_string(out.join("routes.json")).unwrap())
    };
    let (a, first, routes_a) = run("a");
    assert!(!first.contains("from the plan cache"), "{first}");
    let (b, second, routes_b) = run("b");
    // Every projection of the fixture is routed (2 layers x 7), not only the targets.
    assert!(second.contains("14 projections from the plan cache"), "{second}");
    assert_eq!(routes_a, routes_b);
    assert_same_run(&a, &b);

    std::fs::write(dir.path().join("plan-cache/plan-cache.json"), b"{ not json").unwrap();
    let (_, third, routes_c) = run("c");
    assert!(third.contains("plan cache") && third.contains("unreadable"), "{third}");
    assert!(!third.contains("from the plan cache"), "{third}");
    assert_eq!(routes_a, routes_c);
    let (_, fourth, _) = run("d");
    assert!(fourth.contains("14 projections from the plan cache"), "the rebuilt cache is used: {fourth}");
}

#[test]
fn a_thermal_pause_changes_nothing_but_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    let battery = dir.path().join("battery_temp");
    std::fs::write(&battery, "300").unwrap();
    let cool = dir.path().join("cool");
    run_ok(job(&data, &cool, "cpu", 6, dir.path()));
    std::fs::write(&battery, "412").unwrap(); // 41.2 C: pause before step 1
    // Cool the battery 400 ms after the job says it paused (not after it
    // started: loading may take longer than that on a loaded machine), and by
    // rename, so the pacer never polls a half-written file.
    let hot = dir.path().join("hot");
    let mut child = job(&data, &hot, "cpu", 6, dir.path()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let cooler = {
        let battery = battery.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut log = String::new();
            for line in std::io::BufReader::new(stderr).lines() {
                let line = line.unwrap();
                if line.contains("pausing before step") {
                    std::thread::sleep(Duration::from_millis(400));
                    std::fs::write(battery.with_extension("new"), "375").unwrap();
                    std::fs::rename(battery.with_extension("new"), &battery).unwrap();
                }
                log += &line;
                log.push('\n');
            }
            log
        })
    };
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout).into_owned() + &cooler.join().unwrap();
    assert!(out.status.success(), "{log}");
    assert!(log.contains("pausing before step 1 (thermal status unknown, battery 41.2 C)"), "{log}");
    assert!(log.contains("(1 pauses)"), "{log}");
    let first: serde_json::Value = serde_json::from_str(std::fs::read_to_string(hot.join("runtime.jsonl")).unwrap().lines().next().unwrap()).unwrap();
    assert!(first["pause_before_s"].as_f64().unwrap() >= 0.3, "{first}");
    assert_same_run(&cool, &hot);
}

#[test]
fn sigterm_stops_after_a_commit_and_a_rerun_finishes_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    std::fs::write(dir.path().join("battery_temp"), "300").unwrap();
    let steps = 200;
    let whole = dir.path().join("whole");
    run_ok(job(&data, &whole, "dsp", steps, dir.path()));
    let stopped = dir.path().join("stopped");
    let child = job(&data, &stopped, "dsp", steps, dir.path()).stdout(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while !stopped.join("commit.safetensors").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no commit appeared");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{log}");
    let at = TrainState::load(&stopped).unwrap().unwrap().step();
    assert!(at < steps as u64, "the run finished before SIGTERM arrived; raise `steps`");
    assert!(log.contains(&format!("SIGTERM: stopped after step {at} (committed)")), "{log}");
    assert!(!stopped.join("adapter").exists());
    let log = run_ok(job(&data, &stopped, "dsp", steps, dir.path()));
    assert!(log.contains("resuming the run"), "{log}");
    assert_same_run(&whole, &stopped);
}

#[test]
fn projections_the_service_refuses_run_on_the_cpu_path_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    std::fs::write(dir.path().join("battery_temp"), "300").unwrap();
    // MLP in Q8_0: the service refuses widths 48 and 80 (not multiples of
    // 32); attention stays FP16 on the service.
    let mixed = dir.path().join("mixed");
    let log = run_ok(job_at(&data, &mixed, "dsp", "mlp=q8_0,attention=f16", 4, dir.path()));
    assert!(log.contains("planner: 32 of 56 routes on the DSP"), "{log}");
    let routes: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(mixed.join("routes.json")).unwrap()).unwrap();
    for r in routes["routes"].as_array().unwrap() {
        let name = r["projection"].as_str().unwrap();
        let reason = r["reason"].as_str().unwrap();
        if name.contains(".mlp.") {
            assert!(r["on_dsp"] == false && reason.starts_with("load (q8_0)"), "{r}");
        } else {
            assert!(r["on_dsp"] == true && reason.is_empty(), "{r}");
        }
    }
    // All refused: the run is the CPU path's, bit for bit.
    let (refused, cpu) = (dir.path().join("refused"), dir.path().join("cpu"));
    let log = run_ok(job_at(&data, &refused, "dsp", "q8_0", 4, dir.path()));
    assert!(log.contains("planner: 0 of 56 routes on the DSP"), "{log}");
    run_ok(job(&data, &cpu, "cpu", 4, dir.path()));
    assert_same_run(&refused, &cpu);
}

/// The Hexagon service ELF for the simulator transport, or None (skipped;
/// a failure under CI, where ci/test.sh sets it).
fn sim_service() -> Option<PathBuf> {
    let why = match std::env::var_os("HEXLORA_SIM_SERVICE").map(PathBuf::from) {
        Some(p) if p.is_file() => return Some(p),
        Some(p) => format!("HEXLORA_SIM_SERVICE={} does not exist", p.display()),
        None => "HEXLORA_SIM_SERVICE is not set".to_string(),
    };
    support::skip(&format!("{why} (ci/test.sh builds the service with ci/sim-test.sh and sets it)"));
    None
}

#[test]
fn killing_the_simulator_for_good_mid_run_falls_back_to_the_cpu_and_finishes() {
    let Some(service) = sim_service() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    std::fs::write(dir.path().join("battery_temp"), "300").unwrap();
    let steps = 40;
    let reference = dir.path().join("dsp");
    run_ok(job(&data, &reference, "dsp", steps, dir.path()));
    // A private copy of the service: deleting it makes every restart fail,
    // so the client gives up and the run must switch to the CPU path.
    let copy = dir.path().join("sim_service");
    std::fs::copy(&service, &copy).unwrap();
    let out = dir.path().join("sim");
    let mut cmd = job(&data, &out, "dsp-sim", steps, dir.path());
    let child = cmd.env("HEXLORA_SIM_SERVICE", &copy).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while !out.join("commit.safetensors").exists() {
        assert!(start.elapsed() < Duration::from_secs(300), "no commit appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::remove_file(&copy).unwrap();
    let pgrep = Command::new("pgrep").args(["-P", &child.id().to_string(), "qemu-hexagon"]).output().unwrap();
    let qemu = String::from_utf8_lossy(&pgrep.stdout).trim().to_string();
    assert!(!qemu.is_empty(), "no qemu-hexagon child found");
    let committed_before_kill = TrainState::load(&out).unwrap().unwrap().step();
    assert!(Command::new("kill").args(["-KILL", &qemu]).status().unwrap().success());
    let done = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&done.stdout).into_owned() + &String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{log}");
    assert!(log.contains("the rest of this run uses the CPU path") && log.contains("DSP fallback:"), "{log}");
    assert!(out.join("adapter/adapter_model.safetensors").exists());
    let (sim, native) = (TrainState::load(&out).unwrap().unwrap(), TrainState::load(&reference).unwrap().unwrap());
    assert_eq!(sim.step(), steps as u64);
    assert!(sim.history.iter().all(|r| r.loss.is_finite()));
    // Before the kill the simulator and the in-process service agree bit for bit.
    let bits = |s: &TrainState, n: u64| s.history.iter().take(n as usize).map(|r| r.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&sim, committed_before_kill), bits(&native, committed_before_kill));
    let last: serde_json::Value = serde_json::from_str(std::fs::read_to_string(out.join("runtime.jsonl")).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!(last["dsp_calls"], 0, "{last}");
    assert!(last["cpu_calls"].as_u64().unwrap() > 0, "{last}");
}

#[test]
fn qwen35_keeps_recurrent_projections_in_fp16_on_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    std::fs::write(dir.path().join("battery_temp"), "300").unwrap();
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training/qwen35/model");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let mut logs = Vec::new();
    for out in [&a, &b] {
        let targets = "in_proj_qkv,out_proj,q_proj,down_proj";
        logs.push(run_ok(job_on(&model, targets, &data, out, "dsp", "default", 3, dir.path())));
    }
    assert_same_run(&a, &b);
    let routes: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(a.join("routes.json")).unwrap()).unwrap();
    let routes = routes["routes"].as_array().unwrap();
    let recurrent: Vec<_> = routes.iter().filter(|r| r["projection"].as_str().unwrap().contains("linear_attn")).collect();
    assert!(!recurrent.is_empty());
    // Recurrent: FP16 on the service. Attention and MLP: Q8_0, which holds
    // o_proj (input width 64) but not the fixture's widths 48 and 80 (CPU).
    assert!(recurrent.iter().all(|r| r["on_dsp"] == true), "{recurrent:?}");
    for r in routes.iter().filter(|r| !recurrent.contains(r)) {
        let name = r["projection"].as_str().unwrap();
        let refused = r["reason"].as_str().unwrap().starts_with("load (q8_0)");
        assert_eq!(r["on_dsp"] == true, name.ends_with("o_proj"), "{r}");
        assert_eq!(refused, !name.ends_with("o_proj"), "{r}");
    }
    let policy_line = logs[0].lines().find(|l| l.starts_with("policy (attn q8_0, mlp q8_0, recurrent f16)")).unwrap();
    let fp16_mb: f64 = policy_line.rsplit(')').next().unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(fp16_mb > 0.0, "{policy_line}");
}

/// SIGTERM during the start-up planner (SmolLM2, no plan cache, the
/// default buckets: about a minute of probes natively in a release build)
/// ends the process within 2 s (one probe), exit 0, saying so, with no
/// commit.
#[test]
fn sigterm_during_the_planner_exits_promptly_without_a_commit() {
    let Some(model) = support::smollm2() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_data(&data);
    std::fs::write(dir.path().join("battery_temp"), "300").unwrap();
    let out = dir.path().join("run");
    let mut c = support::hexlora();
    c.args(["personalize", "--quiet", "--rank", "4", "--targets", "q_proj,v_proj", "--device", "dsp", "--steps", "2", "--no-plan-cache"]);
    c.arg("--model").arg(&model).arg("--data").arg(&data).arg("--out").arg(&out);
    c.arg("--powercap-root").arg(dir.path().join("powercap")).arg("--power-supply-root").arg(dir.path().join("power_supply"));
    c.arg("--battery-temp").arg(dir.path().join("battery_temp"));
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let sent = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let done = child.wait_with_output().unwrap();
    let waited = sent.elapsed();
    let log = String::from_utf8_lossy(&done.stdout);
    assert!(done.status.success(), "{log}{}", String::from_utf8_lossy(&done.stderr));
    assert!(log.contains("SIGTERM: stopped during start-up planning"), "the planner finished before SIGTERM, or ignored it: {log}");
    eprintln!("personalize exited {waited:?} after SIGTERM during the planner");
    assert!(waited < Duration::from_secs(2), "exit {waited:?} after SIGTERM (the issue's bar: 2 s)");
    assert!(!out.join("commit.safetensors").exists());
}

#[test]
fn init_adapter_starts_from_that_adapter_and_cpu_names_the_options_it_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let (data, sys) = (dir.path().join("d.jsonl"), dir.path().join("sys"));
    write_data(&data);
    std::fs::create_dir_all(&sys).unwrap();
    let first = dir.path().join("first");
    let log = run_ok(job(&data, &first, "cpu", 3, &sys));
    // --precision, --buckets and --plan-cache configure the DSP side only.
    assert!(log.contains("warning: --precision, --buckets, --plan-cache ignored: --device cpu"), "{log}");
    // One step at a vanishing learning rate from the first run's adapter
    // ends (almost) where it started: the run began there, not at a fresh init.
    let next = dir.path().join("next");
    let resumed = |rank: &str| {
        let mut c = support::hexlora();
        c.args(["personalize", "--quiet", "--device", "cpu", "--steps", "1", "--lr", "1e-12", "--rank", rank]);
        c.arg("--model").arg(model_dir()).arg("--data").arg(&data).arg("--out").arg(&next);
        c.arg("--powercap-root").arg(sys.join("powercap")).arg("--power-supply-root").arg(sys.join("power_supply"));
        c.arg("--init-adapter").arg(first.join("adapter"));
        c
    };
    run_ok(resumed("8"));
    let load = |d: &Path| hexlora::lora::Adapter::load(&d.join("adapter")).unwrap();
    let (a, b) = (load(&first), load(&next));
    assert_eq!(b.config.r, 4, "the rank is the init adapter's, not --rank");
    for (ma, mb) in a.modules.iter().zip(&b.modules) {
        for (x, y) in ma.b.data.iter().zip(&mb.b.data).chain(ma.a.data.iter().zip(&mb.a.data)) {
            assert!((x - y).abs() < 1e-6, "{}: {x} vs {y}", ma.name);
        }
    }
    assert!(a.modules[0].b.data.iter().any(|&v| v != 0.0), "the first run moved B");
    // A rerun resumes the committed run (--rank is the init adapter's either way).
    let log = run_ok(resumed("16"));
    assert!(log.contains("resuming"), "{log}");
}
