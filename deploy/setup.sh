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
# A join token per sidecar identity, where the sidecars read them (volume `tokens`): each
# sidecar makes its own key and gets its certificate from the mesh CA with it (and renews with
# it); until its token is there it retries. The token goes out in one short write.
tokens=${TOKENS_DIR:-/var/lib/weft-tokens}
for pair in ranker-a=service/ranker-a ranker-b=service/ranker-b client=ns/ranking/sa/client; do
  name=${pair%%=*} id=${pair#*=}
  out=$(weftctl --server "$servers" identity token create --identity "$id" --description "compose $name") || {
    echo "weft-setup: could not make the join token of $id" >&2; exit 1; }
  printf '%s\n' "${out%%$'\n'*}" > "$tokens/$name.token"
  echo "weft-setup: join token for $id written"
done
echo "weft-setup: identities ready"
