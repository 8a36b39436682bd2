//! The last good xDS-derived config on disk (`--xds-cache`), so a sidecar restarted while the
//! control plane is unreachable serves what it served before instead of only its bootstrap.
//! Written atomically (temp file, fsync, rename): a crash mid-write leaves the previous file,
//! never half of one. JSON in config form, so an operator can read what a sidecar would serve.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

use super::convert::Dynamic;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    /// The node it was pushed to: another node's config must not be served by mistake.
    node: String,
    resources: Dynamic,
}

/// Saves `resources` for `node` at `path`, replacing the previous file atomically.
pub fn save(path: &Path, node: &str, resources: &Dynamic) -> Result<(), String> {
    let body = serde_json::to_vec_pretty(&Saved { node: node.to_owned(), resources: resources.clone() })
        .map_err(|e| format!("cannot encode the xDS cache: {e}"))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself is durable only once the directory is: without this, a power
        // loss could bring the previous file back.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write the xDS cache {}: {e}", path.display())
    })
}

/// Loads what [`save`] wrote for `node`; `Ok(None)` when there is no file yet.
pub fn load(path: &Path, node: &str) -> Result<Option<Dynamic>, String> {
    let body = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read the xDS cache {}: {e}", path.display())),
    };
    let saved: Saved =
        serde_json::from_slice(&body).map_err(|e| format!("the xDS cache {} is not valid: {e}", path.display()))?;
    if saved.node != node {
        return Err(format!("the xDS cache {} belongs to node {:?}, not {node:?}", path.display(), saved.node));
    }
    Ok(Some(saved.resources))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_load_round_trips_and_checks_the_node() {
        let dir = std::env::temp_dir().join(format!("weft-xds-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cache.json");
        assert_eq!(load(&path, "n1"), Ok(None));
        let mut d = Dynamic::default();
        d.endpoints.insert("c".into(), vec!["127.0.0.1:1".into()]);
        save(&path, "n1", &d).unwrap();
        assert_eq!(load(&path, "n1"), Ok(Some(d)));
        assert!(load(&path, "n2").unwrap_err().contains("belongs to node \"n1\""));
        std::fs::write(&path, b"{").unwrap();
        assert!(load(&path, "n1").unwrap_err().contains("is not valid"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
