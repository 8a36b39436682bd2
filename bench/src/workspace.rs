//! What every bench needs from its surroundings: release binaries of this workspace's other
//! packages (which `cargo run -p weft-bench` does not build), a description of the machine, and
//! where and how results are written.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Builds `target/release/BIN` of this workspace and returns its path.
///
/// It builds every binary of the workspace in one go, with the features unified across the
/// workspace. A `-p PACKAGE` build resolves the shared dependencies' features differently and
/// would compile them once more. One build then serves every bench, and `.ci/run`, which builds
/// the same way first, pays for one release build instead of one per package.
pub fn release_bin(bin: &str) -> Result<PathBuf> {
    let workspace = root()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace)
        .args(["build", "--release", "--workspace", "--bins"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release --workspace --bins (for {bin}) failed ({status})");
    }
    let target_dir =
        std::env::var("CARGO_TARGET_DIR").map_or_else(|_| workspace.join("target"), PathBuf::from);
    built(target_dir.join("release").join(bin), "the build")
}

/// Builds weft-proxy as it ships, profile-guided (`scripts/pgo-build.sh`: fat LTO, trained on
/// a sidecar's load; it reuses the profile when neither the code nor the training changed), and
/// returns the binary's path: the script's last line of output.
pub fn pgo_weft_proxy() -> Result<PathBuf> {
    // The script's training upstreams come from the workspace build; make sure it is current.
    release_bin("weft-model-sim")?;
    let workspace = root()?;
    let out = Command::new(workspace.join("scripts/pgo-build.sh"))
        .current_dir(workspace)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running scripts/pgo-build.sh")?;
    if !out.status.success() {
        bail!(
            "scripts/pgo-build.sh failed ({}); `--weft-build release` measures the plain build",
            out.status
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said = stdout.lines().last().unwrap_or_default().trim();
    built(workspace.join(said), "scripts/pgo-build.sh")
}

/// The workspace's root: the parent of this package's directory.
fn root() -> Result<&'static Path> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")
}

/// `path`, if `what` left a file there.
fn built(path: PathBuf, what: &str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        bail!("{} not found after {what}", path.display())
    }
}

/// This binary, by a path that stays valid while this process runs: `/proc/PID/exe`. The
/// benches re-run themselves (upstream server, stand-in control node, fsync-delay wrapper), and
/// [`release_bin`]'s workspace build may replace their own file meanwhile (`cargo run -p
/// weft-bench` resolves features differently), after which `current_exe()` names a deleted
/// file. Unlike `/proc/self/exe`, it also holds when a launcher (`taskset`, `sh`) execs it.
pub fn self_exe() -> PathBuf {
    PathBuf::from(format!("/proc/{}/exe", std::process::id()))
}

/// CPU count and model, kernel and OS, for the results JSON.
pub fn machine() -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|k| k.trim().to_string())
    };
    let model = read("/proc/cpuinfo").and_then(|c| {
        c.lines().find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim().to_string())
        })
    });
    let os = read("/etc/os-release").and_then(|t| {
        t.lines().find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim_matches('"').to_string())
        })
    });
    json!({
        "nproc": std::thread::available_parallelism().map_or(1, usize::from),
        "cpu_model": model,
        "kernel": read("/proc/sys/kernel/osrelease"),
        "os": os,
    })
}

/// `bench/results/FILE`, or the git-ignored `bench/results/tmp/FILE` for quick runs.
pub fn results_path(file: &str, quick: bool) -> PathBuf {
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    if quick {
        results.join("tmp").join(file)
    } else {
        results.join(file)
    }
}

/// Writes `doc` as pretty JSON, creating the directory.
pub fn write_json(path: &Path, doc: &Value) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}
