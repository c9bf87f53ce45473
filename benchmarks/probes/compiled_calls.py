"""Probe: the library's calls inside torch.compile against the same calls made eagerly.

Under torch.compile, softmax / softmax_with_lse / attention reach dynamo as custom ops
(``ringsoftmax.softmax.softmax_rows_op``, ``ringsoftmax.attention.attention_block_op``): the graph
runs the same kernels, plus the dispatcher's cost per op. For each case this times forward +
backward (``triton.testing.do_bench``, median ms) of:

- eager: the library called directly;
- compiled: ``torch.compile(fn, fullgraph=True)`` (inductor);
- graphs: the same with ``mode="reduce-overhead"`` (CUDA graphs: no host cost per call);
- torch compiled: ``torch.compile`` of torch's own op (softmax cases only), for scale;
- scale eager / scale compiled: the input's scaling alone (``x * 1.5``, forward + backward), eagerly and
  compiled: what a compiled call costs around an op that does almost nothing (host-bound at these sizes).

Each case's function scales its input first (``x * 1.5``), so that the compiled graph holds an op of
inductor's around the library's. Ratios are against eager, in the same process.

Run on a GPU:  python3 benchmarks/probes/compiled_calls.py [--rounds 3]
"""
from __future__ import annotations

import argparse

import torch
import triton

import ringsoftmax as rs

SOFTMAX_CASES = [(4096, 1024), (1024, 16384), (16, 1048576), (4, 16777216)]  # (M, N), bf16
ATTENTION_CASES = [(4, 2048, 16, 128), (1, 16384, 16, 128)]                  # (batch, seqlen, heads, head_dim), causal


def fwd_bwd(fn, inputs, grads):
    """A callable running fn(*inputs) and its backward with ``grads`` (inputs' gradients dropped each time)."""
    def run():
        outs = fn(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.backward(outs[:len(grads)], grads)
    return run


def scale(*t):
    return t[0] * 1.5


def variants(lib_fn, torch_fn):
    out = {"eager": lib_fn, "compiled": torch.compile(lib_fn, fullgraph=True),
           "graphs": torch.compile(lib_fn, fullgraph=True, mode="reduce-overhead")}
    if torch_fn is not None:
        out["torch compiled"] = torch.compile(torch_fn, fullgraph=True)
    out.update({"scale eager": scale, "scale compiled": torch.compile(scale, fullgraph=True)})
    return out


def time_case(name, lib_fn, torch_fn, inputs, grads, rounds):
    rows = {}
    for _ in range(rounds):
        for label, fn in variants(lib_fn, torch_fn).items():
            run = fwd_bwd(fn, inputs, grads)
            for _ in range(3):
                run()                                    # compile, record graphs, warm up
            ms = triton.testing.do_bench(run, grad_to_none=list(inputs), return_mode="median")
            rows.setdefault(label, []).append(ms)
    eager = min(rows["eager"])
    cells = "  ".join(f"{label} {min(v):.4f} ms ({min(v) / eager:.2f}x)" for label, v in rows.items())
    print(f"{name:<42} {cells}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"forward + backward, median ms (best of {args.rounds} rounds), ratio to eager", flush=True)
    for m, n in SOFTMAX_CASES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16).requires_grad_()
        g = torch.randn_like(x)
        time_case(f"softmax bf16 ({m}, {n})", lambda t: rs.softmax(t * 1.5, dim=-1),
                  lambda t: torch.softmax(t * 1.5, dim=-1), [x], [g], args.rounds)
    for b, s, h, d in ATTENTION_CASES:
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        g = torch.randn_like(q)
        time_case(f"attention bf16 causal ({b}, {s}, {h}, {d})",
                  lambda a, c, e: rs.attention(a * 1.5, c, e, causal=True)[0], None, [q, k, v], [g], args.rounds)


if __name__ == "__main__":
    main()
