"""Running a function on 2 CPU processes with gloo, for the distributed tests.

``run_ranks(worker, tmp_path)`` spawns ``worker(rank, world, out_dir)`` on every rank after
``init_process_group("gloo")`` (a file store under ``tmp_path``: no port to pick); each
rank saves what it computed with :func:`save` and the checks run in the parent, on what
:func:`run_ranks` loads back (one dict per rank, in rank order).
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
TIMEOUT_S = 240


def _entry(rank, world, store_path, out_dir, worker, timeout_s):
    torch.set_num_threads(1)
    if "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback: no network needed, whatever the hostname resolves to
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s // 2))
    try:
        worker(rank, world, out_dir)
    finally:
        dist.destroy_process_group()


def save(res, rank, out_dir):
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))


def run_ranks(worker, tmp, world=WORLD, timeout_s=TIMEOUT_S):
    """``worker(rank, world, out_dir)`` on ``world`` spawned processes (a module-level
    function: it is pickled by name); returns every rank's :func:`save`\\ d results."""
    tmp = str(tmp)
    ctx = mp.start_processes(_entry, args=(world, os.path.join(tmp, "store"), tmp, worker, timeout_s),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world} ranks did not finish in {timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True) for r in range(world)]
