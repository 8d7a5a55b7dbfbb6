# Hosts made of network namespaces for the multi-host tests: source it with
# the test's name in $test_name. Defines skip, the namespaces $nsa and $nsb
# (hosts host0 and host1, 10.231.7.1 and .2 on the veth pair $va / $vb) and
# start_rank; removes everything it made when the test exits.
#
# Needs root. Where namespaces cannot be made, the test says so on a line
# starting "SKIPPED:" (which .ci/run's summary lists) and passes: it never
# skips silently.

skip() {
  echo "SKIPPED: $test_name: $*"
  exit 0
}
[[ $(id -u) -eq 0 ]] || skip "not root, so no network namespaces can be made"
command -v ip >/dev/null || skip "no 'ip' command (Debian's iproute2)"
command -v unshare >/dev/null || skip "no 'unshare' command (util-linux)"

tag="f2h$$"
nsa="${tag}a" nsb="${tag}b" va="${tag}x" vb="${tag}y"
cleanup_hosts() {
  # Whatever is left of a run, then the namespaces (which takes the veth).
  for ns in "$nsa" "$nsb"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup_hosts EXIT
if ! err=$(ip netns add "$nsa" 2>&1); then skip "cannot create a network namespace: $err"; fi
ip netns add "$nsb" || { echo "FAIL: second namespace"; exit 1; }
ip link add "$va" type veth peer name "$vb" || skip "cannot create a veth pair"
ip link set "$va" netns "$nsa" && ip link set "$vb" netns "$nsb" || exit 1
ip -n "$nsa" addr add 10.231.7.1/24 dev "$va" && ip -n "$nsb" addr add 10.231.7.2/24 dev "$vb" || exit 1
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$nsa" link set "$va" up && ip -n "$nsb" link set "$vb" up || exit 1

# start_rank HOST LOG VAR=VALUE... -- COMMAND...: runs COMMAND in the
# background on host HOST (0 or 1) with the variables set, output to LOG;
# its pid is in $!.
start_rank() {
  local host="$1" log="$2"; shift 2
  local vars=()
  while [[ "$1" != "--" ]]; do vars+=("$1"); shift; done
  shift
  local ns=$([[ $host == 0 ]] && echo "$nsa" || echo "$nsb")
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec env "$@"' \
    "host$host" "${vars[@]}" "$@" > "$log" 2>&1 &
}
