"""Small tensors the launchers keep for the life of the process, one per (name, device): the
persistent kernels' counter of waits that gave up, and the stand-ins for pointer arguments a build
never reads.

They are made outside any CUDA graph's memory pool. Under ``torch.compile(mode="reduce-overhead")``
cudagraph trees route every allocation of the thread that warms up or records a graph into the
graphs' pool, and raise when recording finds a tensor in that pool which is not an output ("tensor(s)
in the cudagraph pool not tracked as outputs"). A kept tensor first made during such a warm-up would
be one, so ``kept`` makes it on a helper thread, whose allocations are not routed there, and waits
for it.

During a plain stream capture (``torch.cuda.graph``) the tensor is made on the capturing thread, as
any other: it lands in that graph's pool and its initial fill runs when the graph replays. Call the
kernels once before capturing (the usual warm-up) and it already exists.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

_KEPT: dict[tuple[str, str], torch.Tensor] = {}
_MAKING = threading.Lock()


def kept(name: str, device, make: Callable[[torch.device], torch.Tensor]) -> torch.Tensor:
    """The tensor kept under ``name`` for ``device`` ("cuda" means the current CUDA device), made by
    ``make(device)`` at the first call, outside any graph pool where it can be (see the module)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (name, str(device))
    tensor = _KEPT.get(key)
    if tensor is None:
        with _MAKING:   # (threads that call first together get one tensor: a second counter would go unread)
            tensor = _KEPT.get(key)
            if tensor is None:
                tensor = _KEPT[key] = _make_outside_pools(make, device)
    return tensor


def _make_outside_pools(make, device: torch.device) -> torch.Tensor:
    """``make(device)`` on a helper thread for a CUDA device (the helper's stream synchronized, so the
    tensor is ready for any stream), on this thread where the device is not CUDA or a capture is on."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make(device)
    made: list = []

    def work():
        try:
            with torch.cuda.device(device):
                made.append(make(device))
                torch.cuda.current_stream(device).synchronize()
        except BaseException as error:   # re-raised on the caller's thread
            made.append(error)

    helper = threading.Thread(target=work, name="ringsoftmax-kept-tensor")
    helper.start()
    helper.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def no_int32s(device) -> torch.Tensor:
    """One int32 (zero) on ``device``, kept: what launches pass for pointer arguments their build
    never reads (int32 says so)."""
    return kept("no_int32s", device, lambda d: torch.zeros(1, dtype=torch.int32, device=d))
