#!/usr/bin/env python3
"""Mutation fuzz of weft-control's REST API, the complement of schemathesis (which only knows
the OpenAPI document's generic `spec` object): a valid seed spec per kind, every number and
duration in it replaced in turn by extremes (0, -1, 2^31, 2^32, 2^53, 2^63, 2^64, 1e308, ...) and
PUT; then the POST endpoints that take numbers (preemption notices, checkpoint requests,
schedule plans and applies) with the same extremes. Accepted specs get a moment under the
leader's loops (autoscaler every 0.2 s, placement, training, rollouts). Fails on a 5xx other
than 503, on the node exiting, or on a panic in its log.

Usage: scripts/api-mutate.py target/debug/weft-control   (scripts/api-fuzz.sh runs it)
"""
import atexit, copy, json, os, shutil, subprocess, sys, time, urllib.request, urllib.error, socket, tempfile

BIN = sys.argv[1]
SETTLE_S = float(os.environ.get("API_MUTATE_SETTLE_S", "0.25"))
work = tempfile.mkdtemp()
atexit.register(shutil.rmtree, work, True)

def free():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

api, xds = free(), free()
log = open(f"{work}/node.log", "w")
node = subprocess.Popen([BIN, "--id", "1", "--listen", f"127.0.0.1:{api}", "--xds-listen", f"127.0.0.1:{xds}",
                         "--data-dir", f"{work}/data", "--init", "--autoscale-interval-s", "0.2"], stdout=log, stderr=log)
atexit.register(node.kill)
url = f"http://127.0.0.1:{api}"

