#!/usr/bin/env bash
# Several "hosts" on one machine: network namespaces, each with its own address on a private
# subnet, joined by veth pairs to a bridge of their own; runs a command in the first host and
# removes everything (processes left in the hosts, namespaces, veths, bridge) when it ends, fails
# or is stopped. A command that is mpirun (or mpiexec) gets, right after its name, the options that
# launch across the hosts over TCP: a hostfile with one slot per host, Open MPI's rsh agent set to
# a wrapper that runs the daemon under `ip netns exec HOST` (no ssh server), the TCP transport
# limited to the bed's subnet, and the keepalive that ends the job when a host's link is lost.
# Needs root and iproute2 (ip, tc). Prints "netns_hosts: cannot ..." and exits 77 when it cannot
# make namespaces.
# Usage: bash scripts/netns_hosts.sh [--hosts N] [--name NAME] [--rate RATE] [--delay DELAY]
#        [--verbose] [--] COMMAND [ARGS...]
#   --hosts N      hosts to make, 1 to 8 (default 2); host i is NAME-hI at 10.237.0.(i+1)/24
#   --name NAME    prefix of every namespace and link made (default tg<pid>; letters and digits,
#                  at most 9); host i's link, outside its namespace, is NAME-vI
#   --rate RATE    limits every host's link both ways, e.g. 1gbit or 10gbit (tc tbf)
#   --delay DELAY  adds one-way delay on every host's link, e.g. 0.2ms (tc netem; a round trip
#                  between two hosts crosses two links each way: 4 x DELAY)
# The command sees NETNS_HOSTS (the host names), NETNS_MPIRUN_ARGS (the mpirun options above)
# and NETNS_HOSTFILE. Example:
#   bash scripts/netns_hosts.sh --hosts 3 mpirun -np 3 build/train_char --data input.txt --batch 12
set -euo pipefail

usage() { sed -n '11,21p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "netns_hosts: $*" >&2; exit 2; }

hosts=2
name="tg$$"
rate=""
delay=""
verbose=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) [ $# -ge 2 ] || die "--hosts needs a count"; hosts="$2"; shift 2 ;;
    --name) [ $# -ge 2 ] || die "--name needs a prefix"; name="$2"; shift 2 ;;
    --rate) [ $# -ge 2 ] || die "--rate needs a rate such as 10gbit"; rate="$2"; shift 2 ;;
    --delay) [ $# -ge 2 ] || die "--delay needs a time such as 0.2ms"; delay="$2"; shift 2 ;;
    --verbose) verbose=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || die "no command to run (see --help)"
[[ "$hosts" =~ ^[1-8]$ ]] || die "--hosts $hosts is not a count from 1 to 8"
[[ "$name" =~ ^[A-Za-z][A-Za-z0-9]{0,8}$ ]] || die "--name '$name' is not 1-9 letters and digits starting with a letter"

cannot() { echo "netns_hosts: cannot make network namespaces: $*" >&2; exit 77; }
command -v ip >/dev/null || cannot "ip (iproute2) is not installed"
[ "$(id -u)" = 0 ] || cannot "not root (network namespaces, veths and bridges need CAP_NET_ADMIN)"
if [ -n "$rate$delay" ]; then command -v tc >/dev/null || cannot "tc (iproute2) is not installed"; fi

subnet="10.237.0"   # private; the bridge is ours alone, so beds running side by side never meet
bridge="$name-br"
work="$(mktemp -d "${TMPDIR:-/tmp}/netns_hosts.XXXXXX")"
host_names=()
for ((i = 0; i < hosts; ++i)); do host_names+=("$name-h$i"); done

say() { if [ "$verbose" = 1 ]; then echo "netns_hosts: $*" >&2; fi; }

made=0  # set once this run has made its first namespace or link: only then is there ours to remove
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ "$made" = 0 ]; then rm -rf "$work"; exit "$status"; fi
  # Daemons end a moment after mpirun: up to 2 s for the hosts to empty by themselves.
  for ((wait = 0; wait < 20; ++wait)); do
    local busy=0
    for host in "${host_names[@]}"; do
      if [ -e "/run/netns/$host" ] && [ -n "$(ip netns pids "$host" 2>/dev/null)" ]; then busy=1; fi
    done
    [ "$busy" = 1 ] || break
    sleep 0.1
  done
  for host in "${host_names[@]}"; do
    [ -e "/run/netns/$host" ] || continue
    # What still runs in a host was started by this bed (daemons, ranks cut off from mpirun).
    local pids
    pids="$(ip netns pids "$host" 2>/dev/null || true)"
    if [ -n "$pids" ]; then
      echo "netns_hosts: ended what still ran in $host:" $(ps -o pid=,comm= -p "$(echo $pids | tr ' ' ,)") >&2
      kill -KILL $pids 2>/dev/null || true
    fi
  done
  for ((i = 0; i < hosts; ++i)); do ip link del "$name-v$i" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
  for host in "${host_names[@]}"; do ip netns del "$host" 2>/dev/null || true; done
  rm -rf "$work"
  say "removed $hosts hosts and $bridge"
  exit "$status"
}
child=""  # the command's pid, once it runs
# A stop is passed on to the command as SIGTERM (a background job of a script starts with SIGINT
# ignored, so INT would reach only commands that set their own handler, as mpirun does), and the
# command gets up to 5 s to end by itself: mpirun ends its ranks and daemons, and train_char's
# ranks save a checkpoint first. The cleanup then ends whatever is left. (5 s, not more: a caller
# that gives up and kills the process group, as the tests do after 10 s, would leave the hosts.)
stop() {  # stop STATUS
  if [ -n "$child" ]; then
    kill -s TERM "$child" 2>/dev/null || true
    for ((tenths = 0; tenths < 50; ++tenths)); do
      kill -0 "$child" 2>/dev/null || break
      sleep 0.1
    done
  fi
  exit "$1"
}
trap cleanup EXIT
trap 'stop 143' TERM
trap 'stop 130' INT

