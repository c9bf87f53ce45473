"""Write variant copies of the Gluon attention forward (``attention_fwd_gluon.py``), for timing beside
the library with ``fa_gluon_probe.py --modules`` (unlike ``ablations.py`` their results are right):

- ``fa_lazy``: FlashAttention-4's lazy rescale, decided by the row sums instead of the row max. On
  a tile with no masked key (D=64 only; D=128 spilled) the exponentials are taken against the row's
  running reference m; if every row's sum of them stays <= 2^15 (so each p <= 2^15, within fp16 and
  bf16), m is kept, no row max is taken and O is not rescaled; else (any row of the warpgroup: a
  cross-warp reduction) the tile takes the exact update. m = -inf gives p = inf, so the first tile of
  a row always takes the exact one.
- ``fa_pinned``: the tile's softmax in a block of its own (``if Sk > 0``, always true), so that
  ptxas does not schedule the wait for P_{j-1} V_{j-1} above it: in the committed kernel's sm_90a
  SASS (triton 3.6) that wait sits at the start of the softmax, not after it as in the source.

Run:  python3 benchmarks/probes/fa_variants.py DIR      (then, on a GPU)
      python3 benchmarks/probes/fa_gluon_probe.py --dims 64,128 --configs "" \\
          --modules base=ringsoftmax/kernels/attention_fwd_gluon.py,lazy=DIR/fa_lazy.py,pinned=DIR/fa_pinned.py
Each edit is checked to apply (the script fails if the source changed under it).
"""
from __future__ import annotations

import pathlib
import sys

from ablations import KERNELS, edit  # same folder

SOFTMAX_CALL = '''                        p, m_i, l_q, alpha = _softmax_tile(s, m_i, l_q, qk_scale, j >= n_full,
                                                           lim0 - j * BLOCK_N, cols, TREES)
'''


def lazy(src: str) -> str:
    src = edit(src, '''    @gluon.jit
    def _units(n_m, BH, causal):''', '''    @gluon.jit
    def _softmax_tile_lazy(s, m_i, l_q, qk_scale, cols, TREES: gl.constexpr):
        """_softmax_tile on a tile with no masked key, against the reference m_i while every row's sum
        of exponentials stays <= LAZY_SUM_MAX (each lane's share <= a quarter of it). Returns (p, m_new,
        l_q_new, alpha, rescaled)."""
        p = gl.exp2(s * qk_scale - m_i[:, None])
        t = _lane_row_sums(p, TREES)
        grew = gl.max(gl.max(gl.where(t <= LAZY_SUM_MAX / 4, 0, 1), axis=1), axis=0)
        alpha = m_i
        if grew != 0:
            p, m_i, l_q, alpha = _softmax_tile(s, m_i, l_q, qk_scale, False, cols, cols, TREES)
        else:
            l_q = l_q + t
        return p, m_i, l_q, alpha, grew

    @gluon.jit
    def _units(n_m, BH, causal):''')
    src = edit(src, '''if gluon is not None:
''', '''if gluon is not None:
    LAZY_SUM_MAX = gl.constexpr(32768.0)
    LAZY_MAX_DIM = gl.constexpr(64)
''')
    src = edit(src, SOFTMAX_CALL, '''                        rescale = 1
                        if HEAD_DIM <= LAZY_MAX_DIM:
                            if j >= n_full:
                                p, m_i, l_q, alpha = _softmax_tile(s, m_i, l_q, qk_scale, True,
                                                                   lim0 - j * BLOCK_N, cols, TREES)
                            else:
                                p, m_i, l_q, alpha, rescale = _softmax_tile_lazy(s, m_i, l_q, qk_scale, cols, TREES)
                        else:
                            p, m_i, l_q, alpha = _softmax_tile(s, m_i, l_q, qk_scale, j >= n_full,
                                                               lim0 - j * BLOCK_N, cols, TREES)
''')
    return edit(src, '''                        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
''', '''                        if rescale != 0:
                            o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
''')


def pinned(src: str) -> str:
    return edit(src, SOFTMAX_CALL, '''                        if Sk > 0:  # always: a block of its own, which ptxas does not hoist the wait into
                            p, m_i, l_q, alpha = _softmax_tile(s, m_i, l_q, qk_scale, j >= n_full,
                                                               lim0 - j * BLOCK_N, cols, TREES)
''')


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "fa_variants")
    out.mkdir(parents=True, exist_ok=True)
    src = (KERNELS / "attention_fwd_gluon.py").read_text()
    (out / "fa_lazy.py").write_text(lazy(src))
    (out / "fa_pinned.py").write_text(pinned(src))
    print("wrote fa_lazy.py, fa_pinned.py to", out)


if __name__ == "__main__":
    main()
