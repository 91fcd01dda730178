"""Does rank 0's recovery cost more in an old job? Ages the job's log, then times its rollback.

    python bench/recovery_aging.py [--logged_steps 10 100000] [--rounds 7] [--json]

A job's ``events.jsonl`` grows by its ranks' ``step`` events for as long as it runs (about
eight lines a second, whatever its size: recovery/train/step_events.py). For each age (a
number of logged steps) a fresh log dir gets that many ``step`` lines, then rank 0's
recovery is timed as :class:`recovery.train.elastic.ElasticTrainer` does it after a fault
(its ``_roll_back``: agree on the newest common checkpoint, load and restore it, write the
``step``, ``rollback`` and ``recovered`` events), in a one-rank gloo group: one untimed
rollback per age, then ``--rounds`` rounds, the ages alternating; the median is reported.
The checkpoints are the same for every age (the main job's MLP and optimizer, 5.4 MB;
their own aging is bench/ckpt_aging.py's). The design target
(issue 28): the oldest job's recovery within 1.1x the youngest's. Run by hand; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "templates" / "mnist"))
from common import free_port  # noqa: E402
from train import build_model  # noqa: E402 - the template's model, found through its folder

from recovery import env as names  # noqa: E402
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver  # noqa: E402
from recovery.position import TrainPosition  # noqa: E402
from recovery.runtime.cluster import ClusterContext  # noqa: E402
from recovery.train.elastic import ElasticTrainer  # noqa: E402
from recovery.train.sampler import ResumableDistributedSampler  # noqa: E402

LINEAGE = "recovery-aging-bench"


def age_log(log_dir: Path, logged_steps: int) -> int:
    """Append ``logged_steps`` step events as a 4-rank job writes them; the file's size."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / "events.jsonl"
    with open(path, "ab") as file:
        for step in range(1, logged_steps + 1):
            file.write((json.dumps({"ts": 1.7e9 + step / 8, "event": "step", "rank": step % 4,
                                    "step": step, "total": 10 ** 6, "generation": 0,
                                    "why": "interval", "node_rank": 0}) + "\n").encode())
    return path.stat().st_size


def trainer(recovery_path: Path) -> ElasticTrainer:
    """Rank 0's trainer with two checkpoints on disk, as after some training."""
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    saver = CheckpointSaver(model, optimizer, config=CheckpointConfig(keep_checkpoint_max=2),
                            prefix="aged", directory=recovery_path / "checkpoints" / "rank_0",
                            lineage=LINEAGE)
    for step in (10, 20):
        saver.save(TrainPosition(1, step, step))
    ctx = ClusterContext(0, 1, 1, "0", 0, "gloo")
    sampler = ResumableDistributedSampler(60_000, 32, num_replicas=1, rank=0, seed=1)
    return ElasticTrainer(ctx, model, optimizer, saver=saver, sampler=sampler)


def aged_trainer(scratch: Path, logged_steps: int) -> tuple[int, ElasticTrainer]:
    """Rank 0's trainer of a job whose log holds ``logged_steps`` step events, and the
    log's size (the trainer takes its log dir and recovery path from the environment)."""
    log_dir = scratch / f"age_{logged_steps}" / "logs"
    size = age_log(log_dir, logged_steps)
    os.environ[names.TFT_LOG_DIR] = str(log_dir)
    os.environ[names.MS_RECOVERY_PATH] = str(log_dir.parent / "recovery")
    return size, trainer(log_dir.parent / "recovery")


def timed_rollback(rank0: ElasticTrainer) -> float:
    started = time.perf_counter()
    rank0._roll_back()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logged_steps", type=int, nargs="+", default=[10, 100_000])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    load_before = os.getloadavg()[0]
    seconds: dict[int, list[float]] = {logged: [] for logged in args.logged_steps}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            aged = {logged: aged_trainer(Path(scratch), logged) for logged in args.logged_steps}
            for _size, rank0 in aged.values():
                timed_rollback(rank0)  # the first in a process loads more code: not counted
            # The ages alternate round by round: a change of the machine's load hits all.
            for _ in range(args.rounds):
                for logged, (_size, rank0) in aged.items():
                    seconds[logged].append(timed_rollback(rank0))
            for _size, rank0 in aged.values():
                rank0.saver.close()
    finally:
        dist.destroy_process_group()
    rows = [{"logged_steps": logged, "events_bytes": aged[logged][0],
             "median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4)}
            for logged, times in seconds.items()]
    ratio = rows[-1]["median_s"] / rows[0]["median_s"]
    result = {"bench": "recovery_aging", "torch": torch.__version__, "rounds": args.rounds,
              "rows": rows, "oldest_over_youngest": round(ratio, 3),
              "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
              "target": "oldest_over_youngest <= 1.1"}
    if args.json:
        print(json.dumps(result))
        return
    print(f"rank 0's rollback, median of {args.rounds} rounds (torch {torch.__version__}, 1 thread)")
    for row in rows:
        print(f"  {row['logged_steps']:>9} steps logged ({row['events_bytes'] / 1e6:8.2f} MB): "
              f"{row['median_s'] * 1e3:8.1f} ms (min {row['min_s'] * 1e3:.1f} ms)")
    print(f"  oldest / youngest {ratio:.3f} (target <= 1.1); load average "
          f"{result['load_before']} before, {result['load_after']} after")


if __name__ == "__main__":
    main()
