//! The one rule for files a command writes: an existing output is replaced
//! only with `--force`, and never when it is one of the command's own
//! inputs (or holds one), `--force` or not: `export-gguf --out` given the
//! `--model` file replaced the base model with a LoRA file and exited 0.
use crate::{Error, Result};
use std::path::Path;

/// The same file or directory (one canonical path, or one inode: a hard
/// link counts), or `input` inside the directory `output`.
fn clobbers(output: &Path, input: &Path) -> bool {
    let (Ok(o), Ok(i)) = (output.canonicalize(), input.canonicalize()) else { return false };
    if i.starts_with(&o) {
        return true;
    }
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(&o), std::fs::metadata(&i)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Refuses to write `output` (what `--out` names) over any of `inputs`
/// (option name, path), ever, or over an existing file without `force`.
pub fn check_output(output: &Path, inputs: &[(&str, &Path)], force: bool) -> Result<()> {
    let name = format!("--out {}", output.display());
    for (option, input) in inputs {
        if clobbers(output, input) {
            return Err(Error::invalid(name, format!("is (or holds) the {option} input {}; writing it would destroy the input; choose another --out", input.display())));
        }
    }
    if !force && output.exists() {
        return Err(Error::invalid(name, "exists; pass --force to replace it, or choose another --out"));
    }
    Ok(())
}

/// [`check_output`] for each of a run directory's `outputs` under `out`,
/// without the existence rule (run directories have their own, with
/// commits: `train::learner::claim_out_dir`, which calls this first).
pub fn check_run_outputs(out: &Path, outputs: &[&str], inputs: &[(&str, &Path)]) -> Result<()> {
    let paths = outputs.iter().map(|o| out.join(o)).chain([out.join("commit.safetensors")]);
    for p in paths {
        if let Some((option, input)) = inputs.iter().find(|(_, i)| clobbers(&p, i)) {
            let msg = format!("would write {} over the {option} input {}; choose another --out", p.display(), input.display());
            return Err(Error::invalid(format!("--out {}", out.display()), msg));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_is_never_overwritten_and_an_existing_file_needs_force() {
        let dir = std::env::temp_dir().join(format!("hexlora-outputs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("adapter")).unwrap();
        let model = dir.join("model.gguf");
        std::fs::write(&model, b"x").unwrap();
        let link = dir.join("link.gguf");
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(&model, &link).unwrap();
        let inputs = [("--model", model.as_path()), ("--adapter", &*dir.join("adapter"))];
        for force in [false, true] {
            assert!(check_output(&model, &inputs, force).unwrap_err().to_string().contains("--model input"));
            assert!(check_output(&link, &inputs, force).unwrap_err().to_string().contains("--model input"));
            assert!(check_output(&dir.join("./adapter"), &inputs, force).unwrap_err().to_string().contains("--adapter input"));
            assert!(check_output(&dir, &inputs, force).is_err(), "a directory holding an input");
        }
        let other = dir.join("other.gguf");
        std::fs::write(&other, b"y").unwrap();
        assert!(check_output(&other, &inputs, false).unwrap_err().to_string().contains("--force"));
        assert!(check_output(&other, &inputs, true).is_ok());
        assert!(check_output(&dir.join("new.gguf"), &inputs, false).is_ok());
        assert!(check_run_outputs(&dir, &["adapter"], &inputs).is_err());
        assert!(check_run_outputs(&dir.join("run"), &["adapter"], &inputs).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
