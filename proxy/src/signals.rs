//! The stop request every weft binary waits for: SIGTERM (the kubelet, systemd, `docker stop`)
//! or SIGINT (Ctrl-C), whichever comes first.

/// Resolves when the process is asked to stop.
pub async fn stop_requested() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
