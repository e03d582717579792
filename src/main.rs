//! The `metahook` binary: parses the command line and hands over to [`metahook::cli`].

fn main() -> std::process::ExitCode {
    metahook::cli::main()
}
