"""The Triton attention block kernels (forward, delta, backward) against float64 attention.

CPU tests run the kernels under TRITON_INTERPRET=1 at tiny shapes (float16/float32; the
interpreter's bfloat16 dot is broken in triton 3.9). GPU tests (``-m gpu``) cover bfloat16/float16,
head dims 64/96/128/256, GQA 1/2/4/8, every kind of mask a ring step makes, and varlen batches.
The oracle below is written here, in float64 with explicit position masks, and its gradients come
from autograd; inputs are fresh random draws for every case.
"""
import functools
import os

import pytest
import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ringsoftmax.kernels import attention_config  # noqa: E402
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta  # noqa: E402
from ringsoftmax.kernels.attention_fwd import attention_fwd  # noqa: E402

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ----------------------------------------------------------------------------- float64 oracle
def oracle(q, k, v, scale, causal, q_pos=(0, 1), k_pos=(0, 1), dout=None, dlse=None):
    """Dense float64 attention: (out, lse, dq, dk, dv); rows with no visible key: out 0, lse -inf.

    Gradients are of ``sum(out * dout) + sum(lse * dlse)`` (lse of empty rows excluded).
    """
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk = k64.repeat_interleave(H // Hkv, dim=2)
    vv = v64.repeat_interleave(H // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q64, kk) * scale
    qp = q_pos[0] + torch.arange(Sq, device=q.device) * q_pos[1]
    kp = k_pos[0] + torch.arange(Sk, device=q.device) * k_pos[1]
    mask = kp[None, :] <= qp[:, None] if causal else torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    seen = mask.any(-1)  # (Sq,)
    s = s.masked_fill(~mask, -1e300)  # exp underflows to exactly 0 in float64, gradients stay finite
    p = torch.softmax(s, -1) * seen[:, None]
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    lse = torch.where(seen, torch.logsumexp(s, -1), torch.zeros((), dtype=s.dtype, device=s.device))
    grads = (None, None, None)
    if dout is not None:
        loss = (out * dout.double()).sum()
        if dlse is not None:
            loss = loss + (lse * dlse.double()).sum()
        grads = torch.autograd.grad(loss, (q64, k64, v64))
    lse = torch.where(seen, lse, torch.full_like(lse, float("-inf")))
    return (out.detach(), lse.detach(), *grads)


def oracle_varlen(q, k, v, cu_q, cu_k, scale, causal, q_pos, k_pos, dout):
    """Packed varlen oracle: each sequence through ``oracle`` on its own; lse (H, Tq)."""
    outs, lses, dqs, dks, dvs = [], [], [], [], []
    for i in range(len(cu_q) - 1):
        qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        o, lse, dq, dk, dv = oracle(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], scale, causal, q_pos, k_pos,
                                    dout[None, qs:qe])
        outs.append(o[0]), lses.append(lse[0]), dqs.append(dq[0]), dks.append(dk[0]), dvs.append(dv[0])
    return (torch.cat(outs), torch.cat(lses, 1), torch.cat(dqs), torch.cat(dks), torch.cat(dvs))


# ----------------------------------------------------------------------------- checks
def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(name, x, ref, tol):
    assert torch.isfinite(x).all(), f"{name}: non-finite values"
    err = rel_err(x, ref)
    assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.1e}"


def check_lse(lse, ref, atol):
    assert not lse.isnan().any(), "lse has NaN"
    empty = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(lse), empty), "lse = -inf exactly where a row sees no key"
    if (~empty).any():
        err = (lse[~empty].double() - ref[~empty]).abs().max().item()
        assert err <= atol, f"lse: max abs error {err:.2e} > {atol:.1e}"


TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}
LSE_ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}


def rand(*shape, dtype, device, scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)


# Kernel modes (attention_config): dQ in its own kernel or by atomics in the dK/dV kernel; the
# dK/dV kernel with or without a separate loop for the last partial query tile; the forward's
# loads through pointers or through tensor descriptors (TMA); the warp-specialized kernels (forward
# and backward) over the unmasked tiles, followed by the plain kernels over the masked ones.
_PLAIN = dict(fwd_warp_spec=False, bwd_warp_spec=False)
MODES = {
    "separate": dict(_PLAIN, dq_atomic=False, dkdv_split_tail=False, fwd_tma=False),
    "atomic": dict(_PLAIN, dq_atomic=True, dkdv_split_tail=False, fwd_tma=False),
    "split": dict(_PLAIN, dq_atomic=False, dkdv_split_tail=True, fwd_tma=False),
    "atomic+split": dict(_PLAIN, dq_atomic=True, dkdv_split_tail=True, fwd_tma=False),
    "tma": dict(_PLAIN, dq_atomic=False, dkdv_split_tail=True, fwd_tma=True),
    "tma+ws": dict(dq_atomic=False, dkdv_split_tail=True, fwd_tma=True, fwd_warp_spec=True, fwd_persistent=False,
                   fwd_resume_min_keys=0, bwd_warp_spec=True),
}
# the warp-specialized forward persistent (a grid of one program per multiprocessor; 4 on the CPU)
MODES["tma+ws+pers"] = dict(MODES["tma+ws"], fwd_persistent=True)
# the Gluon forward (Hopper) wherever it supports the block pair, the default table elsewhere
MODES["gluon"] = dict(fwd_gluon=True)


def kernel_paths(monkeypatch):
    """Record which kernel each launch ran, as "fwd:", "dkdv:" or "dq:" followed by "ws"
    (warp-specialized), "pers" (the forward warp-specialized and persistent), "rest" (the forward's
    masked keys after "ws" or "pers") or "plain" (a list the test reads afterwards)."""
    from ringsoftmax.kernels import attention_bwd as bwd_module
    from ringsoftmax.kernels import attention_fwd as fwd_module
    names = {fwd_module._attn_fwd_kernel: "fwd", bwd_module._attn_bwd_dkdv_kernel: "dkdv",
             bwd_module._attn_bwd_dq_kernel: "dq"}
    seen, real = [], fwd_module.launch

    def recording(kernel, grid, args, kwargs, *rest, **kw):
        path = ("pers" if kwargs.get("PERSISTENT") else "ws") if kwargs.get("WARP_SPEC") else (
            "rest" if kwargs.get("RESUME") else "plain")
        real(kernel, grid, args, kwargs, *rest, **kw)   # a launch that raises (does not fit) is not listed
        seen.append(f"{names[kernel]}:{path}")

    monkeypatch.setattr(fwd_module, "launch", recording)
    monkeypatch.setattr(bwd_module, "launch", recording)
    return seen


def of(seen, kernel):
    """The paths ("ws", "rest", "plain") that ``kernel`` ("fwd", "dkdv", "dq") took, in order."""
    return [p.split(":")[1] for p in seen if p.startswith(kernel + ":")]


def all_visible(Sk, case):
    """(causal, q_pos, k_pos) of a step where every query sees all Sk keys: the warp-specialized
    forward. case 0: full block; 1: keys all in the past; 2: the same in the stripe layout."""
    return [(False, (0, 1), (0, 1)), (True, (Sk + 5, 1), (0, 1)), (True, (3 * Sk + 2, 3), (2, 3))][case]


