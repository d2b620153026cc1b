#!/usr/bin/env bash
# A real two-node Slurm cluster on one machine, for the Slurm tests and by hand:
#
#   tests/slurm/cluster.sh up            # munged, slurmctld, two slurmd; prints the state dir
#   tests/slurm/cluster.sh exec sbatch --nodes=2 --wait slurm/ray_job.sbatch hymem_train.opd ...
#   tests/slurm/cluster.sh pids NODE     # processes left inside a node (slurmd alone when idle)
#   tests/slurm/cluster.sh down          # stops everything and deletes the namespaces
#
# Each node is a network namespace with its own address and a UTS namespace with its own hostname
# (hm-n1 10.231.0.11, hm-n2 10.231.0.12); slurmctld and the client commands live in a third one (hm-ctl,
# 10.231.0.1, the "login node") that holds the bridge. Nothing is added to the host's own network.
# The filesystem is shared, as on a cluster. Needs root, iproute2, Debian's slurm-wlm and munge.
# `up` exits 77 with the reason when this machine cannot do that (the tests skip on 77).
set -euo pipefail

DIR=${HYMEM_SLURM_DIR:-/tmp/hymem-slurm}
NET=${HYMEM_SLURM_NET:-10.231.0}
P=${HYMEM_SLURM_PREFIX:-hm}
NODES=("${P}-n1" "${P}-n2")
CTL="${P}-ctl"
CPUS=${HYMEM_SLURM_CPUS:-2}  # per node; both nodes share this machine's cores

die() { echo "cluster.sh: $*" >&2; exit 1; }
cant() { echo "cluster.sh: cannot run a Slurm cluster here: $*" >&2; exit 77; }
addr() { case $1 in "$CTL") echo "$NET.1" ;; *) echo "$NET.1${1##*-n}" ;; esac; }
# nsenter, not `ip netns exec`: that remounts /sys, which hides the cgroup tree slurmd reads
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

preflight() {
  [[ $(id -u) == 0 ]] || cant "needs root (network namespaces)"
  for b in ip unshare nsenter munged slurmctld slurmd sbatch; do
    command -v "$b" >/dev/null || cant "$b not found (apt-get install iproute2 util-linux munge slurm-wlm)"
  done
  ip netns add "${P}-probe" 2>/dev/null || cant "ip netns add failed (no CAP_SYS_ADMIN / CAP_NET_ADMIN?)"
  ip netns del "${P}-probe"
}

conf() {
  cat <<EOF
# written by tests/slurm/cluster.sh
ClusterName=hymem
SlurmctldHost=${CTL}($(addr "$CTL"))
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire+1 s before it may start (its new launch credential must postdate the
# old one's revocation on the nodes; a forced early start can be refused there): 30 s, not 120 s
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=30
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# the backfill pass that starts a requeued job once its hold ends runs every 5 s, not 30 s
SchedulerParameters=bf_interval=5
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=10
NodeName=${NODES[0]} NodeHostname=${NODES[0]} NodeAddr=$(addr "${NODES[0]}") CPUs=$CPUS RealMemory=8000 State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=${NODES[1]} NodeAddr=$(addr "${NODES[1]}") CPUs=$CPUS RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP
EOF
}

up() {
  preflight
  down quiet
  mkdir -p "$DIR"/{munge,ctld,run,log} "${NODES[@]/#/$DIR/spool/}"
  chmod 700 "$DIR/munge"
  # our own munged on its own socket: the host's munge (if any) is left alone
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed"
  conf >"$DIR/slurm.conf"

  ip netns add "$CTL"
  in_ns "$CTL" ip link set lo up
  in_ns "$CTL" ip link add br0 type bridge
  in_ns "$CTL" ip addr add "$(addr "$CTL")/24" dev br0
  in_ns "$CTL" ip link set br0 up
  for n in "${NODES[@]}"; do
    ip netns add "$n"
    in_ns "$n" ip link set lo up
    ip link add "${n}-eth" netns "$n" type veth peer name "${n}-br" netns "$CTL"
    in_ns "$n" ip link set "${n}-eth" name eth0
    in_ns "$n" ip addr add "$(addr "$n")/24" dev eth0
    in_ns "$n" ip link set eth0 up
    in_ns "$CTL" ip link set "${n}-br" master br0 up
  done

  in_ns "$CTL" unshare --uts sh -c "hostname $CTL && exec slurmctld -f '$DIR/slurm.conf' -i"
  for n in "${NODES[@]}"; do
    # its own hostname (unshare --uts) and network; slurmd daemonizes, its jobs inherit both
    in_ns "$n" unshare --uts sh -c "hostname $n && exec slurmd -f '$DIR/slurm.conf' -N $n"
  done
  for _ in $(seq 60); do
    idle=$(run sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [[ $idle == "${#NODES[@]}" ]] && { echo "$DIR"; return 0; }
    sleep 0.5
  done
  run sinfo -N >&2 || true
  tail -n 20 "$DIR"/log/*.log >&2 || true
  die "the nodes did not become idle within 30 s (logs above, in $DIR/log)"
}

# a client command on the login node
run() { SLURM_CONF="$DIR/slurm.conf" in_ns "$CTL" "$@"; }

pids() { ip netns pids "$1" 2>/dev/null || true; }

down() {
  if [[ -f $DIR/slurm.conf ]] && ip netns list | grep -q "^$CTL\b"; then
    run scancel --full --quiet --user=root 2>/dev/null || true
  fi
  for ns in "${NODES[@]}" "$CTL"; do
    ip netns list | grep -q "^$ns\b" || continue
    # everything inside the namespace: slurmd, slurmctld, and whatever a job left behind
    mapfile -t left < <(pids "$ns")
    ((${#left[@]})) && kill -TERM "${left[@]}" 2>/dev/null || true
  done
  for _ in $(seq 20); do
    busy=0
    for ns in "${NODES[@]}" "$CTL"; do [[ -n $(pids "$ns") ]] && busy=1; done
    ((busy)) || break
    sleep 0.5
  done
  for ns in "${NODES[@]}" "$CTL"; do
    mapfile -t left < <(pids "$ns")
    ((${#left[@]})) && kill -KILL "${left[@]}" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  if [[ -f $DIR/run/munged.pid ]]; then
    kill "$(cat "$DIR/run/munged.pid")" 2>/dev/null || true
    rm -f "$DIR/run/munged.pid"
  fi
  [[ ${1:-} == quiet ]] || echo "cluster down"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  exec) shift; run "$@" ;;
  pids) pids "${2:?usage: cluster.sh pids NODE}" ;;
  nodes) echo "${NODES[@]}" ;;
  conf) conf ;;
  *) die "usage: cluster.sh up|down|exec CMD...|pids NODE|nodes|conf" ;;
esac
