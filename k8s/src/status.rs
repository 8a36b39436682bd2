//! What the sync writes back into a custom resource's `status`, from weft-control's answers.
//! Pure: JSON in, [`SyncStatus`] out.

use serde_json::Value;

use crate::crds::SyncStatus;

/// The status for weft-control's answer to the PUT of a resource (`status` is the HTTP status,
/// `body` its JSON, `error_line` the client's one-line rendering of an error).
pub fn of_write(status: u16, body: &Value, error_line: &str, generation: Option<i64>) -> SyncStatus {
    if (200..300).contains(&status) {
        let warnings: Vec<&str> = body["warnings"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let message = if warnings.is_empty() {
            "written to weft's store".to_string()
        } else {
            format!("written to weft's store; {}", warnings.join("; "))
        };
        SyncStatus {
            phase: "Accepted".into(),
            message,
            observed_generation: generation,
            revision: body["revision"].as_u64(),
            ..SyncStatus::default()
        }
    } else {
        SyncStatus {
            phase: "Refused".into(),
            message: error_line.to_string(),
            observed_generation: generation,
            ..SyncStatus::default()
        }
    }
}

/// The sidecars whose last NACK (from `GET /v1/proxies`) names the resource, as `node: error`.
/// A NACK is per resource type and version, so the error's wording is what ties it to one name.
pub fn nacks_for(proxies: &Value, name: &str) -> Vec<String> {
    let quoted = [format!("\"{name}\""), format!("'{name}'"), format!(" {name}:"), format!(" {name} ")];
    let mut out: Vec<String> = proxies["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let err = p["nack"]["error"].as_str()?;
            quoted.iter().any(|q| err.contains(q.as_str())).then(|| format!("{}: {err}", p["node_id"].as_str().unwrap_or("?")))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A rollout's engine phase, step and weight, from `GET /v1/rollout/NAME`.
pub fn with_rollout(mut s: SyncStatus, rollout: &Value) -> SyncStatus {
    let state = &rollout["rollout"]["state"];
    s.rollout_phase = state["phase"].as_str().map(str::to_string);
    s.rollout_step = state["step"].as_u64().and_then(|v| u32::try_from(v).ok());
    s.rollout_weight = state["weight"].as_u64().and_then(|v| u32::try_from(v).ok());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_accepted_write_carries_its_revision_and_warnings() {
        let s = of_write(200, &json!({"revision": 42, "warnings": ["experiment ranker-ab does not exist yet"]}), "", Some(3));
        assert_eq!((s.phase.as_str(), s.revision, s.observed_generation), ("Accepted", Some(42), Some(3)));
        assert!(s.message.contains("ranker-ab does not exist yet"), "{}", s.message);
    }

    #[test]
    fn a_refused_write_says_why() {
        let s = of_write(422, &json!({"error": "bad", "field": "routes[0].retry.attempts"}), "bad (field: routes[0].retry.attempts)", Some(1));
        assert_eq!(s.phase, "Refused");
        assert!(s.message.contains("routes[0].retry.attempts"));
        assert_eq!(s.revision, None);
    }

    #[test]
    fn only_nacks_naming_the_resource_count() {
        let proxies = json!({"items": [
            {"node_id": "ranker-a-1.models", "nack": {"error": "service \"ranker\": route infer: unknown experiment"}},
            {"node_id": "ranker-a-2.models", "nack": {"error": "service \"ranker-canary\": bad"}},
            {"node_id": "ranker-b-1.models", "nack": null},
        ]});
        assert_eq!(nacks_for(&proxies, "ranker"), ["ranker-a-1.models: service \"ranker\": route infer: unknown experiment"]);
    }

    #[test]
    fn a_rollouts_state_is_copied() {
        let s = with_rollout(SyncStatus::default(), &json!({"rollout": {"state": {"phase": "progressing", "step": 1, "weight": 25}}}));
        assert_eq!((s.rollout_phase.as_deref(), s.rollout_step, s.rollout_weight), (Some("progressing"), Some(1), Some(25)));
    }
}
