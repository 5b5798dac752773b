//! The projection service as a simulator process: `qemu-hexagon -cpu v73
//! sim_service SHM_FILE BYTES` maps the host's shared file and serves the
//! mailbox in it (`hexlora_dsp::service::mailbox`) until the host stops it,
//! restarts it, or goes away. Built by ci/sim-test.sh; the host's simulator
//! transport (`host/src/npu/transport/simulator.rs`) runs it.
//!
//! The Linux calls it needs beyond `rt::linux` (openat, mmap2, nanosleep,
//! getppid) are issued here with `trap0(#1)`, asm-generic numbering.
//! Natively it only says where it belongs: there the shared-memory
//! transport runs the same mailbox loop on a thread.
#![cfg_attr(target_arch = "hexagon", no_std, no_main)]
#![cfg_attr(target_arch = "hexagon", feature(asm_experimental_arch))]

#[cfg(target_arch = "hexagon")]
mod hexagon {
    use core::arch::asm;
    use core::fmt::Write;
    use hexlora_dsp::rt::linux;
    use hexlora_dsp::service::{mailbox, ProjectionService};

    const SYS_OPENAT: u32 = 56;
    const SYS_NANOSLEEP: u32 = 101;
    const SYS_GETPPID: u32 = 173;
    const SYS_MMAP2: u32 = 222;
    const AT_FDCWD: isize = -100;
    const O_RDWR: usize = 2;
    const PROT_READ_WRITE: usize = 3;
    const MAP_SHARED: usize = 1;

    unsafe fn syscall6(nr: u32, a: [usize; 6]) -> isize {
        let ret: isize;
        asm!("trap0(#1)", inlateout("r0") a[0] => ret, in("r1") a[1], in("r2") a[2], in("r3") a[3], in("r4") a[4],
             in("r5") a[5], in("r6") nr, options(nostack));
        ret
    }

    /// Looks between requests: every call sleeps 20 us (a busy loop would
    /// take a host core from the training side); every 4096th also checks
    /// that the host process is still our parent.
    fn idle(parent: isize) -> impl FnMut(u32) -> bool {
        move |spins| {
            let ts: [i32; 2] = [0, 20_000];
            // SAFETY: ts is a valid 32-bit timespec; no remainder wanted.
            unsafe { syscall6(SYS_NANOSLEEP, [ts.as_ptr() as usize, 0, 0, 0, 0, 0]) };
            // SAFETY: getppid has no arguments.
            spins % 4096 != 0 || unsafe { syscall6(SYS_GETPPID, [0; 6]) } == parent
        }
    }

    fn fail(what: &str) -> i32 {
        let _ = writeln!(linux::Stdout, "sim_service: {what}");
        2
    }

    #[no_mangle]
    extern "C" fn hexlora_main(args: linux::Args) -> i32 {
        let mut it = args.iter();
        let (Some(path), Some(bytes)) = (it.next(), it.next()) else {
            return fail("usage: sim_service SHM_FILE BYTES");
        };
        let Some(len) = core::str::from_utf8(bytes).ok().and_then(|s| s.parse::<usize>().ok()) else {
            return fail("BYTES is not a number");
        };
        // argv strings are NUL-terminated in place, so the slice's pointer
        // is a C string.
        // SAFETY: openat reads the NUL-terminated path.
        let fd = unsafe { syscall6(SYS_OPENAT, [AT_FDCWD as usize, path.as_ptr() as usize, O_RDWR, 0, 0, 0]) };
        if fd < 0 {
            return fail("cannot open the shared file");
        }
        // SAFETY: a fresh shared mapping of the whole file.
        let base = unsafe { syscall6(SYS_MMAP2, [0, len, PROT_READ_WRITE, MAP_SHARED, fd as usize, 0]) };
        if (-4096..0).contains(&base) {
            return fail("cannot map the shared file");
        }
        // SAFETY: getppid has no arguments.
        let parent = unsafe { syscall6(SYS_GETPPID, [0; 6]) };
        let mut idle = idle(parent);
        // SAFETY: the mapping is `len` bytes, read-write, for the rest of
        // the process; the host follows the mailbox protocol.
        let exit = unsafe { mailbox::serve::<ProjectionService>(base as *mut u8, len, &mut idle) };
        let _ = writeln!(linux::Stdout, "sim_service: {exit:?}");
        match exit {
            mailbox::Exit::Stopped | mailbox::Exit::Superseded | mailbox::Exit::Abandoned => 0,
            _ => 1,
        }
    }
}

#[cfg(not(target_arch = "hexagon"))]
fn main() {
    eprintln!(
        "sim_service is the Hexagon build of the projection service for qemu-hexagon (ci/sim-test.sh builds it); \
         natively the shared-memory transport runs the same loop on a thread"
    );
    std::process::exit(2);
}
