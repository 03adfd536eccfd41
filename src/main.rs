fn main() -> std::process::ExitCode {
    ai_crew_sync::cli::main()
}
