//! The `hexlora` command line. Each subcommand lives in `cli/<name>.rs`.
fn main() -> std::process::ExitCode {
    hexlora::cli::main()
}
