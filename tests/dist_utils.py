"""Run a function on W gloo processes on this machine; any rank's exception fails the test."""
import os
import socket
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, args, errdir, backend):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=120))
    try:
        fn(rank, world, *args)
        dist.barrier()     # nobody tears its connections down while a peer still finishes its last op
    except BaseException:
        with open(os.path.join(errdir, f"rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_world(world: int, fn, *args, backend: str = "gloo") -> None:
    """Spawn ``world`` processes running ``fn(rank, world, *args)`` in one process group
    (gloo on the CPU; nccl puts rank r on GPU r)."""
    with tempfile.TemporaryDirectory() as errdir:
        try:
            mp.start_processes(_worker, args=(world, _free_port(), fn, args, errdir, backend), nprocs=world,
                               start_method="spawn", join=True)
        except Exception as e:
            logs = "".join(open(os.path.join(errdir, n)).read() for n in sorted(os.listdir(errdir)))
            raise AssertionError(f"a rank failed:\n{logs or e}") from None