def run_and_check(B, Sq, Sk, H, Hkv, D, dtype, device, causal, q_pos=(0, 1), k_pos=(0, 1), scale=None,
                  mode="separate", accumulate=False):
    """Forward + backward of one block pair against the oracle; returns nothing, asserts.

    ``mode`` names the kernel mode (a key of MODES), or is a dict of ``attention_config.override``.
    ``accumulate``: the gradients are added into caller buffers holding ones, as the ring does."""
    scale = D ** -0.5 if scale is None else scale
    q = rand(B, Sq, H, D, dtype=dtype, device=device, scale=1.5)
    k = rand(B, Sk, Hkv, D, dtype=dtype, device=device, scale=1.5)
    v = rand(B, Sk, Hkv, D, dtype=dtype, device=device)
    dout = rand(B, Sq, H, D, dtype=dtype, device=device)
    kw = dict(softmax_scale=scale, causal=causal, q_offset=q_pos[0], q_stride=q_pos[1], k_offset=k_pos[0],
              k_stride=k_pos[1])
    with attention_config.override(**(MODES[mode] if isinstance(mode, str) else mode)):
        out, lse = attention_fwd(q, k, v, **kw)
        assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
        assert lse.shape == (B, H, Sq) and lse.dtype == torch.float32
        delta = attention_delta(out, dout)
        if accumulate:
            ones = [torch.ones(t.shape, dtype=torch.float32, device=device) for t in (q, k, v)]
            dq, dk, dv = (g - 1 for g in attention_bwd(q, k, v, out, dout, lse, delta, dq=ones[0], dk=ones[1],
                                                       dv=ones[2], **kw))
        else:
            dq, dk, dv = attention_bwd(q, k, v, out, dout, lse, delta, **kw)
    ref = oracle(q, k, v, scale, causal, q_pos, k_pos, dout)
    tol = TOL[dtype]
    check("out", out, ref[0], tol)
    check_lse(lse, ref[1], LSE_ATOL[dtype])
    nothing_visible = bool(torch.isneginf(ref[1]).all())
    for name, x, r in (("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
        assert x.dtype == torch.float32 and x.shape == r.shape
        if nothing_visible:  # exact zeros
            assert torch.equal(x, torch.zeros_like(x)), f"{name} must be 0 when no key is visible"
        elif r.abs().max() == 0:
            # rows that see one key have a constant softmax: the exact gradient is 0, the kernel's is
            # dp - delta rounded (two float32 sums of the same products in different orders)
            assert x.abs().max() <= 1e-4, f"{name}: {x.abs().max():.1e} where the exact gradient is 0"
        else:
            check(name, x, r, 2 * tol)


# ----------------------------------------------------------------------------- CPU (interpreter)
CPU = torch.device("cpu")

# (causal, q_pos, k_pos): every kind of ring step, on lengths 37 (queries) and 45 (keys)
CPU_MASKS = [
    (False, (0, 1), (0, 1)),      # full block
    (True, (0, 1), (0, 1)),       # diagonal block
    (True, (5, 1), (20, 1)),      # keys start later: the first 15 query rows see nothing
    (True, (100, 1), (0, 1)),     # keys all in the past: every tile unmasked
    (True, (1, 3), (2, 3)),       # stripe layout, keys one slot later
    (True, (2, 3), (0, 3)),       # stripe layout, keys earlier
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal,q_pos,k_pos", CPU_MASKS)
def test_cpu_masks(dtype, causal, q_pos, k_pos):
    run_and_check(1, 37, 45, 4, 2, 32, dtype, CPU, causal, q_pos, k_pos)


@pytest.mark.parametrize("mode", ["atomic", "split", "atomic+split", "tma"])
@pytest.mark.parametrize("causal,q_pos,k_pos", [CPU_MASKS[0], CPU_MASKS[2], CPU_MASKS[5]])
def test_cpu_masks_modes(causal, q_pos, k_pos, mode):
    run_and_check(1, 37, 45, 4, 2, 32, torch.float16, CPU, causal, q_pos, k_pos, mode=mode)


# Offsets whose difference sits next to a multiple of the interpreter's 16-row tiles, so that an
# off-by-one in any loop bound (unmasked end, masked end, first query of a key tile) moves a tile.
BOUNDARY_OFFSETS = [(1, 0), (0, 1), (14, 0), (15, 0), (0, 14), (17, 0), (0, 17)]


@pytest.mark.parametrize("q_off,k_off", BOUNDARY_OFFSETS)
def test_cpu_tile_boundaries(q_off, k_off):
    mode = "separate" if q_off > k_off else "split"
    run_and_check(1, 37, 45, 2, 1, 16, torch.float32, CPU, True, (q_off, 1), (k_off, 1), mode=mode)


@pytest.mark.parametrize("D,H,Hkv", [(16, 2, 1), (24, 2, 2), (64, 3, 3)])
def test_cpu_head_dims(D, H, Hkv):
    run_and_check(2, 19, 23, H, Hkv, D, torch.float32, CPU, True, (6, 1), (0, 1))


@pytest.mark.parametrize("mode", ["separate", "tma+ws+pers"])
def test_cpu_single_key(mode):
    """One key per block: every visible row's softmax is that key alone (its exact gradient wrt q
    and k is 0), under every kind of ring-step mask."""
    for causal, q_pos, k_pos in gpu_masks(40, 1):
        run_and_check(2, 40, 1, 4, 2, 32, torch.float16, CPU, causal, q_pos, k_pos, mode=mode)


def test_cpu_invisible_block():
    """A key block entirely after the queries: out 0, lse -inf, gradients 0, never NaN."""
    run_and_check(1, 21, 30, 2, 1, 32, torch.float16, CPU, True, (0, 1), (50, 1))


@pytest.mark.parametrize("mode", ["separate", "atomic+split", "tma"])
def test_cpu_varlen(mode):
    """Packed sequences of lengths 1, 7, 13 (queries) and 7, 1, 13 (keys): none sees another."""
    dtype, H, Hkv, D, scale = torch.float32, 4, 2, 32, 0.3
    cu_q = torch.tensor([0, 1, 8, 21], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 8, 21], dtype=torch.int32)
    for causal, q_pos, k_pos in ((False, (0, 1), (0, 1)), (True, (3, 1), (0, 1)), (True, (0, 2), (1, 2))):
        q = rand(21, H, D, dtype=dtype, device=CPU)
        k = rand(21, Hkv, D, dtype=dtype, device=CPU)
        v = rand(21, Hkv, D, dtype=dtype, device=CPU)
        dout = rand(21, H, D, dtype=dtype, device=CPU)
        kw = dict(softmax_scale=scale, causal=causal, q_offset=q_pos[0], q_stride=q_pos[1], k_offset=k_pos[0],
                  k_stride=k_pos[1], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        with attention_config.override(**MODES[mode]):
            out, lse = attention_fwd(q, k, v, **kw)
            assert lse.shape == (H, 21)
            delta = attention_delta(out, dout)
            assert delta.shape == (H, 21)
            dq, dk, dv = attention_bwd(q, k, v, out, dout, lse, delta, max_seqlen_q=13, max_seqlen_k=13, **kw)
        ref = oracle_varlen(q, k, v, cu_q, cu_k, scale, causal, q_pos, k_pos, dout)
        check("out", out, ref[0], TOL[dtype])
        check_lse(lse, ref[1], LSE_ATOL[dtype])
        for name, x, r in (("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
            check(name, x, r, 2 * TOL[dtype])


@pytest.mark.parametrize("mode", ["separate", "atomic+split", "tma"])
def test_cpu_strided_accumulate_and_dlse(mode):
    """Inputs and gradient buffers are slices along dim 1 of bigger tensors; gradients are ADDED
    into the buffers; passing delta - dlse also propagates a gradient of lse."""
    dtype, B, Sq, Sk, H, Hkv, D, scale = torch.float32, 2, 17, 29, 4, 2, 32, 0.2
    big_q = rand(B, Sq + 9, H, D, dtype=dtype, device=CPU)
    big_kv = rand(B, Sk + 5, 2, Hkv, D, dtype=dtype, device=CPU)
    q, k, v = big_q[:, 4:4 + Sq], big_kv[:, 5:, 0], big_kv[:, 5:, 1]
    dout = rand(B, Sq, H, D, dtype=dtype, device=CPU)
    dlse = rand(B, H, Sq, dtype=torch.float32, device=CPU)
    kw = dict(softmax_scale=scale, causal=True, q_offset=20, k_offset=3)
    bufs = [torch.randn(B, S + 6, h, D) for S, h in ((Sq, H), (Sk, Hkv), (Sk, Hkv))]
    views = [buf[:, 3:-3] for buf in bufs]
    before = [view.clone() for view in views]
    with attention_config.override(**MODES[mode]):
        out, lse = attention_fwd(q, k, v, out_dtype=torch.float32, **kw)
        assert out.dtype == torch.float32
        delta = attention_delta(out, dout) - dlse
        dq, dk, dv = attention_bwd(q, k, v, out, dout, lse, delta, dq=views[0], dk=views[1], dv=views[2], **kw)
    for got, view in zip((dq, dk, dv), views):
        assert got.data_ptr() == view.data_ptr()
    ref = oracle(q, k, v, scale, True, (20, 1), (3, 1), dout, dlse)
    check("out", out, ref[0], TOL[dtype])
    for name, x, b0, r in zip(("dq", "dk", "dv"), (dq, dk, dv), before, ref[2:]):
        check(name, x - b0, r, 2 * TOL[dtype])
    for buf in bufs:  # the margins around the views are untouched
        assert torch.isfinite(buf).all()


def check_grad_dtype(B, Sq, Sk, H, Hkv, D, dtype, device, causal, q_pos, k_pos, mode):
    """grad_dtype=dtype: the new gradient buffers hold exactly the float32 gradients rounded once
    (dQ by atomics is cast at the end); a given float32 buffer keeps float32, and so does its
    partner dk/dv."""
    q = rand(B, Sq, H, D, dtype=dtype, device=device, scale=1.5)
    k = rand(B, Sk, Hkv, D, dtype=dtype, device=device, scale=1.5)
    v = rand(B, Sk, Hkv, D, dtype=dtype, device=device)
    dout = rand(B, Sq, H, D, dtype=dtype, device=device)
    kw = dict(softmax_scale=D ** -0.5, causal=causal, q_offset=q_pos[0], q_stride=q_pos[1], k_offset=k_pos[0],
              k_stride=k_pos[1])
    with attention_config.override(**(MODES[mode] if mode else {})):
        out, lse = attention_fwd(q, k, v, **kw)
        delta = attention_delta(out, dout)
        wide = attention_bwd(q, k, v, out, dout, lse, delta, **kw)
        narrow = attention_bwd(q, k, v, out, dout, lse, delta, grad_dtype=dtype, **kw)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=device)
        mixed = attention_bwd(q, k, v, out, dout, lse, delta, grad_dtype=dtype, dk=dk, **kw)
    for name, w, n in zip(("dq", "dk", "dv"), wide, narrow):
        assert n.dtype == dtype and torch.equal(n, w.to(dtype)), name
    assert [g.dtype for g in mixed] == [dtype, torch.float32, torch.float32]
    assert torch.equal(mixed[1], wide[1]) and torch.equal(mixed[2], wide[2])
    with pytest.raises(TypeError, match="grad_dtype"):
        attention_bwd(q, k, v, out, dout, lse, delta, grad_dtype=torch.int8, **kw)


@pytest.mark.parametrize("mode", ["separate", "atomic", "tma+ws"])
@pytest.mark.parametrize("causal,q_pos,k_pos", [CPU_MASKS[0], CPU_MASKS[2]])
def test_cpu_grad_dtype(mode, causal, q_pos, k_pos):
    check_grad_dtype(2, 36, 48, 4, 2, 32, torch.float16, CPU, causal, q_pos, k_pos, mode)


@pytest.mark.parametrize("mode", ["separate", "atomic"])
def test_cpu_grad_dtype_empty_queries(mode):
    """No query rows: zero gradients, still in grad_dtype (dQ by atomics included)."""
    q, k = rand(1, 0, 2, 16, dtype=torch.float16, device=CPU), rand(1, 5, 2, 16, dtype=torch.float16, device=CPU)
    rows = torch.zeros(1, 2, 0)
    with attention_config.override(**MODES[mode]):
        grads = attention_bwd(q, k, k, q, q, rows, rows, softmax_scale=0.2, grad_dtype=torch.float16)
    assert [g.dtype for g in grads] == [torch.float16] * 3
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape] and not grads[1].any() and not grads[2].any()


@pytest.mark.parametrize("mode", ["tma+ws", "tma+ws+pers"])
@pytest.mark.parametrize("case", [0, 1, 2])
def test_cpu_forward_warp_spec(monkeypatch, case, mode):
    """Keys in whole tiles, all visible: the warp-specialized kernel alone; a ragged key block adds
    the resuming launch for the masked tail; a query count off the lse alignment runs the plain one.
    Persistent: 4 programs walk 24 or 12 query tiles, partial last tiles reading the next batch's rows."""
    seen = kernel_paths(monkeypatch)
    ws = "pers" if mode.endswith("pers") else "ws"
    run_and_check(2, 36, 48, 4, 2, 32, torch.float16, CPU, *all_visible(48, case), mode=mode)
    assert of(seen, "fwd") == [ws]
    seen.clear()
    run_and_check(1, 36, 45, 4, 2, 32, torch.float16, CPU, *all_visible(45, case), mode=mode)
    assert of(seen, "fwd") == [ws, "rest"]
    seen.clear()
    run_and_check(1, 37, 48, 4, 2, 32, torch.float16, CPU, *all_visible(48, case), mode=mode)
    assert of(seen, "fwd") == ["plain"]


@pytest.mark.parametrize("layout", ["packed qkv", "heads first", "batch gaps"])
def test_cpu_forward_persistent_strides(monkeypatch, layout):
    """The persistent kernel reads q/k/v through descriptors over whole tensors: a (B, S, 3, H, D)
    qkv slice (token rows 3x wider) runs persistent; (B, H, S, D) storage and padding between
    batches cannot be addressed so and run the per-tile warp-specialized kernel. Values exact."""
    seen = kernel_paths(monkeypatch)
    B, S, H, D = 3, 48, 4, 32
    if layout == "packed qkv":
        q, k, v = rand(B, S, 3, H, D, dtype=torch.float16, device=CPU, scale=1.5).unbind(2)
    elif layout == "heads first":
        q, k, v = (rand(B, H, S, D, dtype=torch.float16, device=CPU, scale=1.5).transpose(1, 2) for _ in range(3))
    else:
        q, k, v = (rand(B, S + 4, H, D, dtype=torch.float16, device=CPU, scale=1.5)[:, :S] for _ in range(3))
    with attention_config.override(**MODES["tma+ws+pers"]):
        out, lse = attention_fwd(q, k, v, softmax_scale=0.2)
    assert of(seen, "fwd") == (["pers"] if layout == "packed qkv" else ["ws"])
    ref = oracle(q, k, v, 0.2, False, (0, 1), (0, 1))
    check("out", out, ref[0], TOL[torch.float16])
    check_lse(lse, ref[1], LSE_ATOL[torch.float16])


def test_cpu_forward_persistent_misfit(monkeypatch):
    """A persistent launch that does not fit the shared memory (the float32 output at D=128 on an
    H200) falls back to the per-tile warp-specialized kernel, and later calls go there directly."""
    from ringsoftmax.kernels import attention_fwd as fwd_module
    seen = kernel_paths(monkeypatch)
    real, tries = fwd_module.launch, []
    monkeypatch.setattr(fwd_module, "_MISFITS", set())   # what this test learns stays here

    def no_room_for_persistent(kernel, grid, args, kwargs, *rest, **kw):
        if kwargs.get("PERSISTENT"):
            tries.append(1)
            raise RuntimeError("no attention tile fits")   # what launch raises when nothing fits
        return real(kernel, grid, args, kwargs, *rest, **kw)

    monkeypatch.setattr(fwd_module, "launch", no_room_for_persistent)
    q, k, v = (rand(2, 32, 4, 32, dtype=torch.float16, device=CPU, scale=1.5) for _ in range(3))
    with attention_config.override(**MODES["tma+ws+pers"]):
        for _ in range(2):
            out, lse = attention_fwd(q, k, v, softmax_scale=0.2, out_dtype=torch.float32)
            check("out", out, oracle(q, k, v, 0.2, False, (0, 1), (0, 1))[0], TOL[torch.float16])
    assert of(seen, "fwd") == ["ws", "ws"] and len(tries) == 1


def test_persistent_table():
    """The persistent forward: off on the CPU and for float32 unless overridden; the override wins."""
    cpu = torch.device("cpu")
    assert not attention_config.fwd_persistent(cpu, 128, torch.float16, False, 4096)
    assert not attention_config.fwd_persistent(torch.device("cuda"), 128, torch.float32, False, 4096)
    with attention_config.override(fwd_persistent=True):
        assert attention_config.fwd_persistent(cpu, 128, torch.float16, False, 1 << 20)
    with attention_config.override(fwd_warp_spec=False):   # no warp-specialized forward at all
        assert not attention_config.fwd_persistent(torch.device("cuda"), 128, torch.float16, False, 4096)
    assert all(most >= 4096 for most in attention_config._SM90_FWD_PERSISTENT_MAX_KEYS.values())


def test_gluon_table(monkeypatch):
    """The Gluon forward: Hopper 16-bit D=64 and 128 at any length; off for float32 inputs, on the
    CPU, and under any override of the Triton forward's tiles or modes, unless asked for. Its grid
    of units: a query tile each (192 rows at D=64 without a causal mask, else 128), or a pair of them
    when causal (odd counts round up); a launch that splits takes SPLIT_TILE."""
    from ringsoftmax.kernels import attention_fwd_gluon as gluon_fwd
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(attention_config, "cuda_major", lambda device: 9)
    fwd_gluon = attention_config.fwd_gluon
    assert fwd_gluon(cuda, 128, torch.bfloat16, True, 1) and fwd_gluon(cuda, 128, torch.float16, False, 1 << 20)
    assert fwd_gluon(cuda, 64, torch.bfloat16, False, 1) and fwd_gluon(cuda, 64, torch.bfloat16, True, 8192)
    assert not fwd_gluon(cuda, 256, torch.bfloat16, False, 8192) and not fwd_gluon(cuda, 128, torch.float32, False, 1)
    assert not fwd_gluon(cpu, 128, torch.bfloat16, False, 4096)
    q = torch.empty(2, 300, 3, 64)   # 2 query tiles of 192 rows per (batch, head), 3 of 128 when causal
    assert gluon_fwd.grid_size(q, False, persistent=False) == 12
    assert gluon_fwd.grid_size(q, True, persistent=False) == 12
    q = torch.empty(2, 300, 3, 128)  # 3 query tiles per (batch, head)
    assert gluon_fwd.grid_size(q, False, persistent=False) == 18 and gluon_fwd.grid_size(q, True, persistent=False) == 12
    assert gluon_fwd.TILES[(64, False)][0] == 192 and gluon_fwd.SPLIT_TILE[0] == 128
    assert all(tile[0] == 128 for key, tile in gluon_fwd.TILES.items() if key != (64, False))
    for mode in ("tma+ws", "tma+ws+pers", "separate", "tma"):
        with attention_config.override(**MODES[mode]):
            assert not fwd_gluon(cuda, 128, torch.bfloat16, False, 4096), mode
    with attention_config.override(fwd_gluon=False):
        assert not fwd_gluon(cuda, 128, torch.bfloat16, False, 4096)
    with attention_config.override(fwd_gluon=True, fwd_tma=True):
        assert fwd_gluon(cuda, 256, torch.bfloat16, False, 1)
    monkeypatch.setattr(attention_config, "cuda_major", lambda device: 8)
    assert not fwd_gluon(cuda, 128, torch.bfloat16, False, 4096)
    # what the kernel computes: 16-bit in, their dtype or float32 out, D 64 or 128, unit position
    # strides if causal
    q = torch.empty(1, 8, 2, 128, dtype=torch.bfloat16)
    assert gluon_fwd.supports(q, 128, True, 1, 1, torch.bfloat16)
    assert gluon_fwd.supports(q, 128, False, 4, 4, torch.bfloat16)
    assert not gluon_fwd.supports(q, 128, True, 4, 4, torch.bfloat16)
    assert gluon_fwd.supports(q, 128, True, 1, 1, torch.float32)      # the ring's block outputs
    assert not gluon_fwd.supports(q, 128, False, 1, 1, torch.float16)
    assert not gluon_fwd.supports(q, 96, False, 1, 1, torch.bfloat16)
    assert not gluon_fwd.supports(q.float(), 128, False, 1, 1, torch.float32)


@pytest.mark.parametrize("mode,out_dtype", [("tma+ws", None), ("tma+ws", torch.float32), ("tma+ws+pers", None),
                                            ("tma+ws+pers", torch.float32)])
@pytest.mark.parametrize("causal,q_pos,k_pos", CPU_MASKS)
def test_cpu_forward_split_launches(monkeypatch, causal, q_pos, k_pos, mode, out_dtype):
    """Every ring-step mask through the two-launch forward (unmasked keys, then the masked keys
    resuming from their (out, lse)), including rows that see no key, and float32 output (in place);
    the first launch per tile or persistent."""
    seen = kernel_paths(monkeypatch)
    q = rand(2, 36, 4, 32, dtype=torch.float16, device=CPU, scale=1.5)
    k = rand(2, 45, 2, 32, dtype=torch.float16, device=CPU, scale=1.5)
    v = rand(2, 45, 2, 32, dtype=torch.float16, device=CPU)
    with attention_config.override(**MODES[mode]):
        out, lse = attention_fwd(q, k, v, softmax_scale=0.2, causal=causal, q_offset=q_pos[0], q_stride=q_pos[1],
                                 k_offset=k_pos[0], k_stride=k_pos[1], out_dtype=out_dtype)
    assert of(seen, "fwd") == ["pers" if mode.endswith("pers") else "ws", "rest"]
    assert out.dtype == (out_dtype or torch.float16)
    ref = oracle(q, k, v, 0.2, causal, q_pos, k_pos)
    check("out", out, ref[0], TOL[torch.float16])
    check_lse(lse, ref[1], LSE_ATOL[torch.float16])


@pytest.mark.parametrize("case", [0, 1, 2])
def test_cpu_backward_warp_spec(monkeypatch, case):
    """Each backward kernel runs warp-specialized alone, whole tiles or ragged (rows past the end
    read 0); lse rows off 16-byte alignment run the plain kernels."""
    seen = kernel_paths(monkeypatch)
    run_and_check(2, 32, 48, 4, 2, 32, torch.float16, CPU, *all_visible(48, case), mode="tma+ws")
    run_and_check(1, 36, 45, 4, 1, 32, torch.float16, CPU, *all_visible(45, case), mode="tma+ws")
    assert (of(seen, "dkdv"), of(seen, "dq")) == (["ws", "ws"], ["ws", "ws"])
    seen.clear()
    run_and_check(1, 37, 48, 4, 4, 32, torch.float16, CPU, *all_visible(48, case), mode="tma+ws")
    assert (of(seen, "dkdv"), of(seen, "dq")) == (["plain"], ["plain"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal,q_pos,k_pos", CPU_MASKS)
def test_cpu_backward_warp_spec_masks(monkeypatch, dtype, causal, q_pos, k_pos):
    """Every ring-step mask through the warp-specialized backward (every tile masked by relative
    positions), GQA, rows that see no key, ragged tiles."""
    seen = kernel_paths(monkeypatch)
    run_and_check(2, 36, 45, 4, 2, 32, dtype, CPU, causal, q_pos, k_pos, mode="tma+ws")
    assert (of(seen, "dkdv"), of(seen, "dq")) == (["ws"], ["ws"])


def test_warp_specialized_dkdv_writes_fresh_buffers(monkeypatch):
    """The warp-specialized dK/dV kernel raced on an H200 when it added into the caller's buffers:
    given buffers to add into, attention_bwd launches it with ACCUMULATE off and adds afterwards."""
    from ringsoftmax.kernels import attention_bwd as bwd_module
    flags, real = [], bwd_module.launch_split

    def recording(kernel, grid, args, kwargs, *rest, **kw):
        if kernel is bwd_module._attn_bwd_dkdv_kernel:
            flags.append(kwargs["ACCUMULATE"])
        return real(kernel, grid, args, kwargs, *rest, **kw)

    monkeypatch.setattr(bwd_module, "launch_split", recording)
    run_and_check(1, 32, 48, 4, 2, 32, torch.float16, CPU, *all_visible(48, 0), mode="tma+ws",
                  accumulate=True)
    assert flags and not any(flags)


def test_warp_specialized_tiles_keep_two_stages():
    """triton 3.6's Hopper warp specialization races with 3 pipeline stages (NaN / changed
    gradients on an H200): no table tile of a warp-specialized kernel may ask for more than 2."""
    tables = [((key, causal), tile) for key, entry in attention_config._SM90_16BIT.items() if key[0].endswith("_ws")
              for causal, tile in (entry.items() if isinstance(entry, dict) else [(None, entry)])]
    tables += [(key, tile) for key, tile in attention_config._GENERIC_16BIT.items() if key.endswith("_ws")]
    assert len(tables) >= 9
    for key, tile in tables:
        assert tile.num_stages <= 2 and tile.num_warps == 4, (key, tile)


def test_cpu_rejects_bad_input():
    q = torch.randn(1, 8, 2, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        attention_fwd(q, q, q, softmax_scale=1.0)
    q = torch.randn(1, 8, 3, 16)
    k = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="multiple"):
        attention_fwd(q, k, k, softmax_scale=1.0)
    for bad in (-1.0, 0.0, float("nan")):
        with pytest.raises(ValueError, match="softmax_scale"):
            attention_fwd(q, q, q, softmax_scale=bad)
    out, lse = attention_fwd(q, q, q, softmax_scale=1.0)
    with pytest.raises(ValueError, match="softmax_scale"):
        attention_bwd(q, q, q, out, out, lse, lse, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="float32"):
        out, lse = attention_fwd(q, q, q, softmax_scale=1.0)
        attention_bwd(q, q, q, out, out, lse, lse, softmax_scale=1.0, dq=torch.zeros_like(q).half())


# ----------------------------------------------------------------------------- GPU
def gpu_masks(Sq, Sk):
    """(causal, q_pos, k_pos) for every kind of ring step, for blocks of Sq queries and Sk keys."""
    return [
        (False, (0, 1), (0, 1)),             # full block
        (True, (0, 1), (0, 1)),              # diagonal block
        (True, (Sk + 64, 1), (0, 1)),        # keys all in the past
        (True, (0, 1), (Sq + 1, 1)),         # keys all in the future: nothing visible
        (True, (Sq // 3, 1), (Sq // 2, 1)),  # partial: some query rows see no key
        (True, (3, 4), (1, 4)),              # stripe layout (4 ranks), keys earlier
        (True, (1, 4), (3, 4)),              # stripe layout, keys later
    ]


GPU_SHAPES = [  # (dtype, head_dim, heads, kv_heads)
    (torch.bfloat16, 64, 8, 8),
    (torch.bfloat16, 96, 8, 4),
    (torch.bfloat16, 128, 8, 2),
    (torch.bfloat16, 256, 8, 1),
    (torch.float16, 64, 8, 1),
    (torch.float16, 128, 8, 8),
]


@gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["separate", "atomic", "split", "tma", "tma+ws", "tma+ws+pers", "gluon"])
@pytest.mark.parametrize("dtype,D,H,Hkv", GPU_SHAPES)
def test_gpu_masks(dtype, D, H, Hkv, mode):
    Sq, Sk = 301, 517
    for causal, q_pos, k_pos in gpu_masks(Sq, Sk):
        run_and_check(2, Sq, Sk, H, Hkv, D, dtype, torch.device("cuda"), causal, q_pos, k_pos, mode=mode)


@gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["tma+ws", "tma+ws+pers"])
@pytest.mark.parametrize("dtype,D,H,Hkv", [(torch.bfloat16, 128, 8, 2), (torch.bfloat16, 64, 4, 4),
                                           (torch.float16, 128, 4, 1)])
def test_gpu_warp_spec(monkeypatch, dtype, D, H, Hkv, mode):
    """Every ring-step mask through the warp-specialized kernels (Hopper). Forward: alone where
    every key is visible in whole tiles, else followed by the launch for the masked keys, per tile
    or persistent (per tile where the persistent kernel's float32 output does not fit the shared
    memory, D=128); backward: one launch per kernel."""
    seen = kernel_paths(monkeypatch)
    dev = torch.device("cuda")
    for Sq, Sk in ((1000, 256), (128, 517)):
        for case in (0, 1, 2):
            run_and_check(2, Sq, Sk, H, Hkv, D, dtype, dev, *all_visible(Sk, case), mode=mode)
        for causal, q_pos, k_pos in gpu_masks(Sq, Sk):
            run_and_check(2, Sq, Sk, H, Hkv, D, dtype, dev, causal, q_pos, k_pos, mode=mode)
    if torch.cuda.get_device_capability()[0] == 9:
        runs = 2 * (3 + len(gpu_masks(1, 1)))
        fwd = of(seen, "fwd")
        first = fwd.count("ws") + fwd.count("pers")
        assert "plain" not in fwd and first == runs and fwd.count("rest") > 0
        assert (fwd.count("pers") > 0) == mode.endswith("pers")
        for kernel in ("dkdv", "dq"):
            assert of(seen, kernel) == ["ws"] * runs, kernel


def gluon_launches(monkeypatch):
    """Record the block pairs the Gluon forward ran, as (Sq, Sk, causal, delta)."""
    from ringsoftmax.kernels import attention_fwd as fwd_module
    seen, real = [], fwd_module.gluon_fwd.launch

    def recording(q, k, v, out, lse, **kw):
        real(q, k, v, out, lse, **kw)
        seen.append((q.shape[1], k.shape[1], kw["causal"], kw["delta"]))

    monkeypatch.setattr(fwd_module.gluon_fwd, "launch", recording)
    return seen


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype,D,H,Hkv", [(torch.bfloat16, 128, 8, 2), (torch.bfloat16, 64, 4, 4),
                                           (torch.float16, 128, 4, 1), (torch.float16, 64, 8, 1)])
def test_gpu_gluon_forward(monkeypatch, dtype, D, H, Hkv):
    """The Gluon forward (Hopper) on odd lengths, every unit-stride ring-step mask (offsets that
    leave rows with no visible key, blocks with nothing visible), GQA, a packed qkv tensor, and
    float32 outputs; the stripe masks (stride 4) go to the Triton kernels. Values and lse against
    float64, gradients through the Triton backward from its (out, lse)."""
    seen = gluon_launches(monkeypatch)
    dev = torch.device("cuda")
    expect = 0
    for Sq, Sk in ((301, 517), (1000, 256), (128, 1), (4100, 4100)):
        for causal, q_pos, k_pos in gpu_masks(Sq, Sk):
            run_and_check(2, Sq, Sk, H, Hkv, D, dtype, dev, causal, q_pos, k_pos, mode="gluon")
            expect += q_pos[1] == 1
    if torch.cuda.get_device_capability()[0] != 9:
        assert not seen
        return
    assert len(seen) == expect and any(not c for _, _, c, _ in seen) and any(d < 0 for _, _, _, d in seen)
    # q, k, v as slices of one packed (B, S, 3, H, D) tensor: token stride 3 * H * D
    qkv = rand(2, 777, 3, H, D, dtype=dtype, device=dev, scale=1.5)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1, :Hkv], qkv[:, :, 2, :Hkv]
    for causal in (False, True):
        with attention_config.override(fwd_gluon=True):
            out, lse = attention_fwd(q, k, v, softmax_scale=D ** -0.5, causal=causal)
        ref = oracle(q, k, v, D ** -0.5, causal)
        check("out", out, ref[0], TOL[dtype])
        check_lse(lse, ref[1], LSE_ATOL[dtype])
    # float32 outputs, as the ring's forward steps ask, under the unit-stride ring-step masks
    masks = [m for m in gpu_masks(1000, 256) if m[1][1] == 1]
    for causal, q_pos, k_pos in masks:
        q = rand(2, 1000, H, D, dtype=dtype, device=dev, scale=1.5)
        k, v = (rand(2, 256, Hkv, D, dtype=dtype, device=dev, scale=1.5) for _ in range(2))
        kw = dict(softmax_scale=D ** -0.5, causal=causal, q_offset=q_pos[0], k_offset=k_pos[0])
        with attention_config.override(fwd_gluon=True):
            out, lse = attention_fwd(q, k, v, out_dtype=torch.float32, **kw)
        assert out.dtype == torch.float32
        ref = oracle(q, k, v, D ** -0.5, causal, q_pos, k_pos)
        check("out", out, ref[0], TOL[dtype] / 2)
        check_lse(lse, ref[1], LSE_ATOL[dtype])
    assert len(seen) == expect + 2 + len(masks)


def test_gluon_split_rule(monkeypatch):
    """Where the Gluon forward splits its grid by key tiles (``split_grid``): not causal, persistent,
    fewer than SPLIT_MAX_WAVES waves of query tiles with the last one partial, at least
    SPLIT_MIN_KEY_TILES key tiles per query tile; one program per two steps where they are fewer than
    the multiprocessors."""
    from ringsoftmax.kernels import attention_fwd_gluon as gluon_fwd
    monkeypatch.setattr(gluon_fwd, "_multiprocessors", lambda index: 132)
    q, k = torch.empty(1, 1000, 6, 64), torch.empty(1, 8192, 2, 64)   # 48 query tiles of 64 key tiles
    split = functools.partial(gluon_fwd.split_grid, block_m=128, block_n=128)
    assert split(q, k, False) == 132 and split(q, k, True) == 0 and split(q, k, False, persistent=False) == 0
    assert split(q, k, False, split=False) == 0 and split(q, k[:, :8064], False) == 0   # 63 key tiles
    assert split(q, k, False, block_m=1000) == 132 and split(q[:, :100, :1], k, False) == 32   # 64 steps
    assert split(torch.empty(1, 128, 132, 64), k, False) == 0   # one whole wave
    assert split(torch.empty(1, 128, 5 * 132 - 1, 64), k, False) == 132
    assert split(torch.empty(1, 128, 5 * 132 + 1, 64), k, False) == 0
    # the tile of a launch: SPLIT_TILE where it splits; else the table's, unsplit even where 192-row
    # tiles would split (700 tiles of 128 rows: 5.3 waves; 490 of 192: 3.7)
    assert gluon_fwd.launch_tile(q, k, False) == (list(gluon_fwd.SPLIT_TILE), 132)
    assert gluon_fwd.launch_tile(q, k, True) == (list(gluon_fwd.TILES[(64, True)]), 0)
    q = torch.empty(1, 1280, 70, 64)
    assert gluon_fwd.launch_tile(q, k, False) == (list(gluon_fwd.TILES[(64, False)]), 0)
    assert gluon_fwd.launch_tile(q, k, False, (192, None, None, 160, 40)) == ([192, 128, 2, 160, 40], 132)
    # a given block_m takes the other sizes from an entry of that many rows (registers by warpgroups)
    assert gluon_fwd.launch_tile(q, k, False, (192,) + (None,) * 4)[0] == list(gluon_fwd.TILES[(64, False)])
    assert gluon_fwd.launch_tile(q, k, False, (128,) + (None,) * 4) == (list(gluon_fwd.SPLIT_TILE), 0)


def test_gluon_dkdv_table(monkeypatch):
    """The Gluon dK/dV kernel: Hopper 16-bit D=64 and 128; off for float32, on the CPU, on other GPUs
    and under any override of the Triton dK/dV kernel's tiles or modes, unless asked for. What it
    computes (16-bit, D 64 or 128, unit position strides if causal), and lse/delta rows it reads as
    they are when 16-byte aligned, else as a copy padded with zeros to a multiple of 4."""
    from ringsoftmax.kernels import attention_bwd_gluon as gluon_bwd
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(attention_config, "cuda_major", lambda device: 9)
    dkdv_gluon = attention_config.dkdv_gluon
    assert dkdv_gluon(cuda, 128, torch.bfloat16, True) and dkdv_gluon(cuda, 64, torch.float16, False)
    assert not dkdv_gluon(cuda, 256, torch.bfloat16, False)
    assert not dkdv_gluon(cuda, 128, torch.float32, False)
    assert not dkdv_gluon(cpu, 128, torch.bfloat16, False)
    for mode in ("tma+ws", "separate", "atomic", "tma"):
        with attention_config.override(**MODES[mode]):
            assert not dkdv_gluon(cuda, 128, torch.bfloat16, False), mode
    with attention_config.override(dkdv=attention_config.Tile(32, 64, 4, 2)):
        assert not dkdv_gluon(cuda, 64, torch.bfloat16, False)
    with attention_config.override(dkdv_gluon=False):
        assert not dkdv_gluon(cuda, 128, torch.bfloat16, False)
    with attention_config.override(fwd_gluon=True):   # the forward's switch leaves it on
        assert dkdv_gluon(cuda, 128, torch.bfloat16, False)
    monkeypatch.setattr(attention_config, "cuda_major", lambda device: 8)
    assert not dkdv_gluon(cuda, 128, torch.bfloat16, False)
    q = torch.empty(1, 8, 2, 128, dtype=torch.bfloat16)
    assert gluon_bwd.supports(q, 128, True, 1, 1) and gluon_bwd.supports(q, 64, False, 3, 2)
    assert not gluon_bwd.supports(q, 96, False, 1, 1) and not gluon_bwd.supports(q, 128, True, 4, 4)
    assert not gluon_bwd.supports(q.float(), 128, False, 1, 1)
    aligned = torch.randn(2, 3, 8)
    assert gluon_bwd.tma_rows(aligned)[0] is aligned and gluon_bwd.tma_rows(aligned)[1] == 8
    for x in (torch.randn(2, 3, 7), torch.randn(2, 3, 10)[..., 1:9], torch.randn(3, 2, 8).transpose(0, 1)):
        rows, row = gluon_bwd.tma_rows(x)
        assert row % 4 == 0 and rows.is_contiguous() and rows.shape == (*x.shape[:2], row)
        assert torch.equal(rows[..., :x.shape[2]], x) and not rows[..., x.shape[2]:].any()


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype,D,H,Hkv", [(torch.bfloat16, 128, 8, 2), (torch.bfloat16, 64, 4, 4),
                                           (torch.float16, 128, 4, 1), (torch.float16, 64, 8, 1)])
