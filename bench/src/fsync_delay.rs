//! A slower disk for one process tree: every `fsync` and `fdatasync` of a process, and of every
//! thread and child process it starts, takes a fixed delay longer. raft-write runs each node of
//! both systems under it (`--fsync-delay-ms`) to show the fsync-bound regime on a machine whose
//! own disk flushes in a fraction of a millisecond.
//!
//! Why not `strace -f --seccomp-bpf -e inject=fdatasync,fsync:delay_exit=…`, which this replaces:
//! strace 6.1 (Debian 12) resumes each *new thread* at every system call until that thread's
//! first traced call. A `stat()` loop in a new thread ran 53× slower under it here (in the main
//! thread, and in a thread after one `fdatasync`, at full speed). Tokio's workers and Go's
//! threads never call fsync themselves, so every `epoll_wait`, `recvfrom` and `futex` of the
//! nodes took a ptrace round trip: the emulated disk also slowed the CPU side, by an amount
//! that depends on how many system calls each system makes per write.
//!
//! How: the child installs a seccomp filter that returns `SECCOMP_RET_TRACE` for `fsync` and
//! `fdatasync` only (every other call runs untraced, in every thread: the filter is inherited),
//! asks to be traced, and execs the program. This process, single-threaded (a tracee belongs to
//! the thread that traces it), resumes every stop at once except those seccomp stops, which it
//! resumes `delay` later; the call then runs. The delay comes before the flush instead of after
//! it: the caller waits the same. Signals reaching the tracees are delivered to them; SIGTERM,
//! SIGINT and SIGHUP sent to this process are passed on to the program; if this process dies,
//! the kernel kills the tracees (`PTRACE_O_EXITKILL`), so nothing keeps running untraced.
//!
//! One of two modules with `unsafe` (netns.rs is the other): fork-time setup, ptrace and seccomp have no
//! safe interface in std, and a dependency for them would be larger than this file.
#![allow(unsafe_code)]

use anyhow::{Context, Result, bail};
use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// ptrace's unused address argument (variadic: it must be pointer-sized).
const NULL: *mut libc::c_void = std::ptr::null_mut();

/// The hidden first argument that makes a bench binary run as the wrapper:
/// `BIN FLAG MICROS PROGRAM ARGS...` (see [`wrapper`] and [`exec_if_asked`]).
pub const FLAG: &str = "--exec-with-fsync-delay-us";

/// The argument list that runs a program under a `delay` on every fsync: this binary again
/// ([`crate::workspace::self_exe`]), with [`FLAG`]; the caller appends the program and its
/// arguments.
pub fn wrapper(delay: Duration) -> Vec<String> {
    vec![crate::workspace::self_exe().display().to_string(), FLAG.into(), delay.as_micros().to_string()]
}

/// If this process was started as the wrapper (first argument [`FLAG`]), runs the program and
/// returns its exit status (128 + signal when a signal ended it); otherwise `None`.
/// Call first thing in `main`, before any thread exists.
pub fn exec_if_asked() -> Option<i32> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_none_or(|a| a != FLAG) {
        return None;
    }
    let run = || -> Result<i32> {
        let micros: u64 = args
            .get(1)
            .and_then(|m| m.to_str())
            .and_then(|m| m.parse().ok())
            .with_context(|| format!("{FLAG} wants microseconds, then the program"))?;
        let program = args.get(2).with_context(|| format!("{FLAG} {micros}: no program to run"))?;
        run(Duration::from_micros(micros), program, &args[3..])
    };
    Some(run().unwrap_or_else(|e| {
        eprintln!("fsync delay: {e:#}");
        127
    }))
}

/// Runs `program` with every fsync/fdatasync of its process tree delayed by `delay`.
pub fn run(delay: Duration, program: &OsString, args: &[OsString]) -> Result<i32> {
    let arch = audit_arch()?;
    let forwarded = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
    let waited = sigset(&[libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP]);
    let mut cmd = Command::new(program);
    cmd.args(args);
    // SAFETY: between fork and exec the closure only makes async-signal-safe system calls
    // (sigprocmask, prctl, ptrace) on data on its own stack; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let code = filter_program(arch);
            let prog = libc::sock_fprog { len: code.len() as u16, filter: code.as_ptr().cast_mut() };
            let empty = sigset(&[]);
            check(libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()))?;
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong))?;
            check(libc::ptrace(libc::PTRACE_TRACEME, 0 as libc::pid_t, NULL, NULL) as libc::c_int)?;
            check(libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &raw const prog as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ))?;
            Ok(())
        });
    }
    // Block the signals waited for before the child exists, so none is missed; the child
    // unblocks them before it execs.
    // SAFETY: plain system call on a valid signal set.
    check(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &waited, std::ptr::null_mut()) })?;
    let child = cmd.spawn().with_context(|| format!("starting {}", program.to_string_lossy()))?;
    let main = child.id() as libc::pid_t;
    drop(child); // reaped below with waitpid, never through `Child`

    // The exec stops the child with SIGTRAP (it asked to be traced): set the options, go.
    let status = wait(main, 0)?.context("the child vanished before its first stop")?.1;
    if !libc::WIFSTOPPED(status) {
        bail!("{} did not start (wait status {status:#x})", program.to_string_lossy());
    }
    let options = libc::PTRACE_O_TRACESECCOMP
        | libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_EXITKILL;
    // SAFETY: ptrace on our stopped tracee; no pointers involved.
    check(unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, main, NULL, options as libc::c_long) } as libc::c_int)?;
    resume(main, 0);

    let mut known = HashSet::from([main]);
    let mut held: VecDeque<(Instant, libc::pid_t)> = VecDeque::new();
    let mut exit = None;
    loop {
        // Every stop and exit that is ready.
        loop {
            match wait(-1, libc::WNOHANG) {
                Ok(Some((pid, status))) => {
                    match classify(status, known.contains(&pid)) {
                        Stop::Exited(code) => {
                            known.remove(&pid);
                            if pid == main {
                                exit = Some(code);
                            }
                        }
                        Stop::Fsync => held.push_back((Instant::now() + delay, pid)),
                        Stop::New => {
                            known.insert(pid);
                            resume(pid, 0);
                        }
                        Stop::Resume(sig) => resume(pid, sig),
                    }
                }
                Ok(None) => break,
                // No tracee left: the program and everything it started are gone.
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return Ok(exit.unwrap_or(127)),
                Err(e) => return Err(e).context("waitpid"),
            }
        }
        // The delay is the same for every call, so the held calls are due in arrival order.
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, pid) = held.pop_front().expect("checked non-empty");
            resume(pid, 0);
        }
        let timeout = held.front().map_or(Duration::from_secs(1), |(due, _)| due.saturating_duration_since(now));
        let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
        // SAFETY: valid set and timespec; a null info pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(&waited, std::ptr::null_mut(), &ts) };
        if forwarded.contains(&sig) {
            // SAFETY: plain system call.
            unsafe { libc::kill(main, sig) };
        }
    }
}

