//! Child processes that cannot outlive the bench.
//!
//! Every process the bench starts is spawned in its own process group and registered here, so a
//! drop (normal end, `?` error, panic) or a SIGINT/SIGTERM to the bench stops the whole group:
//! nginx's workers die with their master, and nothing keeps a port or a core busy afterwards.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use std::os::unix::process::CommandExt;

/// Process groups of live children, read by the signal handler (which cannot reach the guards).
static LIVE_GROUPS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// Scratch directories to remove if the bench is interrupted.
static TEMP_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A running child process group, stopped on drop.
pub struct Spawned {
    /// Short name used in logs and errors.
    pub name: String,
    child: Child,
    stopped: bool,
}

impl Spawned {
    /// Starts `cmd` in a new process group with stdin closed.
    pub fn start(name: &str, cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        LIVE_GROUPS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child.id());
        Ok(Self {
            name: name.to_string(),
            child,
            stopped: false,
        })
    }

    /// Runs `cmd` to its end and returns its stdout; `Err` (with its output) when it fails or is
    /// still running after `limit`, so a stalled peer cannot hang the bench (or CI).
    pub fn run_to_end(name: &str, cmd: &mut Command, limit: Duration) -> Result<String> {
        let mut p = Self::start(name, cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))?;
        let stdout = p.child.stdout.take().map(read_in_background);
        let stderr = p.child.stderr.take().map(read_in_background);
        let deadline = Instant::now() + limit;
        let status = loop {
            match p.exited() {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => break None,
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        p.stop();
        let text = |r: Option<std::thread::JoinHandle<String>>| {
            r.and_then(|h| h.join().ok()).unwrap_or_default()
        };
        let (out, err) = (text(stdout), text(stderr));
        match status {
            Some(s) if s.success() => Ok(out),
            Some(s) => bail!("{name} failed ({s}): {out}{err}"),
            None => bail!("{name} still running after {limit:?}: {out}{err}"),
        }
    }

    /// Pid of the group leader (the process the command execs into).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Gives access to piped stdout, if the command was configured with one.
    pub fn stdout(&mut self) -> Option<&mut std::process::ChildStdout> {
        self.child.stdout.as_mut()
    }

    /// `Some(status)` if the process has already exited (a crashed peer).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops the group: SIGTERM (graceful, lets nginx stop its workers), SIGKILL after 2 s.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let pgid = self.child.id();
        if self.exited().is_none() {
            signal_group(pgid, "TERM");
            let deadline = Instant::now() + Duration::from_secs(2);
            while self.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Leftover group members (or a leader ignoring TERM) get no second chance.
        signal_group(pgid, "KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
        LIVE_GROUPS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&g| g != pgid);
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends a signal to a process group through kill(1), which keeps the crate free of `unsafe`.
fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Reads a child's pipe to the end on a thread, so a full stderr pipe cannot block the child
/// while stdout is being read.
fn read_in_background(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// Kills every registered group, removes the scratch directories and exits when the bench
/// receives SIGINT or SIGTERM, because the default action would end it without any `Drop`.
pub fn stop_children_on_signal() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async {
                use tokio::signal::unix::{SignalKind, signal};
                let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            });
            let groups = LIVE_GROUPS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            for &pgid in &groups {
                signal_group(pgid, "KILL");
            }
            for dir in TEMP_DIRS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let _ = std::fs::remove_dir_all(dir);
            }
            eprintln!(
                "interrupted: stopped {} child process group(s)",
                groups.len()
            );
            std::process::exit(130);
        })?;
    Ok(())
}

/// A scratch directory for configs and logs, removed on drop (or on SIGINT/SIGTERM).
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/<prefix>-<pid>`, emptied first if a previous run with the same pid left it.
    pub fn new(prefix: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        TEMP_DIRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(dir.clone());
        Ok(Self(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        TEMP_DIRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|d| d != &self.0);
    }
}
