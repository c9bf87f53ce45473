"""Launch plans kept per layout (``kernels/plan_memo.py``): what a plan is keyed on, that every knob a plan
reads is checked on each hit, and that the softmax launchers plan a layout once yet follow a knob change."""
import dis
import inspect
import os
import re
import types

import pytest
import torch

from helpers import rel_err, softmax64, softmax_grad64
from ringsoftmax.kernels import plan_memo
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_held as H
from ringsoftmax.kernels import softmax_staged as S

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERP, reason="interpreter tests: TRITON_INTERPRET=1 (set without CUDA)")

#: Module-level names the plans read that are not knobs: constants no test or probe changes
#: (COMPILE_OPTIONS), or values that only feed the stand-in arguments a plan compiles with
#: (SPIN_MAX) or the per-build occupancy cache (RESERVED_SHARED_PER_BLOCK).
NOT_KNOBS = {"COMPILE_OPTIONS", "SPIN_MAX", "RESERVED_SHARED_PER_BLOCK"}
#: The held path's own knobs: in its memo's ``extra`` (the key), not its knobs.
HELD_KEYED = {"HELD_MIN_SHARE", "HELD_FILL", "HELD_MIN_BYTES", "HELD_MIN_ROWS_CAPTURED"}
_MODULES = (F, B, S, H)
_UPPER = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # lambdas, comprehensions
            yield from _code_objects(const)


def module_data_read(*functions) -> set:
    """Upper-case module-level data names (knobs, constants) that ``functions`` read, following every call
    into the library's own functions, from their bytecode: a global resolves in the function's module, an
    attribute of a module global (``F.ROWS_TILE``) in that module, any other attribute in each of the
    softmax kernel modules that has it (an over-approximation: more names, never fewer)."""
    seen, names, stack = set(), set(), list(functions)
    while stack:
        fn = stack.pop()
        if not isinstance(fn, types.FunctionType) or fn in seen or not fn.__module__.startswith("ringsoftmax"):
            continue
        seen.add(fn)
        for code in _code_objects(fn.__code__):
            owner = None  # the module whose attribute the next LOAD_ATTR reads, where known
            for ins in dis.get_instructions(code):
                if ins.opname == "LOAD_GLOBAL":
                    value = fn.__globals__.get(ins.argval)
                    owner, spaces = (value if inspect.ismodule(value) else None), [fn.__globals__]
                elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                    spaces = [vars(m) for m in ([owner] if owner is not None else _MODULES)]
                    owner = None
                else:
                    owner = None
                    continue
                for space in spaces:
                    value = space.get(ins.argval)
                    if isinstance(value, types.FunctionType):
                        stack.append(value)
                    elif (_UPPER.match(ins.argval) and ins.argval in space and not callable(value)
                          and not inspect.ismodule(value)):
                        names.add(ins.argval)
    return names


def test_the_walk_finds_knobs():
    """The bytecode walk itself: a knob read through a chain of calls and module attributes is found."""
    assert {"ROWS_TILE", "ELEMS_PER_THREAD", "ROWS_MAX_WARPS", "ROWS_TAIL"} <= module_data_read(F.rows_config)
    assert "BWD_MASKED_WARPS" in module_data_read(B.rows_config)      # B's own, then fwd.rows_config's
    assert "ROWS_TAIL" in module_data_read(B.rows_config)
    assert {"STAGED", "STAGED_MIN_N"} <= module_data_read(F.staged_fits)  # (S imported inside the function)


@pytest.mark.parametrize("builds, knobs, keyed", [
    ((F._fwd_route, F._stats_route), F.rows_knobs, set()),
    ((B._bwd_route, B._dot_route), B.bwd_knobs, set()),
    ((F.stats_plan, F.normalize_plan, B.dot_plan, B.elementwise_plan), F.stream_knobs, set()),
    ((S._launch_plan,), S.plan_knobs, set()),
    ((H._plan,), S.plan_knobs, HELD_KEYED),
], ids=["forward routes", "backward routes", "streaming passes", "staged launch", "held path"])
def test_every_knob_a_plan_reads_is_checked(builds, knobs, keyed):
    """Each memoized plan's knob snapshot (the ``knobs`` its caller passes ``plan_memo.memo``) covers every
    module-level table or switch its build reads, so that a test or probe that changes one gets a new
    plan rather than a stale one (session 48's review found one missing by hand)."""
    missing = module_data_read(*builds) - module_data_read(knobs) - NOT_KNOBS - keyed
    assert not missing, f"{knobs.__name__} lacks {sorted(missing)}, which the plans read"
    assert keyed <= module_data_read(H.held_split)  # (the held path puts its own knobs in the key)


