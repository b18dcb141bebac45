#!/usr/bin/env bash
# Stop the dev cluster started by dev-cluster-start.sh, its slurmd of each node and slurmctld (by pid
# files, never by name; slurmd.pid is the one node of a cluster started before there were two).
set -uo pipefail
RUN=/run/slurm
stop() {
    local pidfile=$1
    [ -f "$pidfile" ] || return 0
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}
for pidfile in "$RUN"/slurmd-*.pid "$RUN/slurmd.pid"; do
    stop "$pidfile"
done
stop "$RUN/slurmctld.pid"
if [ "${1:-}" != "--keep-munge" ]; then
    stop /run/munge/munged.pid
fi
echo "SLURM dev cluster stopped"
