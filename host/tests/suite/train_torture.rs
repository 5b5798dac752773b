//! Torture test of commits and resume: `hexlora train` on the tiny Llama
//! fixture killed with SIGKILL at seeded random instants and resumed until
//! done, then the last commit of saved kill states damaged by one random
//! byte each (half in the header, half in the tensor data; a quarter of
//! them without the previous commit to fall back to) and resumed.
//! Every resume either ends with the adapter of one uninterrupted run, byte
//! for byte, or refuses with an error naming the commit; none trains on
//! damaged state, and nothing panics.
//!
//! `HEXLORA_TORTURE_KILLS` (default 50), `HEXLORA_TORTURE_FLIPS` (default
//! 20) and `HEXLORA_TORTURE_SEED` (default 24) set the counts and the seed.
use crate::support;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// splitmix64: a seeded stream, so a failing schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Six learnable token examples (prompt part ignored).
fn write_data(dir: &Path) -> PathBuf {
    let lines: Vec<String> = (0..6u32)
        .map(|i| {
            let ids: Vec<u32> = (0..16).map(|t| (i * 7 + t * 3) % 128).collect();
            let labels: Vec<i64> = ids.iter().enumerate().map(|(t, &x)| if t < 4 { -100 } else { x as i64 }).collect();
            serde_json::json!({"input_ids": ids, "labels": labels}).to_string()
        })
        .collect();
    let path = dir.join("data.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// The run under test, always with `--resume` (a fresh start when there is
/// no commit yet); stderr goes to `err`.
fn train(data: &Path, out: &Path, err: &Path) -> Command {
    let mut c = support::hexlora();
    c.args(["train", "--quiet", "--steps", "12", "--rank", "4", "--alpha", "8", "--lr", "5e-3", "--seed", "3"]);
    // --resume where a commit (or the one before it) is kept: `train`
    // refuses --resume with nothing to resume.
    if out.join("commit.safetensors").exists() || out.join("commit.prev.safetensors").exists() {
        c.arg("--resume");
    }
    c.args(["--targets", "q_proj,v_proj,down_proj", "--frozen-dtype", "f32", "--dropout", "0.1"]);
    c.arg("--model").arg(support::root().join("tests/fixtures/training/llama/model")).arg("--data").arg(data).arg("--out").arg(out);
    c.stdout(Stdio::null()).stderr(std::fs::File::create(err).unwrap());
    c
}

fn adapter_bytes(run: &Path) -> Vec<u8> {
    std::fs::read(run.join("adapter/adapter_model.safetensors")).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// What the kill phase saw.
#[derive(Default, Debug)]
struct Kills {
    kills: u64,
    after_a_commit: u64,
    completed: u64,
}

/// Kills runs at random instants below `full` until `n` kills landed; each
/// run that completes first is checked against `reference` and started
/// over. Saves up to `keep` killed states that hold a commit.
fn kill_phase(rng: &mut Rng, data: &Path, dir: &Path, full: Duration, n: u64, keep: u64, reference: &[u8]) -> (Kills, Vec<PathBuf>) {
    let (run, err) = (dir.join("killed"), dir.join("killed.err"));
    let mut seen = Kills::default();
    let mut saved = Vec::new();
    let check_stderr = |err: &Path| {
        let text = std::fs::read_to_string(err).unwrap();
        assert!(!text.contains("panicked") && !text.contains("WARNING"), "an undamaged run warned or panicked: {text}");
    };
    // Kill instants scale with a whole run's time, grow when a run that had
    // not committed is killed before its first commit, and shrink when a
    // run completes first: the load of a shared machine changes how long a
    // run takes from one minute to the next.
    let mut scale = full.as_micros() as u64;
    while seen.kills < n {
        let had_commit = run.join("commit.safetensors").exists();
        let mut child = train(data, &run, &err).spawn().unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(scale)));
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{}", std::fs::read_to_string(&err).unwrap());
            check_stderr(&err);
            assert_eq!(adapter_bytes(&run), reference, "a resumed run ended with another adapter");
            seen.completed += 1;
            scale -= scale / 4;
            std::fs::remove_dir_all(&run).unwrap();
            continue;
        }
        child.kill().unwrap(); // SIGKILL: before, during or after a step or a commit
        child.wait().unwrap();
        check_stderr(&err);
        seen.kills += 1;
        seen.after_a_commit += had_commit as u64;
        if !had_commit && !run.join("commit.safetensors").exists() {
            scale += scale / 4;
        }
        if (saved.len() as u64) < keep && run.join("commit.safetensors").exists() {
            let copy = dir.join(format!("saved-{}", saved.len()));
            copy_dir(&run, &copy);
            saved.push(copy);
        }
    }
    let status = train(data, &run, &err).status().unwrap();
    assert!(status.success(), "{}", std::fs::read_to_string(&err).unwrap());
    check_stderr(&err);
    assert_eq!(adapter_bytes(&run), reference, "the last resumed run ended with another adapter");
    (seen, saved)
}