def test_gpu_gluon_dkdv(monkeypatch, dtype, D, H, Hkv):
    """The Gluon dK/dV kernel (Hopper, the default there) on odd lengths (lse rows not 16-byte
    aligned), every unit-stride ring-step mask (rows with no visible key, blocks with nothing
    visible), GQA, gradients written fresh and added into buffers; the stripe masks go to the Triton
    kernel. Against float64, and bit for bit the plain Triton kernel's dK/dV (same tiles, same order
    of additions); 16-bit gradients are the float32 ones rounded once."""
    from ringsoftmax.kernels import attention_bwd_gluon as gluon_bwd
    seen, real = [], gluon_bwd.launch
    monkeypatch.setattr(gluon_bwd, "launch", lambda *a, **kw: (seen.append(kw["causal"]), real(*a, **kw)))
    dev = torch.device("cuda")
    expect = 0
    for i, (Sq, Sk) in enumerate(((301, 517), (1000, 256), (128, 1), (77, 3000), (4100, 4100))):
        for causal, q_pos, k_pos in gpu_masks(Sq, Sk):
            run_and_check(2, Sq, Sk, H, Hkv, D, dtype, dev, causal, q_pos, k_pos, mode={}, accumulate=i % 2 == 1)
            expect += q_pos[1] == 1
    hopper = torch.cuda.get_device_capability()[0] == 9
    assert len(seen) == (expect if hopper else 0) and (not hopper or (True in seen and False in seen))
    q = rand(2, 1003, H, D, dtype=dtype, device=dev, scale=1.5)
    k, v = (rand(2, 700, Hkv, D, dtype=dtype, device=dev, scale=1.5) for _ in range(2))
    dout = rand(2, 1003, H, D, dtype=dtype, device=dev)
    for causal, q_pos, k_pos in gpu_masks(1003, 700)[:5]:
        kw = dict(softmax_scale=D ** -0.5, causal=causal, q_offset=q_pos[0], k_offset=k_pos[0])
        out, lse = attention_fwd(q, k, v, **kw)
        delta = attention_delta(out, dout)
        grads = attention_bwd(q, k, v, out, dout, lse, delta, **kw)
        with attention_config.override(dkdv_gluon=False, dkdv_warp_spec=False):
            plain = attention_bwd(q, k, v, out, dout, lse, delta, **kw)
        assert torch.equal(grads[1], plain[1]) and torch.equal(grads[2], plain[2]), (causal, q_pos, k_pos)
        narrow = attention_bwd(q, k, v, out, dout, lse, delta, grad_dtype=dtype, **kw)
        assert torch.equal(narrow[1], grads[1].to(dtype)) and torch.equal(narrow[2], grads[2].to(dtype))


