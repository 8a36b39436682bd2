//! Telling the control plane about the node: its inventory once (`PUT /v1/nodes/<node>`, retried
//! until it lands, skipped when the stored spec is already that) and its [`NodeStatus`]
//! (`PUT /v1/nodestatuses/<node>`) whenever it changes and at least every `interval`, so a
//! silent agent goes stale. Runs as its own task: the loop never waits on the control plane.

use std::time::Duration;

use http::Method;
use serde_json::Value;
use tokio::sync::watch;
use weft_control::cli::client::Client;
use weft_control::nodes::NodeStatus;

/// Spawns the reporter; the loop sends each new status on the returned channel.
pub fn spawn(mut client: Client, node: String, spec: Value, interval: Duration) -> watch::Sender<Option<NodeStatus>> {
    let (tx, mut rx) = watch::channel::<Option<NodeStatus>>(None);
    tokio::spawn(async move {
        register(&mut client, &node, &spec).await;
        let path = format!("/v1/nodestatuses/{node}");
        let mut last_error = String::new();
        loop {
            let status = rx.borrow_and_update().clone();
            if let Some(mut s) = status {
                s.reported_at_ms = weft_control::cli::node::now_ms();
                let body = serde_json::to_value(&s).expect("a status serializes");
                let error = match client.request(Method::PUT, &path, Some(&body), None).await {
                    Ok(r) if r.status.is_success() => String::new(),
                    Ok(r) => format!("PUT {path}: {}", r.error_line()),
                    Err(e) => format!("PUT {path}: {e}"),
                };
                // Said once per change of error, not every interval.
                if !error.is_empty() && error != last_error {
                    eprintln!("weft-agent: {error}");
                }
                last_error = error;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(interval) => {}
            }
        }
    });
    tx
}

/// Registers the inventory, retrying every 2 s until the control plane takes it.
async fn register(client: &mut Client, node: &str, spec: &Value) {
    let path = format!("/v1/nodes/{node}");
    let mut said = String::new();
    loop {
        let error = match client.request(Method::GET, &path, None, None).await {
            Ok(r) if r.status.is_success() && &r.body["spec"] == spec => return,
            _ => match client.request(Method::PUT, &path, Some(spec), None).await {
                Ok(r) if r.status.is_success() => {
                    eprintln!("weft-agent: registered {node} ({})", spec);
                    return;
                }
                Ok(r) => format!("PUT {path}: {}", r.error_line()),
                Err(e) => format!("PUT {path}: {e}"),
            },
        };
        if error != said {
            eprintln!("weft-agent: {error}; retrying");
            said = error;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
