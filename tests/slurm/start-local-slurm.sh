#!/usr/bin/env bash
# A one-host Slurm cluster (slurmctld + slurmd on this machine, munge for auth) for the
# opt-in test tests/integration/test_slurm.py. Debian/Ubuntu: apt-get install slurm-wlm.
#
#   tests/slurm/start-local-slurm.sh            start it; prints the SLURM_CONF to export
#   tests/slurm/start-local-slurm.sh stop       stop the daemons this script started
#
# Run as root (slurmd starts job steps as their user). Everything lives in $TFT_SLURM_DIR
# (default /tmp/tftrun-slurm); /etc/slurm is not touched, so the cluster exists only for
# commands that see SLURM_CONF=$TFT_SLURM_DIR/slurm.conf.
set -euo pipefail

dir=${TFT_SLURM_DIR:-/tmp/tftrun-slurm}
node=$(hostname -s)

stop() {
    for daemon in slurmd slurmctld munged; do
        if [[ -f $dir/$daemon.pid ]]; then
            kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true
            rm -f "$dir/$daemon.pid"
        fi
    done
}

if [[ ${1:-start} == stop ]]; then
    stop
    exit 0
fi

for tool in slurmctld slurmd munged srun scontrol; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install slurm-wlm" >&2; exit 1; }
done
mkdir -p "$dir"/{state,spool,munge}
chmod 700 "$dir/munge"
[[ -f /etc/munge/munge.key ]] || { echo "no /etc/munge/munge.key (reinstall munge)" >&2; exit 1; }

cat >"$dir/slurm.conf" <<CONF
ClusterName=tftlocal
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=${TFT_SLURMCTLD_PORT:-6817}
SlurmdPort=${TFT_SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting/storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF

export SLURM_CONF=$dir/slurm.conf
munged --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munge/munged.seed" --force
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"

for _ in $(seq 50); do
    if scontrol ping >/dev/null 2>&1 && sinfo -h -o %T 2>/dev/null | grep -q idle; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "slurm did not come up; see $dir/*.log" >&2
exit 1
