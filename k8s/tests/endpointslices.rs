//! EndpointSlice → weft endpoints, replaying a recorded watch (tests/fixtures/
//! endpointslice-watch.jsonl): a LIST, MODIFIED/ADDED/DELETED events, a BOOKMARK, a slice weft
//! cannot use, and a 410 Expired followed by a relist that misses a deletion made while the
//! watch was down.

mod common;

use common::{events, recorded};
use serde_json::Value;
use weft_k8s::endpoints::{Change, Endpoints, Skipped};

fn step(state: &mut Endpoints, line: &Value) -> (Vec<Change>, Vec<Skipped>) {
    let (mut changes, mut skipped) = (vec![], vec![]);
    for e in events(line) {
        let (c, s) = state.apply(e);
        changes.extend(c);
        skipped.extend(s);
    }
    (changes, skipped)
}

/// `cluster → [address (variant)]` of each Put, and the Deletes.
fn summary(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::Put(e) => {
                let eps: Vec<String> = e.endpoints.iter().map(|x| format!("{} ({})", x.address, x.variant)).collect();
                format!("put {}: {}", e.name, eps.join(", "))
            }
            Change::Delete(n) => format!("delete {n}"),
        })
        .collect()
}

#[test]
fn a_recorded_watch_becomes_the_right_endpoint_writes() {
    let lines = recorded();
    let mut state = Endpoints::new();

    // 1. The initial LIST: both variants' Services feed cluster `ranker` (weft.dev/cluster), on
    //    the port named weft; the embedder's only port is taken as is.
    let (c, s) = step(&mut state, &lines[0]);
    assert!(s.is_empty());
    assert_eq!(
        summary(&c),
        [
            "put embedder: 10.1.2.31:8000 ()",
            "put ranker: 10.1.0.11:15006 (a), 10.1.0.12:15006 (a), 10.1.1.21:15006 (b)",
        ]
    );
    let Change::Put(ranker) = &c[1] else { unreachable!() };
    let first = &ranker.endpoints[0].labels;
    assert_eq!(
        (first["pod"].as_str(), first["node"].as_str(), first["zone"].as_str()),
        ("ranker-a-6d8f9c7b54-x7k2p", "gpu-node-1", "us-east-1a")
    );

    // 2. A new pod that is not ready yet: nothing to write.
    assert_eq!(step(&mut state, &lines[1]).0, []);
    // 3. It becomes ready while another terminates.
    assert_eq!(
        summary(&step(&mut state, &lines[2]).0),
        ["put ranker: 10.1.0.11:15006 (a), 10.1.0.13:15006 (a), 10.1.1.21:15006 (b)"]
    );
    // 4. A second slice of ranker-b (one endpoint without conditions: ready, as documented).
    assert_eq!(
        summary(&step(&mut state, &lines[3]).0),
        ["put ranker: 10.1.0.11:15006 (a), 10.1.0.13:15006 (a), 10.1.1.21:15006 (b), 10.1.1.22:15006 (b), 10.1.1.23:15006 (b)"]
    );
    // 5. A bookmark changes nothing.
    assert_eq!(step(&mut state, &lines[4]).0, []);
    // 6. A slice with two ports and none named weft is skipped, saying what to do.
    let (c, s) = step(&mut state, &lines[5]);
    assert_eq!(c, []);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].slice, "models/reranker-uvwxy");
    assert!(s[0].why.contains("none named \"weft\""), "{}", s[0].why);
    // 7. The embedder Service is deleted: its endpoints resource goes.
    assert_eq!(summary(&step(&mut state, &lines[6]).0), ["delete embedder"]);
    // 8. 410 Expired: nothing until the relist.
    assert_eq!(step(&mut state, &lines[7]).0, []);
    // 9. The relist no longer has ranker-b-fghij (deleted while the watch was down) and
    //    ranker-a lost its terminated pod: the listed set replaces the old one.
    let (c, s) = step(&mut state, &lines[8]);
    assert_eq!(s.len(), 1, "the unusable slice is still skipped");
    assert_eq!(
        summary(&c),
        ["put ranker: 10.1.0.11:15006 (a), 10.1.0.13:15006 (a), 10.1.1.22:15006 (b), 10.1.1.23:15006 (b)"]
    );
    // A second relist of the same state writes nothing.
    assert_eq!(step(&mut state, &lines[8]).0, []);
}

#[test]
fn a_relist_after_every_slice_went_away_deletes_the_cluster() {
    let lines = recorded();
    let mut state = Endpoints::new();
    step(&mut state, &lines[0]);
    let empty = serde_json::json!({"list": {"items": []}});
    let (c, _) = step(&mut state, &empty);
    assert_eq!(summary(&c), ["delete embedder", "delete ranker"]);
}

#[test]
fn a_failed_write_is_retried_on_the_next_event() {
    let lines = recorded();
    let mut state = Endpoints::new();
    step(&mut state, &lines[0]);
    // weft-control refused the PUT for ranker: forgetting it makes the next touch rewrite it,
    // even when the set did not change.
    state.forget_written("ranker");
    assert_eq!(summary(&step(&mut state, &lines[1]).0)[0].split(':').next(), Some("put ranker"));
}
