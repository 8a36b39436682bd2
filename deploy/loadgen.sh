#!/usr/bin/env bash
# The compose mesh's load generator (image weft-tools, service `loadgen`). It shares the network
# namespace of the client's outbound sidecar and sends KServe v2 infer requests to it, as an app
# would: http://127.0.0.1:15001/v2/models/ranker/infer with Host: ranker and an x-user-id
# header (the experiment is sticky by it). One curl process sends a batch of BATCH requests for
# one user on a keep-alive connection, paced at RATE requests per second.
#
# Environment: TARGET (default http://127.0.0.1:15001), RATE (20), USERS (1000), BATCH (10).
target=${TARGET:-http://127.0.0.1:15001}
rate=${RATE:-20}
users=${USERS:-1000}
batch=${BATCH:-10}
body='{"inputs":[{"name":"input","datatype":"FP32","shape":[4],"data":[0.1,0.2,0.3,0.4]}]}'
echo "weft-loadgen: $rate req/s to $target (Host: ranker, $users users, $batch requests per user)"
sent=0
while :; do
  user="user-$(( (RANDOM * 32768 + RANDOM) % users ))"
  # The [1-N] URL glob repeats the request N times on one connection; --rate paces them.
  if ! curl -sS -o /dev/null --max-time 30 --rate "$rate/s" -H 'Host: ranker' -H "x-user-id: $user" \
      -H 'content-type: application/json' --data "$body" "$target/v2/models/ranker/infer?n=[1-$batch]"; then
    sleep 1 # the sidecar is not up yet (or went away): do not spin
  fi
  sent=$((sent + batch))
  if (( sent % 1000 == 0 )); then echo "weft-loadgen: $sent requests sent"; fi
done
