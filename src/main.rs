//! The `afkit` command: the command line over the stage crates.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
