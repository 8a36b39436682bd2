//! A model server's load, read from its Prometheus `/metrics` in the formats the real servers
//! write: vLLM (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:gpu_cache_usage_perc` or, from vLLM 0.10, `vllm:kv_cache_usage_perc`, and
//! `vllm:lora_requests_info` whose labels list the running and waiting adapters), TGI
//! (`tgi_queue_size`, `tgi_batch_current_size`) and Triton
//! (`nv_inference_pending_request_count`). Pure: the scraper hands it the text.

use std::collections::BTreeSet;

/// One scrape of one endpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signals {
    /// Requests queued, not yet scheduled.
    pub waiting: f64,
    /// Requests in the running batch.
    pub running: f64,
    /// KV-cache use in [0, 1]; `None` when the server does not say (TGI, Triton).
    pub kv_usage: Option<f64>,
    /// Adapters in the running batch or queued for it: loaded, or being loaded.
    pub adapters: BTreeSet<String>,
    /// Adapters the server holds at once (`max_lora`); `None` when not said.
    pub max_adapters: Option<u32>,
}

/// One sample: metric name, labels, value.
struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

/// Parses one exposition line; `None` for comments, blanks and lines it cannot read.
fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].find('}')?;
            (&line[..open], &line[open + 1..close], &line[close + 1..])
        }
        None => {
            let space = line.find(char::is_whitespace)?;
            (&line[..space], "", &line[space..])
        }
    };
    // The value, then an optional timestamp.
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample { name, labels, value })
}

/// The value of label `key` in a `{a="x",b="y"}` body (escapes are not expected in these).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let k = rest[..eq].trim().trim_start_matches(',').trim();
        let after = rest[eq + 1..].strip_prefix('"')?;
        let end = after.find('"')?;
        if k == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}

/// Reads the signals out of a `/metrics` text. Several series of one gauge (one per model
/// name) are summed; of `vllm:lora_requests_info` the newest series counts (its value is the
/// time it was written). Errors when the text holds none of the known gauges, so a wrong
/// `metrics_path` is reported rather than read as an idle server.
pub fn parse(text: &str) -> Result<Signals, String> {
    let mut s = Signals::default();
    let mut known = false;
    let mut newest_lora = f64::NEG_INFINITY;
    for smp in text.lines().filter_map(sample) {
        match smp.name {
            "vllm:num_requests_waiting" | "tgi_queue_size" | "nv_inference_pending_request_count" => s.waiting += smp.value,
            "vllm:num_requests_running" | "tgi_batch_current_size" => s.running += smp.value,
            "vllm:gpu_cache_usage_perc" | "vllm:kv_cache_usage_perc" => {
                s.kv_usage = Some(s.kv_usage.unwrap_or(0.0).max(smp.value.clamp(0.0, 1.0)));
            }
            "vllm:lora_requests_info" => {
                if smp.value >= newest_lora {
                    newest_lora = smp.value;
                    s.adapters = ["running_lora_adapters", "waiting_lora_adapters"]
                        .iter()
                        .filter_map(|k| label(smp.labels, k))
                        .flat_map(|list| list.split(','))
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(String::from)
                        .collect();
                    s.max_adapters = label(smp.labels, "max_lora").and_then(|m| m.parse().ok());
                }
            }
            _ => continue,
        }
        known = true;
    }
    if known {
        Ok(s)
    } else {
        Err("no vLLM, TGI or Triton load gauge (vllm:num_requests_waiting, tgi_queue_size, nv_inference_pending_request_count) in the metrics".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a vLLM 0.9 server writes (trimmed): two adapter-info series, the newer one counts.
    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="llama"} 0.42
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters="code"} 1.8e9
"#;

    #[test]
    fn reads_vllm_queue_kv_cache_and_adapters() {
        let s = parse(VLLM).unwrap();
        assert_eq!((s.waiting, s.running), (7.0, 3.0));
        assert_eq!(s.kv_usage, Some(0.42));
        assert_eq!(s.adapters, BTreeSet::from(["sql".to_string(), "code".to_string()]), "the newest series, running and waiting");
        assert_eq!(s.max_adapters, Some(4));
    }

    #[test]
    fn reads_the_newer_vllm_kv_name_tgi_and_triton() {
        let v = parse("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.9\nvllm:num_requests_waiting 0\n").unwrap();
        assert_eq!(v.kv_usage, Some(0.9));
        let tgi = parse("tgi_queue_size 5\ntgi_batch_current_size 12\n").unwrap();
        assert_eq!((tgi.waiting, tgi.running, tgi.kv_usage), (5.0, 12.0, None));
        let triton = parse("nv_inference_pending_request_count{model=\"a\",version=\"1\"} 2\nnv_inference_pending_request_count{model=\"b\",version=\"1\"} 1\n").unwrap();
        assert_eq!(triton.waiting, 3.0, "summed over models");
    }

    #[test]
    fn a_page_without_load_gauges_is_an_error_not_an_idle_server() {
        let e = parse("# HELP up\nprocess_cpu_seconds_total 4\n").unwrap_err();
        assert!(e.contains("vllm:num_requests_waiting"), "{e}");
        assert!(parse("").is_err());
    }
}
