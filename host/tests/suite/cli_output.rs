//! What the `hexlora` binary does with its standard output.
use crate::support;
use std::process::Stdio;

/// `hexlora ... | head` once `head` has exited: the process ends from
/// SIGPIPE, as `cat` would, instead of panicking in `println!`.
#[cfg(unix)]
#[test]
fn closed_stdout_ends_quietly_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    // the reading end is closed before the child starts: its first write fails
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = support::hexlora().arg("info").stdout(writer).stderr(Stdio::piped()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "panicked on a closed stdout: {stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "status {:?}, stderr {stderr}", out.status);
}
