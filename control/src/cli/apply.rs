//! `weftctl apply`: multi-document YAML → validated, ordered, idempotent writes.
//!
//! The order of operations is what makes an apply all-or-nothing *up to the first write*:
//!
//! 1. parse every document locally (YAML, kind, name, spec shape); any problem aborts;
//! 2. dry-run every document on the server, which validates it with the proxy's own rules and
//!    answers current vs proposed and which references do not resolve; any refusal aborts,
//!    still before the first write, and so does a reference to something neither the server
//!    nor another document of the file defines (unless `--allow-dangling`);
//! 3. write only the documents that change, dependencies first (clusters, endpoints,
//!    experiments, services), each conditional on the revision seen in step 2 so an edit
//!    made by someone else in between is a conflict rather than silently overwritten.
//!
//! The server has no multi-resource transaction, so a failure *during* step 3 (a conflict, a
//! lost node) leaves the earlier documents applied; the output says which were.

use serde_json::{Value, json};

use super::client::{Client, ClientError, Response};
use super::output::{self, Format};
use super::{CliError, api_error, err_line, ok_or_api_error, out};
use crate::resources::{self, Kind};

/// One document of an apply file.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    /// 1-based position in the file, counting empty documents.
    pub number: usize,
    /// The line the document starts on, when it could be told (see [`doc_starts`]).
    pub line: Option<usize>,
    pub kind: Kind,
    pub name: String,
    pub spec: Value,
}

impl Doc {
    pub fn object(&self) -> String {
        output::object(self.kind, &self.name)
    }

    fn label(&self) -> String {
        format!("document {} ({})", self.number, self.object())
    }
}

/// Where each document starts (1-based lines), found by scanning for `---` markers: the
/// parser reports where an error is, but not where the document holding a semantically
/// wrong value began. A first document without a marker starts at its first content line.
pub fn doc_starts(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut seen_marker = false;
    for (i, l) in text.lines().enumerate() {
        let marker = l.starts_with("---") && l[3..].chars().next().is_none_or(char::is_whitespace);
        if marker {
            seen_marker = true;
            starts.push(i + 1);
        } else if !seen_marker && starts.is_empty() {
            let t = l.trim();
            if !t.is_empty() && !t.starts_with('#') && !t.starts_with('%') {
                starts.push(i + 1);
            }
        }
    }
    starts
}

/// Parses every document of `text`. All problems found are reported together, one line each,
/// naming the document number (and its line); a YAML syntax error ends parsing, since nothing
/// after it can be trusted. Empty documents (a trailing `---`) are skipped.
pub fn parse_docs(text: &str) -> Result<Vec<Doc>, String> {
    use serde::Deserialize;
    let starts = doc_starts(text);
    let mut raw = Vec::new();
    for (i, de) in serde_norway::Deserializer::from_str(text).enumerate() {
        let number = i + 1;
        let parsed = serde_norway::Value::deserialize(de).and_then(|mut v| v.apply_merge().map(|()| v));
        match parsed {
            Ok(v) => raw.push((number, v)),
            // libyaml stops at its first error, and serde_norway would repeat it forever.
            Err(e) => {
                let at = starts.get(i).map(|l| format!(" (line {l})")).unwrap_or_default();
                let mut errors: Vec<String> = check_all(&raw, &starts).err().unwrap_or_default();
                errors.push(format!("document {number}{at}: invalid YAML: {e}"));
                return Err(errors.join("\n"));
            }
        }
    }
    let docs = check_all(&raw, &starts).map_err(|e| e.join("\n"))?;
    if docs.is_empty() {
        return Err("no documents: expected one or more `{kind, name, spec}` documents".into());
    }
    Ok(docs)
}

