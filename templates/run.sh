#!/usr/bin/env bash
# Start a dynamic cluster by hand, in msrun's style: MS_WORKER_NUM workers and one
# scheduler, each the same `python train.py`, told its role by environment variables.
# The processes run in the background; relaunch any one of them with recover.sh.
#
#   bash run.sh [SCRIPT [ARGS...]]      SCRIPT defaults to mnist/train.py next to this file
#
# Settings come from the environment, with these defaults:
#   MS_WORKER_NUM=8  MS_SCHED_HOST=127.0.0.1  MS_SCHED_PORT=8118
#   MS_RECOVERY_PATH=./tft_recovery  TFT_LOG_DIR=./device  PYTHON=python
#   TFT_REJOIN_COOLDOWN=30  TFT_CLUSTER_TIME_OUT=600  TFT_HEARTBEAT_TIMEOUT=30
#   TFT_PROGRESS_TIMEOUT=300
#   TFT_JOB_TOKEN: the job's secret, the key of every request's signature; by default a new
#     random one, kept (mode 0600) in TFT_TOKEN_FILE (~/.tftrun/tokens/, one per recovery
#     path) for recover.sh. TFT_INSECURE_NO_TOKEN=1: none at all (anyone who reaches the
#     port can steer the job; docs/security.md).
# The scheduler listens on MS_SCHED_HOST only; nothing written is writable by others;
# a log dir or recovery path another user owns or may write into is refused, as tftrun does.
# Like tftrun, it starts a new job: an earlier job's checkpoints in MS_RECOVERY_PATH move
# to previous/<n>/ (TFT_IS_RECOVER=1: resume that job instead; docs/checkpoints.md#lineage).
# Watch it with: tftctl status --log_dir "$TFT_LOG_DIR"
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SCRIPT=${1:-$HERE/mnist/train.py}
shift || true

export MS_WORKER_NUM=${MS_WORKER_NUM:-8}        # workers in the cluster
export MS_SCHED_HOST=${MS_SCHED_HOST:-127.0.0.1}  # the scheduler's address
export MS_SCHED_PORT=${MS_SCHED_PORT:-8118}     # the scheduler's port
export MS_ENABLE_RECOVERY=1                     # fault recovery on
export MS_RECOVERY_PATH=${MS_RECOVERY_PATH:-./tft_recovery}  # persisted state, checkpoints
export TFT_LOG_DIR=${TFT_LOG_DIR:-./device}     # logs and events.jsonl
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}    # many processes share the cores
PYTHON=${PYTHON:-python}
umask "$(printf '%04o' $(( $(umask) | 022 )))"

mkdir -p "$TFT_LOG_DIR" "$MS_RECOVERY_PATH"
"$PYTHON" -m recovery.runtime.folders           # refused as tftrun refuses them: exit 2
TFT_TOKEN_FILE=${TFT_TOKEN_FILE:-$HOME/.tftrun/tokens/$("$PYTHON" -c 'import hashlib, os, sys
print(hashlib.sha256(os.path.realpath(sys.argv[1]).encode()).hexdigest()[:16])' "$MS_RECOVERY_PATH").token}
if [ -z "${TFT_JOB_TOKEN:-}" ] && [ "${TFT_INSECURE_NO_TOKEN:-0}" != 1 ]; then
    TFT_JOB_TOKEN=$("$PYTHON" -c 'import secrets; print(secrets.token_hex(16))')
    (umask 077 && mkdir -p "$(dirname "$TFT_TOKEN_FILE")" \
        && printf '%s\n' "$TFT_JOB_TOKEN" > "$TFT_TOKEN_FILE")
fi
export TFT_JOB_TOKEN=${TFT_JOB_TOKEN:-}          # every process signs with it
if [ "${TFT_IS_RECOVER:-0}" = 1 ]; then LINEAGE_MODE=resume; else LINEAGE_MODE=new; fi
TFT_LINEAGE=$("$PYTHON" -m recovery.ckpt.lineage "$LINEAGE_MODE" "$MS_RECOVERY_PATH")
export TFT_LINEAGE                              # the job's lineage: what it may restore
echo "start training: $MS_WORKER_NUM workers, scheduler at $MS_SCHED_HOST:$MS_SCHED_PORT, logs in $TFT_LOG_DIR"

for ((i = 0; i < MS_WORKER_NUM; i++)); do
    MS_ROLE=MS_WORKER MS_NODE_ID=$i "$PYTHON" "$SCRIPT" "$@" > "$TFT_LOG_DIR/worker_$i.log" 2>&1 &
    echo "worker $i: pid $!"
done

MS_ROLE=MS_SCHED "$PYTHON" "$SCRIPT" "$@" > "$TFT_LOG_DIR/scheduler.log" 2>&1 &
echo "scheduler: pid $!"