for host in "${host_names[@]}" "$bridge"; do
  if [ -e "/run/netns/$host" ] || ip link show "$host" >/dev/null 2>&1; then
    die "$host already exists (another bed named $name is running?)"
  fi
done

made=1
ip link add "$bridge" type bridge || cannot "ip link add $bridge type bridge failed"
ip link set "$bridge" up
# Limits on a link: tbf shapes to the rate (a bucket of 64 KB: a NIC has no burst above its line
# rate, and a larger bucket would let a whole gradient shard through unshaped), netem below it
# adds the delay.
shape() {  # shape DEVICE [NETNS]
  local run=()
  if [ $# -ge 2 ]; then run=(ip netns exec "$2"); fi
  local parent=(root)
  if [ -n "$rate" ]; then
    "${run[@]}" tc qdisc add dev "$1" root handle 1: tbf rate "$rate" burst 64kb latency 100ms ||
      die "tc cannot shape $1 to --rate $rate (tbf)"
    parent=(parent 1:1)
  fi
  if [ -n "$delay" ]; then
    "${run[@]}" tc qdisc add dev "$1" "${parent[@]}" handle 10: netem delay "$delay" limit 100000 ||
      die "tc cannot add --delay $delay (netem; is the kernel's sch_netem there?)"
  fi
}
for ((i = 0; i < hosts; ++i)); do
  host="${host_names[$i]}"
  ip netns add "$host" || cannot "ip netns add $host failed"
  ip link add "$name-v$i" type veth peer name eth0 netns "$host"
  ip link set "$name-v$i" master "$bridge" up
  ip -n "$host" addr add "$subnet.$((i + 1))/24" dev eth0
  ip -n "$host" link set eth0 up
  ip -n "$host" link set lo up
  # A connection with data in flight gives up after about 6 s of silence (4 retransmissions)
  # rather than 15 minutes: mpirun then hears of a lost host (together with the daemons'
  # keepalive, which covers the connections without data in flight).
  ip netns exec "$host" sysctl -qw net.ipv4.tcp_retries2=4
  shape "$name-v$i"        # toward the host
  shape eth0 "$host"       # from the host
done
say "$hosts hosts on $bridge, $subnet.0/24${rate:+, rate $rate}${delay:+, delay $delay}"

# The rsh agent: Open MPI calls it as `agent HOST COMMAND...` for every host but the one it runs on.
cat >"$work/agent" <<EOF
#!/bin/sh
# Open MPI's rsh agent of this bed: runs the daemon's command line in the host's namespace.
address="\$1"; shift
case "\$address" in
$(for ((i = 0; i < hosts; ++i)); do echo "  $subnet.$((i + 1))) host=${host_names[$i]} ;;"; done)
  *) echo "netns_hosts agent: no host has the address \$address" >&2; exit 1 ;;
esac
# Each daemon its own session folder: the hosts share one file system and one host name, and the
# daemons would otherwise make and remove the same folders under /tmp at once. (Not mpirun's: a
# folder set for mpirun is passed on to every daemon.)
mkdir -p "$work/\$host"
exec ip netns exec "\$host" env OMPI_MCA_orte_tmpdir_base="$work/\$host" /bin/sh -c "\$*"
EOF
chmod +x "$work/agent"
for ((i = 0; i < hosts; ++i)); do echo "$subnet.$((i + 1)) slots=1"; done >"$work/hostfile"

mpirun_args=(--hostfile "$work/hostfile" --mca plm_rsh_agent "$work/agent" --allow-run-as-root
             --mca btl self,tcp --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24"
             --mca hwloc_base_binding_policy none
             --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3)
# Each daemon counts one rank on a host of its own, so Open MPI never sees that the hosts share
# this machine's cores and lets waiting ranks spin: with more hosts than cores a spinning rank holds
# the core the rank it waits for needs (3 hosts on 2 cores: an exchange of (b) took 208 ms, 33 ms
# with waiting ranks yielding).
if [ "$hosts" -gt "$(nproc)" ]; then mpirun_args+=(--mca mpi_yield_when_idle 1); fi
export NETNS_HOSTS="${host_names[*]}" NETNS_HOSTFILE="$work/hostfile" NETNS_MPIRUN_ARGS="${mpirun_args[*]}"

command=("$@")
case "$(basename "$1")" in
  mpirun|mpiexec|orterun) command=("$1" "${mpirun_args[@]}" "${@:2}") ;;
esac
say "in ${host_names[0]}: ${command[*]}"
# In the background, so that a signal to this script reaches stop() at once. (ip netns exec
# execs the command: its pid is the command's.)
ip netns exec "${host_names[0]}" "${command[@]}" &
child=$!
set +e
wait "$child"
status=$?
set -e
exit "$status"
