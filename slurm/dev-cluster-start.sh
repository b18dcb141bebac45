#!/usr/bin/env bash
# Bring up a single-node SLURM cluster on this machine: munge + slurmctld + slurmd, no systemd.
# Idempotent: running it again with the daemons up only checks that the node is idle.
# Used by the tests and by anyone trying `relpos-lab submit` on a laptop or a CI box (root needed).
set -euo pipefail

if ! command -v slurmctld >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends munge slurm-wlm >/dev/null
fi

HOST=$(hostname -s)
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
MEM=$(( MEM * 9 / 10 ))

CONF=$(cat <<CONF
# Written by relpos_lab slurm/dev-cluster-start.sh: a single-node development cluster.
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
SlurmdSpoolDir=${SPOOL}
SlurmctldPidFile=${RUN}/slurmctld.pid
SlurmdPidFile=${RUN}/slurmd.pid
SlurmctldLogFile=${LOGS}/slurmctld.log
SlurmdLogFile=${LOGS}/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
KillWait=10
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=short Nodes=${HOST} MaxTime=30 State=UP OverSubscribe=NO
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
alive "$RUN/slurmctld.pid" || slurmctld
alive "$RUN/slurmd.pid" || slurmd

for _ in $(seq 150); do
    state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
    case "$state" in
        idle|mixed|allocated) echo "SLURM dev cluster up: node $HOST ($CPUS CPUs, ${MEM} MB) is $state"; exit 0 ;;
        down*|drain*) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
done
echo "SLURM dev cluster did not come up; see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
exit 1