/// Turns parsed YAML values into documents; the starts are trusted only if the scan found
/// as many documents as the parser (a `---` inside a block scalar would fool it).
fn check_all(raw: &[(usize, serde_norway::Value)], starts: &[usize]) -> Result<Vec<Doc>, Vec<String>> {
    let trust = raw.last().is_none_or(|(n, _)| starts.len() >= *n);
    let mut docs: Vec<Doc> = Vec::new();
    let mut errors = Vec::new();
    for (number, v) in raw {
        if v.is_null() {
            continue;
        }
        let line = if trust { starts.get(number - 1).copied() } else { None };
        match check(*number, line, v) {
            Ok(d) => match docs.iter().find(|o| o.kind == d.kind && o.name == d.name) {
                Some(o) => {
                    errors.push(format!("{}: {} is also document {}", here(d.number, d.line), d.object(), o.number))
                }
                None => docs.push(d),
            },
            Err(e) => errors.push(format!("{}: {e}", here(*number, line))),
        }
    }
    if errors.is_empty() { Ok(docs) } else { Err(errors) }
}

fn here(number: usize, line: Option<usize>) -> String {
    match line {
        Some(l) => format!("document {number} (line {l})"),
        None => format!("document {number}"),
    }
}

fn kinds_list() -> String {
    Kind::ALL.iter().filter(|k| k.user_writable()).map(|k| k.yaml_kind()).collect::<Vec<_>>().join(", ")
}

/// One document's `{kind, name, spec}`.
fn check(number: usize, line: Option<usize>, v: &serde_norway::Value) -> Result<Doc, String> {
    use serde_norway::Value as Y;
    let Y::Mapping(m) = v else {
        return Err(format!("expected a mapping with kind, name and spec, found {}", yaml_type(v)));
    };
    let (mut kind, mut name, mut spec) = (None, None, None);
    for (k, val) in m {
        match k.as_str() {
            Some("kind") => kind = Some(val),
            Some("name") => name = Some(val),
            Some("spec") => spec = Some(val),
            _ => {
                let key = serde_norway::to_string(k).unwrap_or_default();
                return Err(format!("unknown key {:?}; a document has kind, name and spec", key.trim()));
            }
        }
    }
    let kind = match kind {
        None => return Err(format!("missing `kind` (one of {})", kinds_list())),
        Some(Y::String(s)) => {
            Kind::parse(s).ok_or_else(|| format!("unknown kind {s:?}; expected one of {}", kinds_list()))?
        }
        Some(other) => return Err(format!("`kind` must be a string, found {}", yaml_type(other))),
    };
    let name = match name {
        None => return Err("missing `name`".into()),
        Some(Y::String(s)) => s.clone(),
        // `name: 2024` is a number to YAML; as a resource name it is just text.
        Some(Y::Number(n)) => n.to_string(),
        Some(other) => return Err(format!("`name` must be a string, found {}", yaml_type(other))),
    };
    resources::check_name(&name).map_err(|e| e.to_string())?;
    let spec = match spec {
        None | Some(Y::Null) => return Err("missing `spec`".into()),
        Some(s @ Y::Mapping(_)) => yaml_to_json(s, "spec")?,
        Some(other) => return Err(format!("`spec` must be a mapping, found {}", yaml_type(other))),
    };
    Ok(Doc { number, line, kind, name, spec })
}

fn yaml_type(v: &serde_norway::Value) -> &'static str {
    use serde_norway::Value as Y;
    match v {
        Y::Null => "nothing",
        Y::Bool(_) => "a boolean",
        Y::Number(_) => "a number",
        Y::String(_) => "a string",
        Y::Sequence(_) => "a list",
        Y::Mapping(_) => "a mapping",
        Y::Tagged(_) => "a tagged value",
    }
}

/// YAML → JSON, naming the path of anything JSON cannot carry. Scalar keys become strings
/// (`200: x` is the key "200"), which is how the proxy reads its own YAML config too.
pub fn yaml_to_json(v: &serde_norway::Value, path: &str) -> Result<Value, String> {
    use serde_norway::Value as Y;
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(*b),
        Y::Number(n) => {
            if let Some(u) = n.as_u64() {
                json!(u)
            } else if let Some(i) = n.as_i64() {
                json!(i)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                Value::Number(
                    serde_json::Number::from_f64(f).ok_or_else(|| format!("{path}: {n} cannot be sent as JSON"))?,
                )
            }
        }
        Y::String(s) => Value::String(s.clone()),
        Y::Sequence(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| yaml_to_json(x, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Y::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, x) in m {
                let key = match k {
                    Y::String(s) => s.clone(),
                    Y::Number(n) => n.to_string(),
                    Y::Bool(b) => b.to_string(),
                    _ => return Err(format!("{path}: keys must be scalars, found {}", yaml_type(k))),
                };
                let value = yaml_to_json(x, &format!("{path}.{key}"))?;
                if out.insert(key.clone(), value).is_some() {
                    return Err(format!("{path}: duplicate key {key:?}"));
                }
            }
            Value::Object(out)
        }
        Y::Tagged(t) => return Err(format!("{path}: YAML tags ({}) are not supported", t.tag)),
    })
}