def test_plan_memo_keys_cpu(monkeypatch):
    """A plan is built once per layout and knob setting: again for another shape, stride, dtype or
    16-byte alignment of the rows, or after a knob the plans read has changed (in place too)."""
    monkeypatch.setattr(plan_memo, "_PLANS", {})
    builds = []

    def plan(*tensors, extra="x"):
        return plan_memo.memo("test", tensors, extra, lambda: builds.append(1) or len(builds), S.plan_knobs())

    base = torch.empty(4, 4096, dtype=torch.bfloat16)
    assert plan(base) == plan(base) == plan(torch.empty(4, 4096, dtype=torch.bfloat16)) == 1
    assert plan(base, extra="y") == 2
    assert plan(torch.empty(4, 4097, dtype=torch.bfloat16)) == 3           # shape
    assert plan(torch.empty(4, 4096)) == 4                                  # dtype
    assert plan(torch.empty(4, 4104, dtype=torch.bfloat16)[:, :4096]) == 5  # row stride
    shifted = torch.empty(4 * 4096 + 8, dtype=torch.bfloat16)[1:4 * 4096 + 1].view(4, 4096)
    assert shifted.data_ptr() % 16 != base.data_ptr() % 16 and plan(shifted) == 6  # alignment
    monkeypatch.setattr(S, "CLAIM", not S.CLAIM)
    assert plan(base) == 7
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 12)
    assert plan(base) == 8
    table = {k: list(v) for k, v in S.STAGED_CONFIG.items()}
    table["fwd", 4][-1] = (table["fwd", 4][-1][0], (4096, 4, 3, 1, 1, False))
    monkeypatch.setattr(S, "STAGED_CONFIG", table)
    assert plan(base) == 9 and plan(base) == 9
    table["fwd", 4][-1] = (table["fwd", 4][-1][0], (4096, 4, 3, 1, 2, False))   # in place
    assert plan(base) == 10 and plan(base) == 10
    monkeypatch.setattr(S, "STAGED_CONFIG_WHOLE", {**S.STAGED_CONFIG_WHOLE, ("bwd", 4): [(1, None)]})
    assert plan(base) == 11
    # the two-pass passes' knobs (the held path keeps those passes' plans in its memoized plan)
    monkeypatch.setitem(F.STREAM_TILE, 2, F.STREAM_TILE[2] // 2)
    assert plan(base) == 12
    monkeypatch.setattr(F, "STREAM_SECOND_PASS_REVERSED", not F.STREAM_SECOND_PASS_REVERSED)
    assert plan(base) == 13 and plan(base) == 13
    monkeypatch.setattr(plan_memo, "MEMO_SIZE", 2)
    plan(base, extra="z")
    assert len(plan_memo._PLANS) == 1 and plan(base, extra="z") == 14  # full: started again
    assert plan(base, extra="z") == 14


def test_plans_share_knob_snapshots(monkeypatch):
    """A plan built under knobs equal to an earlier plan's takes that plan's copy of them: calls whose
    shapes keep changing (a new plan each) do not copy the knobs each time; a knob change makes a new
    copy, and the old plans still see it as a change."""
    monkeypatch.setattr(plan_memo, "_PLANS", {})
    monkeypatch.setattr(plan_memo, "_SNAPSHOTS", [])
    for m in range(1, 6):
        plan_memo.memo("test", (torch.empty(m, 8),), None, lambda: m, F.rows_knobs())
    assert len(plan_memo._SNAPSHOTS) == 1 and len(plan_memo._PLANS) == 5
    assert {id(entry[0]) for entry in plan_memo._PLANS.values()} == {id(plan_memo._SNAPSHOTS[0])}
    assert plan_memo._SNAPSHOTS[0] is not F.rows_knobs()[2] and plan_memo._SNAPSHOTS[0] == F.rows_knobs()
    monkeypatch.setitem(F.ROWS_TILE, 4, F.ROWS_TILE[4] // 2)          # (in place: the copies keep the old value)
    assert plan_memo.memo("test", (torch.empty(1, 8),), None, lambda: "again", F.rows_knobs()) == "again"
    assert plan_memo.memo("test", (torch.empty(2, 8),), None, lambda: "again", F.rows_knobs()) == "again"
    assert len(plan_memo._SNAPSHOTS) == 2
    monkeypatch.setattr(plan_memo, "SNAPSHOTS_SIZE", 2)
    monkeypatch.setitem(F.ROWS_TILE, 4, F.ROWS_TILE[4] // 2)
    assert plan_memo.memo("test", (torch.empty(3, 8),), None, lambda: 0, F.rows_knobs()) == 0
    assert len(plan_memo._SNAPSHOTS) == 1  # (full: started again)


def _spy(monkeypatch, module, name):
    """Count the calls of ``module.name`` (the calls go on to it)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@cpu_only
def test_softmax_routes_planned_once_per_layout_cpu(monkeypatch):
    """``softmax_fwd`` / ``row_stats`` / ``softmax_bwd`` / ``row_dot`` plan a layout's route once (the rows
    kernel's tiles included) and launch by it on later calls; a knob change (``ROWS_MAX_N`` lowered in
    place) plans again and sends the same rows to the split paths (here the two-pass passes), whose plans
    are made once too, ``normalize``'s included; values right (float64) throughout."""
    monkeypatch.setattr(plan_memo, "_PLANS", {})
    routes = {name: _spy(monkeypatch, mod, name) for mod, name in
              ((F, "_fwd_route"), (F, "_stats_route"), (B, "_bwd_route"), (B, "_dot_route"))}
    passes = {name: _spy(monkeypatch, mod, name) for mod, name in
              ((F, "stats_plan"), (F, "normalize_plan"), (B, "dot_plan"), (B, "elementwise_plan"))}
    rows = _spy(monkeypatch, F, "_rows"), _spy(monkeypatch, B, "_rows")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 100, generator=gen) * 3
    x[1] = float("-inf")
    want, want_lse = softmax64(x, -1)
    dy = torch.randn(3, 100, generator=gen)
    yr = want.float()
    want_dx = softmax_grad64(yr, dy)

    def run():
        y, lse = F.softmax_fwd(x)
        mx, sx = F.row_stats(x)
        dx = B.softmax_bwd(yr, dy)
        dot = B.row_dot(yr, dy)
        assert rel_err(y, want) < 1e-5 and rel_err(lse, want_lse) < 1e-6 and rel_err(dx, want_dx) < 1e-5
        assert torch.allclose(mx[[0, 2]], x[[0, 2]].amax(-1)) and mx[1] == float("-inf") and sx[1] == 0
        assert torch.allclose(dot.double(), (yr.double() * dy.double()).sum(-1), rtol=1e-5, atol=1e-6)
        assert rel_err(F.normalize(x, mx, sx), want) < 1e-5

    for _ in range(3):
        run()
    assert [len(c) for c in routes.values()] == [1, 1, 1, 1]
    assert [len(r) for r in rows] == [6, 6]          # every call on the rows kernels
    assert [len(c) for c in passes.values()] == [0, 1, 0, 0]  # (normalize always streams)
    monkeypatch.setitem(F.ROWS_MAX_N, 4, 64)         # (in place) the forward's rows now too long for them
    monkeypatch.setattr(B, "BWD_ROWS_MAX_N", 64)     # and the backward's
    for _ in range(2):
        run()
    assert [len(c) for c in routes.values()] == [2, 2, 2, 2]
    assert [len(r) for r in rows] == [6, 6]          # the split paths took them
    # one plan per pass and layout: stats for softmax_fwd and row_stats, the dot for softmax_bwd and row_dot
    assert [len(c) for c in passes.values()] == [1, 1, 1, 1]


def test_memo_layout_key_sees_the_pointer_offset():
    """The key tells apart views that differ only in their data pointer's offset within 16 bytes (the
    kernels' ALIGN and Triton's specializations depend on it)."""
    flat = torch.empty(4 * 64 + 8)
    a, b = flat[:256].view(4, 64), flat[1:257].view(4, 64)
    assert plan_memo.layout_key((a,)) != plan_memo.layout_key((b,))
    assert plan_memo.layout_key((a,)) == plan_memo.layout_key((torch.empty(4, 64),))
