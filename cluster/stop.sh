#!/usr/bin/env bash
# Stop the daemons cluster/start.sh started, newest first, by the PIDs it recorded; nothing else.
set -uo pipefail
STATE=${MMKIT_SLURM_STATE:-/run/mmkit-slurm}
[ -f "$STATE/pids" ] || { echo "cluster/stop.sh: nothing to stop (no $STATE/pids)" >&2; exit 0; }
tac "$STATE/pids" | while read -r name pid; do
    # a PID whose process is gone may since name another process: only that daemon is stopped
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || continue
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "stopped $name ($pid)" >&2
done
rm -f "$STATE/pids"
