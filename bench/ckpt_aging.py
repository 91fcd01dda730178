"""Does a rollback cost more in an old job? Ages a job, then times its rollback.

    python bench/ckpt_aging.py [--ages 10 100 1000] [--faults_every 10] [--world_size 4] [--json]

For each age (a number of periodic saves) a fresh recovery path is aged with the real
saver: a save per step, and every ``--faults_every`` saves a fault: a last-words save of
every rank (:func:`recovery.ckpt.last_words.save_last_words`) and a relaunch of the rank
(a new ``CheckpointSaver``, which writes under the next ``<prefix>_<n>``). Then rank 0's
rollback (:func:`recovery.train.rollback.choose_rollback`, in a one-rank gloo group) is
timed twice: *cold*, as a relaunched process does it (no file verified yet), and *warm*,
as a survivor's next rollback does (what it verified is remembered). It prints, per age,
the files on disk, the bytes hashed and both times; the design target is a flat line:
the oldest job's cold rollback within 1.5x the youngest's. Run by hand; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port  # noqa: E402

import recovery.ckpt.manifest as manifest  # noqa: E402
from recovery.ckpt import layout  # noqa: E402
from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver  # noqa: E402
from recovery.ckpt.durable import FileDigest, file_digest  # noqa: E402
from recovery.ckpt.last_words import save_last_words  # noqa: E402
from recovery.position import TrainPosition  # noqa: E402
from recovery.train.rollback import checkpoint_dirs, choose_rollback  # noqa: E402

LINEAGE = "aging-bench"


class HashedBytes:
    """Counts the bytes the manifest's checks hash (wrapping the real digest)."""

    def __init__(self) -> None:
        self.total = 0

    def __call__(self, path: str | os.PathLike[str]) -> FileDigest:
        digest = file_digest(path)
        self.total += digest.size
        return digest


def _saver(recovery_path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> CheckpointSaver:
    return CheckpointSaver(model, optimizer, config=CheckpointConfig(keep_checkpoint_max=5), prefix="aged",
                           directory=layout.rank_dir(recovery_path, 0), lineage=LINEAGE)


def age_job(recovery_path: Path, saves: int, faults_every: int, world_size: int) -> CheckpointSaver:
    """Save ``saves`` times, with a fault (last words + relaunch) every ``faults_every``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    saver = _saver(recovery_path, model, optimizer)
    for step in range(1, saves + 1):
        position = TrainPosition(1, step, step)
        saver.save(position)
        if step % faults_every == 0:
            save_last_words(saver, recovery_path, position, world_size)
            saver = _saver(recovery_path, model, optimizer)
    return saver


def files_under(path: Path) -> int:
    return sum(1 for _, _, names in os.walk(path) for name in names if name.endswith(layout.CHECKPOINT_SUFFIX))


def timed_rollback(saver: CheckpointSaver, recovery_path: Path, hashed: HashedBytes) -> tuple[float, int]:
    """Seconds for rank 0's rollback, and the bytes it hashed."""
    hashed.total = 0
    started = time.perf_counter()
    chosen = choose_rollback(checkpoint_dirs(saver, str(recovery_path), 0), LINEAGE)
    seconds = time.perf_counter() - started
    assert chosen is not None
    return seconds, hashed.total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ages", type=int, nargs="+", default=[10, 100, 1000], help="periodic saves per job")
    parser.add_argument("--faults_every", type=int, default=10, help="saves between two faults")
    parser.add_argument("--world_size", type=int, default=4, help="ranks each last-words save writes for")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()

    hashed = HashedBytes()
    manifest.file_digest = hashed  # count what the checks hash; the real digest still runs
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    rows = []
    try:
        with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
            for saves in args.ages:
                recovery_path = Path(scratch) / f"age_{saves}"
                started = time.perf_counter()
                saver = age_job(recovery_path, saves, args.faults_every, args.world_size)
                aging = time.perf_counter() - started
                cold, cold_bytes = timed_rollback(saver, recovery_path, hashed)
                warm, warm_bytes = timed_rollback(saver, recovery_path, hashed)
                rows.append({"saves": saves, "faults": saves // args.faults_every,
                             "files": files_under(recovery_path), "aging_s": round(aging, 2),
                             "cold_s": round(cold, 4), "cold_hashed_bytes": cold_bytes,
                             "warm_s": round(warm, 4), "warm_hashed_bytes": warm_bytes})
    finally:
        dist.destroy_process_group()
    youngest, oldest = rows[0], rows[-1]
    result = {"bench": "ckpt_aging", "torch": torch.__version__, "world_size": args.world_size,
              "faults_every": args.faults_every, "rows": rows,
              "cold_ratio_oldest_to_youngest": round(oldest["cold_s"] / youngest["cold_s"], 3),
              "warm_ratio_oldest_to_youngest": round(oldest["warm_s"] / youngest["warm_s"], 3),
              "target": "cold_ratio_oldest_to_youngest <= 1.5"}
    if args.json:
        print(json.dumps(result))
        return
    print(f"rank 0's rollback vs the job's age (a fault every {args.faults_every} saves, "
          f"last words for {args.world_size} ranks, keep_checkpoint_max 5, torch {torch.__version__})")
    print(f"  {'saves':>6} {'faults':>6} {'files':>6} {'cold s':>8} {'hashed':>10} {'warm s':>8} {'hashed':>8}")
    for row in rows:
        print(f"  {row['saves']:>6} {row['faults']:>6} {row['files']:>6} {row['cold_s']:>8.4f} "
              f"{row['cold_hashed_bytes']:>10} {row['warm_s']:>8.4f} {row['warm_hashed_bytes']:>8}")
    print(f"  oldest / youngest: cold {result['cold_ratio_oldest_to_youngest']}, "
          f"warm {result['warm_ratio_oldest_to_youngest']} (target: cold <= 1.5)")


if __name__ == "__main__":
    main()