/// The server's dry-run answer for one document.
#[derive(Debug, Clone)]
struct Plan {
    changed: bool,
    /// Current revision (0 = absent): the precondition of the real write.
    revision: u64,
    current: Value,
    proposed: Value,
    warnings: Vec<String>,
    /// References that do not resolve on the server: (field, YAML kind, name).
    dangling: Vec<(String, String, String)>,
}

/// How `apply` treats references to resources that do not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dangling {
    /// Refused unless another document of the same apply defines the target.
    Refuse,
    /// Written anyway, with a warning (`--allow-dangling`): for files applied in parts.
    Allow,
}

/// `PUT ...?dry_run=true` of one document: its plan, or the server's refusal. Dangling
/// references are allowed here and listed in the plan: whether they are acceptable depends on
/// the other documents (see [`unresolved`]).
async fn check_on_server(client: &mut Client, doc: &Doc) -> Result<Result<Plan, Response>, ClientError> {
    let path = format!("{}?dry_run=true&allow_dangling=true", put_path(doc));
    let r = client.request(http::Method::PUT, &path, Some(&doc.spec), None).await?;
    if !r.status.is_success() {
        return Ok(Err(r));
    }
    Ok(Ok(Plan {
        changed: r.body["changed"] != Value::Bool(false),
        revision: r.body["revision"].as_u64().unwrap_or(0),
        current: r.body["current"].clone(),
        proposed: r.body["proposed"].clone(),
        warnings: strings(&r.body["warnings"]),
        dangling: r.body["dangling"]
            .as_array()
            .map(|a| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                a.iter().map(|d| (s(&d["field"]), s(&d["kind"]), s(&d["name"]))).collect()
            })
            .unwrap_or_default(),
    }))
}

/// The dangling references of `plan` that no document of `docs` defines, as error lines.
fn unresolved(plan: &Plan, docs: &[Doc]) -> Vec<String> {
    plan.dangling
        .iter()
        .filter(|(_, kind, name)| !docs.iter().any(|d| d.kind.yaml_kind() == kind && &d.name == name))
        .map(|(field, kind, name)| {
            format!(
                "{field}: {kind} {name:?} does not exist and this file does not define it (field: {field}); \
                 apply it too, or pass --allow-dangling"
            )
        })
        .collect()
}

/// `current` vs `proposed` of a plan as YAML, unified-style.
fn plan_diff(doc: &Doc, plan: &Plan) -> String {
    let (old, from) = if plan.current.is_null() {
        (String::new(), format!("{} (absent)", doc.object()))
    } else {
        (output::to_yaml(&plan.current), format!("{} (revision {})", doc.object(), plan.revision))
    };
    let to = format!("{} (proposed)", doc.object());
    super::diff::unified(&old, &output::to_yaml(&plan.proposed), &from, &to, 3)
}

/// Drops dry-run warnings about references to documents of this same apply: they exist by
/// the time the referring document is written (dependencies go first). The server words
/// them `FIELD: Kind "name" does not exist (yet); ...`.
fn relevant_warnings<'a>(warnings: &'a [String], docs: &[Doc]) -> Vec<&'a String> {
    warnings
        .iter()
        .filter(|w| !docs.iter().any(|d| w.contains(&format!("{} {:?} does not exist", d.kind.yaml_kind(), d.name))))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
}

fn put_path(doc: &Doc) -> String {
    format!("/v1/{}/{}", doc.kind.as_str(), doc.name)
}

