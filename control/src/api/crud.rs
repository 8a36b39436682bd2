//! Resource endpoints: list, get, put (create or replace), delete, history, rollback, and the
//! experiment weights shortcut. Specs are validated by `crate::resources` before they reach
//! Raft, so an invalid spec never becomes a log entry.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState};
use crate::resources::{self, Kind};
use crate::store::{Command, Resource};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReadQuery {
    /// `local` answers from this node's state without a quorum round (may be stale).
    consistency: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct WriteQuery {
    /// Precondition: the current revision (0 = must not exist). `If-Match` works too.
    revision: Option<u64>,
    /// Validate and show what would change, write nothing.
    dry_run: bool,
    /// Accept references to resources that do not exist (yet): for bulk loaders that write in
    /// their own order. Without it such a write is a 422 naming the field, because sidecars
    /// cannot serve the resource until the reference resolves.
    allow_dangling: bool,
}

fn kind(segment: &str) -> ApiResult<Kind> {
    Kind::parse(segment).ok_or_else(|| {
        let known: Vec<_> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        ApiError::field(StatusCode::NOT_FOUND, "kind", format!("unknown kind {segment:?}; known: {}", known.join(", ")))
    })
}

/// Refuses writes of specs to kinds only the control plane writes (405, saying how instead).
fn writable(kind: Kind) -> ApiResult<Kind> {
    match kind.written_by() {
        None => Ok(kind),
        Some(by) => Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{kind} are written by {by}"))),
    }
}

fn local(q: &ReadQuery) -> ApiResult<bool> {
    match q.consistency.as_deref() {
        None | Some("linearizable") => Ok(false),
        Some("local") => Ok(true),
        Some(other) => Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "consistency",
            format!("{other:?} is not one of linearizable, local"),
        )),
    }
}

/// The revision precondition from `?revision=` or `If-Match` (quotes allowed).
fn precondition(q: &WriteQuery, headers: &HeaderMap) -> ApiResult<Option<u64>> {
    let header = match headers.get(http::header::IF_MATCH) {
        None => None,
        Some(v) => {
            let s = v.to_str().unwrap_or("").trim().trim_matches('"');
            Some(s.parse::<u64>().map_err(|_| {
                ApiError::field(StatusCode::BAD_REQUEST, "If-Match", format!("{s:?} is not a revision number"))
            })?)
        }
    };
    match (q.revision, header) {
        (Some(a), Some(b)) if a != b => Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "revision",
            format!("?revision={a} and If-Match: {b} disagree"),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

fn spec_of(r: &Resource) -> Value {
    serde_json::from_str(&r.value_json).unwrap_or(Value::Null)
}

fn item(kind: Kind, r: &Resource) -> Value {
    json!({ "kind": kind.as_str(), "name": r.name, "revision": r.revision, "spec": spec_of(r) })
}

async fn read_one(st: &AppState, kind: Kind, name: &str, local: bool) -> ApiResult<Option<Resource>> {
    if !local {
        st.node.linearize().await?;
    }
    Ok(st.node.local().get(kind.as_str(), name).map_err(crate::store::StoreError::from)?)
}

pub async fn list(
    State(st): State<Arc<AppState>>,
    Path(k): Path<String>,
    Query(q): Query<ReadQuery>,
) -> ApiResult<Json<Value>> {
    let kind = kind(&k)?;
    if !local(&q)? {
        st.node.linearize().await?;
    }
    let view = st.node.local().view().map_err(crate::store::StoreError::from)?;
    let revision = view.revision().map_err(crate::store::StoreError::from)?;
    let items: Vec<Value> =
        view.list(kind.as_str()).map_err(crate::store::StoreError::from)?.iter().map(|r| item(kind, r)).collect();
    Ok(Json(json!({ "revision": revision, "items": items })))
}

pub async fn get(
    State(st): State<Arc<AppState>>,
    Path((k, name)): Path<(String, String)>,
    Query(q): Query<ReadQuery>,
) -> ApiResult<Json<Value>> {
    let kind = kind(&k)?;
    match read_one(&st, kind, &name, local(&q)?).await? {
        Some(r) => Ok(Json(item(kind, &r))),
        None => Err(ApiError::new(StatusCode::NOT_FOUND, format!("{kind}/{name} does not exist"))),
    }
}

/// A dry run answers a failed precondition as the real write would: 409.
fn check_expect(kind: Kind, name: &str, expect: Option<u64>, current: Option<&Resource>) -> ApiResult<()> {
    let actual = current.map_or(0, |r| r.revision);
    match expect {
        Some(e) if e != actual => Err(ApiError::from(crate::store::StoreError::Rejected(
            crate::store::CommandError::Conflict { kind: kind.as_str().into(), name: name.into(), expected: e, actual },
        ))),
        _ => Ok(()),
    }
}

/// Parses a request body as JSON, with a 400 that says where it broke.
fn body_json(body: &Bytes) -> ApiResult<Value> {
    if body.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "the request body is empty; send the spec as JSON"));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")))
}

