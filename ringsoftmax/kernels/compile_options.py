"""Triton compile options that every kernel launch here passes (and the warmups that size grids).

``enable_fp_fusion=True``: multiply-adds contracted to FMA, as every kernel here was built, tuned and
tested. Triton 3.9 warns once per process that ``TRITON_DEFAULT_FP_FUSION`` is unset and announces that
3.10 turns fusion off by default; passing the option keeps today's builds there, and on 3.6 and 3.9
(where fusion is the default) changes nothing in them.
"""
COMPILE_OPTIONS = {"enable_fp_fusion": True}