/// Runs an apply of already parsed `docs` (see the module doc for the steps).
pub async fn run(
    client: &mut Client,
    mut docs: Vec<Doc>,
    dry_run: bool,
    dangling: Dangling,
    format: Format,
) -> Result<(), CliError> {
    docs.sort_by_key(|d| Kind::ALL.iter().position(|k| *k == d.kind));

    // Step 2: every document past the server's validation before anything is written.
    let mut plans: Vec<Plan> = Vec::with_capacity(docs.len());
    let mut refused = Vec::new();
    for doc in &docs {
        match check_on_server(client, doc).await {
            Ok(Ok(plan)) => {
                if dangling == Dangling::Refuse {
                    refused.extend(unresolved(&plan, &docs).into_iter().map(|e| format!("{}: {e}", doc.label())));
                }
                plans.push(plan)
            }
            Ok(Err(r)) => refused.push(format!("{}: {}", doc.label(), api_error(&r))),
            Err(e) => return Err(CliError::Request(format!("{e}\nnothing was applied"))),
        }
    }
    if !refused.is_empty() {
        refused.push("nothing was applied".into());
        return Err(CliError::Request(refused.join("\n")));
    }

    let mut results = Vec::new();
    let table = format == Format::Table;
    if dry_run {
        for (doc, plan) in docs.iter().zip(&plans) {
            let action = match (plan.changed, plan.current.is_null()) {
                (false, _) => "unchanged",
                (true, true) => "created",
                (true, false) => "configured",
            };
            let diff = if plan.changed { plan_diff(doc, plan) } else { String::new() };
            let warnings = relevant_warnings(&plan.warnings, &docs);
            if table {
                let suffix = if plan.changed { " (dry run)" } else { "" };
                out(format!("{} {action}{suffix}\n", doc.object()));
                out(&diff);
            }
            for w in &warnings {
                err_line(format!("warning: {}: {w}", doc.object()));
            }
            results.push(json!({
                "kind": doc.kind.as_str(), "name": doc.name, "action": action, "dry_run": true,
                "revision": plan.revision, "diff": diff, "warnings": warnings,
            }));
        }
    } else {
        // Step 3. A failure stops here; what was already written is listed above it.
        for (doc, plan) in docs.iter().zip(&plans) {
            if !plan.changed {
                if table {
                    out(format!("{} unchanged\n", doc.object()));
                }
                results.push(json!({"kind": doc.kind.as_str(), "name": doc.name, "action": "unchanged", "revision": plan.revision}));
                continue;
            }
            let path = match dangling {
                Dangling::Refuse => put_path(doc),
                Dangling::Allow => format!("{}?allow_dangling=true", put_path(doc)),
            };
            let r = client
                .request(http::Method::PUT, &path, Some(&doc.spec), Some(plan.revision))
                .await
                .map_err(|e| partial(&results, format, CliError::request(e)))?;
            let body = if r.status == http::StatusCode::CONFLICT {
                // The spec may be there already: this PUT retried on another node after its
                // first answer was lost, or someone applied the same file. Only a *different*
                // current spec is a conflict.
                match check_on_server(client, doc).await {
                    Ok(Ok(now)) if !now.changed => json!({ "revision": now.revision, "changed": true }),
                    _ => {
                        let m = api_error(&r);
                        let e = format!(
                            "{}: changed by someone else since it was checked: {m}; run apply again",
                            doc.label()
                        );
                        return Err(partial(&results, format, CliError::Request(e)));
                    }
                }
            } else {
                ok_or_api_error(r).map_err(|e| {
                    let e = match e {
                        CliError::Request(m) => CliError::Request(format!("{}: {m}", doc.label())),
                        other => other,
                    };
                    partial(&results, format, e)
                })?
            };
            let revision = body["revision"].as_u64().unwrap_or(0);
            let action = match (body["changed"] != Value::Bool(false), plan.current.is_null()) {
                (false, _) => "unchanged",
                (true, true) => "created",
                (true, false) => "configured",
            };
            let warnings = strings(&body["warnings"]);
            if table {
                out(format!("{} {action} (revision {revision})\n", doc.object()));
            }
            for w in &warnings {
                err_line(format!("warning: {}: {w}", doc.object()));
            }
            results.push(json!({
                "kind": doc.kind.as_str(), "name": doc.name, "action": action, "revision": revision, "warnings": warnings,
            }));
        }
    }
    if let Some(s) = output::structured(format, &Value::Array(results)) {
        out(s);
    }
    Ok(())
}

