//! The sync (`weft-k8s sync`): weft's custom resources and meshed Services' EndpointSlices,
//! watched on the API server, written to weft-control through its REST API (the same one
//! `weftctl` uses, so every write is validated and replicated as any other).
//!
//! - A custom resource is PUT as the weft resource of its name (references to resources not
//!   written yet are allowed: `kubectl apply` sends documents in any order) and its `status`
//!   says what weft-control answered ([`crate::status`]). A finalizer deletes the weft resource
//!   before the object goes, so a delete while the sync is down is not missed.
//! - EndpointSlice events become the endpoint sets of [`crate::endpoints`]; a cluster the sync
//!   feeds is created with weft's defaults if it does not exist (write your own to tune it).
//!
//! weft-control unreachable: the write is retried (requeued, or retried with backoff for
//! endpoints); nothing is dropped silently, every failure is logged with the resource.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use http::Method;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use kube::core::object::{HasSpec, HasStatus};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use weft_control::cli::client::{Client, Response};
use weft_control::resources::Kind;

use crate::crds::{self, SyncStatus};
use crate::endpoints::{Change, Endpoints, MESH_LABEL};
use crate::status;

/// The finalizer the sync puts on the custom resources it has written.
pub const FINALIZER: &str = "weft.dev/sync";
/// The field manager of the status the sync writes.
pub const MANAGER: &str = "weft-k8s";
/// How often an accepted resource is written again (weft-control answers `changed: false` when
/// it already holds it; a restored store gets it back).
const RESYNC: Duration = Duration::from_secs(300);
/// How often a rollout's status is refreshed (its step and weight move on their own).
const ROLLOUT_RESYNC: Duration = Duration::from_secs(15);

/// weft-control couldn't be reached, or the Kubernetes API refused a status write: retried.
#[derive(Debug)]
pub struct SyncError(pub String);

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SyncError {}

/// weft-control's REST API (one client, requests one at a time).
pub struct Weft {
    client: tokio::sync::Mutex<Client>,
}

impl Weft {
    pub fn new(client: Client) -> Weft {
        Weft { client: tokio::sync::Mutex::new(client) }
    }

    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Response, SyncError> {
        self.client.lock().await.request(method, path, body, None).await.map_err(|e| SyncError(e.to_string()))
    }
}

/// Write one custom resource to weft; the status to record. `Err` only when weft-control did
/// not answer (the caller retries).
pub async fn write<K>(weft: &Weft, cr: &K) -> Result<SyncStatus, SyncError>
where
    K: Resource<DynamicType = ()> + HasSpec,
    K::Spec: Serialize,
{
    let generation = cr.meta().generation;
    let (kind, name, spec) = match crds::to_weft(cr) {
        Ok(w) => w,
        Err(message) => {
            return Ok(SyncStatus { phase: "Refused".into(), message, observed_generation: generation, ..Default::default() });
        }
    };
    let r = weft.call(Method::PUT, &format!("/v1/{kind}/{name}?allow_dangling=true"), Some(&spec)).await?;
    let mut st = status::of_write(r.status.as_u16(), &r.body, &r.error_line(), generation);
    if st.phase == "Accepted" {
        // What became of it: best effort, the write itself is what counts.
        if let Ok(p) = weft.call(Method::GET, "/v1/proxies", None).await {
            st.nacks = status::nacks_for(&p.body, &name);
        }
        if kind == Kind::Rollouts
            && let Ok(ro) = weft.call(Method::GET, &format!("/v1/rollout/{name}"), None).await
        {
            st = status::with_rollout(st, &ro.body);
        }
    }
    Ok(st)
}

/// Delete the weft resource of a custom resource being deleted. Already gone is fine; any
/// other refusal keeps the finalizer (and says why) rather than leave weft serving it.
pub async fn delete<K: Resource<DynamicType = ()>>(weft: &Weft, cr: &K) -> Result<(), SyncError> {
    let kind = crds::kind_of(&K::kind(&())).ok_or_else(|| SyncError(format!("{} is not a weft kind", K::kind(&()))))?;
    let name = cr.meta().name.clone().unwrap_or_default();
    let r = weft.call(Method::DELETE, &format!("/v1/{kind}/{name}"), None).await?;
    match r.status.as_u16() {
        200..300 | 404 => Ok(()),
        _ => Err(SyncError(format!("DELETE {kind}/{name}: {}", r.error_line()))),
    }
}

/// Write one endpoint change, creating the cluster it feeds when missing.
pub async fn write_change(weft: &Weft, c: &Change) -> Result<(), SyncError> {
    match c {
        Change::Put(spec) => {
            let name = &spec.name;
            let cluster = weft.call(Method::GET, &format!("/v1/clusters/{name}"), None).await?;
            if cluster.status.as_u16() == 404 {
                let r = weft.call(Method::PUT, &format!("/v1/clusters/{name}"), Some(&json!({ "name": name }))).await?;
                if !r.status.is_success() {
                    return Err(SyncError(format!("PUT clusters/{name}: {}", r.error_line())));
                }
            }
            let body = serde_json::to_value(spec).expect("an endpoints spec always serializes");
            let r = weft.call(Method::PUT, &format!("/v1/endpoints/{name}?allow_dangling=true"), Some(&body)).await?;
            if r.status.is_success() { Ok(()) } else { Err(SyncError(format!("PUT endpoints/{name}: {}", r.error_line()))) }
        }
        Change::Delete(name) => {
            let r = weft.call(Method::DELETE, &format!("/v1/endpoints/{name}"), None).await?;
            match r.status.as_u16() {
                200..300 | 404 => Ok(()),
                _ => Err(SyncError(format!("DELETE endpoints/{name}: {}", r.error_line()))),
            }
        }
    }
}

