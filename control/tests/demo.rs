//! `weft demo` as a user runs it: the built `weft` binary. Bad flags and busy ports fail before
//! anything starts; a quick run prints the report and writes the HTML; Ctrl-C stops every
//! process the demo started. The last two need `weft-proxy` and `weft-model-sim` next to
//! `weft` (`cargo build -p weft-proxy -p weft-control`) and are skipped, saying so, without them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_control::demo::run::check_ports;

const WEFT: &str = env!("CARGO_BIN_EXE_weft");

/// A base port whose 10 demo ports are free, below the ephemeral range; `salt` keeps tests
/// running at once apart.
fn free_base(salt: u16) -> u16 {
    (0..500u16).map(|i| 20_000 + (salt * 2_500 + i * 10) % 12_000).find(|b| check_ports(*b).is_ok()).expect("a free range of 10 ports")
}

/// Processes whose command line mentions one of the demo's ports.
fn leftovers(base: u16) -> Vec<String> {
    let ports: Vec<String> = (0..10).map(|k| format!("127.0.0.1:{}", base + k)).collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if ports.iter().any(|p| cmd.contains(p.as_str())) {
            found.push(format!("{}: {cmd}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

fn children_built() -> bool {
    let dir = Path::new(WEFT).parent().unwrap();
    let ok = dir.join("weft-proxy").is_file() && dir.join("weft-model-sim").is_file();
    if !ok {
        eprintln!(
            "SKIPPED: weft-proxy / weft-model-sim are not built in {}; run `cargo build -p weft-proxy -p weft-control` first",
            dir.display()
        );
    }
    ok
}

#[test]
fn demo_rejects_a_bad_flag() {
    let out = Command::new(WEFT).args(["demo", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--bogus"), "{err}");
    let out = Command::new(WEFT).args(["demo", "--seconds", "5", "--warmup", "5"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--warmup: 5 s leaves nothing to measure"));
}

#[test]
fn demo_refuses_a_busy_port_and_starts_nothing() {
    let base = free_base(1);
    let _held = std::net::TcpListener::bind(("127.0.0.1", base + 2)).unwrap();
    let t = Instant::now();
    let out = Command::new(WEFT).args(["demo", "--quick", "--listen-base", &base.to_string()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("port {} (for the model server a) is already in use", base + 2)), "{err}");
    assert!(err.contains("--listen-base"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(leftovers(base), Vec::<String>::new());
}

#[test]
fn demo_quick_run_prints_the_report_and_writes_the_html() {
    if !children_built() {
        return;
    }
    let base = free_base(2);
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let out = Command::new(WEFT)
        // Relative: the report line then prints where it is, whatever directory reads it.
        .args(["demo", "--seconds", "4", "--warmup", "1", "--concurrency", "4", "--listen-base", &base.to_string(), "--report", "report.html"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for needle in ["== A/B report: experiment ranker-ab", "sample ratio (expected 50/50): users a ", "latency:", "error rate:", "verdict:"] {
        assert!(stdout.contains(needle), "{needle:?} missing from:\n{stdout}");
    }
    // The split is sticky by x-user-id through the real sidecars: no user reached both variants.
    assert!(stdout.contains("users saw one variant only"), "{stdout}");
    let shown = format!("HTML report with the latency chart: {}\n", html.display());
    assert!(stdout.contains(&shown), "the report's absolute path {shown:?} missing from:\n{stdout}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.matches("<polyline").count() == 2, "{page}");
    assert_eq!(leftovers(base), Vec::<String>::new());
}

#[test]
fn demo_ctrl_c_stops_every_process_it_started() {
    if !children_built() {
        return;
    }
    let base = free_base(3);
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(WEFT)
        .args(["demo", "--seconds", "120", "--concurrency", "2", "--listen-base", &base.to_string()])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Traffic is flowing once the progress line shows.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !String::from_utf8_lossy(&seen).contains("req") {
        assert!(Instant::now() < deadline, "no progress line: {}", String::from_utf8_lossy(&seen));
        let mut buf = Vec::new();
        if err.read_until(b'\r', &mut buf).unwrap() == 0 {
            panic!("weft demo exited early: {}", String::from_utf8_lossy(&seen));
        }
        seen.extend(buf);
    }
    assert!(leftovers(base).len() >= 5, "children running: {:?}", leftovers(base));
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "weft demo did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130));
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    assert!(rest.contains("interrupted; stopped every process it started"), "{rest}");
    assert_eq!(leftovers(base), Vec::<String>::new());
}
