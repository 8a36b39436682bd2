//! `GET /v1/rollout/{experiment}`: the experiment's per-variant numbers (requests, error rate
//! with its Wilson interval, p50/p95/p99 from the merged latency sketches with
//! distribution-free intervals, SRM against the current weights) and its rollout's state,
//! verdict and evidence. `POST /v1/rollout/{experiment}/{promote|rollback|pause|resume}`: an
//! operator's command. Both run on the leader (the gate forwards them), where the engine lives.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use http::StatusCode;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState};
use crate::experiments::rollout::{Command, RolloutSpec};
use crate::experiments::stats::{Z95, quantile_ci, srm_weighted, wilson};
use crate::reports::ExperimentLoad;
use crate::resources::Kind;
use crate::store::StoreError;

fn variant_row(l: &ExperimentLoad) -> Value {
    let n = l.requests;
    let (elo, ehi) = wilson(l.errors, n, Z95);
    let count = l.latency.count();
    let pct = |q: f64| {
        if count == 0 {
            return Value::Null;
        }
        let (lo, hi) = quantile_ci(count as usize, q, Z95);
        let at = |rank: usize| l.latency.quantile(rank as f64 / (count - 1).max(1) as f64);
        json!({"ms": l.latency.quantile(q), "lo": at(lo), "hi": at(hi)})
    };
    json!({
        "variant": l.variant,
        "requests": n,
        "errors": l.errors,
        "error_rate": if n > 0 { l.errors as f64 / n as f64 } else { 0.0 },
        "error_rate_ci": [elo, ehi],
        "p50": pct(0.5),
        "p95": pct(0.95),
        "p99": pct(0.99),
    })
}

/// `GET /v1/rollout/{experiment}`.
pub async fn status(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    st.node.linearize().await?;
    let sm = st.node.local();
    let Some(exp) = sm.get(Kind::Experiments.as_str(), &name).map_err(StoreError::from)? else {
        return Err(ApiError::field(StatusCode::NOT_FOUND, "name", format!("experiments/{name} does not exist")));
    };
    let exp: weft_proxy::config::Experiment =
        serde_json::from_str(&exp.value_json).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    let token = st.tokens.admin_token().and_then(|t| http::HeaderValue::from_str(&format!("Bearer {t}")).ok());
    let (by_node, unreachable) = super::every_nodes_loads(&st, token.as_ref()).await;
    let merged: BTreeMap<String, ExperimentLoad> =
        super::merge_loads(by_node.into_iter().flat_map(|(_, items)| items).filter(|l| l.experiment == name))
            .into_iter()
            .map(|l| (l.variant.clone(), l))
            .collect();
    let variants: Vec<Value> = exp
        .variants
        .iter()
        .map(|v| {
            let l = merged.get(&v.name).cloned().unwrap_or_else(|| ExperimentLoad { variant: v.name.clone(), ..Default::default() });
            let mut row = variant_row(&l);
            row["weight"] = json!(v.weight);
            row
        })
        .collect();
    let counts: Vec<u64> = exp.variants.iter().map(|v| merged.get(&v.name).map_or(0, |l| l.requests)).collect();
    let weights: Vec<f64> = exp.variants.iter().map(|v| f64::from(v.weight)).collect();
    let srm = srm_weighted(&counts, &weights);
    let spec = sm
        .get(Kind::Rollouts.as_str(), &name)
        .map_err(StoreError::from)?
        .and_then(|r| serde_json::from_str::<RolloutSpec>(&r.value_json).ok());
    let (state, revision) = crate::rollouts::stored_state(&st, &name)?;
    Ok(Json(json!({
        "experiment": name,
        "variants": variants,
        // Cumulative since the control nodes started (the rollout's own counts, warm-up
        // excluded, are in `rollout.state`); against the weights now.
        "srm": {"chi2": srm.chi2, "p": srm.p, "ok": srm.ok},
        "rollout": spec.map(|s| json!({"spec": s, "state": state, "revision": revision})),
        "unreachable": unreachable,
    })))
}

/// `POST /v1/rollout/{experiment}/{action}`.
pub async fn command(
    State(st): State<Arc<AppState>>,
    Path((name, action)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let Some(cmd) = Command::parse(&action) else {
        return Err(ApiError::field(
            StatusCode::NOT_FOUND,
            "action",
            format!("{action:?} is not one of promote, rollback, pause, resume"),
        ));
    };
    st.node.linearize().await?;
    let spec = st
        .node
        .local()
        .get(Kind::Rollouts.as_str(), &name)
        .map_err(StoreError::from)?
        .and_then(|r| serde_json::from_str::<RolloutSpec>(&r.value_json).ok());
    let Some(spec) = spec else {
        return Err(ApiError::field(
            StatusCode::NOT_FOUND,
            "name",
            format!("no rollout of experiment {name:?} (apply a `kind: Rollout` named after the experiment)"),
        ));
    };
    let (stored, revision) = crate::rollouts::stored_state(&st, &name)?;
    let Some(mut state) = stored else {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("the rollout of {name:?} has not started yet; retry in a moment")));
    };
    let now = crate::rollouts::now_ms();
    let weight = state.command(cmd, now).map_err(|e| ApiError::new(StatusCode::CONFLICT, format!("{action}: {e}")))?;
    if let Some(w) = weight {
        crate::rollouts::set_weight(&st, &spec, &name, w).await.map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e))?;
    }
    let revision = crate::rollouts::save(&st, &name, &state, revision)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e))?;
    st.rollouts.forget(&name);
    Ok(Json(json!({"experiment": name, "revision": revision, "state": state})))
}