/// Before an error mid-apply: prints (in JSON/YAML mode) the results so far, which table mode
/// has already printed line by line, and says in the error that they stand.
fn partial(results: &[Value], format: Format, e: CliError) -> CliError {
    if let Some(s) = output::structured(format, &Value::Array(results.to_vec())) {
        out(s);
    }
    let applied: Vec<String> = results
        .iter()
        .filter(|r| r["action"] != json!("unchanged"))
        .filter_map(|r| Some(format!("{}/{}", r["kind"].as_str()?, r["name"].as_str()?)))
        .collect();
    match e {
        CliError::Request(m) if applied.is_empty() => CliError::Request(format!("{m}\nnothing was applied")),
        CliError::Request(m) => CliError::Request(format!("{m}\nalready applied: {}", applied.join(", "))),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::Server;
    use super::super::client::test_server::{self, Seen};
    use super::*;

    const GOOD: &str = "\
# a comment before the first document
kind: Cluster
name: c1
spec:
  endpoints: [\"127.0.0.1:8001\"]
---
kind: Service
name: chat
spec:
  hosts: [chat]
  routes:
    - name: all
      match: { path_prefix: / }
      cluster: c1
---
---
kind: experiment
name: 2024
spec:
  variants:
    - { name: a, cluster: c1, weight: 90 }
  stratify:
    weights:
      200: { a: 1 }
";

    #[test]
    fn documents_parse_with_numbers_and_lines() {
        let docs = parse_docs(GOOD).unwrap();
        let got: Vec<_> = docs.iter().map(|d| (d.number, d.line, d.kind, d.name.as_str())).collect();
        assert_eq!(
            got,
            [
                (1, Some(2), Kind::Clusters, "c1"),
                (2, Some(6), Kind::Services, "chat"),
                (4, Some(16), Kind::Experiments, "2024"),
            ]
        );
        assert_eq!(docs[1].spec["routes"][0]["match"]["path_prefix"], json!("/"));
        assert_eq!(docs[2].spec["variants"][0]["weight"], json!(90));
        assert_eq!(docs[2].spec["stratify"]["weights"]["200"]["a"], json!(1), "scalar keys become strings");
    }

    #[test]
    fn document_starts() {
        assert_eq!(doc_starts("a: 1\n---\nb: 2\n--- \nc\n"), [1, 2, 4]);
        assert_eq!(doc_starts("# c\n\n---\na: 1\n----\n"), [3]);
        assert_eq!(doc_starts("%YAML 1.2\n---\na\n"), [2]);
        assert_eq!(doc_starts(""), Vec::<usize>::new());
    }

    fn err(text: &str) -> String {
        parse_docs(text).expect_err(text)
    }

    #[test]
    fn bad_documents_are_named_by_number_and_line() {
        let e = err("kind: Cluster\nname: c\nspec: {}\n---\nkind: Pod\nname: p\nspec: {}\n");
        assert_eq!(
            e,
            "document 2 (line 4): unknown kind \"Pod\"; expected one of Cluster, Endpoints, Experiment, Service, Node, NodeStatus, Autoscaler, Rollout, TrainingJob, AuthorizationPolicy, Revocation"
        );
        let e = err("kind: Cluster\nspec: {}\n");
        assert_eq!(e, "document 1 (line 1): missing `name`");
        let e = err("kind: Cluster\nname: c\n");
        assert_eq!(e, "document 1 (line 1): missing `spec`");
        let e = err("name: c\nspec: {}\n");
        assert!(e.starts_with("document 1 (line 1): missing `kind`"), "{e}");
        let e = err("kind: Cluster\nname: c\nspec: {}\nmetadata: {}\n");
        assert!(e.contains("unknown key \"metadata\""), "{e}");
        let e = err("kind: Cluster\nname: a/b\nspec: {}\n");
        assert!(e.starts_with("document 1 (line 1): name: \"a/b\" is not a valid name"), "{e}");
        let e = err("kind: Cluster\nname: c\nspec: [1]\n");
        assert_eq!(e, "document 1 (line 1): `spec` must be a mapping, found a list");
        let e = err("- 1\n- 2\n");
        assert!(e.contains("expected a mapping"), "{e}");
        let e = err("kind: Cluster\nname: c\nspec: { x: !foo 1 }\n");
        assert!(e.contains("spec.x: YAML tags (!foo) are not supported"), "{e}");
        let e = err("kind: Cluster\nname: c\nspec: { x: .nan }\n");
        assert!(e.contains("spec.x: .nan cannot be sent as JSON"), "{e}");
    }

    #[test]
    fn every_bad_document_is_reported_and_syntax_errors_stop_parsing() {
        let e = err(
            "kind: Pod\nname: a\nspec: {}\n---\nkind: Cluster\nname: c\nspec: {}\n---\nkind: Cluster\nname: c\nspec: {}\n",
        );
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 2, "{e}");
        assert!(lines[0].starts_with("document 1 (line 1): unknown kind"), "{e}");
        assert_eq!(lines[1], "document 3 (line 8): cluster/c is also document 2");

        let e = err("kind: Cluster\nname: c\nspec: {}\n---\nkind: Service\nname: s\nspec:\n  hosts: [a\n  routes: 1\n");
        assert!(e.starts_with("document 2 (line 4): invalid YAML: "), "{e}");
        assert!(e.contains("line "), "the parser's own location is kept: {e}");
        assert_eq!(e.lines().count(), 1);

        let e = err("kind: Cluster\nname: c\nspec:\n  a: 1\n  a: 2\n");
        assert!(e.contains("document 1") && e.contains("duplicate"), "{e}");
    }

    #[test]
    fn empty_input_is_an_error() {
        assert!(err("").starts_with("no documents"));
        assert!(err("# nothing\n---\n").starts_with("no documents"));
    }

    #[test]
    fn merge_keys_and_anchors_work() {
        let text = "\
kind: Cluster
name: base
spec: &base
  lb: round_robin
  endpoints: [\"h:1\"]
---
kind: Cluster
name: copy
spec:
  <<: *base
  endpoints: [\"h:2\"]
";
        // Anchors do not cross documents in YAML; this is an error that names document 2.
        let e = err(text);
        assert!(e.starts_with("document 2"), "{e}");
        let one = "kind: Cluster\nname: c\nspec:\n  x: &e [\"h:1\"]\n  endpoints: *e\n  <<: { lb: round_robin }\n";
        let docs = parse_docs(one).unwrap();
        assert_eq!(docs[0].spec["endpoints"], json!(["h:1"]));
        assert_eq!(docs[0].spec["lb"], json!("round_robin"));
    }

    #[test]
    fn same_file_reference_warnings_are_dropped() {
        let docs = parse_docs(GOOD).unwrap();
        let w = vec![
            "routes.all.cluster: Cluster \"c1\" does not exist (yet); sidecars will reject this until it does"
                .to_string(),
            "routes.x.cluster: Cluster \"other\" does not exist (yet); sidecars will reject this until it does"
                .to_string(),
        ];
        assert_eq!(relevant_warnings(&w, &docs), vec![&w[1]]);
    }

    fn dry(changed: bool, revision: u64, current: Value) -> (u16, String) {
        let body = json!({"dry_run": true, "changed": changed, "revision": revision, "current": current,
            "proposed": {"name": "x"}, "warnings": []});
        (200, body.to_string())
    }

    async fn apply_against(answers: Vec<(u16, String)>, text: &str) -> (Result<(), CliError>, Vec<Seen>) {
        let (addr, seen) = test_server::start(answers).await;
        let mut c = Client::new(vec![Server::parse(&addr, false).unwrap()], None);
        let r = run(&mut c, parse_docs(text).unwrap(), false, Dangling::Refuse, Format::Json).await;
        let seen = seen.lock().unwrap().clone();
        (r, seen)
    }

    const TWO: &str = "kind: Cluster\nname: b\nspec: {}\n---\nkind: Cluster\nname: a\nspec: {}\n";

    #[tokio::test]
    async fn writes_are_conditional_and_a_conflict_with_our_own_spec_is_success() {
        let answers = vec![
            dry(true, 0, Value::Null),
            dry(true, 4, json!({"name": "a"})),
            (200, json!({"revision": 6, "changed": true}).to_string()),
            (409, json!({"error": "conflict", "current_revision": 7}).to_string()),
            dry(false, 7, json!({"name": "x"})),
        ];
        let (r, seen) = apply_against(answers, TWO).await;
        r.unwrap();
        let lines: Vec<(&str, Option<&str>)> = seen.iter().map(|s| (s.line.as_str(), s.if_match.as_deref())).collect();
        assert_eq!(
            lines,
            [
                ("PUT /v1/clusters/b?dry_run=true&allow_dangling=true", None),
                ("PUT /v1/clusters/a?dry_run=true&allow_dangling=true", None),
                ("PUT /v1/clusters/b", Some("0")),
                ("PUT /v1/clusters/a", Some("4")),
                ("PUT /v1/clusters/a?dry_run=true&allow_dangling=true", None),
            ]
        );
    }

    #[tokio::test]
    async fn a_real_conflict_stops_the_apply_and_names_what_was_applied() {
        let answers = vec![
            dry(true, 0, Value::Null),
            dry(true, 4, json!({"name": "a"})),
            (200, json!({"revision": 6, "changed": true}).to_string()),
            (409, json!({"error": "conflict", "current_revision": 7}).to_string()),
            dry(true, 7, json!({"name": "other"})),
        ];
        let (r, _) = apply_against(answers, TWO).await;
        let e = r.unwrap_err();
        assert_eq!(e.exit_code(), 1);
        assert!(e.message().starts_with("document 2 (cluster/a): changed by someone else"), "{e:?}");
        assert!(e.message().contains("(current revision: 7)"), "{e:?}");
        assert!(e.message().ends_with("\nalready applied: clusters/b"), "{e:?}");
    }

    #[tokio::test]
    async fn a_refused_document_means_no_write_at_all() {
        let answers = vec![dry(true, 0, Value::Null), (422, json!({"error": "bad", "field": "lb"}).to_string())];
        let (r, seen) = apply_against(answers, TWO).await;
        let e = r.unwrap_err();
        assert_eq!(e.message(), "document 2 (cluster/a): bad (field: lb)\nnothing was applied");
        assert_eq!(seen.len(), 2, "two dry runs, no write: {seen:?}");
    }

    #[test]
    fn dangling_references_must_be_defined_by_the_same_file() {
        let docs = parse_docs("kind: Cluster\nname: here\nspec: {}\n").unwrap();
        let plan = |targets: &[&str]| Plan {
            changed: true,
            revision: 0,
            current: Value::Null,
            proposed: Value::Null,
            warnings: vec![],
            dangling: targets.iter().map(|t| ("routes.r.cluster".into(), "Cluster".into(), (*t).into())).collect(),
        };
        assert!(unresolved(&plan(&["here"]), &docs).is_empty(), "defined by another document");
        let e = unresolved(&plan(&["here", "gone"]), &docs);
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("routes.r.cluster: Cluster \"gone\" does not exist") && e[0].ends_with("--allow-dangling"), "{e:?}");
    }

    #[test]
    fn plan_diffs() {
        let doc = Doc { number: 1, line: None, kind: Kind::Clusters, name: "c".into(), spec: json!({}) };
        let plan = Plan {
            changed: true,
            revision: 7,
            current: json!({"name": "c", "lb": "round_robin"}),
            proposed: json!({"name": "c", "lb": "p2c_ewma"}),
            warnings: vec![],
            dangling: vec![],
        };
        assert_eq!(
            plan_diff(&doc, &plan),
            "--- cluster/c (revision 7)\n+++ cluster/c (proposed)\n@@ -1,2 +1,2 @@\n-lb: round_robin\n+lb: p2c_ewma\n name: c\n"
        );
        let new = Plan { current: Value::Null, revision: 0, ..plan };
        assert!(
            plan_diff(&doc, &new).starts_with("--- cluster/c (absent)\n+++ cluster/c (proposed)\n@@ -0,0 +1,2 @@\n")
        );
    }
}