/// What to do with one wait status of a tracee.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// It exited; the status for `exit` (128 + signal when killed).
    Exited(i32),
    /// Stopped at an fsync/fdatasync by the filter: resume it after the delay.
    Fsync,
    /// The first stop of a new thread or process (SIGSTOP): resume it, suppressing the signal.
    New,
    /// Any other stop: resume it, delivering this signal (0: none).
    Resume(i32),
}

fn classify(status: libc::c_int, known: bool) -> Stop {
    if libc::WIFEXITED(status) {
        return Stop::Exited(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        return Stop::Exited(128 + libc::WTERMSIG(status));
    }
    let sig = libc::WSTOPSIG(status);
    let event = (status >> 16) & 0xff;
    match (sig, event) {
        (libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP) => Stop::Fsync,
        // Clone, fork, vfork, exec events: the tracee itself goes on.
        (libc::SIGTRAP, e) if e != 0 => Stop::Resume(0),
        (libc::SIGSTOP, _) if !known => Stop::New,
        (sig, _) => Stop::Resume(sig),
    }
}

fn resume(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: ptrace on a tracee; it may have died meanwhile (ESRCH), which is fine.
    unsafe { libc::ptrace(libc::PTRACE_CONT, pid, NULL, sig as libc::c_long) };
}

/// `waitpid(pid, __WALL | flags)`, retried on EINTR; `None` with WNOHANG and nothing ready.
fn wait(pid: libc::pid_t, flags: libc::c_int) -> std::io::Result<Option<(libc::pid_t, libc::c_int)>> {
    loop {
        let mut status = 0;
        // SAFETY: valid pointer to a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL | flags) };
        match r {
            0 => return Ok(None),
            r if r > 0 => return Ok(Some((r, status))),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
}

fn check(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initializes it before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

/// The audit architecture of this build, which the seccomp filter checks calls against
/// (linux/audit.h; not in the libc crate).
fn audit_arch() -> Result<u32> {
    if cfg!(target_arch = "x86_64") {
        Ok(0xC000_003E) // AUDIT_ARCH_X86_64
    } else if cfg!(target_arch = "aarch64") {
        Ok(0xC000_00B7) // AUDIT_ARCH_AARCH64
    } else {
        bail!("the fsync delay supports x86_64 and aarch64 only")
    }
}

/// The seccomp program: trace fsync and fdatasync, allow everything else (and every call made
/// under another architecture's convention, which this filter does not know the numbers of).
/// A plain array, so the forked child can build it without allocating.
fn filter_program(arch: u32) -> [libc::sock_filter; 8] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let nr = std::mem::offset_of!(libc::seccomp_data, nr) as u32;
    let arch_at = std::mem::offset_of!(libc::seccomp_data, arch) as u32;
    [
        op(load, 0, 0, arch_at),
        op(jeq, 1, 0, arch),
        op(ret, 0, 0, libc::SECCOMP_RET_ALLOW),
        op(load, 0, 0, nr),
        op(jeq, 2, 0, libc::SYS_fsync as u32),
        op(jeq, 1, 0, libc::SYS_fdatasync as u32),
        op(ret, 0, 0, libc::SECCOMP_RET_ALLOW),
        op(ret, 0, 0, libc::SECCOMP_RET_TRACE),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(sig: i32, event: i32) -> i32 {
        (event << 16) | (sig << 8) | 0x7f
    }

    #[test]
    fn only_fsync_stops_are_held_and_new_tracees_start_without_their_sigstop() {
        assert_eq!(classify(stopped(libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP), true), Stop::Fsync);
        assert_eq!(classify(stopped(libc::SIGTRAP, libc::PTRACE_EVENT_CLONE), true), Stop::Resume(0));
        assert_eq!(classify(stopped(libc::SIGSTOP, 0), false), Stop::New);
        // A signal for a known tracee is delivered, not swallowed.
        assert_eq!(classify(stopped(libc::SIGTERM, 0), true), Stop::Resume(libc::SIGTERM));
        assert_eq!(classify(stopped(libc::SIGSTOP, 0), true), Stop::Resume(libc::SIGSTOP));
        assert_eq!(classify(3 << 8, true), Stop::Exited(3));
        assert_eq!(classify(libc::SIGKILL, true), Stop::Exited(128 + libc::SIGKILL));
    }
}
