"""Shared checks: norm-relative error against a float64 reference, and float64 oracles."""
import torch


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64, over finite entries; inf if NaN appears or -inf/0 differ."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if torch.isnan(got).any():
        return float("inf")
    if not torch.equal(torch.isinf(got), torch.isinf(want)):
        return float("inf")
    fin = torch.isfinite(want)
    g, w = got[fin], want[fin]
    denom = w.norm().item()
    return (g - w).norm().item() / (denom if denom > 0 else 1.0)


def assert_close(name: str, got, want, tol: float) -> None:
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = rel_err(got, want)
    assert err <= tol, f"{name}: norm-relative error {err:.3e} > {tol:.1e}"


def softmax64(x: torch.Tensor, dim: int):
    """float64 softmax and lse with the all -inf row rule (y = 0, lse = -inf)."""
    x = x.double()
    lse = torch.logsumexp(x, dim)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    return torch.exp(x - safe.unsqueeze(dim)), lse


def softmax_grad64(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """float64 gradient of softmax rows (last dim) given its output y and output gradient dy:
    y * (dy - rowsum(dy * y))."""
    y, dy = y.double(), dy.double()
    return y * (dy - (dy * y).sum(-1, keepdim=True))


def check_softmax_grad(y, dy, dx, tol, delta=None) -> None:
    """dx (m, n) against the float64 gradient of the softmax output ``y`` that the backward was given,
    ``y * (dy - delta)`` with ``delta = rowsum(y * dy)`` (or the given ``delta``, (m,)).

    The error is measured on the scale of ``|y| (|dy| + |delta|)``, not of ``|dx|``: dy - delta cancels,
    so where rows are nearly one-hot dx is tiny and a float32 (or 16-bit) error bound follows the terms,
    and the reference uses the rounded y the kernel read, not the exact softmax.
    """
    y64, dy64 = y.double(), dy.double()
    d64 = (y64 * dy64).sum(-1) if delta is None else delta.double()
    want = y64 * (dy64 - d64[:, None])
    assert dx.dtype == dy.dtype and dx.shape == dy.shape and dx.is_contiguous()
    assert not torch.isnan(dx).any()
    scale = (y64.abs() * (dy64.abs() + d64.abs()[:, None])).norm().item()
    # float16 stores values under 6e-5 as subnormals, 6e-8 apart: allow half a step per element
    floor = 2.0**-25 * dx.numel() ** 0.5 if dx.dtype == torch.float16 else 0.0
    err = (dx.double() - want).norm().item()
    assert err <= tol * scale + floor, f"dx: {err / max(scale, 1e-300):.2e} of the |y| (|dy| + |delta|) scale"


def gpu_sleep(seconds: float, device=0) -> None:
    """Queue a kernel that spins ~``seconds`` on ``device``'s current stream (work queued after it waits)."""
    torch.cuda._sleep(int(seconds * torch.cuda.get_device_properties(device).clock_rate * 1e3))


def attention64(q, k, v, causal=False, scale=None, q_pos=None, k_pos=None):
    """Naive float64 attention with explicit global positions: (out (B,Sq,H,D), lse (B,H,Sq))."""
    q, k, v = q.double(), k.double(), v.double()
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    k = k.repeat_interleave(h // hkv, dim=2)
    v = v.repeat_interleave(h // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        qp = (torch.arange(sq) if q_pos is None else q_pos).to(s.device)
        kp = (torch.arange(sk) if k_pos is None else k_pos).to(s.device)
        s = s.masked_fill(kp[None, :] > qp[:, None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe[..., None])
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse
