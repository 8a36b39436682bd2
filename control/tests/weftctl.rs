//! `weftctl` against a real single-node control plane started in-process: the built binary is
//! run as a user would run it, and the server's state is checked before and after each
//! command that must (or must not) change it.
//!
//! - `apply_is_validated_ordered_and_idempotent`: create, re-apply (unchanged, same
//!   revisions), `--dry-run` (a diff, no change), invalid YAML / a bad field / an unknown kind
//!   (clear error, non-zero exit, nothing written), then a real update.
//! - `get_history_rollback_weights_delete_round_trip`: the other resource commands, their
//!   table and JSON output, and their errors.
//! - `cluster_commands_and_server_failover`: status, members, proxy-status, a dead first
//!   `--server` skipped, and every server dead.

mod common;

use common::*;
use serde_json::Value;

/// Dependencies last on purpose: apply must order them.
const APP: &str = "\
kind: Service
name: chat
spec:
  hosts: [chat]
  routes:
    - name: infer
      match: { path_prefix: /v1/ }
      experiment: chat-ab
    - name: default
      match: { path_prefix: / }
      cluster: chat-a
---
kind: Experiment
name: chat-ab
spec:
  variants:
    - { name: a, cluster: chat-a, weight: 50 }
    - { name: b, cluster: chat-b, weight: 50 }
---
kind: Cluster
name: chat-a
spec:
  endpoints: [\"127.0.0.1:8001\"]
---
kind: Cluster
name: chat-b
spec:
  endpoints: [\"127.0.0.1:8002\"]
---
kind: Endpoints
name: chat-b
spec:
  endpoints:
    - { address: \"127.0.0.1:8003\", variant: b }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_is_validated_ordered_and_idempotent() {
    let node = start().await;
    let url = node.url.as_str();
    let files = tempfile::tempdir().unwrap();
    let app = write(&files, "app.yaml", APP);

    // Create: dependencies first, no dangling-reference warnings.
    let o = ctl(url, &["apply", "-f", &app], None).await;
    assert_eq!(o.code, 0, "{o:?}");
    let order: Vec<&str> = o.stdout.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(order, ["cluster/chat-a", "cluster/chat-b", "endpoints/chat-b", "experiment/chat-ab", "service/chat"]);
    assert!(o.stdout.lines().all(|l| l.contains(" created (revision ")), "{}", o.stdout);
    assert!(!o.stderr.contains("warning"), "{}", o.stderr);
    let created = revisions(url).await;
    assert_eq!(created.len(), 5, "{created:?}");

    // Re-apply (from stdin): unchanged, nothing written.
    let o = ctl(url, &["apply", "-f", "-"], Some(APP)).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(o.stdout.lines().filter(|l| l.ends_with(" unchanged")).count(), 5, "{}", o.stdout);
    assert_eq!(revisions(url).await, created);

    // --dry-run of a change: a diff for the changed document, nothing written.
    let changed = APP.replace("127.0.0.1:8001", "127.0.0.1:8009");
    let changed_file = write(&files, "changed.yaml", &changed);
    let o = ctl(url, &["apply", "-f", &changed_file, "--dry-run"], None).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("cluster/chat-a configured (dry run)\n"), "{}", o.stdout);
    assert!(
        o.stdout.contains(&format!("--- cluster/chat-a (revision {})\n", created["clusters/chat-a"])),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("+++ cluster/chat-a (proposed)\n"), "{}", o.stdout);
    assert!(o.stdout.contains("\n-- 127.0.0.1:8001\n+- 127.0.0.1:8009\n"), "{}", o.stdout);
    assert!(o.stdout.contains("service/chat unchanged\n"), "{}", o.stdout);
    assert_eq!(revisions(url).await, created);
    let dry = json(url, &["apply", "-f", &changed_file, "--dry-run"]).await;
    assert_eq!(dry.as_array().unwrap().iter().filter(|r| r["action"] == "configured").count(), 1, "{dry}");

    // Invalid YAML in the second document: a parse error naming it, nothing written (the
    // valid first document included).
    let bad_yaml = write(
        &files,
        "bad.yaml",
        "kind: Cluster\nname: new-one\nspec: {endpoints: [\"127.0.0.1:9\"]}\n---\nkind: Service\nname: s\nspec:\n  hosts: [a\n  routes: x\n",
    );
    let o = ctl(url, &["apply", "-f", &bad_yaml], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.starts_with("error: document 2 (line 4): invalid YAML: "), "{}", o.stderr);
    assert_eq!(o.stdout, "");
    assert_eq!(revisions(url).await, created);

    // A document the server refuses: its error and field, nothing written.
    let bad_field = changed.replace("path_prefix: /v1/", "path_prefix: noslash");
    let bad_field = write(&files, "bad-field.yaml", &bad_field);
    let o = ctl(url, &["apply", "-f", &bad_field], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    let first = o.stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: document 1 (service/chat): "), "{}", o.stderr);
    assert!(first.contains("noslash") && first.contains("(field: routes"), "{}", o.stderr);
    assert!(o.stderr.contains("error: nothing was applied"), "{}", o.stderr);
    assert_eq!(revisions(url).await, created, "the valid cluster change was not written either");

    // An unknown kind: a usage error before any request.
    let pod = write(&files, "pod.yaml", &format!("{APP}---\nkind: Pod\nname: p\nspec: {{}}\n"));
    let o = ctl(url, &["apply", "-f", &pod], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("document 6 (line 35): unknown kind \"Pod\""), "{}", o.stderr);
    let o = ctl(url, &["apply", "-f", "/nonexistent/weft.yaml"], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert_eq!(revisions(url).await, created);

    // The real update: only the changed document is written.
    let o = ctl(url, &["apply", "-f", &changed_file], None).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("cluster/chat-a configured (revision "), "{}", o.stdout);
    let after = revisions(url).await;
    for (k, rev) in &after {
        if k == "clusters/chat-a" {
            assert!(*rev > created[k]);
        } else {
            assert_eq!(*rev, created[k], "{k}");
        }
    }
    node.running.shutdown().await.unwrap();
}

/// A service whose route names a cluster that does not exist: refused by the API (422 naming
/// the field and the value) unless the write says it means it; one file holding both applies
/// in any document order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dangling_references_are_refused_unless_allowed() {
    let node = start().await;
    let url = node.url.as_str();
    let files = tempfile::tempdir().unwrap();
    let service = "kind: Service\nname: s\nspec:\n  hosts: [s]\n  routes:\n    - { name: all, match: { path_prefix: / }, cluster: ghost }\n";
    let alone = write(&files, "alone.yaml", service);
    let o = ctl(url, &["apply", "-f", &alone], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("routes.all.cluster") && o.stderr.contains("\"ghost\""), "{}", o.stderr);
    assert!(o.stderr.contains("--allow-dangling"), "the way out is named: {}", o.stderr);
    assert!(o.stderr.contains("nothing was applied"), "{}", o.stderr);
    assert!(revisions(url).await.is_empty());

    // The REST API itself: 422 with the field, and nothing stored.
    use weft_control::cli::client::{Client, Server};
    let spec = serde_json::json!({"hosts": ["s"], "routes": [{"name": "all", "match": {"path_prefix": "/"}, "cluster": "ghost"}]});
    let mut client = Client::new(vec![Server::parse(url, false).unwrap()], None);
    let r = client.request(http::Method::PUT, "/v1/services/s", Some(&spec), None).await.unwrap();
    assert_eq!(r.status, http::StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], "routes.all.cluster", "{:?}", r.body);
    assert!(r.body["error"].as_str().unwrap().contains("\"ghost\""), "{:?}", r.body);
    assert!(revisions(url).await.is_empty());

    // Both in one file, the service first: applied, cluster first, no warning.
    let both = write(&files, "both.yaml", &format!("{service}---\nkind: Cluster\nname: ghost\nspec: {{endpoints: [\"127.0.0.1:9\"]}}\n"));
    let o = ctl(url, &["apply", "-f", &both], None).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(!o.stderr.contains("warning"), "{}", o.stderr);
    assert_eq!(revisions(url).await.len(), 2);

    // Deliberately dangling: allowed, with the warning.
    let other = write(&files, "other.yaml", &service.replace("name: s\n", "name: t\n").replace("ghost", "later"));
    let o = ctl(url, &["apply", "-f", &other, "--allow-dangling"], None).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("warning: service/t: routes.all.cluster: Cluster \"later\" does not exist"), "{}", o.stderr);
    assert_eq!(revisions(url).await.len(), 3);
    node.running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_history_rollback_weights_delete_round_trip() {
    let node = start().await;
    let url = node.url.as_str();
    let o = ctl(url, &["apply", "-f", "-"], Some(APP)).await;
    assert_eq!(o.code, 0, "{o:?}");

    // get: table and JSON.
    let t = ok(url, &["get", "clusters"]).await;
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["KIND", "NAME", "REVISION", "SUMMARY"]);
    assert!(
        lines[1].starts_with("cluster ")
            && lines[1].contains("chat-a")
            && lines[1].ends_with("endpoints=127.0.0.1:8001"),
        "{t}"
    );
    let exp = json(url, &["get", "experiment", "chat-ab"]).await;
    assert_eq!(exp["spec"]["variants"][0]["weight"], 50);
    let yaml = ok(url, &["get", "service", "chat", "-o", "yaml"]).await;
    assert!(yaml.contains("name: chat\n") && yaml.contains("path_prefix: /v1/"), "{yaml}");
    let o = ctl(url, &["get", "service", "nope"], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.starts_with("error: ") && o.stderr.contains("does not exist"), "{}", o.stderr);
    let o = ctl(url, &["get", "pods"], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    let o = ctl(url, &["get", "service", "a b"], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("not a valid name"), "{}", o.stderr);

    // set-weights, then history shows both revisions.
    let r1 = exp["revision"].as_u64().unwrap();
    let out = ok(url, &["experiment", "set-weights", "chat-ab", "a=90", "b=10"]).await;
    assert!(out.starts_with("experiment/chat-ab weights set: a=90 (90%) b=10 (10%) (revision "), "{out}");
    let exp = json(url, &["get", "experiment", "chat-ab"]).await;
    let weights: Vec<&Value> = exp["spec"]["variants"].as_array().unwrap().iter().map(|v| &v["weight"]).collect();
    assert_eq!(weights, [90, 10]);
    let r2 = exp["revision"].as_u64().unwrap();
    assert!(r2 > r1);
    let o = ctl(url, &["experiment", "set-weights", "chat-ab", "c=1"], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("(field: weights.c)"), "{}", o.stderr);
    let o = ctl(url, &["experiment", "set-weights", "chat-ab", "a=lots"], None).await;
    assert_eq!(o.code, 2, "{o:?}");

    let hist = json(url, &["history", "experiment", "chat-ab"]).await;
    let revs: Vec<u64> = hist.as_array().unwrap().iter().map(|h| h["revision"].as_u64().unwrap()).collect();
    assert_eq!(revs, [r1, r2]);
    let t = ok(url, &["history", "experiment", "chat-ab"]).await;
    assert_eq!(
        t.lines().nth(1).unwrap().split_whitespace().collect::<Vec<_>>(),
        [r1.to_string().as_str(), "a=50", "(50%)", "b=50", "(50%)"]
    );

    // rollback restores revision 1's weights in a new revision.
    let out = ok(url, &["rollback", "experiment", "chat-ab", "--to", &r1.to_string()]).await;
    assert!(out.starts_with(&format!("experiment/chat-ab rolled back to revision {r1} (revision ")), "{out}");
    let exp = json(url, &["get", "experiment", "chat-ab"]).await;
    assert_eq!(exp["spec"]["variants"][0]["weight"], 50);
    assert!(exp["revision"].as_u64().unwrap() > r2);
    let o = ctl(url, &["rollback", "experiment", "chat-ab", "--to", "999999"], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("(field: revision)"), "{}", o.stderr);

    // Weights are relative shares: 150 and 10 are a 93.75/6.25 split, and every output says so.
    let out = ok(url, &["experiment", "set-weights", "chat-ab", "a=150", "b=10"]).await;
    assert!(out.starts_with("experiment/chat-ab weights set: a=150 (93.8%) b=10 (6.3%) (revision "), "{out}");
    let t = ok(url, &["get", "experiments"]).await;
    assert!(t.contains("a=150 (93.8%) b=10 (6.3%)"), "{t}");
    let o = ctl(url, &["experiment", "set-weights", "chat-ab", "a=0", "b=0"], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("weights sum to 0") && o.stderr.contains("(field: variants)"), "{}", o.stderr);
    let out = ok(url, &["experiment", "set-weights", "chat-ab", "a=90", "b=10"]).await;
    assert!(out.contains("a=90 (90%) b=10 (10%)"), "{out}");

    // get without a kind lists the kinds, with counts.
    let t = ok(url, &["get"]).await;
    let row = |k: &str| t.lines().find(|l| l.split_whitespace().next() == Some(k)).map(|l| l.split_whitespace().nth(1).unwrap().to_string());
    assert_eq!(t.lines().next().unwrap().split_whitespace().collect::<Vec<_>>(), ["KIND", "COUNT", "WRITTEN", "BY"]);
    assert_eq!((row("clusters").as_deref(), row("services").as_deref(), row("rollouts").as_deref()), (Some("2"), Some("1"), Some("0")), "{t}");

    // describe: spec, history, who runs it (nobody is connected here).
    let d = ok(url, &["describe", "experiment", "chat-ab"]).await;
    assert!(d.starts_with("Kind:      Experiment\nName:      chat-ab\n"), "{d}");
    assert!(d.contains("\nSpec:\n") && d.contains("weight: 90"), "{d}");
    assert!(d.contains("History (5 revisions, newest first):"), "{d}");
    let newest = d.split("newest first):\n").nth(1).unwrap().lines().nth(1).unwrap();
    assert!(newest.contains("a=90 (90%) b=10 (10%)"), "each revision summarized: {d}");
    assert!(d.contains("Sidecars:\n  none subscribes to it\n"), "{d}");
    let dj = json(url, &["describe", "experiment", "chat-ab"]).await;
    assert_eq!(dj["item"]["spec"]["variants"][0]["weight"], 90);
    assert_eq!(ctl(url, &["describe", "experiment", "nope"], None).await.code, 1);

    // delete, then the history ends in a deletion.
    let out = ok(url, &["delete", "service", "chat"]).await;
    assert!(out.starts_with("service/chat deleted (revision "), "{out}");
    assert_eq!(ctl(url, &["get", "service", "chat"], None).await.code, 1);
    let t = ok(url, &["history", "service", "chat"]).await;
    assert!(t.trim_end().ends_with("deleted"), "{t}");
    assert_eq!(json(url, &["get", "services"]).await, Value::Array(vec![]));
    node.running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_commands_and_server_failover() {
    let node = start().await;
    let url = node.url.as_str();

    let status = json(url, &["status"]).await;
    assert_eq!((status["id"].as_u64(), status["role"].as_str()), (Some(1), Some("leader")));
    let t = ok(url, &["status"]).await;
    assert!(t.lines().any(|l| l.split_whitespace().eq(["role", "leader"])), "{t}");

    let t = ok(url, &["members"]).await;
    assert!(t.contains(&node.running.api_addr.to_string()) && t.contains("voter (leader)"), "{t}");
    let m = json(url, &["members", "list"]).await;
    assert_eq!(m["leader"], 1);
    let o = ctl(url, &["members", "remove", "1"], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("last voter") && o.stderr.contains("(field: id)"), "{}", o.stderr);

    let t = ok(url, &["proxy-status"]).await;
    assert_eq!(
        t.lines().next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["NODE", "CONTROL", "CONNECTED", "CLUSTERS@REV", "ENDPOINTS@REV", "EXPERIMENTS@REV", "SERVICES@REV", "AUTHZ@REV", "OTHER", "CERT", "EXPIRES", "LAST", "NACK"]
    );
    assert!(json(url, &["proxy-status"]).await["items"].is_array());

    // A dead first server is skipped; all dead is an error naming each.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let both = format!("http://{dead},{url}");
    let s = json(&both, &["status"]).await;
    assert_eq!(s["id"], 1);
    let o = ctl(&format!("http://{dead}"), &["status"], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.starts_with("error: no control node answered: ") && o.stderr.contains(&dead), "{}", o.stderr);
    let o = ctl("https://x:1", &["status"], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("--ca FILE"), "{o:?}");
    node.running.shutdown().await.unwrap();
}

const NODES: &str = "\
kind: Node
name: gpu-1
spec:
  cpu_milli: 64000
  memory_mib: 512000
  gpu_model: A100
  gpu_count: 2
  gpu_memory_bytes: 85899345920
";

/// Two variants of one 16 GiB base at half a GPU each, and one replica bigger than a GPU.
const WORKLOADS: &str = "\
workloads:
  - {kind: replica, name: chat-a-0, variant: a, base_model: llama-8b, base_bytes: 17179869184, delta_bytes: 536870912, working_set_bytes: 4294967296, compute_milli: 500, cpu_milli: 1000, memory_mib: 4096}
  - {kind: replica, name: chat-b-0, variant: b, base_model: llama-8b, base_bytes: 17179869184, delta_bytes: 536870912, working_set_bytes: 4294967296, compute_milli: 500, cpu_milli: 1000, memory_mib: 4096}
  - {kind: replica, name: huge-0, variant: h, base_model: huge, base_bytes: 171798691840, delta_bytes: 0, working_set_bytes: 0, compute_milli: 1000, cpu_milli: 1000, memory_mib: 4096}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_plan_then_apply_commits_placements() {
    let n = start().await;
    let url = n.url.as_str();
    let dir = tempfile::tempdir().unwrap();

    // No inventory yet: a clear refusal.
    let w = write(&dir, "w.yaml", WORKLOADS);
    let o = ctl(url, &["schedule", "plan", "-f", &w], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("no GPU inventory"), "{o:?}");

    ok(url, &["apply", "-f", &write(&dir, "nodes.yaml", NODES)]).await;
    let before = revisions(url).await;
    let plan = json(url, &["schedule", "plan", "-f", &w]).await;
    assert_eq!(plan["committed"], false);
    let placed: Vec<&str> = plan["placed"].as_array().unwrap().iter().map(|p| p["workload"].as_str().unwrap()).collect();
    assert_eq!(placed, ["chat-a-0", "chat-b-0"]);
    assert_eq!(plan["unplaced"][0]["workload"], "huge-0");
    assert_eq!(plan["unplaced"][0]["reason"], "too_large", "{plan}");
    let a = &plan["placed"][0]["allocations"][0];
    let b = &plan["placed"][1]["allocations"][0];
    assert_eq!(a["gpus"][0]["gpu"], b["gpus"][0]["gpu"], "variants of one base share a GPU");
    assert_eq!(b["shared_base"]["base"], "llama-8b");
    assert_eq!(revisions(url).await, before, "a plan writes nothing");
    let table = ok(url, &["schedule", "plan", "-f", &w]).await;
    assert!(table.contains("chat-b-0") && table.contains("llama-8b") && table.contains("huge-0"), "{table}");

    // Apply commits the placements; planning the same again refuses to place them twice.
    let applied = json(url, &["schedule", "apply", "-f", &w]).await;
    assert_eq!(applied["committed"], true);
    let stored = json(url, &["get", "placements"]).await;
    let names: Vec<&str> = stored.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["chat-a-0", "chat-b-0"]);
    assert_eq!(stored[0]["spec"]["allocations"][0]["node"], "gpu-1");
    let again = json(url, &["schedule", "plan", "-f", &w]).await;
    assert!(again["placed"].as_array().unwrap().is_empty(), "{again}");
    assert!(again["unplaced"][0]["message"].as_str().unwrap().contains("already placed"), "{again}");

    // Placements are the scheduler's: no hand edits; DELETE releases one.
    let o = ctl(url, &["apply", "-f", &write(&dir, "p.yaml", "kind: Placement\nname: x\nspec: {}\n")], None).await;
    assert_ne!(o.code, 0, "{o:?}");
    ok(url, &["delete", "placement", "chat-a-0"]).await;
    assert_eq!(json(url, &["get", "placements"]).await.as_array().unwrap().len(), 1);

    // A bad workloads file never reaches the server.
    let o = ctl(url, &["schedule", "plan", "-f", &write(&dir, "bad.yaml", "workloads:\n  - {kind: replica, name: r, compute_milli: lots}\n")], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("workloads[0]"), "{o:?}");
    n.running.shutdown().await.unwrap();
}
