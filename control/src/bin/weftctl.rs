//! `weftctl`: the command-line client of the weft control plane. Everything lives in
//! `weft_control::cli` (so its pure parts are unit-tested with the library); see
//! `docs/control-api.md` for the commands.

fn main() -> std::process::ExitCode {
    weft_control::cli::main()
}
