"""ringsoftmax: exact softmax and attention over sequences split across blocks and GPUs.

Per-device kernels return (out, lse) pairs; a torch.distributed ring merges them with the
log-sum-exp rule. See README.md for the API and DESIGN.md for the contract.
"""
from .attention import attention, attention_varlen
from .layouts import shard, unshard
from .merge import merge
from .ring import ring_attention, ring_softmax
from .softmax import softmax, softmax_with_lse

__all__ = ["softmax", "softmax_with_lse", "attention", "attention_varlen", "merge", "ring_softmax",
           "ring_attention", "shard", "unshard"]
__version__ = "0.1.0"
