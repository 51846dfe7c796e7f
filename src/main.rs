fn main() -> std::process::ExitCode {
    afkit::cli::main()
}