/// Validates and writes `spec` as `kind/name`; shared by PUT and the weights shortcut.
/// References to resources that do not exist are refused (422, the first one's field) unless
/// `allow_dangling`; allowed, they are warnings. A dry run lists them under `dangling` either
/// way, so `weftctl apply` can tell which ones the same file defines.
pub(crate) async fn write_spec(
    st: &AppState,
    kind: Kind,
    name: &str,
    spec: &Value,
    expect: Option<u64>,
    dry_run: bool,
    allow_dangling: bool,
) -> ApiResult<Json<Value>> {
    let valid = resources::validate(kind, name, spec)
        .map_err(|e| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, &e.field, &e.message))?;
    let sm = st.node.local();
    let exists = |k: Kind, n: &str| sm.get(k.as_str(), n).ok().flatten().is_some();
    let missing = resources::missing(&valid.refs, exists);
    let listed: Vec<Value> =
        missing.iter().map(|m| json!({ "field": m.field, "kind": m.kind.yaml_kind(), "name": m.name })).collect();
    if let Some(first) = missing.first().filter(|_| !allow_dangling) {
        let all: Vec<String> = missing.iter().map(|m| m.to_string()).collect();
        let e = format!(
            "{}; create it first (weftctl apply -f orders the documents of one file), or write with \
             ?allow_dangling=true (weftctl apply --allow-dangling) to store it anyway",
            all.join("; ")
        );
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, &first.field, e).with("dangling", json!(listed)));
    }
    let warnings: Vec<String> = missing.iter().map(resources::Missing::warning).collect();
    if dry_run {
        let current = read_one(st, kind, name, false).await?;
        check_expect(kind, name, expect, current.as_ref())?;
        let proposed: Value = serde_json::from_str(&valid.json).unwrap_or(Value::Null);
        let current_spec = current.as_ref().map(spec_of);
        return Ok(Json(json!({
            "kind": kind.as_str(),
            "name": name,
            "dry_run": true,
            "changed": current_spec.as_ref() != Some(&proposed),
            "revision": current.map(|r| r.revision).unwrap_or(0),
            "current": current_spec,
            "proposed": proposed,
            "warnings": warnings,
            "dangling": listed,
        })));
    }
    let cmd = Command::Put {
        kind: kind.as_str().into(),
        name: name.into(),
        value_json: valid.json,
        expect_revision: expect,
    };
    let (revision, changed) = st.node.write_changed(cmd).await?;
    Ok(Json(json!({
        "kind": kind.as_str(), "name": name, "revision": revision, "changed": changed, "warnings": warnings,
    })))
}

pub async fn put(
    State(st): State<Arc<AppState>>,
    Path((k, name)): Path<(String, String)>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = writable(kind(&k)?)?;
    let expect = precondition(&q, &headers)?;
    let spec = body_json(&body)?;
    let trace = (!q.dry_run).then(|| st.spans.begin("PUT", "/v1/{kind}/{name}", traceparent(&headers))).flatten();
    let r = write_spec(&st, kind, &name, &spec, expect, q.dry_run, q.allow_dangling).await;
    finish_trace(&st, trace, kind, &name, &r);
    r
}

fn traceparent(headers: &HeaderMap) -> Option<&[u8]> {
    headers.get("traceparent").map(|v| v.as_bytes())
}

/// Ends a traced write (see `crate::spans`).
fn finish_trace(st: &AppState, trace: Option<crate::spans::Write>, kind: Kind, name: &str, r: &ApiResult<Json<Value>>) {
    let Some(t) = trace else { return };
    let outcome = match r {
        Ok(Json(v)) => Ok((v["revision"].as_u64().unwrap_or(0), v["changed"] != Value::Bool(false))),
        Err(e) => Err(format!("{} {}", e.status, e.body["error"].as_str().unwrap_or_default())),
    };
    st.spans.finish(t, kind.as_str(), name, outcome);
}

pub async fn delete(
    State(st): State<Arc<AppState>>,
    Path((k, name)): Path<(String, String)>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let kind = kind(&k)?;
    let expect = precondition(&q, &headers)?;
    resources::check_name(&name).map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, &e.field, &e.message))?;
    if q.dry_run {
        let current = read_one(&st, kind, &name, false).await?;
        check_expect(kind, &name, expect, current.as_ref())?;
        return Ok(Json(json!({
            "kind": kind.as_str(), "name": name, "dry_run": true, "changed": current.is_some(),
            "revision": current.map(|r| r.revision).unwrap_or(0),
        })));
    }
    let trace = st.spans.begin("DELETE", "/v1/{kind}/{name}", traceparent(&headers));
    let cmd = Command::Delete { kind: kind.as_str().into(), name: name.clone(), expect_revision: expect };
    let r = match st.node.write(cmd).await {
        Ok(revision) => Ok(Json(json!({ "kind": kind.as_str(), "name": name, "revision": revision }))),
        Err(e) => Err(ApiError::from(e)),
    };
    finish_trace(&st, trace, kind, &name, &r);
    r
}

