//! The trainer's loopback API, on the sidecar's admin address:
//!
//! - `GET /training/map` — this worker's view of the job's shard map (`rank` null = not a
//!   member: scaled away or declared dead; stop). `?after=R&wait=30s` long-polls: answers
//!   as soon as the map's revision passes `R`, or `204 No Content` when `wait` runs out.
//!   `404` while no map has been pushed (without `after`).
//! - `POST /training/ack` `{"version": V, "step": S}` — map V is in effect and the trainer is
//!   at step S (call it every step or so: it is the trainer's heartbeat).
//! - `POST /training/checkpoint` `{"version": V, "step": S, "location": "...", "final": false}`
//!   — a checkpoint of this rank is written.
//! - `GET /training/status` — what the sidecar reports about its trainer.
//!
//! Errors are JSON `{"error", "field", "message"}` with a 4xx.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::json;

use super::Trainer;
use super::state::{Ack, Checkpoint, MAX_WAIT};
use crate::admin::json;

type Reply = Response<Full<Bytes>>;

/// Largest request body accepted.
const MAX_BODY: usize = 64 << 10;

/// Whether `path` is served here.
pub fn serves(path: &str) -> bool {
    path.starts_with("/training/")
}

pub async fn handle(t: &Trainer, req: Request<Incoming>) -> Response<Full<Bytes>> {
    t.state.lock().unwrap().touch(Instant::now());
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/training/map") => map(t, req.uri().query().unwrap_or("")).await,
        (Method::GET, "/training/status") => json(StatusCode::OK, t.state.lock().unwrap().status(Instant::now())),
        (Method::POST, "/training/ack") => match body::<Ack>(req).await {
            Ok(a) => answer(t.state.lock().unwrap().ack(&a).map(|()| json!({"ok": true, "version": a.version, "step": a.step}))),
            Err(r) => *r,
        },
        (Method::POST, "/training/checkpoint") => match body::<Checkpoint>(req).await {
            Ok(c) => {
                let (v, s) = (c.version, c.step);
                answer(t.state.lock().unwrap().checkpoint(c).map(|()| json!({"ok": true, "version": v, "step": s})))
            }
            Err(r) => *r,
        },
        (_, "/training/map" | "/training/status" | "/training/ack" | "/training/checkpoint") => {
            *error(StatusCode::METHOD_NOT_ALLOWED, "method", format!("{} is not allowed on {path}", req.method()))
        }
        _ => *error(
            StatusCode::NOT_FOUND,
            "path",
            format!("no training endpoint {path:?}; try /training/map /training/ack /training/checkpoint /training/status"),
        ),
    }
}

fn error(status: StatusCode, field: &str, message: String) -> Box<Reply> {
    Box::new(json(status, json!({"error": status.canonical_reason().unwrap_or("error"), "field": field, "message": message})))
}

fn answer(r: Result<serde_json::Value, super::state::Refused>) -> Response<Full<Bytes>> {
    match r {
        Ok(v) => json(StatusCode::OK, v),
        // A stale map version conflicts with what the sidecar holds; anything else is invalid.
        Err(e) if e.field == "version" => *error(StatusCode::CONFLICT, e.field, e.message),
        Err(e) => *error(StatusCode::UNPROCESSABLE_ENTITY, e.field, e.message),
    }
}

async fn body<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, Box<Reply>> {
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| error(StatusCode::PAYLOAD_TOO_LARGE, "body", format!("unreadable or over {MAX_BODY} bytes: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| error(StatusCode::BAD_REQUEST, "body", format!("invalid JSON: {e}")))
}

/// An open long poll; closed on drop, also when the trainer hangs up and the request's
/// future is dropped mid-wait (a dead trainer must not look alive forever).
struct Poll<'a>(&'a Trainer);

impl<'a> Poll<'a> {
    fn open(t: &'a Trainer) -> Poll<'a> {
        t.state.lock().unwrap().polling(true, Instant::now());
        Poll(t)
    }
}

impl Drop for Poll<'_> {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().polling(false, Instant::now());
    }
}

/// `after` and `wait` from the query string.
fn poll_args(query: &str) -> Result<(Option<u64>, Duration), Box<Reply>> {
    let (mut after, mut wait) = (None, Duration::ZERO);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "after" => {
                after = Some(v.parse().map_err(|_| error(StatusCode::BAD_REQUEST, "after", format!("{v:?} is not a revision number")))?);
            }
            "wait" => {
                wait = crate::duration::parse(v).map_err(|e| error(StatusCode::BAD_REQUEST, "wait", e))?;
                if wait > MAX_WAIT {
                    return Err(error(StatusCode::BAD_REQUEST, "wait", format!("{v} is over the {MAX_WAIT:?} maximum")));
                }
            }
            other => return Err(error(StatusCode::BAD_REQUEST, "query", format!("unknown parameter {other:?} (after, wait)"))),
        }
    }
    Ok((after, wait))
}

async fn map(t: &Trainer, query: &str) -> Response<Full<Bytes>> {
    let (after, wait) = match poll_args(query) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let newer = |rev: u64| after.is_none_or(|a| rev > a) && rev > 0;
    let mut rx = t.changed.subscribe();
    if !newer(*rx.borrow_and_update()) && !wait.is_zero() {
        let _open = Poll::open(t);
        let _ = tokio::time::timeout(wait, rx.wait_for(|r| newer(*r))).await;
    }
    let s = t.state.lock().unwrap();
    match s.view() {
        Some(v) if newer(s.revision()) => json(StatusCode::OK, v),
        _ if after.is_some() => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        _ => *error(StatusCode::NOT_FOUND, "map", format!("no shard map for job {:?} has been pushed to this sidecar yet", s.job)),
    }
}
