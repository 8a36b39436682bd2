//! Log output for weft's binaries (weft-proxy, weft-control, weft): human-readable lines on
//! stderr, coloured only when stderr is a terminal and `NO_COLOR` is not set, so a log read
//! from a file, a pipe, `docker logs` or journald holds no escape codes.

use std::io::IsTerminal;

/// Install the global subscriber with `filter` (RUST_LOG syntax).
pub fn init(filter: tracing_subscriber::EnvFilter) {
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour).init();
}
