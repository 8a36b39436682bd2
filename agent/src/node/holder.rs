//! The node's weight holders: one `weft-agent hold` process per (base file, GPU), started when
//! the first replica that shares that base needs it, stopped when no wanted replica does. A
//! holder that dies takes its replicas' mappings' source with it: they exit (status 3) and the
//! loop restarts them, which starts the holder again. A base that cannot be held (missing,
//! not a base) is the replicas' failure reason, retried with backoff.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use weft_control::nodes::HolderStatus;

use super::backoff;
use super::process::Proc;
use super::store::{HolderRecord, Store};

/// Which holder: the base file and the GPU its replicas run on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub base_path: String,
    pub gpu: Option<u32>,
}

impl Key {
    /// A stable name for its files: the base's file stem plus the GPU.
    fn name(&self) -> String {
        let stem = std::path::Path::new(&self.base_path).file_stem().map_or("base".into(), |s| s.to_string_lossy().into_owned());
        // Two bases of one stem in different directories must not share a socket.
        let hash = self.base_path.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
        match self.gpu {
            Some(g) => format!("{stem}-{:08x}-gpu{g}", hash as u32),
            None => format!("{stem}-{:08x}-cpu", hash as u32),
        }
    }
}

/// Where a replica's base is.
#[derive(Debug, PartialEq, Eq)]
pub enum Ready {
    /// Serving on this socket.
    Socket(PathBuf),
    /// Still loading.
    Pending,
    /// Cannot be held; why.
    Failed(String),
}

struct Holder {
    rec: HolderRecord,
    proc: Proc,
    serving: bool,
}

/// A holder that failed, and when to try again.
struct Failure {
    reason: String,
    retry_at: Instant,
    tries: u32,
}

/// How long an unneeded holder has between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct Holders {
    live: BTreeMap<Key, Holder>,
    failed: BTreeMap<Key, Failure>,
    /// Holders sent SIGTERM, with when they get SIGKILL: stopping takes several steps so the
    /// agent's loop never waits on one.
    stopping: Vec<(Proc, Instant)>,
}

impl Holders {
    /// Takes over the holders an earlier agent left running; forgets the dead ones.
    pub fn adopt(store: &Store) -> (Holders, Vec<String>) {
        let (records, warnings) = store.records::<HolderRecord>("holders");
        let mut h = Holders::default();
        for rec in records {
            let key = Key { base_path: rec.base_path.clone(), gpu: rec.gpu };
            let path = store.holder_path(&key.name());
            match Proc::adopt(rec.proc, store.log(&format!("holder-{}", key.name()))) {
                Some(proc) => {
                    h.live.insert(key, Holder { rec, proc, serving: true });
                }
                None => store.remove(&path),
            }
        }
        (h, warnings)
    }

    /// The socket of the holder for `key`, starting it if needed.
    pub fn ensure(&mut self, key: &Key, base_model: &str, store: &Store, agent_bin: &str) -> Ready {
        if let Some(f) = self.failed.get(key)
            && Instant::now() < f.retry_at
        {
            return Ready::Failed(f.reason.clone());
        }
        if !self.live.contains_key(key) {
            let name = key.name();
            let socket = store.run_file(&format!("{name}.sock"));
            let argv = [agent_bin, "hold", "--base", &key.base_path, "--socket", &socket.display().to_string()].map(String::from);
            let log = store.log(&format!("holder-{name}"));
            match Proc::spawn(&argv, &BTreeMap::new(), &log) {
                Ok(proc) => {
                    let bytes = std::fs::metadata(&key.base_path).map_or(0, |m| m.len());
                    let rec = HolderRecord { base_path: key.base_path.clone(), gpu: key.gpu, base_model: base_model.into(), socket, proc: proc.id, bytes };
                    let _ = store.save(&store.holder_path(&name), &rec);
                    self.live.insert(key.clone(), Holder { rec, proc, serving: false });
                }
                Err(e) => return self.fail(key, format!("weight holder: {e}")),
            }
        }
        let h = self.live.get_mut(key).expect("inserted above");
        if let Some(how) = h.proc.exited() {
            let reason = format!("weight holder for {}: {how}", key.base_path);
            self.live.remove(key);
            store.remove(&store.holder_path(&key.name()));
            return self.fail(key, reason);
        }
        if !h.serving {
            h.serving = std::os::unix::net::UnixStream::connect(&h.rec.socket).is_ok();
        }
        if h.serving {
            self.failed.remove(key);
            Ready::Socket(h.rec.socket.clone())
        } else {
            Ready::Pending
        }
    }

    fn fail(&mut self, key: &Key, reason: String) -> Ready {
        let tries = self.failed.get(key).map_or(0, |f| f.tries) + 1;
        self.failed.insert(key.clone(), Failure { reason: reason.clone(), retry_at: Instant::now() + backoff(tries), tries });
        Ready::Failed(reason)
    }

    /// Forgets holders that died (their replicas notice by themselves) and stops those no
    /// wanted replica needs any more: SIGTERM now, SIGKILL on a later call if still running
    /// after [`STOP_GRACE`].
    pub fn prune(&mut self, needed: &[Key], store: &Store) {
        let keys: Vec<Key> = self.live.keys().cloned().collect();
        for key in keys {
            let h = self.live.get_mut(&key).expect("listed");
            let dead = h.proc.exited().is_some();
            if !dead && needed.contains(&key) {
                continue;
            }
            let h = self.live.remove(&key).expect("listed");
            store.remove(&store.holder_path(&key.name()));
            if !dead {
                h.proc.signal(Signal::TERM);
                self.stopping.push((h.proc, Instant::now() + STOP_GRACE));
            }
        }
        let now = Instant::now();
        self.stopping.retain_mut(|(proc, kill_at)| {
            if proc.exited().is_some() {
                return false;
            }
            if now >= *kill_at {
                proc.kill();
                return false;
            }
            true
        });
        self.failed.retain(|k, _| needed.contains(k));
    }

    /// What to report, with the number of replicas using each.
    pub fn statuses(&self, users: impl Fn(&Key) -> u32) -> Vec<HolderStatus> {
        self.live
            .iter()
            .map(|(k, h)| HolderStatus {
                base_model: h.rec.base_model.clone(),
                gpu: k.gpu,
                pid: h.proc.id.pid,
                users: users(k),
                bytes: h.rec.bytes,
                mechanism: "memfd".into(),
            })
            .collect()
    }
}
