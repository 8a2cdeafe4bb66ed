#!/usr/bin/env bash
# Start a real single-node SLURM cluster on this machine (Debian, root): munge, slurmctld, slurmd.
# Idempotent: a cluster this script started and that is up is left as it is. cluster/stop.sh ends
# only the daemons this script started, by the PIDs it recorded in $STATE/pids.
#
# No accounting database: jobs are polled with squeue (profiles/slurm sets slurm-status-command),
# so finished jobs must stay in squeue's list long enough (MinJobAge below).
set -euo pipefail

STATE=${MMKIT_SLURM_STATE:-/run/mmkit-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by minimind-resume cluster/start.sh"
WAIT_S=${MMKIT_SLURM_WAIT_S:-60}
NODE=$(hostname -s)

die() { echo "cluster/start.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (it starts munged, slurmctld and slurmd); on a real site use its own cluster"

# one start at a time: a second one (another test session, another worker) waits here, then finds it up
mkdir -p "$STATE"
exec 9>"$STATE/start.lock"
flock 9

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sinfo >/dev/null; then
    command -v apt-get >/dev/null || die "SLURM binaries missing (slurmctld, slurmd, munged, sinfo) and no apt-get to install them"
    echo "installing slurmctld slurmd slurm-client munge (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null || die "apt-get update failed"
    timeout 600 apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
        || die "apt-get install of the SLURM packages failed"
fi

node_state() { timeout 5 sinfo -h -n "$NODE" -o %t 2>/dev/null | head -1 || true; }
running() { [ -n "${2:-}" ] && [ "$(cat "/proc/$2/comm" 2>/dev/null)" = "$1" ]; }  # name pid

up() { case "$(node_state)" in idle | mix | alloc) return 0 ;; *) return 1 ;; esac; }
if up; then
    echo "cluster already up: node $NODE is $(node_state)" >&2
    exit 0
fi

if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; refusing to replace a real site's configuration"
fi

mkdir -p "$STATE"
touch "$STATE/pids"
# keep only the daemons that still run: lines left by an earlier boot, or by a machine image taken while a
# cluster was up, name processes that are gone (or PIDs now reused by others)
while read -r name pid; do running "$name" "$pid" && echo "$name $pid"; done <"$STATE/pids" >"$STATE/pids.new" || true
mv "$STATE/pids.new" "$STATE/pids"
record() { echo "$1 $2" >>"$STATE/pids"; }  # name pid
start_daemon() {  # name pidfile [command prefix...]
    local name=$1 pidfile=$2 pid
    shift 2
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if running "$name" "$pid"; then return; fi
    # a pid file left by a daemon of an earlier boot (/run may be on disk) names a dead or foreign process:
    # remove it, so the PID recorded below is the one the new daemon writes
    rm -f "$pidfile"
    "$@" "/usr/sbin/$name" 9>&-  # the daemon must not hold the start lock
    for _ in $(seq 100); do
        pid=$(cat "$pidfile" 2>/dev/null || true)
        running "$name" "$pid" && break
        sleep 0.1
    done
    running "$name" "$pid" || die "$name did not start (see /var/log/slurm/ or /var/log/munge/)"
    record "$name" "$pid"
}

grep -q "[[:space:]]$NODE\b" /etc/hosts || echo "127.0.0.1 $NODE" >>/etc/hosts

# munge: authentication between the daemons and the client commands
[ -s /etc/munge/munge.key ] || mungekey --create
install -d -o munge -g munge -m 0755 /run/munge
if ! timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; then
    start_daemon munged /run/munge/munged.pid runuser -u munge --
fi
timeout 5 munge -n </dev/null | timeout 5 unmunge >/dev/null || die "munged does not answer"

# the node as slurmd sees it, memory less 5% (at least 512 MB) for the system
HW=$(slurmd -C | head -1)
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$HW"; }
MEM=$(field RealMemory)
CUT=$((MEM / 20 > 512 ? MEM / 20 : 512))
install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm /run/slurm
install -d /var/spool/slurmd
cat >"$CONF" <<CONF
$MARK
ClusterName=localcluster
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# no cgroups here: processes are tracked by their parent ids
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
MailProg=/bin/true
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# a job that names no memory gets this per CPU, not the whole node
DefMemPerCPU=2048
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=30
# finished jobs stay visible to squeue, which the executor plugin polls instead of sacct
MinJobAge=3600
SlurmctldTimeout=120
SlurmdTimeout=300
Waittime=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$(field CPUs) Boards=$(field Boards) SocketsPerBoard=$(field SocketsPerBoard) CoresPerSocket=$(field CoresPerSocket) ThreadsPerCore=$(field ThreadsPerCore) RealMemory=$((MEM - CUT)) State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF

start_daemon slurmctld /run/slurm/slurmctld.pid
start_daemon slurmd /run/slurm/slurmd.pid

for _ in $(seq $((WAIT_S * 2))); do
    if up; then echo "cluster up: node $NODE, partition debug" >&2; exit 0; fi
    case "$(node_state)" in down* | drain*) timeout 5 scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;; esac
    sleep 0.5
done
die "node $NODE not idle after ${WAIT_S}s (sinfo says '$(node_state)'; see /var/log/slurm/)"
