"""Write ablated and counting copies of the Gluon kernels' modules, for timing beside the library with the probes'
``--modules`` (their values are wrong on purpose: they show what a stage costs, not a result).

Run:  python3 benchmarks/probes/ablations.py DIR      (then, on a GPU, e.g.)
      python3 benchmarks/probes/fa_gluon_probe.py --dims 64 --causal 0 --modules noexp=DIR/fa_noexp.py,...
      python3 benchmarks/probes/softmax_staged.py --dirs fwd --no-configs --modules stream=DIR/sm_stream.py,...

Attention forward (``attention_fwd_gluon.py``):
- ``fa_noexp``: p = the scaled, shifted score itself (no exp2 of the scores; alpha keeps its exp2);
- ``fa_mmaonly``: no online softmax at all (p = s, m and l unchanged, alpha = 1): the matmuls and the
  pipeline alone.
Staged softmax (``softmax_staged.py``):
- ``sm_nobar``: the kernel's two explicit CTA barriers of the cp.async ring removed (each thread
  reads only what its own cp.async copied; Gluon's shared-memory analysis puts barriers there
  anyway: same SASS count);
- ``sm_nowords``: no reading or merging of the row's partial words (each program normalizes with
  its own chunk's statistic; barriers kept): what the merge costs (session 29, H200: 1-2 points of
  copy at bf16 forward 3M-4M, 5-15 in the deep rings, e.g. bf16 forward 84.8 -> 94.2% at 8M);
- ``sm_nomerge``: the same without the two barriers of ``sm_nobar``;
- ``sm_stream``: also no chunk statistic and no publishing (a store under a false mask keeps one
  read of the chunk from shared memory and a CTA-wide min): cp.async or TMA into the ring (as the
  table says), read back, exp, store: the data path alone;
- ``sm_copy``: also no exp (backward: no dx formula): the chunk copied through the ring as it is.
Counting copies of the staged kernel (right values; the probe's column of waits given up then holds
the count, for the checked launch and the timed ones together):
- ``sm_count_merges``: each merge of a row's partial words adds 1 (session 30, H200: 12672 at bf16
  forward 8M, 32 rows: every program merges every row once);
- ``sm_count_rereads``: each merge adds its re-reads of words still pending (session 30: 654 at bf16
  forward 8M, 6859 at 6M, 30-700 elsewhere: the merge's cost is not waiting).
Each edit is checked to apply (the script fails if a source changed under it).
"""
from __future__ import annotations

import pathlib
import sys

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "ringsoftmax" / "kernels"


def edit(src: str, old: str, new: str) -> str:
    if old not in src:
        raise SystemExit(f"ablation no longer applies: {old.strip().splitlines()[0]!r} not found")
    return src.replace(old, new)


def attention(out: pathlib.Path) -> None:
    src = (KERNELS / "attention_fwd_gluon.py").read_text()
    exp = "        p = gl.exp2(s * qk_scale - m_sub[:, None])\n"
    (out / "fa_noexp.py").write_text(edit(src, exp, "        p = s * qk_scale - m_sub[:, None]\n"))
    body = ('''        m_new = gl.maximum(m_i, _row_max(s, TREES) * qk_scale)
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet: p = 0
        p = gl.exp2(s * qk_scale - m_sub[:, None])
        alpha = gl.exp2(m_i - m_sub)
        share = _lane_row_sums(p, TREES)
        alpha_q = gl.convert_layout(alpha, gl.SliceLayout(1, share.type.layout), assert_trivial=True)
        l_new = l_q * alpha_q[:, None] + share
        return p, m_new, l_new, alpha''')
    (out / "fa_mmaonly.py").write_text(edit(src, body, "        return s, m_i, l_q, gl.full(m_i.shape, 1.0, gl.float32, "
                                                       "m_i.type.layout)"))


def no_merge(src: str) -> str:
    """The staged kernel without reading or merging a row's partial words (each program normalizes
    with its own chunk's statistic)."""
    src = edit(src, '''        done, m, s = _row_stat(P + row.to(gl.int64) * Q, words, Q, spin_max, ERR, BWD, PBLK, playout)
        if not done:
            m, s = _row_from_global(A, B, row, N, stride_a, stride_b, BWD, PIECE, layout, ALIGN)
''', '''        m, s = gl.to_tensor(0.0), gl.to_tensor(1.0)
''')
    return edit(src, '''                if (w_row < M) & fresh:
                    words = _row_words(P + w_row.to(gl.int64) * Q, Q, BWD, PBLK, playout)
''', "                pass\n")


def staged(out: pathlib.Path) -> None:
    src = (KERNELS / "softmax_staged.py").read_text()
    nobar = edit(src, '''            # every thread is done with the slot refilled below (its unit was written, or LAG 2 loaded
            # into registers, last step)
            _cta_barrier()
''', "")
    nobar = edit(nobar, '''            async_copy.wait_group(outstanding)
            _cta_barrier()
''', '''            async_copy.wait_group(outstanding)
''')
    (out / "sm_nobar.py").write_text(nobar)
    (out / "sm_nowords.py").write_text(no_merge(src))
    nomerge = no_merge(nobar)
    (out / "sm_nomerge.py").write_text(nomerge)
    stream = edit(nomerge, '''        cm, cs = _chunk_stat(a.to(gl.float32), b.to(gl.float32), BWD)
        gl.store(P + row.to(gl.int64) * Q + q, _pack(cm, cs))''',
                  '''        gl.store(P + row.to(gl.int64) * Q + q, _pack(gl.min(a, axis=0) * 0.0, gl.to_tensor(1.0)),
                 mask=a.shape[0] < 0)''')
    (out / "sm_stream.py").write_text(stream)
    copy = edit(stream, "out = _output(a, b, m, s, BWD, FOLD).to(OUT.dtype.element_ty)", "out = a.to(OUT.dtype.element_ty)")
    (out / "sm_copy.py").write_text(copy)
    gave_up = '''        done = (n == 0) & (spin_max >= 0)
        gl.atomic_add(ERR, 1, mask=done == 0, sem="relaxed")
'''
    (out / "sm_count_merges.py").write_text(edit(src, gave_up, gave_up + '''        gl.atomic_add(ERR, 1, sem="relaxed")
'''))
    (out / "sm_count_rereads.py").write_text(edit(src, gave_up, gave_up + '''        gl.atomic_add(ERR, spins, sem="relaxed")
'''))


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "ablations")
    out.mkdir(parents=True, exist_ok=True)
    attention(out)
    staged(out)
    print("wrote", ", ".join(sorted(p.name for p in out.glob("*.py"))), "to", out)


if __name__ == "__main__":
    main()