@gpu
@needs_cuda
def test_gpu_gluon_repeatable():
    """The Gluon forward's pipeline (two K/V slots, released by both compute warpgroups) gives the
    same bits over repeated runs, causal and not, with many key tiles per query tile."""
    dev = torch.device("cuda")
    q = rand(2, 4096, 8, 128, dtype=torch.bfloat16, device=dev, scale=1.5)
    k, v = (rand(2, 4096, 2, 128, dtype=torch.bfloat16, device=dev) for _ in range(2))
    for causal in (False, True):
        with attention_config.override(fwd_gluon=True):
            first = attention_fwd(q, k, v, softmax_scale=128 ** -0.5, causal=causal)
            assert torch.isfinite(first[0]).all()
            for _ in range(30):
                again = attention_fwd(q, k, v, softmax_scale=128 ** -0.5, causal=causal)
                assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]), causal


@gpu
@needs_cuda
def test_gpu_gluon_grids():
    """The Gluon forward's persistent grid (programs walking several query tiles: Q buffers and K/V
    slots carried across tiles, causal units paired heaviest with lightest, an odd tile count) gives
    the bits of a grid of one program per unit, on q/k/v from a (B, H, S, D) layout (head stride
    S * D), with 16-bit and float32 outputs; and matches float64. Last tiles with warpgroups that
    have no row (S % 128 <= 64 in 128-row tiles, S % 192 <= 128 in 192-row ones: 4100 and 5000 at
    D=64, causal 4100, 1950 at D=128), and the rotated order of the persistent grid's tiles. Blocks
    with no key give zeros and lse = -inf. (The persistent grid without its split of the key tiles:
    ``test_gpu_gluon_split``.)"""
    from ringsoftmax.kernels import attention_fwd_gluon as gluon_fwd
    from ringsoftmax.kernels.attention_fwd import descriptor_scratch
    if torch.cuda.get_device_capability()[0] != 9 or gluon_fwd.gluon is None:
        pytest.skip("the Gluon forward runs on Hopper only")
    dev = torch.device("cuda")
    for D, S, causal, delta in ((64, 4100, True, 0), (64, 4100, False, 0), (64, 5000, False, 0),
                                (128, 1950, False, 0), (128, 3000, True, -300)):
        q = rand(3, 6, S, D, dtype=torch.bfloat16, device=dev, scale=1.5).transpose(1, 2)
        k, v = (rand(3, 2, S, D, dtype=torch.bfloat16, device=dev).transpose(1, 2) for _ in range(2))
        assert gluon_fwd.grid_size(q, causal) < gluon_fwd.grid_size(q, causal, persistent=False)
        for out_dtype in (torch.bfloat16, torch.float32):
            outs = []
            for persistent in (True, False):
                out = torch.full(q.shape, float("nan"), dtype=out_dtype, device=dev)
                lse = torch.full((3, 6, S), float("nan"), device=dev)
                with descriptor_scratch():
                    gluon_fwd.launch(q, k, v, out, lse, qk_scale=D ** -0.5 * 1.4426950408889634, causal=causal,
                                     delta=delta, persistent=persistent, split=False)
                outs.append((out, lse))
            assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), (D, S, causal)
            ref = oracle(q, k, v, D ** -0.5, causal, (delta, 1), (0, 1))
            check("out", outs[0][0], ref[0], TOL[torch.bfloat16])
            check_lse(outs[0][1], ref[1], LSE_ATOL[torch.bfloat16])
    # no key at all: every row sees nothing
    q = rand(2, 300, 4, 64, dtype=torch.bfloat16, device=dev)
    k = v = torch.empty(2, 0, 4, 64, dtype=torch.bfloat16, device=dev)
    with attention_config.override(fwd_gluon=True):
        out, lse = attention_fwd(q, k, v, softmax_scale=0.125)
    assert torch.equal(out, torch.zeros_like(q)) and bool((lse == float("-inf")).all())


