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
. "$(dirname "$0")/netns_hosts.sh"  # the namespaces, the veth pair and run_job
netns_hosts_up

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
shape_link "${WIA_NETNS_RATE:-50mbit}"
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
