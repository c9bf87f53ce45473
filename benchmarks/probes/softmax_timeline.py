"""Timeline of the staged split-row softmax kernel's steps, read from the multiprocessor's clock.

Writes a copy of ``softmax_staged.py`` whose step loop reads ``%clock`` (the SM's cycle counter) at
six points of each of a program's first TRACE_STEPS steps and stores the readings into the PRIOR
argument (unused by launches without a prior):

    e0 the step's start             e1 the next unit's copy issued (after the CTA barrier, the claim)
    e2 this step's unit landed      e3 its partial published        e4 the written unit's row
    statistic merged (the wait for every program's partial)         e5 the written unit stored

and prints, per configuration, the % of copy of the library kernel and of the traced copy, then the
medians (quartiles) over the programs and steps (the first LAG + 2 left out) of e1-e0, e2-e1, e3-e2,
e4-e3 (a deep ring's step that keeps its row statistic merges nothing), e5-e4 and the step (e0 of
the next step - e0). Forward only, on (M, N) rows, M * N = 2^28.

Run on a GPU:  python3 benchmarks/probes/softmax_timeline.py [--n 4194304] [--dtypes bf16,fp32]
                   [--configs bf16=16384:4:3:1:1,16384:4:7:1:5;fp32=8192:4:7:1:5]  (chunk:warps:slots:ahead:lag, TMA)
The clock readings are ordered with the waits, loads and stores around them (side-effecting asm);
arithmetic may be scheduled across them.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile

import torch
import triton

from ablations import KERNELS, edit  # same folder
from module_copies import load_copies  # same folder

TRACE_STEPS = 48
EVENTS = 6
LOOP = "            "  # the step loop's indentation


def traced_source(src: str) -> str:
    """The kernel module with clock readings in the staged kernel's step loop."""
    def at(e, indent=LOOP, dep="lanes"):
        return f"{indent}_trace(PRIOR, t, {e}, lanes, {dep})\n"
    src = edit(src, '''    @gluon.jit
    def _exp2_ftz(x):''', f'''    @gluon.jit
    def _trace(T, t, e: gl.constexpr, lanes, dep):
        """Store the SM clock (read after ``dep``) at T[pid, t, e] for the first {TRACE_STEPS} steps."""
        c = gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [dep], dtype=gl.int32, is_pure=False,
                                      pack=1)
        offs = (gl.program_id(0) * {TRACE_STEPS} + t) * {EVENTS} + e
        gl.store(T + offs + lanes * 0, c, mask=(lanes == 0) & (t < {TRACE_STEPS}))

    @gluon.jit
    def _exp2_ftz(x):''')
    src = edit(src, '''        while _pending(DEEP, fifo_row, old_row, prev_row, cur_row, M):
''', '''        while _pending(DEEP, fifo_row, old_row, prev_row, cur_row, M):
''' + at(0))
    src = edit(src, '''
            # the unit written now; its row's partial words start arriving, used after the reduction
''', '\n' + at(1) + '''            # the unit written now; its row's partial words start arriving, used after the reduction
''')
    src = edit(src, '''                    _wait_slot(bars, t % STAGES, (t // STAGES) & 1, AHEAD, TMA_LOAD)
                    _reduce_unit(ring_a, ring_b, t % STAGES, P, cur_row, cur_q, Q, N, stride_a, offs, BWD, layout, ALIGN,
                                 CHUNK)
''', '''                    _wait_slot(bars, t % STAGES, (t // STAGES) & 1, AHEAD, TMA_LOAD)
''' + at(2, LOOP + "        ") + '''                    _reduce_unit(ring_a, ring_b, t % STAGES, P, cur_row, cur_q, Q, N, stride_a, offs, BWD, layout, ALIGN,
                                 CHUNK)
''' + at(3, LOOP + "        "))
    src = edit(src, '''                if HAS_PRIOR:  # the whole row's statistic, for its other columns
''', at(4, LOOP + "    ", "(lanes * 0).to(gl.float32) + s") + '''                if HAS_PRIOR:  # the whole row's statistic, for its other columns
''')
    src = edit(src, '''                        _write_ends(A, B, OUT, w_row, start, first, end, stride_a, stride_b, stride_o, m, s, BWD, FOLD,
                                    CHUNK, STORE_EVICT, ALIGN)
''', '''                        _write_ends(A, B, OUT, w_row, start, first, end, stride_a, stride_b, stride_o, m, s, BWD, FOLD,
                                    CHUNK, STORE_EVICT, ALIGN)
''' + at(5, LOOP + "    "))
    src = edit(src, '''    return [a, b, out, *descriptors, out if lse is None else lse, words, err, err if prior is None else prior,''',
               '''    trace = err if TRACE is None else TRACE
    return [a, b, out, *descriptors, out if lse is None else lse, words, err, trace if prior is None else prior,''')
    return src + ("\n#: The probe's trace buffer (int32, programs x TRACE_STEPS x EVENTS), passed as PRIOR."
                  "\nTRACE = None\n")


