//! Logs written to a file or a pipe carry no ANSI colour codes (they did: `\x1b[2m` around
//! every timestamp, unreadable in `docker logs`, journald and CI artifacts).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use weft_tests::workspace_bin;

/// The first stderr lines of `cmd` up to one containing `until` (at most 200 lines).
fn first_lines(mut cmd: Command, until: &str) -> String {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
    let mut seen = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines().take(200) {
        let line = line.unwrap_or_default();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(until) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains(until), "never logged {until:?}:\n{seen}");
    seen
}

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut control = Command::new(workspace_bin("weft-control"));
    control.args(["--listen", "127.0.0.1:0", "--xds-listen", "127.0.0.1:0", "--init", "--data-dir"]).arg(dir.path().join("c"));
    let text = first_lines(control, "without authentication");
    assert!(!text.contains('\x1b'), "weft-control:\n{text:?}");

    let cfg = dir.path().join("proxy.yaml");
    std::fs::write(&cfg, "admin: {address: \"127.0.0.1:0\"}\nlisteners: [{name: out, address: \"127.0.0.1:0\"}]\n").unwrap();
    let mut proxy = Command::new(workspace_bin("weft-proxy"));
    proxy.arg("--config").arg(&cfg);
    let text = first_lines(proxy, "listening");
    assert!(!text.contains('\x1b'), "weft-proxy:\n{text:?}");
}
