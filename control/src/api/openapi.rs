//! The OpenAPI 3.1 document of the control API, served at `/openapi.json`. Written by hand
//! next to the handlers (one place to read), and checked by schemathesis in CI.

use axum::Json;
use serde_json::{Value, json};

use crate::resources::Kind;

fn error_responses() -> Value {
    let e = json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    json!({
        "400": e, "401": e, "403": e, "404": e, "405": e, "409": e, "422": e, "503": e,
    })
}

fn ok(schema: Value) -> Value {
    json!({"description": "OK", "content": {"application/json": {"schema": schema}}})
}

fn responses(schema: Value) -> Value {
    let mut r = error_responses();
    r["200"] = ok(schema);
    r
}

pub async fn document() -> Json<Value> {
    // From the kinds themselves, so a new kind cannot be left out of the document.
    let kinds = Kind::ALL.map(Kind::as_str);
    let kind = json!({"name": "kind", "in": "path", "required": true, "schema": {"type": "string", "enum": kinds}});
    let name = json!({"name": "name", "in": "path", "required": true,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,253}$"}});
    let consistency = json!({"name": "consistency", "in": "query", "required": false,
        "schema": {"type": "string", "enum": ["linearizable", "local"]}});
    let revision = json!({"name": "revision", "in": "query", "required": false,
        "description": "precondition: the current revision (0 = must not exist)", "schema": {"type": "integer", "minimum": 0}});
    let if_match = json!({"name": "If-Match", "in": "header", "required": false,
        "description": "precondition, like ?revision=", "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"}});
    let dry_run = json!({"name": "dry_run", "in": "query", "required": false, "schema": {"type": "boolean"}});
    let body = |schema: Value| json!({"required": true, "content": {"application/json": {"schema": schema}}});
    let item = json!({"$ref": "#/components/schemas/Item"});
    let write = json!({"$ref": "#/components/schemas/WriteResult"});
    let members = json!({"$ref": "#/components/schemas/Members"});
    let plan_request = json!({"$ref": "#/components/schemas/PlanRequest"});
    let plan_result = json!({"$ref": "#/components/schemas/PlanResult"});
    Json(json!({
        "openapi": "3.1.0",
        "info": {
            "title": "weft control API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Config resources of the weft mesh, replicated with Raft. Writes and linearizable reads on a follower are forwarded to the leader. Revisions are Raft log indexes.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {
                    "error": {"type": "string"}, "field": {"type": "string"}, "current_revision": {"type": "integer"}}},
                "Spec": {"type": "object", "description": "A section of the weft-proxy YAML config for this kind (see the config reference), or the kind's own spec (docs/control-api.md); `name` (a node status's `node`) may be omitted."},
                "Item": {"type": "object", "required": ["kind", "name", "revision", "spec"], "properties": {
                    "kind": {"type": "string"}, "name": {"type": "string"}, "revision": {"type": "integer"},
                    "spec": {"$ref": "#/components/schemas/Spec"}}},
                "WriteResult": {"type": "object", "required": ["kind", "name", "revision"], "properties": {
                    "kind": {"type": "string"}, "name": {"type": "string"}, "revision": {"type": "integer"},
                    "changed": {"type": "boolean"}, "warnings": {"type": "array", "items": {"type": "string"}}}},
                "PlanRequest": {"type": "object", "required": ["workloads"], "additionalProperties": false, "properties": {
                    "workloads": {"type": "array", "items": {"type": "object", "required": ["kind", "name"], "description": "kind: pod (cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec), replica (variant, base_model, base_bytes, delta_bytes, working_set_bytes, compute_milli, cpu_milli, memory_mib, priority, class, min_uptime_hours, gpu_spec, launch {cluster, base_path, delta_path, command, env, health_path, labels}) or gang (workers, gpus_per_worker, gpu_memory_bytes, cpu_milli, memory_mib, priority, class, topology, gpu_spec)",
                        "properties": {"kind": {"type": "string", "enum": ["pod", "replica", "gang"]}, "name": {"type": "string"}}}},
                    "nodes": {"type": "array", "items": {"type": "object"}, "description": "plan on these nodes instead of the stored inventory (plan only)"},
                    "preempt": {"type": "boolean"}}},
                "PlanResult": {"type": "object", "properties": {
                    "revision": {"type": "integer"}, "committed": {"type": "boolean"},
                    "placed": {"type": "array", "items": {"type": "object", "properties": {
                        "workload": {"type": "string"}, "kind": {"type": "string"}, "allocations": {"type": "array", "items": {"type": "object"}}}}},
                    "evicted": {"type": "array", "items": {"type": "string"}},
                    "unplaced": {"type": "array", "items": {"type": "object", "properties": {
                        "workload": {"type": "string"}, "reason": {"type": "string"}, "message": {"type": "string"}}}},
                    "warnings": {"type": "array", "items": {"type": "string"}}}},
                "Members": {"type": "object", "properties": {
                    "leader": {"type": ["integer", "null"]}, "term": {"type": "integer"},
                    "members": {"type": "array", "items": {"type": "object", "properties": {
                        "id": {"type": "integer"}, "addr": {"type": "string"}, "xds_addr": {"type": "string"}, "voter": {"type": "boolean"}}}}}},
            }
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/{kind}": {"get": {"summary": "List resources of a kind", "parameters": [kind, consistency],
                "responses": responses(json!({"type": "object", "properties": {"revision": {"type": "integer"}, "items": {"type": "array", "items": item}}}))}},
            "/v1/{kind}/{name}": {
                "get": {"summary": "Read one resource", "parameters": [kind, name, consistency], "responses": responses(item.clone())},
                "put": {"summary": "Create or replace a resource", "parameters": [kind, name, revision, if_match, dry_run],
                    "requestBody": body(json!({"$ref": "#/components/schemas/Spec"})), "responses": responses(write.clone())},
                "delete": {"summary": "Delete a resource (its history is kept)", "parameters": [kind, name, revision, if_match, dry_run],
                    "responses": responses(write.clone())}},
            "/v1/{kind}/{name}/history": {"get": {"summary": "Every revision of a resource, oldest first", "parameters": [kind, name, consistency],
                "responses": responses(json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
                    "revision": {"type": "integer"}, "spec": {"type": ["object", "null"]}}}}}}))}},
            "/v1/{kind}/{name}/rollback": {"post": {"summary": "Restore the spec a resource had at a revision (a new write)", "parameters": [kind, name],
                "requestBody": body(json!({"type": "object", "required": ["revision"], "properties": {"revision": {"type": "integer", "minimum": 1}}, "additionalProperties": false})),
                "responses": responses(write.clone())}},
            "/v1/experiments/{name}/weights": {"post": {"summary": "Set variant weights (one conditional write)", "parameters": [name, revision, if_match, dry_run],
                "requestBody": body(json!({"type": "object", "required": ["weights"], "additionalProperties": false, "properties": {
                    "weights": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}}}})),
                "responses": responses(write)}},
            "/v1/members": {
                "get": {"summary": "Members of the control-plane cluster", "responses": responses(members.clone())},
                "post": {"summary": "Add a member (learner, caught up, then voter)", "requestBody": body(json!({"type": "object", "required": ["id", "addr"], "additionalProperties": false, "properties": {
                    "id": {"type": "integer", "minimum": 1}, "addr": {"type": "string"}, "xds_addr": {"type": "string"}, "voter": {"type": "boolean"},
                    "history_revisions": {"type": "integer", "minimum": 0, "description": "the joining node's --history-revisions; 409 unless it equals the leader's"}}})),
                    "responses": responses(members.clone())}},
            "/v1/members/{id}": {"delete": {"summary": "Remove a member", "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "integer", "minimum": 1}}],
                "responses": responses(members)}},
            "/v1/schedule/plan": {"post": {"summary": "Where workloads would be placed, and why the others cannot be (dry run)",
                "requestBody": body(plan_request.clone()), "responses": responses(plan_result.clone())}},
            "/v1/schedule/apply": {"post": {"summary": "Plan on the stored inventory and commit the placements (pushed over xDS as weft.v1.Placement)",
                "requestBody": body(plan_request), "responses": responses(plan_result)}},
            "/v1/autoscale/status": {"get": {"summary": "Per autoscaler: demand, forecast, ready replicas, the decision and why (from the leader's decision loop)",
                "responses": responses(json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}}}))}},
            "/v1/autoscale/preemption": {"post": {"summary": "A spot preemption notice: critical replicas replaced on on-demand at once",
                "requestBody": body(json!({"type": "object", "additionalProperties": false, "properties": {
                    "node": {"type": "string"}, "autoscaler": {"type": "string"},
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}, "notice_s": {"type": "number", "minimum": 0}, "checkpoint_after_steps": {"type": "integer", "minimum": 0, "maximum": 18446744073709551615u64}}})),
                "responses": responses(json!({"type": "object", "properties": {"revision": {"type": "integer"}, "replaced": {"type": "array"}}}))}},
            "/v1/load": {"get": {"summary": "Per experiment variant: cumulative requests, errors and latency sketch reported by the sidecars (this node's, or merged over every node)",
                "parameters": [{"name": "scope", "in": "query", "required": false, "schema": {"type": "string", "enum": ["cluster", "local"]}},
                    {"name": "window", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 0, "maximum": 18446744073709551615u64}}],
                "responses": responses(json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}}}))}},
            "/v1/rollout/{name}": {"get": {"summary": "An experiment's per-variant numbers (error rate and p50/p95/p99 with intervals), SRM, and its rollout's state, verdict and evidence",
                "parameters": [name.clone()], "responses": responses(json!({"type": "object"}))}},
            "/v1/rollout/{name}/{action}": {"post": {"summary": "Operator command on an experiment's rollout",
                "parameters": [name.clone(), {"name": "action", "in": "path", "required": true, "schema": {"type": "string", "enum": ["promote", "rollback", "pause", "resume"]}}],
                "responses": responses(json!({"type": "object"}))}},
            "/v1/training/{name}": {"get": {"summary": "A training job and its current shard map per rank",
                "parameters": [name.clone()], "responses": responses(json!({"type": "object"}))}},
            "/v1/training/{name}/scale": {"post": {"summary": "Set a training job's worker count (the leader computes the next shard map)",
                "parameters": [name.clone()],
                "requestBody": body(json!({"type": "object", "required": ["workers"], "additionalProperties": false, "properties": {
                    "workers": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}}})),
                "responses": responses(json!({"type": "object"}))}},
            "/v1/training/{name}/checkpoint": {"post": {"summary": "Ask every rank of a training job to checkpoint at a step the control plane picks, a few steps past the furthest rank",
                "parameters": [name.clone()],
                "requestBody": body(json!({"type": "object", "additionalProperties": false, "properties": {
                    "after_steps": {"type": "integer", "minimum": 0, "maximum": 18446744073709551615u64}}})),
                "responses": responses(json!({"type": "object"}))}},
            "/v1/status": {"get": {"summary": "This node's Raft role, term and applied index", "responses": responses(json!({"type": "object"}))}},
            "/v1/proxies": {"get": {"summary": "Connected sidecars: control node, ACKed versions, last NACK", "parameters": [
                {"name": "scope", "in": "query", "required": false, "schema": {"type": "string", "enum": ["cluster", "local"]}}],
                "responses": responses(json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}}}))}},
        }
    }))
}
