//! `replay-guard`: the command is the package's library (`lib.rs` says what it does), so that
//! the simulator can serve connections as the proxy serves them.

fn main() -> std::process::ExitCode {
    replay_guard::main()
}
