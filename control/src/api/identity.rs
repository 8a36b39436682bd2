//! The mesh CA's API: `GET /v1/identity/ca` (the root sidecars and `weftctl` trust),
//! `POST /v1/identity/tokens` (a join token for one SPIFFE ID, shown once: admin),
//! `GET /v1/identity/tokens` (the tokens, never their secrets) and
//! `DELETE /v1/identity/tokens/{id}` (revoke: renewals with it are refused from then on).

use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::extract::{Path, State};
use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState};
use crate::identity::{JoinToken, TOKENS_KIND, TokenRecord, parse_identity, sha256_hex};
use crate::store::{Command, StoreError};

/// Join tokens live this long unless `ttl` says otherwise.
const DEFAULT_TOKEN_TTL: &str = "720h";

/// `GET /v1/identity/ca`.
pub async fn ca(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let ca = st.identity.ca().map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    let ca = ca.ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no mesh CA yet: the leader makes one within a second of its election"))?;
    Ok(Json(json!({
        "trust_domain": ca.trust_domain(),
        "cert_pem": ca.cert_pem(),
        "leaf_lifetime_s": st.identity.leaf_lifetime().as_secs(),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Create {
    identity: String,
    /// "24h", "30m"; "0" = never expires.
    ttl: Option<String>,
    #[serde(default)]
    description: String,
}

use weft_proxy::tls::unix_secs as unix;

/// `POST /v1/identity/tokens`: `{"identity": "ns/NS/sa/NAME" | "service/NAME" | "spiffe://…",
/// "ttl": "720h", "description": "…"}`.
pub async fn create(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<(StatusCode, Json<Value>)> {
    let c: Create = serde_json::from_slice(&body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("body: {e}")))?;
    let id = parse_identity(&c.identity, st.identity.trust_domain()).map_err(|e| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "identity", e))?;
    let ttl_text = c.ttl.as_deref().unwrap_or(DEFAULT_TOKEN_TTL);
    let ttl = weft_proxy::duration::parse(ttl_text).map_err(|e| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "ttl", e))?;
    let now = SystemTime::now();
    let token = JoinToken::generate();
    let record = TokenRecord {
        identity: id.to_string(),
        secret_sha256: sha256_hex(&token.secret),
        created: unix(now),
        expires: if ttl.is_zero() { 0 } else { unix(now + ttl) },
        description: c.description,
    };
    let value_json = serde_json::to_string(&record).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    st.node.write(Command::Put { kind: TOKENS_KIND.into(), name: token.id.clone(), value_json, expect_revision: Some(0) }).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": token.id,
            "token": token.to_string(),
            "identity": record.identity,
            "expires": record.expires,
            "note": "the token is shown only now; the control plane keeps a hash of it",
        })),
    ))
}

/// `GET /v1/identity/tokens`.
pub async fn list(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let mut items = Vec::new();
    for r in st.node.local().list(TOKENS_KIND).map_err(StoreError::from)? {
        let t: TokenRecord = serde_json::from_str(&r.value_json).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
        items.push(json!({"id": r.name, "identity": t.identity, "created": t.created, "expires": t.expires, "description": t.description}));
    }
    Ok(Json(json!({ "items": items })))
}

/// `DELETE /v1/identity/tokens/{id}`.
pub async fn revoke(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let revision = st
        .node
        .write(Command::Delete { kind: TOKENS_KIND.into(), name: id.clone(), expect_revision: None })
        .await
        .map_err(|e| match e {
            StoreError::Rejected(crate::store::CommandError::NotFound { .. }) => ApiError::field(StatusCode::NOT_FOUND, "id", format!("no join token {id:?}")),
            e => e.into(),
        })?;
    Ok(Json(json!({ "revoked": id, "revision": revision })))
}
