//! The processes the agent runs (weight holders, model servers, sidecars). Each starts in its
//! own process group, so a signal to the agent's group (Ctrl-C, a service manager stopping
//! the agent) does not reach it and replicas outlive their agent. Each is known by pid *and*
//! kernel start time, so a restarted agent recognises the processes it left behind and never
//! mistakes a reused pid for one of them.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rustix::process::{Pid, Signal, kill_process};
use serde::{Deserialize, Serialize};

/// A process as the kernel knows it: pid and start time (clock ticks since boot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: u32,
    pub start_time: u64,
}

/// `(state, start time)` from `/proc/PID/stat`; `None` when there is no such process.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: comm may hold spaces and parentheses, so split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 of the man page is the state, field 22 the start time; `rest` begins at field 3.
    Some((fields.first()?.chars().next()?, fields.get(19)?.parse().ok()?))
}

impl ProcId {
    /// Whether this very process still runs (a zombie counts as gone).
    pub fn alive(&self) -> bool {
        stat(self.pid).is_some_and(|(state, start)| start == self.start_time && state != 'Z' && state != 'X')
    }
}

/// A running (or finished) process: one the agent spawned, which it can reap and read the exit
/// status of, or one it adopted from an earlier agent, which it can only watch.
#[derive(Debug)]
pub struct Proc {
    pub id: ProcId,
    pub log: PathBuf,
    child: Option<Child>,
    exit: Option<String>,
}

impl Proc {
    /// Starts `argv` with `env` added, stdout and stderr appended to `log`, stdin closed, in a
    /// process group of its own.
    pub fn spawn(argv: &[String], env: &BTreeMap<String, String>, log: &Path) -> Result<Proc, String> {
        let (program, args) = argv.split_first().ok_or("an empty command")?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(program)
            .args(args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let pid = child.id();
        // The start time is in /proc as soon as fork returns.
        let start_time = stat(pid).map_or(0, |(_, t)| t);
        Ok(Proc { id: ProcId { pid, start_time }, log: log.to_path_buf(), child: Some(child), exit: None })
    }

    /// Takes over a process an earlier agent started; `None` if it is gone.
    pub fn adopt(id: ProcId, log: PathBuf) -> Option<Proc> {
        id.alive().then_some(Proc { id, log, child: None, exit: None })
    }

    /// Whether it was adopted rather than spawned by this agent.
    pub fn adopted(&self) -> bool {
        self.child.is_none()
    }

    /// `None` while it runs; once it is gone, how it ended (`exit status: 1`, `signal: 9`),
    /// with the last line it logged.
    pub fn exited(&mut self) -> Option<&str> {
        if self.exit.is_none() {
            let how = match &mut self.child {
                Some(c) => match c.try_wait() {
                    Ok(None) => return None,
                    Ok(Some(status)) => status.to_string(),
                    Err(e) => format!("cannot be waited for: {e}"),
                },
                None if self.id.alive() => return None,
                None => "exited (its exit status went to the agent that started it)".into(),
            };
            let last = last_line(&self.log);
            self.exit = Some(if last.is_empty() { how } else { format!("{how}: {last}") });
        }
        self.exit.as_deref()
    }

    /// Sends `signal` if it still runs (a pid whose start time changed is someone else's).
    pub fn signal(&self, signal: Signal) {
        if self.id.alive()
            && let Some(pid) = Pid::from_raw(self.id.pid as i32)
        {
            let _ = kill_process(pid, signal);
        }
    }

    /// SIGKILL, then reap it if it is ours.
    pub fn kill(&mut self) {
        self.signal(Signal::KILL);
        if let Some(c) = &mut self.child {
            let _ = c.wait();
        }
    }
}

/// The last non-empty line of a log, at most 300 characters (why a process failed, for the
/// replica's status).
pub fn last_line(log: &Path) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let tail = &text[text.len().saturating_sub(4096)..];
    let line = String::from_utf8_lossy(tail).lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string();
    line.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_known_by_pid_and_start_time_and_its_end_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("p.log");
        let argv = ["sh", "-c", "echo starting; echo 'bad shape' >&2; sleep 0.2; exit 4"].map(String::from);
        let mut p = Proc::spawn(&argv, &BTreeMap::new(), &log).unwrap();
        assert!(p.id.alive() && p.id.start_time > 0);
        assert!(!ProcId { start_time: p.id.start_time + 1, ..p.id }.alive(), "another start time is another process");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while p.exited().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(p.exited(), Some("exit status: 4: bad shape"));
        assert!(!p.id.alive());
        assert!(Proc::adopt(p.id, log).is_none());
    }
}