def req(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(url + path, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

for _ in range(100):
    try:
        if req("GET", "/v1/status")[0] == 200: break
    except Exception: pass
    time.sleep(0.1)

seeds = {
    "clusters": ("c1", {"endpoints": ["127.0.0.1:8001"], "connect_timeout": "1s", "max_idle_per_endpoint": 8,
                 "circuit_breaker": {"max_connections": 100, "max_pending": 100, "max_requests": 100, "max_retries": 3,
                                     "error_rate": {"threshold_pct": 50, "min_requests": 10, "window": "10s", "open_duration": "5s", "half_open_probes": 2}},
                 "outlier": {"consecutive_5xx": 5, "consecutive_gateway_errors": 5, "base_ejection_time": "30s", "max_ejection_time": "300s", "max_ejection_pct": 50}}),
    "experiments": ("e1", {"variants": [{"name": "a", "cluster": "c1", "weight": 50, "max_concurrency": 10, "max_pending": 10},
                                        {"name": "b", "cluster": "c1", "weight": 50}],
                           "shadow": {"cluster": "c1", "fraction": 0.5, "max_body_bytes": 1024, "timeout": "1s"}}),
    "services": ("s1", {"hosts": ["chat"], "routes": [{"name": "r", "match": {"path_prefix": "/"}, "experiment": "e1", "timeout": "5s",
                  "per_try_timeout": "1s", "idle_timeout": "5s",
                  "retry": {"attempts": 3, "backoff_base": "10ms", "backoff_max": "1s", "budget_ratio": 0.2, "budget_min_per_sec": 10, "buffer_bytes": 65536}}]}),
    "nodes": ("n1", {"cpu_milli": 64000, "memory_mib": 512000, "gpu_model": "A100", "gpu_count": 4, "gpu_memory_bytes": 85899345920,
                     "price_per_hour": 3.0, "pool": "spot", "expected_uptime_hours": 20}),
    "autoscalers": ("a1", {"variant": "a", "capacity_rps": 10, "cold_start_s": 30, "min_replicas": 1, "max_replicas": 20, "criticality": 1.0,
                           "backlog_drain_s": 30, "price_per_hour": 3.0, "spot": {"price_per_hour": 1.0, "preemptions_per_hour": 0.01},
                           "budget": {"name": "b", "monthly_usd": 1000},
                           "placement": {"base_model": "m", "base_bytes": 17179869184, "delta_bytes": 1073741824, "working_set_bytes": 4294967296,
                                         "compute_milli": 500, "cpu_milli": 1000, "memory_mib": 4096, "priority": 1}}),
    "rollouts": ("e1", {"baseline": "a", "candidate": "b", "steps": [1, 10, 50, 100], "min_per_step": 100,
                        "warmup_s": 5, "max_error_increase": 0.01, "max_slow_increase": 0.01, "latency_threshold_ms": 100, "alpha": 0.05}),
    "trainingjobs": ("t1", {"workers": 4, "shard_sizes": [100, 200, 300, 400, 500, 600, 700, 800], "global_batch": 64, "max_micro_batch": 8,
                            "checkpoint_every": 10, "dead_after_s": 30, "start_grace_s": 300, "rescale_wait_s": 60, "slack": 0.1,
                            "model": {"tensor_parallel": 1, "pipeline_stages": 1, "gpus_per_node": 8, "layer_bytes": [1000, 1000], "parameters": 1000000, "zero_stage": 1}}),
}

NUMS = [0, -1, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**64 - 1, 2**64, 1e308, -1e308, 0.5, 65535, 65536]
DURS = ["0s", "0ms", "18446744073709551615s", "99999999999h", "1ns", "-1s", "1e308s"]

def leaves(o, path=()):
    if isinstance(o, dict):
        for k, v in o.items(): yield from leaves(v, path + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o): yield from leaves(v, path + (i,))
    else:
        yield path, o

def setp(o, path, v):
    for p in path[:-1]: o = o[p]
    o[path[-1]] = v

def alive(where):
    if node.poll() is not None:
        print(f"api-mutate: FAILED — weft-control exited after {where}"); return False
    log.flush()
    text = open(f"{work}/node.log").read()
    if "panicked" in text:
        i = text.index("panicked"); print(f"api-mutate: FAILED — panic after {where}:\n" + text[max(0, i - 300):i + 800]); return False
    return True

counts = {}
# Seeds first (in dependency order), so references resolve.
for kind in ["clusters", "experiments", "services", "nodes", "autoscalers", "rollouts", "trainingjobs"]:
    name, spec = seeds[kind]
    st, body = req("PUT", f"/v1/{kind}/{name}", spec)
    if st >= 300:
        print(f"api-mutate: FAILED — the {kind} seed was refused ({st}): {body[:300]}")
        sys.exit(1)
ok = True
posts = []
for v in NUMS + ["x", None]:
    posts.append(("/v1/autoscale/preemption", {"node": "n1", "notice_s": v}))
    posts.append(("/v1/autoscale/preemption", {"node": "n1", "checkpoint_after_steps": v}))
    posts.append(("/v1/autoscale/preemption", {"autoscaler": "a1", "replicas": v}))
    posts.append(("/v1/training/t1/checkpoint", {"after_steps": v}))
    for w in [{"kind": "pod", "name": "p", "cpu_milli": v, "memory_mib": v, "num_gpu": v, "gpu_milli": v},
              {"kind": "replica", "name": "r", "variant": "a", "base_model": "m", "base_bytes": v, "delta_bytes": v, "working_set_bytes": v,
               "compute_milli": v, "cpu_milli": 1, "memory_mib": 1, "priority": v},
              {"kind": "gang", "name": "g", "workers": v, "gpus_per_worker": v, "gpu_memory_bytes": v, "cpu_milli": 1, "memory_mib": 1}]:
        posts.append(("/v1/schedule/plan", {"workloads": [w], "preempt": True}))
        posts.append(("/v1/schedule/apply", {"workloads": [w], "preempt": True}))
for path, body in posts:
    st, text = req("POST", path, body)
    counts[st] = counts.get(st, 0) + 1
    if st >= 500 and st != 503:
        print(f"api-mutate: {st} for POST {path} {body}: {text[:300]}"); ok = False
    if not alive(f"POST {path} {body}"):
        sys.exit(1)

for kind in os.environ.get("KINDS", "clusters,experiments,services,nodes,autoscalers,rollouts,trainingjobs").split(","):
    name, spec = seeds[kind]
    for path, v in list(leaves(spec)):
        cands = DURS if isinstance(v, str) and v[-1:] == "s" and v[:1].isdigit() else (NUMS if isinstance(v, (int, float)) and not isinstance(v, bool) else [])
        for c in cands:
            s = copy.deepcopy(spec); setp(s, path, c)
            st, body = req("PUT", f"/v1/{kind}/{name}", s)
            counts[st] = counts.get(st, 0) + 1
            if st >= 500:
                print(f"api-mutate: {st} for {kind} {path}={c}: {body[:300]}"); ok = False
            if st < 300:
                time.sleep(SETTLE_S)  # let the leader loops (autoscaler, placement, training, rollouts) chew on it
            if not alive(f"{kind} {path}={c}"):
                sys.exit(1)
        # restore the seed
        req("PUT", f"/v1/{kind}/{name}", spec)
time.sleep(1)
if ok and alive("the end"):
    print(f"api-mutate: OK — {sum(counts.values())} requests, statuses {dict(sorted(counts.items()))}, no 5xx, no crash, no panic")
else:
    print("api-mutate: FAILED")
    sys.exit(1)
