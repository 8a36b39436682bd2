//! Hot reload: on SIGHUP and whenever the config file's contents change (checked every
//! `watch_interval`), reread, validate and swap. A file that fails to parse or validate is
//! rejected with a log line naming the error, and the running config keeps serving.
//! Polling the contents (not inotify) also catches editors that replace the file and
//! Kubernetes ConfigMap symlink swaps.

use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use crate::server::Options;
use crate::Shared;

pub async fn run(sh: Arc<Shared>, opts: Options) {
    let Some(path) = opts.config_path.clone() else { return };
    let mut last = std::fs::read(&path).ok();
    let mut hup = if opts.signals {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
    } else {
        None
    };
    let mut tick = tokio::time::interval(opts.watch_interval);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
        };
        let now = std::fs::read(&path).ok();
        if !forced && now == last {
            continue;
        }
        last = now;
        reload_file(&sh, &path, if forced { "SIGHUP" } else { "file change" });
    }
}

/// Reread and apply the file; logs the outcome either way.
pub fn reload_file(sh: &Shared, path: &Path, why: &str) {
    let result = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
        .and_then(|text| Config::from_yaml(&text))
        .and_then(|cfg| sh.apply(cfg));
    match result {
        Ok(v) => tracing::info!(version = v, trigger = why, "config reloaded"),
        Err(e) => tracing::error!(trigger = why, error = %e, "config rejected; still serving version {}", sh.snapshot.load().version),
    }
}
