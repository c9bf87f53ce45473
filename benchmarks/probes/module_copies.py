"""Load other copies of a kernel module (a commit's version, an ablation) for a probe's ``--modules``."""
from __future__ import annotations

import importlib.util


def load_copies(spec: str) -> dict:
    """``"name=path,..."`` -> {name: module}. Each copy is named inside ``ringsoftmax.kernels`` so that
    its relative imports (``from . import softmax_fwd``) resolve to the library's modules."""
    copies = {}
    for entry in filter(None, spec.split(",")):
        name, path = entry.split("=")
        module_spec = importlib.util.spec_from_file_location(f"ringsoftmax.kernels.probe_{name}", path)
        copies[name] = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(copies[name])
    return copies
