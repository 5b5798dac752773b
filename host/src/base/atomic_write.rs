//! Crash-safe file replacement: write a temporary file next to the target,
//! fsync it, rename it over the target, fsync the directory. A reader (or a
//! resumed run after `kill -9`) sees the old file or the new one, never a
//! torn one.
use crate::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Atomically replaces `path` with `bytes`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, &mut |tmp| std::fs::File::create(tmp).and_then(|mut f| f.write_all(bytes)).map_err(|e| Error::io(tmp, e)))
}

/// Atomically replaces `path` with what `write(tmp)` writes to the
/// temporary file `tmp` (for writers that stream, so the whole content
/// never sits in memory).
pub fn write_atomic_with(path: &Path, write: &mut dyn FnMut(&Path) -> Result<()>) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| Error::invalid("output path", format!("{} has no file name", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| Error::io(p, e)
    };
    write(&tmp)?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.bin");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(write_atomic(&dir.path().join("missing/x"), b"").is_err());
    }
}
