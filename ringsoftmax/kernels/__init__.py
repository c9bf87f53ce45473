"""Triton kernels only (two in Gluon, Triton's explicit-layout dialect): one concern per file, each
with its kernels and a small launcher.

Nothing here imports from the layers above (softmax.py, attention.py, ring.py). Every launcher takes
and returns plain tensors and follows the (out, lse) contract of DESIGN.md:

- ``lse`` is float32, natural log, one value per row; a row with no valid entry has ``lse = -inf``
  and output 0, never NaN.
- Math is float32 whatever the input dtype; outputs are written in the input dtype unless a
  launcher says otherwise.

Files and launchers:

- ``softmax_fwd.py``: ``softmax_fwd(x, with_lse=True) -> (y, lse)``, ``row_stats(x) -> (max, sum)``,
  ``normalize(x, max, sum) -> y`` for ``x`` of shape (M, N), last stride 1.
- ``softmax_bwd.py``: ``row_dot(y, dy) -> delta`` and ``softmax_bwd(y, dy, delta=None) -> dx``.
- ``softmax_staged.py``: split rows of both directions with chunks held in shared memory (a Gluon
  kernel, CUDA only; ``softmax_fwd`` / ``softmax_bwd`` call it through ``staged_launch``).
- ``attention_fwd.py``: ``attention_fwd(q, k, v, ...) -> (out, lse)`` for one (query block, key
  block) pair with causal masking by global positions.
- ``attention_fwd_gluon.py``: the Hopper forward for 16-bit dense blocks (a Gluon kernel, CUDA only;
  ``attention_fwd`` calls its ``launch`` where ``gluon_ready`` and the table say so).
- ``attention_config.py``: the per-device table of tiles and modes the attention launchers read.
- ``attention_bwd.py``: ``attention_bwd(q, k, v, out, dout, lse, delta, ...) -> (dq, dk, dv)``.
- ``merge.py``: ``merge_(acc_out, acc_lse, out_b, lse_b)``, the fused in-place LSE merge.
- ``kept_tensors.py``: the small tensors launchers keep per device, made outside CUDA graph pools.
- ``launcher.py``: ``launch_kernel``, every launch's way in: Triton's launch with a cache in front.
- ``plan_memo.py``: launch plans kept per tensor layout (the softmax launchers' routes and tiles, the
  staged and held paths' plans), checked against the knobs they read.
- ``compile_options.py``: the Triton compile options every launch passes (FMA contraction on).
"""
