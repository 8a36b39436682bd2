//! What the agent keeps in `--state-dir` so that a restarted agent adopts the replicas and weight
//! holders it left running instead of killing and restarting them, and so that it keeps them
//! when it comes back while the control plane is down:
//!
//! - `replicas/<placement>.json`: a [`ReplicaRecord`] per started replica;
//! - `holders/<key>.json`: a [`HolderRecord`] per weight holder;
//! - `placements.json`: the last set of wanted replicas the control plane pushed.
//!
//! Every file is written whole to a temporary name and renamed over the old one, so a crash
//! mid-write leaves the previous version, never a torn one.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::desired::Want;
use super::process::ProcId;

/// A replica's processes and ports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub want: Want,
    pub server: ProcId,
    pub server_port: u16,
    /// The sidecar; `None` until the server is healthy and the sidecar started.
    pub sidecar: Option<ProcId>,
    /// The sidecar's inbound `host:port` (what it registers) and admin port.
    pub inbound: String,
    pub admin_port: u16,
    /// The holder socket the server maps its base from (`None`: its own command).
    pub holder: Option<String>,
    pub restarts: u32,
    /// Unix ms the replica became ready (0: not yet).
    pub ready_since_ms: u64,
}

/// A weight holder process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    pub base_path: String,
    pub gpu: Option<u32>,
    pub base_model: String,
    pub socket: PathBuf,
    pub proc: ProcId,
    pub bytes: u64,
}

/// The state directory.
#[derive(Clone, Debug)]
pub struct Store {
    pub dir: PathBuf,
}

/// A resource name as a file name: anything but `[A-Za-z0-9._-]` becomes `_`.
pub fn file_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

impl Store {
    /// Opens (creating) `dir` and its subdirectories.
    pub fn open(dir: &Path) -> Result<Store, String> {
        for sub in ["replicas", "holders", "logs", "run"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("--state-dir {}: {e}", dir.display()))?;
        }
        Ok(Store { dir: dir.to_path_buf() })
    }

    pub fn replica_path(&self, placement: &str) -> PathBuf {
        self.dir.join("replicas").join(format!("{}.json", file_name(placement)))
    }

    pub fn holder_path(&self, key: &str) -> PathBuf {
        self.dir.join("holders").join(format!("{}.json", file_name(key)))
    }

    /// Where a process's output goes (`logs/<name>.log`).
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{}.log", file_name(name)))
    }

    /// Where sockets and sidecar bootstraps go (`run/<name>`).
    pub fn run_file(&self, name: &str) -> PathBuf {
        self.dir.join("run").join(file_name(name))
    }

    pub fn save<T: Serialize>(&self, path: &Path, value: &T) -> Result<(), String> {
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn remove(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
    }

    /// Every record in `replicas/` or `holders/`; a file that does not parse is reported and
    /// moved aside (`.bad`), not fatal: the agent then starts that replica afresh.
    pub fn records<T: DeserializeOwned>(&self, sub: &str) -> (Vec<T>, Vec<String>) {
        let (mut ok, mut warnings) = (Vec::new(), Vec::new());
        let Ok(entries) = std::fs::read_dir(self.dir.join(sub)) else { return (ok, warnings) };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
        paths.sort();
        for p in paths {
            match std::fs::read(&p).map_err(|e| e.to_string()).and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string())) {
                Ok(r) => ok.push(r),
                Err(e) => {
                    warnings.push(format!("{}: {e}; moved aside", p.display()));
                    let _ = std::fs::rename(&p, p.with_extension("bad"));
                }
            }
        }
        (ok, warnings)
    }

    fn placements_path(&self) -> PathBuf {
        self.dir.join("placements.json")
    }

    pub fn save_placements(&self, wants: &[Want]) -> Result<(), String> {
        self.save(&self.placements_path(), &wants)
    }

    /// The last pushed wants, if any were ever saved.
    pub fn placements(&self) -> Option<Vec<Want>> {
        serde_json::from_slice(&std::fs::read(self.placements_path()).ok()?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_one_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let rec = HolderRecord {
            base_path: "/m/b".into(),
            gpu: Some(0),
            base_model: "b".into(),
            socket: "/s".into(),
            proc: ProcId { pid: 1, start_time: 2 },
            bytes: 3,
        };
        s.save(&s.holder_path("b/0"), &rec).unwrap();
        std::fs::write(s.holder_path("torn"), b"{\"base_path\":").unwrap();
        let (got, warnings) = s.records::<HolderRecord>("holders");
        assert_eq!(got, [rec]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(s.holder_path("torn").with_extension("bad").exists());
        assert_eq!(file_name("a/b c"), "a_b_c");
    }
}
