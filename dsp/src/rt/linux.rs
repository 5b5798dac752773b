//! The simulator build's process entry and the few Linux system calls
//! qemu-hexagon (a Linux user-mode emulator) provides: `write` and
//! `exit_group`, through `trap0(#1)` with the call number in r6 and the
//! arguments in r0-r5 (the asm-generic numbering).
//!
//! The binary defines `#[no_mangle] extern "C" fn hexlora_main(args: Args)
//! -> i32`; `_start` calls it and exits with its return value.
use core::arch::{asm, global_asm};
use core::fmt;

const SYS_WRITE: u32 = 64;
const SYS_EXIT_GROUP: u32 = 94;

// qemu starts us with r29 (sp) pointing at argc, then the argv pointers.
// sp is realigned to the 8 bytes the Hexagon ABI requires before any call.
global_asm!(
    ".section .text._start,\"ax\",@progbits",
    ".globl _start",
    ".type _start,@function",
    "_start:",
    "  r0 = r29",
    "  r29 = and(r29, #-8)",
    "  call hexlora_rt_start",
    "  r6 = #94",
    "  trap0(#1)",
    ".size _start, . - _start",
);

/// The process arguments.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Args {
    argc: usize,
    argv: *const *const u8,
}

impl Args {
    /// The arguments after the program name, as bytes.
    pub fn iter(&self) -> impl Iterator<Item = &'static [u8]> + '_ {
        (1..self.argc).map(move |i| {
            // SAFETY: the kernel (qemu) put argc valid NUL-terminated
            // strings after sp, alive for the whole process.
            unsafe { core::ffi::CStr::from_ptr((*self.argv.add(i)).cast()).to_bytes() }
        })
    }
}

extern "C" {
    fn hexlora_main(args: Args) -> i32;
}

#[no_mangle]
unsafe extern "C" fn hexlora_rt_start(sp: *const usize) -> i32 {
    let args = Args { argc: *sp, argv: sp.add(1).cast() };
    hexlora_main(args)
}

unsafe fn syscall3(nr: u32, a0: usize, a1: usize, a2: usize) -> isize {
    let ret: isize;
    asm!("trap0(#1)", inlateout("r0") a0 => ret, in("r1") a1, in("r2") a2, in("r6") nr, options(nostack));
    ret
}

/// Writes all of `bytes` to file descriptor `fd`; false on error.
pub fn write_all(fd: usize, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: bytes is a valid readable range.
        let n = unsafe { syscall3(SYS_WRITE, fd, bytes.as_ptr() as usize, bytes.len()) };
        if n <= 0 {
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// Ends the process.
pub fn exit(status: i32) -> ! {
    // SAFETY: exit_group does not return.
    unsafe { syscall3(SYS_EXIT_GROUP, status as usize, 0, 0) };
    loop {}
}

/// Standard output as a `fmt::Write`.
pub struct Stdout;

impl fmt::Write for Stdout {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_all(1, s.as_bytes()).then_some(()).ok_or(fmt::Error)
    }
}

struct Stderr;

impl fmt::Write for Stderr {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_all(2, s.as_bytes()).then_some(()).ok_or(fmt::Error)
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    let _ = fmt::Write::write_fmt(&mut Stderr, format_args!("firmware panic: {info}\n"));
    exit(101)
}
