#!/usr/bin/env bash
# The compose mesh's one-shot setup (image weft-tools, service `setup`): applies
# /etc/weft/mesh.yaml (deploy/config/mesh.yaml) with weftctl once the control plane has a
# leader, retrying for up to SETUP_TIMEOUT seconds (default 120). weftctl tries each server of
# --server in turn; a follower forwards the writes to the leader.
servers=${WEFT_SERVER:-http://control-1:7700,http://control-2:7700,http://control-3:7700}
file=${MESH_FILE:-/etc/weft/mesh.yaml}
deadline=$(( SECONDS + ${SETUP_TIMEOUT:-120} ))
until weftctl --server "$servers" apply -f "$file"; do
  if (( SECONDS >= deadline )); then
    echo "weft-setup: gave up: weftctl apply -f $file did not succeed within ${SETUP_TIMEOUT:-120} s" >&2
    exit 1
  fi
  echo "weft-setup: control plane not ready yet; retrying in 1 s" >&2
  sleep 1
done
weftctl --server "$servers" members
echo "weft-setup: mesh applied"