pub async fn history(
    State(st): State<Arc<AppState>>,
    Path((k, name)): Path<(String, String)>,
    Query(q): Query<ReadQuery>,
) -> ApiResult<Json<Value>> {
    let kind = kind(&k)?;
    if !local(&q)? {
        st.node.linearize().await?;
    }
    let h = st.node.local().history(kind.as_str(), &name).map_err(crate::store::StoreError::from)?;
    if h.is_empty() {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("{kind}/{name} has no history")));
    }
    let items: Vec<Value> = h
        .iter()
        .map(|e| {
            let spec = e.value_json.as_deref().and_then(|v| serde_json::from_str::<Value>(v).ok());
            json!({ "revision": e.revision, "spec": spec })
        })
        .collect();
    Ok(Json(json!({ "kind": kind.as_str(), "name": name, "items": items })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    revision: u64,
}

pub async fn rollback(
    State(st): State<Arc<AppState>>,
    Path((k, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let kind = writable(kind(&k)?)?;
    let b: RollbackBody = serde_json::from_value(body_json(&body)?)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("rollback body: {e}")))?;
    st.node.linearize().await?;
    let history = st.node.local().history(kind.as_str(), &name).map_err(crate::store::StoreError::from)?;
    if !history.iter().any(|h| h.revision == b.revision) {
        let known: Vec<String> = history.iter().map(|h| h.revision.to_string()).collect();
        return Err(ApiError::field(
            StatusCode::NOT_FOUND,
            "revision",
            format!(
                "{kind}/{name} has no revision {} (known: {}; history older than the node's --history-revisions is compacted)",
                b.revision,
                known.join(", ")
            ),
        ));
    }
    let revision = st.node.rollback(kind.as_str(), &name, b.revision).await?;
    Ok(Json(json!({ "kind": kind.as_str(), "name": name, "revision": revision, "restored": b.revision })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsBody {
    weights: BTreeMap<String, u32>,
}

/// Sets variant weights of an experiment in one conditional write (read, change, put with
/// the read revision), so a concurrent edit is a 409 rather than lost.
pub async fn set_weights(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let b: WeightsBody = serde_json::from_value(body_json(&body)?)
        .map_err(|e| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "weights", e))?;
    let expect = precondition(&q, &headers)?;
    set_experiment_weights(&st, &name, &b.weights, expect, q.dry_run).await
}

/// Sets the weights of the named variants of experiment `name` in one conditional write
/// (`expect`: the revision it must be at; default the one read). Also the rollout engine's
/// way of moving a candidate.
pub(crate) async fn set_experiment_weights(
    st: &AppState,
    name: &str,
    weights: &std::collections::BTreeMap<String, u32>,
    expect: Option<u64>,
    dry_run: bool,
) -> ApiResult<Json<Value>> {
    let Some(current) = read_one(st, Kind::Experiments, name, false).await? else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("experiments/{name} does not exist")));
    };
    let expect = expect.unwrap_or(current.revision);
    let mut spec = spec_of(&current);
    let variants = spec.get_mut("variants").and_then(Value::as_array_mut);
    let Some(variants) = variants else {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "stored experiment has no variants"));
    };
    for (variant, weight) in weights {
        let Some(v) = variants.iter_mut().find(|v| v.get("name").and_then(Value::as_str) == Some(variant)) else {
            let known: Vec<&str> = variants.iter().filter_map(|v| v.get("name").and_then(Value::as_str)).collect();
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("weights.{variant}"),
                format!("experiment {name:?} has no variant {variant:?} (variants: {})", known.join(", ")),
            ));
        };
        v["weight"] = json!(weight);
    }
    // Weights do not change what the experiment refers to: a variant whose cluster went away
    // since must not block moving traffic off it.
    let Json(mut answer) = write_spec(st, Kind::Experiments, name, &spec, Some(expect), dry_run, true).await?;
    // Every variant's weight after the write: the ones not named keep theirs, and the shares
    // are relative to the sum of all of them.
    let variants = spec["variants"].as_array().map(Vec::as_slice).unwrap_or_default();
    let all: Vec<Value> = variants.iter().map(|v| json!({ "name": v["name"], "weight": v["weight"] })).collect();
    answer["variants"] = Value::Array(all);
    Ok(Json(answer))
}