def quartiles(xs):
    if not xs:
        return "     - (no readings)"
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{q[1]:7.0f} ({q[0]:.0f}-{q[2]:.0f})"


def analyse(trace: torch.Tensor, first: int) -> list[str]:
    """Summary lines from trace (programs, TRACE_STEPS, EVENTS) int32 clock readings (0: not read)."""
    t = trace.to(torch.int64) & 0xFFFFFFFF

    def d(a, b):   # cycles from b to a through the 32-bit wrap
        return (a - b) & 0xFFFFFFFF
    spans = (("issue: barrier, claim, copy (e1-e0)", 1, 0), ("unit landed (e2-e1)", 2, 1),
             ("reduce, publish (e3-e2)", 3, 2), ("row statistic merged (e4-e3)", 4, 3),
             ("normalize, store (e5-e4)", 5, 4), ("step (e0'-e0)", 6, 0))
    cols = {n: [] for n, _, _ in spans}
    for p in range(t.shape[0]):
        for s in range(first, TRACE_STEPS - 1):
            e = t[p, s].tolist() + [int(t[p, s + 1, 0])]
            for n, x, y in spans:
                if e[x] and e[y] and (y != 3 or e[2]):
                    cols[n].append(d(e[x], e[y]))
    return [f"  {n:38s} {quartiles(v)} cycles, {len(v)} readings" for n, v in cols.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4194304)
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--configs", default="bf16=16384:4:3:1:1,16384:4:7:1:5,8192:4:5:1:3;fp32=8192:4:7:1:5")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from ringsoftmax.kernels import softmax_staged as S
    tmp = pathlib.Path(tempfile.mkdtemp())
    (tmp / "staged_traced.py").write_text(traced_source((KERNELS / "softmax_staged.py").read_text()))
    traced = load_copies(f"traced={tmp / 'staged_traced.py'}")["traced"]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    configs = dict(part.split("=") for part in args.configs.split(";"))
    bench = lambda f: triton.testing.do_bench(f, warmup=5, rep=30, return_mode="median")  # noqa: E731
    a0 = torch.empty(1 << 29, device="cuda").normal_()
    b0 = torch.empty_like(a0)
    copy = 2 * a0.numel() * 4 / bench(lambda: b0.copy_(a0)) / 1e6
    del a0, b0
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, f"copy {copy:.0f} GB/s")
    for dname in args.dtypes.split(","):
        dtype = dtypes[dname]
        n = args.n
        m = max(1, (1 << 28) // n)
        x = (torch.randn(m, n, device="cuda") * 4).to(dtype)
        ref = torch.softmax(x.double(), dim=-1)
        for cfg in configs.get(dname, "").split(","):
            if not cfg:
                continue
            config = tuple(map(int, cfg.split(":"))) + (True,)
            out, lse = torch.empty_like(x), torch.empty(m, device="cuda")
            grid = S._launch_plan("fwd", x, x, out, lse, config, None)
            if grid is None:
                print(f"{dname} N={n} config {config}: a row does not fit the grid")
                continue
            programs = grid[0]
            traced.TRACE = torch.zeros(programs * TRACE_STEPS * EVENTS, dtype=torch.int32, device="cuda")
            runs = {"library": lambda: S.launch("fwd", x, x, out, lse, config),
                    "traced": lambda: traced.launch("fwd", x, x, out, lse, config)}
            times = {k: [] for k in runs}
            for _ in range(args.rounds):
                for k, f in runs.items():
                    times[k].append(bench(f))
            pct = {k: 2 * x.numel() * x.element_size() / statistics.median(v) / 1e6 / copy * 100
                   for k, v in times.items()}
            traced.TRACE.zero_()
            out.fill_(float("nan"))
            runs["traced"]()
            torch.cuda.synchronize()
            err = (out.double() - ref).abs().max().item()
            print(f"{dname} N={n} M={m} config {config}, {programs} programs: library {pct['library']:.1f}% of copy, "
                  f"traced {pct['traced']:.1f}%; traced max error {err:.1e}")
            for line in analyse(traced.TRACE.view(programs, TRACE_STEPS, EVENTS).cpu(), config[4] + 2):
                print(line)


if __name__ == "__main__":
    main()
