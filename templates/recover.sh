#!/usr/bin/env bash
# Relaunch one process of a cluster started with run.sh, with the same environment.
#
#   bash recover.sh sched [SCRIPT [ARGS...]]     the scheduler: it reloads its state from
#                                                MS_RECOVERY_PATH and the workers re-attach
#   bash recover.sh NODE_ID [SCRIPT [ARGS...]]   a worker: the scheduler refuses it until the
#                                                rejoin cooldown of its node id is over, and
#                                                it keeps trying until then
#
# Use the same environment settings as run.sh (see there); SCRIPT defaults to
# mnist/train.py next to this file. The output is appended to the process's log.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: bash recover.sh sched|NODE_ID [SCRIPT [ARGS...]]" >&2
    exit 2
fi
WHO=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
SCRIPT=${1:-$HERE/mnist/train.py}
shift || true

export MS_WORKER_NUM=${MS_WORKER_NUM:-8}
export MS_SCHED_HOST=${MS_SCHED_HOST:-127.0.0.1}
export MS_SCHED_PORT=${MS_SCHED_PORT:-8118}
export MS_ENABLE_RECOVERY=1
export MS_RECOVERY_PATH=${MS_RECOVERY_PATH:-./tft_recovery}
export TFT_LOG_DIR=${TFT_LOG_DIR:-./device}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PYTHON=${PYTHON:-python}

mkdir -p "$TFT_LOG_DIR"
if [ "$WHO" = sched ]; then
    MS_ROLE=MS_SCHED "$PYTHON" "$SCRIPT" "$@" >> "$TFT_LOG_DIR/scheduler.log" 2>&1 &
    echo "scheduler: pid $!"
else
    MS_ROLE=MS_WORKER MS_NODE_ID=$WHO "$PYTHON" "$SCRIPT" "$@" >> "$TFT_LOG_DIR/worker_$WHO.log" 2>&1 &
    echo "worker $WHO: pid $!"
fi
