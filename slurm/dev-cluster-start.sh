#!/usr/bin/env bash
# Bring up a two-node SLURM cluster on this machine: munge + slurmctld + one slurmd per node
# (`slurmd -N n1`, `slurmd -N n2`, each on its own port), no systemd.
# Idempotent: running it again with the daemons up only checks that the nodes are idle, and starts
# a node's slurmd again if it is gone.
# Used by the tests and by anyone trying `relpos-lab submit` on a laptop or a CI box (root needed).
#
# Both nodes are this machine. Each declares all of its CPUs (a job of trainer.devices up to that
# many fits on either node, a 2-node job on both: the cores are shared, oversubscribed up to twice)
# and half of its memory (memory is not a consumable resource here, CR_Core; it bounds --mem).
# The node names resolve to 127.0.0.1 (an /etc/hosts line): Lightning makes the job's first node
# the rendezvous address of its ranks.
set -euo pipefail

if ! command -v slurmctld >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends munge slurm-wlm >/dev/null
fi

HOST=$(hostname -s)
NODES=(n1 n2)
FIRST_PORT=6818  # n1's slurmd listens on 6818, n2's on 6819 (slurmctld: 6817)
CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
RUN=/run/slurm
mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS" "$RUN" /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge

# Hardware as slurmd sees it, minus some memory headroom for the daemons and the OS.
read -r CPUS MEM < <(slurmd -C | awk '/^NodeName/ {for (i=1;i<=NF;i++) {split($i,a,"="); v[a[1]]=a[2]} print v["CPUs"], v["RealMemory"]}')
MEM=$(( MEM * 9 / 10 / ${#NODES[@]} ))

# Lightning's rendezvous address is the job's first node name: it must resolve, to this machine.
for node in "${NODES[@]}"; do
    addr=$( (getent hosts "$node" || true) | awk '{print $1; exit}')
    if [ -z "$addr" ]; then
        echo "127.0.0.1 $node  # relpos_lab slurm/dev-cluster-start.sh" >> /etc/hosts
    elif [ "$addr" != 127.0.0.1 ] && [ "$addr" != ::1 ]; then
        echo "node name $node resolves to $addr, not this machine: the dev cluster needs it for itself" >&2
        exit 1
    fi
done
NODE_LINES=""
for i in "${!NODES[@]}"; do
    NODE_LINES+="NodeName=${NODES[$i]} NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=$(( FIRST_PORT + i )) CPUs=${CPUS} RealMemory=${MEM} State=UNKNOWN"$'\n'
done
NODE_LIST=$(IFS=,; echo "${NODES[*]}")

CONF=$(cat <<CONF
# Written by relpos_lab slurm/dev-cluster-start.sh: a two-node development cluster on one machine.
ClusterName=relpos-dev
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=1
StateSaveLocation=${STATE}
SlurmdSpoolDir=${SPOOL}/%n
SlurmctldPidFile=${RUN}/slurmctld.pid
SlurmdPidFile=${RUN}/slurmd-%n.pid
SlurmctldLogFile=${LOGS}/slurmctld.log
SlurmdLogFile=${LOGS}/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
KillWait=10
${NODE_LINES}PartitionName=debug Nodes=${NODE_LIST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=short Nodes=${NODE_LIST} MaxTime=30 State=UP OverSubscribe=NO
CONF
)
if [ ! -f "$CONF_DIR/slurm.conf" ] || [ "$(cat "$CONF_DIR/slurm.conf")" != "$CONF" ]; then
    printf '%s\n' "$CONF" > "$CONF_DIR/slurm.conf"
    RECONFIGURED=1
fi

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
if [ -n "${RECONFIGURED:-}" ] && alive "$RUN/slurmctld.pid"; then
    "$(dirname "$0")/dev-cluster-stop.sh" --keep-munge
fi
alive "$RUN/slurmd.pid" || rm -f "$RUN/slurmd.pid"  # the one node's, before there were two
alive "$RUN/slurmctld.pid" || slurmctld
for node in "${NODES[@]}"; do
    mkdir -p "$SPOOL/$node"
    alive "$RUN/slurmd-$node.pid" || slurmd -N "$node"
done

for _ in $(seq 150); do
    up=0
    for node in "${NODES[@]}"; do
        state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
        case "$state" in
            idle|mixed|allocated|completing) up=$(( up + 1 )) ;;
            down*|drain*) scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true ;;
        esac
    done
    if [ "$up" = "${#NODES[@]}" ]; then
        echo "SLURM dev cluster up: nodes $NODE_LIST on $HOST ($CPUS CPUs, ${MEM} MB each): $(sinfo -h -N -o '%N %T' | sort -u | tr '\n' ' ')"
        exit 0
    fi
    sleep 0.2
done
echo "SLURM dev cluster did not come up; see $LOGS/slurmctld.log and $LOGS/slurmd-<node>.log" >&2
exit 1
