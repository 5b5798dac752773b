//! GGUF adapters through the command line on the tiny Llama fixture (whose
//! PEFT adapter is PyTorch's): `export-gguf` then `grad --adapter FILE.gguf`
//! gives the PEFT directory's loss, logits and gradients bit for bit;
//! `train --init-adapter FILE.gguf` starts from that adapter (its rank,
//! alpha and targets) and refuses a directory that already holds a run.
use crate::support;
use hexlora::lora::Adapter;
use hexlora::model::checkpoint::Checkpoint;
use std::path::{Path, PathBuf};
use std::process::Output;

fn fixture(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training/llama").join(p)
}

fn hexlora(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    support::hexlora().args(args.iter().map(|a| a.as_ref())).output().unwrap()
}

fn ok(out: Output) -> Output {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn grad(adapter: &Path, out: &Path) -> Vec<u8> {
    ok(hexlora(&[&"grad", &"--model", &fixture("model"), &"--adapter", &adapter, &"--batch", &fixture("batch.json"), &"--out", &out]));
    std::fs::read(out).unwrap()
}

#[test]
fn a_gguf_adapter_gives_the_peft_directorys_gradients_and_starts_training() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("adapter.gguf");
    ok(hexlora(&[&"export-gguf", &"--model", &fixture("model"), &"--adapter", &fixture("adapter"), &"--out", &gguf]));
    assert_eq!(grad(&gguf, &dir.path().join("g1")), grad(&fixture("adapter"), &dir.path().join("g2")), "grad output differs");

    let data = dir.path().join("data.jsonl");
    let lines: Vec<String> = (0..4).map(|i| format!("{{\"input_ids\": [{}], \"labels\": [{}]}}", (0..12).map(|t| ((i * 5 + t * 3) % 100).to_string()).collect::<Vec<_>>().join(","), (0..12).map(|t| ((i * 5 + t * 3) % 100).to_string()).collect::<Vec<_>>().join(","))).collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    let run = dir.path().join("run");
    // lr 1e-30: one step moves nothing, so the saved adapter is the start.
    let train = |extra: &[&dyn AsRef<std::ffi::OsStr>]| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"train", &"--quiet", &"--model"];
        let model = fixture("model");
        args.extend([&model as &dyn AsRef<std::ffi::OsStr>, &"--data", &data, &"--out", &run, &"--init-adapter", &gguf, &"--steps", &"1", &"--lr", &"1e-30", &"--dropout", &"0"]);
        args.extend_from_slice(extra);
        hexlora(&args)
    };
    ok(train(&[]));
    let cfg = Checkpoint::open(&fixture("model")).unwrap().config;
    let start = Adapter::open(&fixture("adapter"), &cfg).unwrap();
    let trained = Adapter::load(&run.join("adapter")).unwrap();
    let targets = |a: &Adapter| {
        let mut t = a.config.target_modules.clone();
        t.sort();
        t
    };
    assert_eq!((trained.config.r, trained.config.alpha, targets(&trained)), (start.config.r, start.config.alpha, targets(&start)));
    for (t, s) in trained.modules.iter().zip(&start.modules) {
        assert_eq!(t.name, s.name);
        let diff = t.a.data.iter().chain(&t.b.data).zip(s.a.data.iter().chain(&s.b.data)).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff < 1e-12, "{}: moved by {diff}", t.name);
    }
    let again = train(&[]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a run"), "{}", String::from_utf8_lossy(&again.stderr));
}
