#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two "hosts" on one machine, sourced by the netns tests and benchmarks:
# network namespaces A and B joined by a veth pair (addresses $addr_a and
# $addr_b), and run_job, which starts 4 ranks of wia-bench (2 per
# namespace) as one job. The caller defines skip and fail (skip exits 77),
# sets bench to the wia-bench binary, then calls netns_hosts_up; the
# namespaces are removed on exit (trap). shape_link RATE puts a tc tbf
# qdisc on both ends of the veth.
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root (uid $(id -u))"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
command -v tc >/dev/null || skip "no 'tc' command (iproute2)"

tag=$$
ns_a=wia-a-$tag ns_b=wia-b-$tag
veth_a=wa$tag veth_b=wb$tag
addr_a=10.77.0.1 addr_b=10.77.0.2
port=29511
work=$(mktemp -d /tmp/wia-netns-XXXXXX)
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  # What still runs inside our namespaces (a rank whose launcher was killed)
  # would keep them alive after 'ip netns del'.
  for p in $(ip netns pids "$ns_a" 2>/dev/null) $(ip netns pids "$ns_b" 2>/dev/null); do
    kill -9 "$p" 2>/dev/null
  done
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  [ -n "${WIA_NETNS_KEEP:-}" ] && echo "logs kept in $work" || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

netns_hosts_up() {
  if ! err=$(ip netns add "$ns_a" 2>&1); then skip "cannot create a network namespace: $err"; fi
  ip netns add "$ns_b" || fail "ip netns add $ns_b"
  if ! err=$(ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b" 2>&1); then
    skip "cannot create a veth pair: $err"
  fi
  ip -n "$ns_a" addr add $addr_a/24 dev "$veth_a" || fail "address on $veth_a"
  ip -n "$ns_b" addr add $addr_b/24 dev "$veth_b" || fail "address on $veth_b"
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
  ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up || fail "veth up"
  # The kernel reports the carrier (IFF_RUNNING, which transports look for)
  # a moment after both ends are up.
  for i in $(seq 50); do
    ip -n "$ns_a" link show "$veth_a" | grep -q 'state UP' && ip -n "$ns_b" link show "$veth_b" | grep -q 'state UP' && break
    sleep 0.1
  done
  ip -n "$ns_b" link show "$veth_b" | grep -q 'state UP' || fail "$veth_b has no carrier after 5 s: $(ip -n "$ns_b" link show "$veth_b")"
}

# shape_link RATE: both ends of the veth at RATE (tc tbf; netem is not
# available here).
shape_link() {
  local rate=$1 side
  for side in "$ns_a $veth_a" "$ns_b $veth_b"; do
    set -- $side
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$rate" burst 32kbit latency 50ms ||
      fail "tc qdisc replace dev $2 in $1"
  done
}

# run_job NAME LIMIT_S WIA_BENCH_ARGS...: ranks 0,1 in A, 2,3 in B; rank r's
# stdout+stderr in $work/NAME.r; fails when a rank fails or overruns.
run_job() {
  local name=$1 limit=$2; shift 2
  pids=()
  port=$((port + 1))  # a fresh rendezvous port per job
  local r ns ifname host
  for r in 0 1 2 3; do
    if [ $r -lt 2 ]; then ns=$ns_a ifname=$veth_a host=hostA; else ns=$ns_b ifname=$veth_b host=hostB; fi
    ip netns exec "$ns" env WIA_HOSTID=$host WIA_RANK=$r WIA_WORLD_SIZE=4 WIA_LOCAL_RANK=$((r % 2)) \
      WIA_LOCAL_SIZE=2 WIA_ROOT_ADDR=$addr_a:$port WIA_SOCKET_IFNAME=$ifname WIA_HOST_DEVICES=1 \
      WIA_LOG_LEVEL=${LOG_LEVEL:-debug} WIA_COLLECTIVES_TIMEOUT_MS=$((limit * 1000)) \
      timeout -k 2 "$limit" "$bench" --procs-from-env "$@" >"$work/$name.$r" 2>&1 &
    pids+=($!)
  done
  local rc=0 st
  for r in 0 1 2 3; do
    wait "${pids[$r]}"; st=$?
    [ $st -eq 0 ] || { echo "  rank $r of '$name' exited with status $st"; rc=1; }
  done
  pids=()
  if [ $rc -ne 0 ]; then
    for r in 0 1 2 3; do echo "--- $name rank $r (last lines)"; tail -n 15 "$work/$name.$r"; done
    return 1
  fi
  grep -v '^\[' "$work/$name.0"   # rank 0's table, without log lines
}

