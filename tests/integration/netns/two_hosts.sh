#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two "hosts" on one machine: network namespaces A and B joined by a veth
# pair, two ranks in each (WIA_HOSTID=hostA / hostB), one job of 4 ranks
# through WIA_RANK / WIA_WORLD_SIZE / WIA_ROOT_ADDR (rank 0's veth address).
# Checks, with wia-bench --procs-from-env as the ranks:
#   1. all-reduce results are right (wia-bench's data check on every rank);
#   2. links inside a namespace use shm, links between them tcp (the
#      per-link choices of WIA_LOG_LEVEL=debug);
#   3. the hierarchical all-reduce (--algo hierarchical) is right;
#   4. with the veth shaped by tc (tbf), the setup measures the slow link
#      and AUTO picks "hierarchical" for a large all-reduce.
# Namespaces are always removed (trap). Without root, ip, tc or namespace
# support it says why and exits 77 (ctest SKIP_RETURN_CODE).
#
#   tests/integration/netns/two_hosts.sh BUILD_BIN_DIR    (holds wia-bench)
set -u
bin_dir=${1:?usage: two_hosts.sh BIN_DIR_WITH_WIA_BENCH}
bench=$bin_dir/wia-bench
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
failures=0
wrong() { echo "  FAILED: $*"; failures=$((failures + 1)); }  # a check failed; go on

[ -x "$bench" ] || fail "no wia-bench at $bench"
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
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  [ -n "${WIA_NETNS_KEEP:-}" ] && echo "logs kept in $work" || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

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

t_start=$(date +%s)
echo "== 1+2. all-reduce over 2 namespaces x 2 ranks; which transport each link uses"
run_job auto 30 --sizes 8,64K,1M -n 2 -w 1 || fail "the all-reduce job failed"
grep -q '# ok: 0 wrong' "$work/auto.0" || fail "wrong all-reduce results"
grep -q '2 node(s)' "$work/auto.0" || fail "the job does not span 2 nodes: $(grep '^# wia-bench' "$work/auto.0")"
grep -h -- '-> rank' "$work"/auto.* | sed 's/^.*\(rank [0-9] -> rank [0-9]: [a-z]*\).*/  \1/' | sort -u
for pair in "0 1" "1 0" "2 3" "3 2"; do
  set -- $pair
  grep -Eq "rank $1 -> rank $2: shm\b" "$work/auto.$1" ||
    wrong "rank $1 -> rank $2 (same namespace) is not shm: $(grep -o "rank $1 -> rank $2: .*" "$work/auto.$1" | cut -c1-200)"
done
for pair in "0 2" "0 3" "1 2" "1 3" "2 0" "3 1"; do
  set -- $pair
  grep -Eq "rank $1 -> rank $2: tcp\b" "$work/auto.$1" ||
    wrong "rank $1 -> rank $2 (across namespaces) is not tcp: $(grep -o "rank $1 -> rank $2: .*" "$work/auto.$1" | cut -c1-200)"
done
[ $failures -eq 0 ] && echo "  ok: shm inside each namespace, tcp between them"

echo "== 3. hierarchical all-reduce (--algo hierarchical)"
LOG_LEVEL=info run_job hier 30 --algo hierarchical --sizes 8,64K,1M -n 2 -w 1 || fail "the hierarchical job failed"
grep -q '# ok: 0 wrong' "$work/hier.0" || fail "wrong hierarchical all-reduce results"
grep -Eq '^ +1048576 .* hierarchical ' "$work/hier.0" && echo "  ok" || wrong "the 1 MiB row did not run hierarchical"

echo "== 4. veth shaped to ${WIA_NETNS_RATE:-50mbit} (tc tbf): AUTO picks hierarchical for a large all-reduce"
for side in "$ns_a $veth_a" "$ns_b $veth_b"; do
  set -- $side
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${WIA_NETNS_RATE:-50mbit}" burst 32kbit latency 50ms ||
    fail "tc qdisc add dev $2 in $1"
done
ip netns exec "$ns_a" tc qdisc show dev "$veth_a" | sed 's/^/  /'
LOG_LEVEL=info run_job shaped 45 --sizes 8,1M -n 1 -w 0 || fail "the job over the shaped link failed"
grep -h 'link between nodes measured' "$work"/shaped.* | sed 's/^.*\(link between.*\)$/  \1/' | sort -u
grep -q 'link between nodes measured' "$work"/shaped.0 "$work"/shaped.1 "$work"/shaped.2 "$work"/shaped.3 ||
  fail "no rank logged 'link between nodes measured'"
grep -q '# ok: 0 wrong' "$work/shaped.0" || fail "wrong results over the shaped link"
if grep -Eq '^ +1048576 .* hierarchical ' "$work/shaped.0"; then
  echo "  ok: 1 MiB all-reduce: $(awk '$1 == 1048576 {print $5 ", " $7 " us"}' "$work/shaped.0") shaped;" \
       "$(awk '$1 == 1048576 {print $5 ", " $7 " us"}' "$work/auto.0") before shaping"
else
  wrong "AUTO did not pick hierarchical for 1 MiB over the shaped link: $(grep -E '^ +1048576 ' "$work/shaped.0")"
fi
[ $failures -eq 0 ] || fail "$failures check(s) failed ($(( $(date +%s) - t_start )) s)"
echo "PASS: two namespaces in $(( $(date +%s) - t_start )) s"
