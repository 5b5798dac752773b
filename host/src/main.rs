//! The `hexlora` command line. Each subcommand lives in `cli/<name>.rs`;
//! everything they run is the `hexlora` library's.
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}

/// `_dl_find_object` for the static musl build (see the file).
#[cfg(all(target_env = "musl", target_os = "linux"))]
#[path = "dl_find_object.rs"]
mod dl_find_object;