/// What the damage phase saw.
#[derive(Default, Debug)]
struct Flips {
    fell_back: u64,
    refused: u64,
    harmless: u64,
}

/// Damages one byte of each saved state's last commit (even ones in the
/// header, odd ones in the data) and resumes it. Every fourth state loses
/// its previous commit first, so that damage must be refused.
fn flip_phase(rng: &mut Rng, data: &Path, saved: &[PathBuf], reference: &[u8]) -> Flips {
    let mut seen = Flips::default();
    for (i, run) in saved.iter().enumerate() {
        if i % 4 == 3 {
            let _ = std::fs::remove_file(run.join("commit.prev.safetensors"));
        }
        let commit = run.join("commit.safetensors");
        let mut bytes = std::fs::read(&commit).unwrap();
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let at = if i % 2 == 0 { rng.below(header_end as u64) as usize } else { header_end + rng.below((bytes.len() - header_end) as u64) as usize };
        bytes[at] ^= 1 + rng.below(255) as u8;
        std::fs::write(&commit, &bytes).unwrap();
        let err = run.join("resume.err");
        let status = train(data, run, &err).status().unwrap();
        let stderr = std::fs::read_to_string(&err).unwrap();
        assert!(!stderr.contains("panicked"), "byte {at} of saved-{i}: {stderr}");
        if status.success() {
            assert_eq!(adapter_bytes(run), reference, "byte {at} of saved-{i} was trained on: {stderr}");
            if stderr.contains("WARNING") {
                assert!(stderr.contains("commit.prev.safetensors"), "{stderr}");
                seen.fell_back += 1;
            } else {
                seen.harmless += 1;
            }
        } else {
            assert!(stderr.contains("commit.safetensors"), "byte {at} of saved-{i}: the refusal does not name the commit: {stderr}");
            seen.refused += 1;
        }
    }
    seen
}

#[test]
fn killed_and_damaged_runs_resume_bit_identically_or_refuse() {
    let (kills, flips) = (env_count("HEXLORA_TORTURE_KILLS", 50), env_count("HEXLORA_TORTURE_FLIPS", 20));
    let mut rng = Rng(env_count("HEXLORA_TORTURE_SEED", 24));
    let dir = tempfile::tempdir().unwrap();
    let data = write_data(dir.path());
    let whole = dir.path().join("whole");
    let started = Instant::now();
    assert!(train(&data, &whole, &dir.path().join("whole.err")).status().unwrap().success());
    let full = started.elapsed();
    let reference = adapter_bytes(&whole);
    let (k, saved) = kill_phase(&mut rng, &data, dir.path(), full, kills, flips, &reference);
    eprintln!("{k:?} (a whole run {} ms)", full.as_millis());
    assert!(k.after_a_commit * 4 >= k.kills, "only {} of {} kills hit a run that had committed", k.after_a_commit, k.kills);
    assert!(flips == 0 || !saved.is_empty(), "no killed state held a commit");
    let f = flip_phase(&mut rng, &data, &saved, &reference);
    eprintln!("{f:?} in {:.1} s", started.elapsed().as_secs_f64());
    // Data flips always fail their checksum; header flips almost always
    // break the JSON or a field's checksum (a space turned into another
    // blank is harmless). A quarter of the states keep no previous commit.
    assert!(saved.len() < 4 || (f.fell_back > 0 && f.refused > 0 && f.refused + f.fell_back >= saved.len() as u64 / 2), "{f:?}");
}
