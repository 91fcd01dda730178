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
# mnist/train.py next to this file. The output is appended to the process's log. The job
# token is TFT_JOB_TOKEN, else the one run.sh kept in TFT_TOKEN_FILE.
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
umask "$(printf '%04o' $(( $(umask) | 022 )))"

mkdir -p "$TFT_LOG_DIR"
"$PYTHON" -m recovery.runtime.folders           # refused as tftrun refuses them: exit 2
TFT_TOKEN_FILE=${TFT_TOKEN_FILE:-$HOME/.tftrun/tokens/$("$PYTHON" -c 'import hashlib, os, sys
print(hashlib.sha256(os.path.realpath(sys.argv[1]).encode()).hexdigest()[:16])' "$MS_RECOVERY_PATH").token}
if [ -z "${TFT_JOB_TOKEN:-}" ] && [ "${TFT_INSECURE_NO_TOKEN:-0}" != 1 ]; then
    if [ ! -r "$TFT_TOKEN_FILE" ]; then
        echo "recover.sh: no job token: set TFT_JOB_TOKEN, or TFT_TOKEN_FILE to the file run.sh kept it in" >&2
        exit 2
    fi
    TFT_JOB_TOKEN=$(cat "$TFT_TOKEN_FILE")
fi
export TFT_JOB_TOKEN=${TFT_JOB_TOKEN:-}
if [ "$WHO" = sched ]; then
    MS_ROLE=MS_SCHED "$PYTHON" "$SCRIPT" "$@" >> "$TFT_LOG_DIR/scheduler.log" 2>&1 &
    echo "scheduler: pid $!"
else
    MS_ROLE=MS_WORKER MS_NODE_ID=$WHO "$PYTHON" "$SCRIPT" "$@" >> "$TFT_LOG_DIR/worker_$WHO.log" 2>&1 &
    echo "worker $WHO: pid $!"
fi
