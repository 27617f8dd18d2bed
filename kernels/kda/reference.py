"""Trusted KDA oracle: input generator and the token-by-token delta-rule recurrence (KERNELS.md section 1.1)."""

import math

import torch

# Above this many state-element updates (B*H*K*V*T) the oracle drops from fp64 to fp32 so that the
# serial loop stays affordable; every shape the task ships is below it.
FP64_LIMIT = 2**34

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def make_inputs(shape: dict, seed: int, device: str) -> dict:
    """Draws one KDA problem for a shape's params.

    q and k are L2-normalised per head (as production KDA feeds them), beta = sigmoid(x), and the decay is the
    safe gate's range: g = clamp(logsigmoid(x), -5, 0) in fp32. ``gate = "lower_bound"`` sets every g to -5 (the
    worst case for exponent range), ``gate = "mild"`` uses logsigmoid(x + 4) so the state remembers hundreds of
    tokens and errors compound. ``h0`` (default true) adds a non-zero fp32 initial state, so a kernel that
    ignores it fails.

    Args:
        shape: params with B, T, H, K, V and optionally dtype, gate, h0.
        seed: generator seed; the same (shape, seed, device) always gives the same tensors.
        device: torch device string.
    """
    B, T, H, K, V = (int(shape[n]) for n in ("B", "T", "H", "K", "V"))
    dtype = _DTYPES[shape.get("dtype", "bfloat16")]
    gate = shape.get("gate", "default")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32)

    q = torch.nn.functional.normalize(randn(B, T, H, K), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(randn(B, T, H, K), dim=-1).to(dtype)
    v = randn(B, T, H, V).to(dtype)
    beta = torch.sigmoid(randn(B, T, H)).to(dtype)
    x = randn(B, T, H, K)
    if gate == "lower_bound":
        g = torch.full_like(x, -5.0)
    elif gate == "mild":
        g = torch.nn.functional.logsigmoid(x + 4.0).clamp(-5.0, 0.0)
    elif gate == "default":
        g = torch.nn.functional.logsigmoid(x).clamp(-5.0, 0.0)
    else:
        raise ValueError(f"unknown gate {gate!r}: expected default, lower_bound or mild")
    h0 = randn(B, H, K, V) if shape.get("h0", True) else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "scale": 1.0 / math.sqrt(K), "initial_state": h0}


@torch.no_grad()
def forward(q, k, v, g, beta, scale, initial_state):
    """Serial recurrence S_t = (I - b k k^T) diag(exp g_t) S_{t-1} + b k v^T, o_t = S_t^T (scale q_t).

    Vectorised over batch and heads, serial over time, in fp64 (fp32 above FP64_LIMIT).

    Returns:
        (o [B,T,H,V] in v's dtype, final_state [B,H,K,V] fp32).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    if g.numel() and float(g.max()) > 0.0:
        raise ValueError("g must be a log-space decay <= 0")
    acc = torch.float64 if B * H * K * V * T <= FP64_LIMIT else torch.float32
    qf, kf, vf, gf, bf = (x.to(acc) for x in (q, k, v, g, beta))
    decay = torch.exp(gf)
    state = torch.zeros(B, H, K, V, dtype=acc, device=q.device)
    if initial_state is not None:
        state = state + initial_state.to(acc)
    o = torch.empty(B, T, H, V, dtype=acc, device=q.device)
    for t in range(T):
        state = state * decay[:, t].unsqueeze(-1)
        kt = kf[:, t]
        err = vf[:, t] - (kt.unsqueeze(-2) @ state).squeeze(-2)
        state = state + (bf[:, t, :, None] * kt).unsqueeze(-1) * err.unsqueeze(-2)
        o[:, t] = ((qf[:, t] * scale).unsqueeze(-2) @ state).squeeze(-2)
    return o.to(v.dtype), state.to(torch.float32)