@gpu
@needs_cuda
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_gluon_split(D):
    """The Gluon forward's split grid (every program an equal share of the (query tile, key tile)
    steps; a tile cut between programs merged by its last piece): one tile cut into a piece per
    multiprocessor, tiles of two key tiles per piece, a masked last key tile, GQA, and a grid just
    past one wave; 16-bit and float32 outputs against float64, the unsplit grid's values, and the
    same bits over repeated runs. (Where it splits: ``test_gluon_split_rule``.)"""
    from ringsoftmax.kernels import attention_fwd_gluon as gluon_fwd
    from ringsoftmax.kernels.attention_fwd import descriptor_scratch
    if torch.cuda.get_device_capability()[0] != 9 or gluon_fwd.gluon is None:
        pytest.skip("the Gluon forward runs on Hopper only")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    block_m, block_n = gluon_fwd.SPLIT_TILE[:2]   # the tile of every split launch
    for B, H, Hkv, Sq, Sk in ((1, 1, 1, 100, 40000), (1, 3, 1, 300, 8200), (2, 6, 2, 1000, 8193),
                              (1, 17, 17, 1024, 8192)):
        q = rand(B, Sq, H, D, dtype=torch.bfloat16, device=dev, scale=1.5)
        k, v = (rand(B, Sk, Hkv, D, dtype=torch.bfloat16, device=dev) for _ in range(2))
        programs = gluon_fwd.split_grid(q, k, False, block_m, block_n)
        assert programs == min(sms, B * H * -(-Sq // block_m) * -(-Sk // block_n) // 2), (B, H, Sq, Sk)
        ref = oracle(q, k, v, D ** -0.5, False)
        for out_dtype in (torch.bfloat16, torch.float32):
            runs = []
            for split in (True, True, False):
                out = torch.full(q.shape, float("nan"), dtype=out_dtype, device=dev)
                lse = torch.full((B, H, Sq), float("nan"), device=dev)
                with descriptor_scratch():
                    gluon_fwd.launch(q, k, v, out, lse, qk_scale=D ** -0.5 * 1.4426950408889634, causal=False,
                                     split=split)
                runs.append((out, lse))
            for out, lse in runs:
                check("out", out, ref[0], TOL[torch.bfloat16] / (2 if out_dtype == torch.float32 else 1))
                check_lse(lse, ref[1], LSE_ATOL[torch.bfloat16])
            assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]), (Sq, Sk)
            assert (runs[0][1] - runs[2][1]).abs().max().item() < 1e-5, (Sq, Sk)


