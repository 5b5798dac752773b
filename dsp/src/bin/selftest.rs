//! Runs the self-test registry: natively with `cargo run -p hexlora-dsp
//! --bin selftest`, on Hexagon under qemu-hexagon (ci/sim-test.sh).
//!
//! Arguments: an optional name filter; `--dump-log` also prints the
//! firmware log ring as one `defmt-log <hex>` line for the host decoder.
//! The exit status is 1 when any test failed.
#![cfg_attr(target_arch = "hexagon", no_std, no_main)]

#[cfg(target_arch = "hexagon")]
mod hexagon {
    use hexlora_dsp::rt::linux;

    #[no_mangle]
    extern "C" fn hexlora_main(args: linux::Args) -> i32 {
        let mut stdout = linux::Stdout;
        let (filter, want_log) = super::parse(args.iter());
        let summary = hexlora_dsp::selftest::run_all(filter, &mut stdout);
        if want_log {
            super::dump_log(&mut stdout);
        }
        (summary.failed > 0) as i32
    }
}

#[cfg(not(target_arch = "hexagon"))]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (filter, want_log) = parse(args.iter().map(|a| a.as_bytes()));
    let mut out = String::new();
    let summary = hexlora_dsp::selftest::run_all(filter, &mut out);
    if want_log {
        dump_log(&mut out);
    }
    print!("{out}");
    std::process::exit((summary.failed > 0) as i32);
}

/// (name filter, whether to dump the log ring).
fn parse<'a>(args: impl Iterator<Item = &'a [u8]>) -> (&'a str, bool) {
    let mut filter = "";
    let mut dump = false;
    for a in args {
        match a {
            b"--dump-log" => dump = true,
            name => filter = core::str::from_utf8(name).unwrap_or(""),
        }
    }
    (filter, dump)
}

fn dump_log(out: &mut dyn core::fmt::Write) {
    let mut ring = hexlora_dsp::rt::log_ring::LOG.lock();
    let _ = out.write_str("defmt-log ");
    let mut chunk = [0u8; 64];
    loop {
        let n = ring.read(&mut chunk);
        if n == 0 {
            break;
        }
        for b in &chunk[..n] {
            let _ = write!(out, "{b:02x}");
        }
    }
    let _ = writeln!(out, "\ndefmt-dropped {}", ring.dropped_frames());
}