/// Feed EndpointSlice watch events into weft until the stream ends. A write that fails is
/// retried with backoff (1 s doubling, 5 tries), then left for the next event to redo.
pub async fn endpoints<S>(weft: &Weft, events: S)
where
    S: futures_util::Stream<Item = Result<watcher::Event<EndpointSlice>, watcher::Error>>,
{
    let mut state = Endpoints::new();
    let mut events = std::pin::pin!(events);
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "EndpointSlice watch failed; retrying");
                continue;
            }
        };
        let (changes, skipped) = state.apply(ev);
        for s in skipped {
            tracing::warn!(slice = %s.slice, why = %s.why, "EndpointSlice skipped");
        }
        for c in changes {
            let cluster = match &c {
                Change::Put(s) => s.name.clone(),
                Change::Delete(n) => n.clone(),
            };
            let mut delay = Duration::from_secs(1);
            let mut tries = 0;
            loop {
                match write_change(weft, &c).await {
                    Ok(()) => {
                        tracing::info!(%cluster, "endpoints synced");
                        break;
                    }
                    Err(e) if tries < 5 => {
                        tracing::warn!(%cluster, error = %e, "endpoints not written; retrying");
                        tries += 1;
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                    Err(e) => {
                        tracing::error!(%cluster, error = %e, "endpoints not written; the next change to it retries");
                        state.forget_written(&cluster);
                        break;
                    }
                }
            }
        }
    }
}

/// What every reconcile needs.
pub struct Ctx {
    pub kube: kube::Client,
    pub weft: Arc<Weft>,
}

async fn reconcile<K>(obj: Arc<K>, ctx: Arc<Ctx>) -> Result<Action, finalizer::Error<SyncError>>
where
    K: Resource<DynamicType = ()> + HasSpec + HasStatus<Status = SyncStatus> + Clone + DeserializeOwned + Serialize + Debug,
    K::Spec: Serialize,
{
    let api: Api<K> = Api::all(ctx.kube.clone());
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            finalizer::Event::Apply(o) => {
                let st = write(&ctx.weft, &*o).await?;
                if o.status() != Some(&st) {
                    tracing::info!(kind = %K::kind(&()), name = %o.name_any(), phase = %st.phase, message = %st.message, "synced");
                    let body = json!({ "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": st });
                    api.patch_status(&o.name_any(), &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
                        .await
                        .map_err(|e| SyncError(format!("status of {} {}: {e}", K::kind(&()), o.name_any())))?;
                }
                Ok(Action::requeue(if K::kind(&()) == "Rollout" { ROLLOUT_RESYNC } else { RESYNC }))
            }
            finalizer::Event::Cleanup(o) => {
                delete(&ctx.weft, &*o).await?;
                tracing::info!(kind = %K::kind(&()), name = %o.name_any(), "deleted from weft");
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn retry_later<K: Resource<DynamicType = ()>>(obj: Arc<K>, e: &finalizer::Error<SyncError>, _: Arc<Ctx>) -> Action {
    tracing::warn!(kind = %K::kind(&()), name = obj.meta().name.as_deref().unwrap_or(""), error = %e, "sync failed; retrying in 10 s");
    Action::requeue(Duration::from_secs(10))
}

async fn control<K>(ctx: Arc<Ctx>)
where
    K: Resource<DynamicType = ()>
        + HasSpec
        + HasStatus<Status = SyncStatus>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + Send
        + Sync
        + 'static,
    K::Spec: Serialize,
{
    let api: Api<K> = Api::all(ctx.kube.clone());
    Controller::new(api, watcher::Config::default())
        .run(reconcile::<K>, retry_later::<K>, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile");
            }
        })
        .await;
}

/// Run every watch until the process stops.
pub async fn run(kube: kube::Client, weft: Arc<Weft>) {
    let slices: Api<EndpointSlice> = Api::all(kube.clone());
    let selector = format!("{MESH_LABEL}=true");
    let slice_events = watcher::watcher(slices, watcher::Config::default().labels(&selector)).default_backoff();
    let ctx = Arc::new(Ctx { kube, weft: weft.clone() });
    tokio::join!(
        control::<crds::Route>(ctx.clone()),
        control::<crds::Experiment>(ctx.clone()),
        control::<crds::Rollout>(ctx.clone()),
        control::<crds::Autoscaler>(ctx.clone()),
        control::<crds::TrainingJob>(ctx.clone()),
        endpoints(&weft, slice_events),
    );
}