@gpu
@needs_cuda
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_grad_dtype(D):
    """bf16 gradients written by the default kernels (warp-specialized on Hopper) are the float32
    ones rounded once, for full, causal and ring-step masks."""
    for causal, q_pos, k_pos in gpu_masks(1000, 512)[:4]:
        check_grad_dtype(2, 1000, 512, 8, 2, D, torch.bfloat16, torch.device("cuda"), causal, q_pos, k_pos, None)


@gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["tma+ws", "tma+ws+pers"])
def test_gpu_warp_spec_repeatable(mode):
    """The warp-specialized kernels have no atomics: repeated runs give the same bits. (3 pipeline
    stages in the dK/dV kernel raced at these shapes: NaN or other values in ~2.5% of runs.)"""
    dev = torch.device("cuda")
    for Sq, Sk, (causal, q_pos, k_pos) in ((1000, 256, all_visible(256, 2)), (4096, 4096, gpu_masks(4096, 4096)[6]),
                                           (1000, 256, gpu_masks(1000, 256)[5])):
        q = rand(2, Sq, 8, 128, dtype=torch.bfloat16, device=dev, scale=1.5)
        k = rand(2, Sk, 2, 128, dtype=torch.bfloat16, device=dev, scale=1.5)
        v = rand(2, Sk, 2, 128, dtype=torch.bfloat16, device=dev)
        dout = rand(2, Sq, 8, 128, dtype=torch.bfloat16, device=dev)
        kw = dict(softmax_scale=128 ** -0.5, causal=causal, q_offset=q_pos[0], q_stride=q_pos[1], k_offset=k_pos[0],
                  k_stride=k_pos[1])
        with attention_config.override(**MODES[mode]):
            first = attention_fwd(q, k, v, **kw)
            delta = attention_delta(first[0], dout)
            grads = attention_bwd(q, k, v, first[0], dout, first[1], delta, **kw)
            assert all(torch.isfinite(g).all() for g in grads)
            for _ in range(40):
                again = attention_fwd(q, k, v, **kw) + attention_bwd(q, k, v, first[0], dout, first[1], delta, **kw)
                for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), first + grads, again):
                    assert torch.equal(a, b), f"{name} changed between runs ({Sq}x{Sk}, q {q_pos}, k {k_pos})"


