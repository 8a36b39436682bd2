//! The slow-disk emulation raft-write runs each node under (`--fsync-delay-ms`). Alone in its
//! test binary: the wrapper reaps every child of its process, which would steal other tests'.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use weft_bench::fsync_delay;

/// Runs `sh -c script` under the wrapper: its exit status and how long it took; `None` when
/// this machine forbids ptrace or seccomp filters (a locked-down container).
fn sh(delay: Duration, script: &str) -> Option<(i32, Duration)> {
    let started = Instant::now();
    let args = [OsString::from("-c"), OsString::from(script)];
    match fsync_delay::run(delay, &OsString::from("sh"), &args) {
        Ok(code) => Some((code, started.elapsed())),
        Err(e) => {
            let forbidden = e
                .chain()
                .filter_map(|c| c.downcast_ref::<std::io::Error>())
                .any(|io| matches!(io.raw_os_error(), Some(libc::EPERM | libc::EACCES | libc::ENOSYS)));
            assert!(forbidden, "the wrapper failed: {e:#}");
            eprintln!("skipped: ptrace or seccomp is not allowed here ({e:#})");
            None
        }
    }
}

#[test]
fn each_fsync_of_the_program_and_its_children_waits_and_nothing_else_does() {
    let dir = std::env::temp_dir().join(format!("weft-fsync-delay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("f");
    std::fs::write(&file, b"x").unwrap();

    // Two fdatasyncs, each in a child process of the traced shell: two delays.
    let f = file.display();
    let Some((code, took)) = sh(Duration::from_millis(300), &format!("sync --data {f} && sync --data {f}; exit 7")) else {
        return;
    };
    assert_eq!(code, 7, "the program's exit status comes back");
    assert!(took >= Duration::from_millis(600), "two delayed fdatasyncs took only {took:?}");

    // No fsync: no delay (stat, write, fork and exec run untraced). The delay is long enough
    // that one held call would show however slow the machine.
    let long = Duration::from_secs(5);
    let (code, took) = sh(long, &format!("cat {f} > /dev/null; ls {} > /dev/null", dir.display())).expect("allowed above");
    assert_eq!(code, 0);
    assert!(took < long, "a run without fsync took {took:?}: something was held");

    std::fs::remove_dir_all(&dir).unwrap();
}
