"""Triton kernel launches that skip Triton's per-call binding on repeat calls (host time only).

``kernel[grid](*args, **kwargs)`` binds every argument to the kernel's signature, specializes each
runtime argument (a pointer's 16-byte alignment, an int equal to 1 or divisible by 16, its width),
builds and hashes a key of all of them and every constexpr, and only then finds the compiled kernel.
H200 machine, triton 3.6 (session 49, ``benchmarks/probes/launch_cost.py``): a rows-kernel launch 21.0 us
through Triton, 16.8 us here, 6.3 us by the compiled kernel's launcher alone; a long-row softmax call
launches four or five kernels, a 16-row bf16 16M-element backward ran 59.6% of copy through Triton and
66.4% here (``benchmarks/probes/knobs.py``: its host no longer sets the pace).

``launch_kernel(kernel, grid, *args, **kwargs)`` is that call with a cache in front. Its key is the kernel,
the current device, the keyword arguments (constexprs and compile options, by value) and, per
positional argument, a class at least as fine as Triton's specialization of it (``arg_class``): equal
keys mean Triton would pick the same compiled kernel. A key's first launch goes through Triton
(compiling if needed) and keeps the ``CompiledKernel`` it returns; later launches call its launcher
with the same argument list Triton passes (every parameter in signature order, constexprs included).

Triton is used as it is where a launch hook or a pre-run hook is set (profilers need them), under
the interpreter, and for arguments ``arg_class`` does not know. Settings Triton reads at each launch
(``TRITON_DEBUG``, instrumentation) are read at a key's first launch only. ``VERIFY`` (the GPU tests set it)
checks every cached launch against Triton's own lookup. Works with triton 3.6 and 3.9, whose
``JITFunction.run`` and ``CompiledKernel.run`` take the same arguments (checked when written).
"""
from __future__ import annotations

import os

import torch

try:  # the CPU build without triton never launches
    from triton import knobs as _knobs
    from triton.runtime.driver import driver as _driver
    from triton.runtime.jit import JITFunction as _JITFunction
except ImportError:  # pragma: no cover
    _knobs = _driver = _JITFunction = None

#: False: every launch goes through Triton (probes compare the two in one process; the environment
#: variable RINGSOFTMAX_LAUNCH_CACHE=0 sets it at import, should a Triton release break the cache).
ENABLED = os.environ.get("RINGSOFTMAX_LAUNCH_CACHE", "1") != "0"
#: When True, every cached launch also asks Triton which compiled kernel it would run (its lookup
#: without the launch) and raises if that is not the cached one. For tests; costs Triton's binding.
VERIFY = False
#: Launches that took the cache (tests and probes read it).
HITS = 0

_CACHE: dict = {}   # (id of the kernel, device, keyword items, classes of the positional arguments) -> (compiled, tail)
_LAYOUT: dict = {}  # id of the kernel -> (the kernel, kept so its id stays its own; constexpr flags, names, defaults)


class _Unknown(Exception):
    """An argument ``arg_class`` does not classify: the launch goes through Triton."""


def arg_class(a):
    """A hashable class of runtime argument ``a`` at least as fine as Triton's specialization of it:
    tensors by dtype and 16-byte alignment of the data pointer; ints by (== 1, divisible by 16, fits
    int32, needs uint64); bools, floats and None by type; TMA descriptors by everything but the base
    pointer's value. Raises ``_Unknown`` for anything else."""
    t = type(a)
    if t is int:
        return (a == 1, a % 16 == 0, -2**31 <= a < 2**31, a >= 2**63)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if a is None or t is bool or t is float:
        return t
    if hasattr(a, "block_shape") and isinstance(getattr(a, "base", None), torch.Tensor):  # a TensorDescriptor
        return (t, arg_class(a.base), tuple(a.shape), tuple(a.strides), tuple(a.block_shape),
                getattr(a, "layout", None), getattr(a, "padding", None), getattr(a, "round_f32_to_tf32", None))
    raise _Unknown(t)


def _layout(kernel):
    """(constexpr flags, names, defaults) of ``kernel``'s parameters, or None where it is not a JIT
    function Triton compiles (the interpreter's kernels). (Keyed by id: a JIT function's hash is its
    source's.)"""
    entry = _LAYOUT.get(id(kernel))
    if entry is None:
        params = getattr(kernel, "params", None)
        ok = _JITFunction is not None and isinstance(kernel, _JITFunction) and params is not None
        entry = _LAYOUT[id(kernel)] = (kernel, (tuple(p.is_constexpr for p in params), tuple(p.name for p in params),
                                                tuple(p.default for p in params)) if ok else None)
    return entry[1]


def launch_kernel(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; runtime parameters must be positional (those given by
    keyword, if any, send the launch through Triton every time)."""
    layout = _layout(kernel)
    hooks = layout is not None and (_hooked(_knobs.runtime.launch_enter_hook)
                                    or _hooked(_knobs.runtime.launch_exit_hook) or bool(kernel.pre_run_hooks))
    if not ENABLED or layout is None or hooks:
        kernel[grid](*args, **kwargs)
        return
    constexpr = layout[0]
    try:
        classes = tuple(a if constexpr[i] else arg_class(a) for i, a in enumerate(args))
        key = (id(kernel), _driver.active.get_current_device(), tuple(kwargs.items()), classes)
        entry = _CACHE.get(key)
    except (_Unknown, TypeError, IndexError):  # (an unhashable constexpr value; more arguments than parameters)
        kernel[grid](*args, **kwargs)
        return
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is not None:
            _CACHE[key] = _entry(kernel, layout, compiled, len(args), kwargs)
        return
    compiled, tail = entry
    if tail is None:  # a runtime parameter given by keyword: not cacheable
        kernel[grid](*args, **kwargs)
        return
    if VERIFY and kernel.run(*args, grid=grid, warmup=True, **kwargs) is not compiled:
        raise AssertionError(f"launcher: the cached compiled kernel of {kernel} is not the one Triton picks "
                             f"for these arguments (classes {classes})")
    _check_globals(kernel)
    global HITS
    HITS += 1
    device = key[1]
    run = compiled.run  # (loads the module first: compiled.function is set after this)
    run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
        _driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata, None, None, None,
        *args, *tail)


def _hooked(hook) -> bool:
    """Whether a launch hook is set: a non-empty ``HookChain`` (triton 3.6, 3.9) or any other value."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _entry(kernel, layout, compiled, n_args: int, kwargs: dict) -> tuple:
    """(compiled kernel, values of the parameters after the positional ones: constexprs by keyword or
    default); tail None where one of those is a runtime parameter (its value would vary)."""
    constexpr, names, defaults = layout
    tail = []
    for i in range(n_args, len(names)):
        if not constexpr[i] and names[i] in kwargs:
            return compiled, None
        tail.append(kwargs.get(names[i], defaults[i]))
    return compiled, tuple(tail)


def _check_globals(kernel) -> None:
    """Triton's check that the globals a kernel read at compile time still hold those values."""
    for (name, _), (value, globals_dict) in kernel.used_global_vals.items():
        if globals_dict.get(name, _check_globals) != value:
            raise RuntimeError(f"Global variable {name} has changed since we compiled this kernel, "
                               f"from {value} to {globals_dict.get(name)}")