@gpu
@needs_cuda
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_ring_pairs_repeatable(D):
    """The default kernels on the block pairs of a zigzag ring (16K tokens, 2 ranks: 4K segments,
    GQA 16/8), gradients added into float32 buffers as the ring does, 20 times: finite and the same
    bits every time. (The warp-specialized dK/dV kernel adding into the buffers itself gave NaN in
    ring replays of these pairs.)"""
    dev, n = torch.device("cuda"), 4096
    q = rand(1, n, 16, D, dtype=torch.bfloat16, device=dev)
    k, v = (rand(1, n, 8, D, dtype=torch.bfloat16, device=dev) for _ in range(2))
    dout = rand(1, n, 16, D, dtype=torch.bfloat16, device=dev)
    for q_off, k_off in ((n, 0), (0, 0), (3 * n, 2 * n)):   # all visible, diagonal, diagonal later
        kw = dict(softmax_scale=D ** -0.5, causal=True, q_offset=q_off, k_offset=k_off)
        out, lse = attention_fwd(q, k, v, **kw)
        delta = attention_delta(out, dout)
        first = None
        for _ in range(20):
            grads = [torch.ones(t.shape, dtype=torch.float32, device=dev) for t in (q, k, v)]
            attention_bwd(q, k, v, out, dout, lse, delta, dq=grads[0], dk=grads[1], dv=grads[2], **kw)
            assert all(torch.isfinite(g).all() for g in grads), f"non-finite gradient (q at {q_off}, k at {k_off})"
            first = first or grads
            assert all(torch.equal(a, b) for a, b in zip(first, grads)), f"gradients changed (q {q_off}, k {k_off})"


@gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_float32_exact(causal):
    run_and_check(1, 200, 333, 4, 2, 64, torch.float32, torch.device("cuda"), causal, (100, 1), (0, 1))


@gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["separate", "atomic+split", "tma"])
@pytest.mark.parametrize("causal,q_pos,k_pos", [(False, (0, 1), (0, 1)), (True, (0, 1), (0, 1)),
                                                (True, (5, 1), (0, 1)), (True, (0, 2), (1, 2))])
def test_gpu_varlen(causal, q_pos, k_pos, mode):
    dtype, H, Hkv, D, scale, dev = torch.bfloat16, 8, 2, 128, 128 ** -0.5, torch.device("cuda")
    lens_q, lens_k = [1, 7, 1000, 7], [7, 1, 1000, 1000]
    cu_q = torch.tensor([0] + lens_q, device=dev).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device=dev).cumsum(0).to(torch.int32)
    Tq, Tk = sum(lens_q), sum(lens_k)
    q = rand(Tq, H, D, dtype=dtype, device=dev, scale=1.5)
    k = rand(Tk, Hkv, D, dtype=dtype, device=dev, scale=1.5)
    v = rand(Tk, Hkv, D, dtype=dtype, device=dev)
    dout = rand(Tq, H, D, dtype=dtype, device=dev)
    kw = dict(softmax_scale=scale, causal=causal, q_offset=q_pos[0], q_stride=q_pos[1], k_offset=k_pos[0],
              k_stride=k_pos[1], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=1000, max_seqlen_k=1000)
    with attention_config.override(**(MODES[mode] if isinstance(mode, str) else mode)):
        out, lse = attention_fwd(q, k, v, **kw)
        dq, dk, dv = attention_bwd(q, k, v, out, dout, lse, attention_delta(out, dout), **kw)
    ref = oracle_varlen(q, k, v, cu_q.cpu(), cu_k.cpu(), scale, causal, q_pos, k_pos, dout)
    check("out", out, ref[0], TOL[dtype])
    check_lse(lse, ref[1], LSE_ATOL[dtype])
    for name, x, r in (("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
        check(name, x, r, 2 * TOL[dtype])


@gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["separate", "atomic+split", "tma", "tma+ws"])
def test_gpu_strided_accumulate(mode):
    dev, dtype, B, Sq, Sk, H, Hkv, D, scale = torch.device("cuda"), torch.bfloat16, 2, 332, 270, 8, 4, 128, 0.1
    big_q = rand(B, Sq + 10, H, D, dtype=dtype, device=dev)
    big_kv = rand(B, Sk + 7, 2, Hkv, D, dtype=dtype, device=dev)
    q, k, v = big_q[:, 10:], big_kv[:, :Sk, 0], big_kv[:, :Sk, 1]
    dout = rand(B, Sq, H, D, dtype=dtype, device=dev)
    kw = dict(softmax_scale=scale, causal=True, q_offset=100, k_offset=0)
    bufs = [torch.randn(B, S + 6, h, D, device=dev) for S, h in ((Sq, H), (Sk, Hkv), (Sk, Hkv))]
    views = [buf[:, 2:-4] for buf in bufs]
    before = [view.clone() for view in views]
    with attention_config.override(**MODES[mode]):
        out, lse = attention_fwd(q, k, v, out_dtype=torch.float32, **kw)
        dq, dk, dv = attention_bwd(q, k, v, out, dout, lse, attention_delta(out, dout), dq=views[0], dk=views[1],
                                   dv=views[2], **kw)
    ref = oracle(q, k, v, scale, True, (100, 1), (0, 1), dout)
    check("out", out, ref[0], TOL[dtype])
    for name, x, b0, r in zip(("dq", "dk", "dv"), (dq, dk, dv), before, ref[2:]):
        check(name, x - b0, r, 2 * TOL[dtype])


def test_probe_kernel_copies_apply(tmp_path, monkeypatch):
    """The probes' checked edits of the Gluon kernels' sources (``benchmarks/probes/fa_variants.py``,
    ``ablations.py``) still find their anchors (each exits if its text is gone) and write modules
    that parse, so the variants in benchmarks/RESULTS.md can be rebuilt from the current sources."""
    import ast
    import pathlib
    import runpy
    import sys

    probes = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "probes"
    monkeypatch.syspath_prepend(str(probes))
    for script in ("fa_variants.py", "ablations.py"):
        monkeypatch.setattr(sys, "argv", [script, str(tmp_path / script)])
        runpy.run_path(str(probes / script), run_name="__main__")
    written = {p.name: p for p in tmp_path.glob("*/*.py")}
    assert {"fa_lazy.py", "fa_pinned.py", "fa_noexp.py", "fa_mmaonly.py", "sm_stream.py", "sm_nowords.py",
            "sm_count_merges.py", "sm_count_rereads.py"} <= set(written)
    for path in written.values():
        ast.parse(path.read_text())


def test_probe_attention_timeline(monkeypatch):
    """``benchmarks/probes/fa_timeline.py``: its traced copies of the Gluon forward still find their
    anchors and parse, with one clock reading per asked event, and its summary reads spans, lags and
    overlaps right off a made-up trace (period 1000 cycles, warpgroup 1 300 behind, wrapping 2^32)."""
    import ast
    import pathlib
    import re

    probes = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "probes"
    monkeypatch.syspath_prepend(str(probes))
    import fa_timeline
    from ablations import KERNELS

    src = (KERNELS / "attention_fwd_gluon.py").read_text()
    for events in ("012", "01234"):
        traced = fa_timeline.traced_source(src, events)
        ast.parse(traced)
        assert traced.count("_trace(PartML") == len(events)
    t = torch.zeros(2, 2, fa_timeline.TRACE_TILES, fa_timeline.EVENTS, dtype=torch.int64)
    for j in range(1, 32):
        for w in range(2):
            start = (1 << 32) - 5000 + 1000 * j + 300 * w
            t[:, w, j] = torch.tensor([start + e for e in (0, 50, 400, 800, 900)]) & 0xFFFFFFFF
    t = torch.where(t >= 1 << 31, t - (1 << 32), t).to(torch.int32)
    lines = fa_timeline.analyse(t, 32, "01234")
    expect = {"K wait": 50, "S wait after it": 350, "softmax (e3": 400, "P V wait": 100, "to next tile": 100,
              "period": 1000, "S ready, warpgroup 1": 300, "their softmax spans overlap": 50}
    for key, value in expect.items():
        line = next(x for x in lines if key in x)
        assert int(re.search(r" (-?\d+) \(", line).group(1)) == value, line
    assert any("softmax, P V wait" in x and " 600 " in x for x in fa_timeline.analyse(t, 32, "012"))
