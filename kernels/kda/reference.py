"""Trusted KDA oracle: the input generator, the token-by-token delta-rule recurrence (KERNELS.md section 1.1) and
the same function in the chunked WY/UT form (section 1.3), in fp64; ``forward`` is the chunked one.

The recurrence is the definition, serial over T (T steps of a few small launches each: seconds on a GPU at the
task's sizes). The chunked form computes every chunk's part at once and is serial only over T / 64 chunks, and
the tests check it against the recurrence to about 1e-12 relative.
"""

import math

import torch

# Above this many state-element updates (B*H*K*V*T) the token recurrence drops from fp64 to fp32 so that its
# serial loop stays affordable; every shape the task ships is below it. The chunked form is fp64 throughout.
FP64_LIMIT = 2**34
CHUNK = 64
"""Tokens per chunk of the chunked form (shorter where the gate decays faster: see _chunk_len)."""
# Within a chunk the chunked form factors exp(G_r - G_j) as exp(G_r) * exp(-G_j) with G the chunk-local cumulative
# decay, so |G| must stay well inside fp64's exp range (overflow at 709.78 nats, normal numbers down to -708).
MAX_CHUNK_DECAY = 600.0
"""Nats of decay one chunk may span; the chunk is shortened below that, and a single token beyond it falls back
to the recurrence."""
# Bytes of one fp64 [rows, chunks, C, D] intermediate per block of chunks: bounds the oracle's memory on long
# sequences (about ten such tensors are alive at once).
_BLOCK_BYTES = 1 << 28

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


def _check_gate(g: torch.Tensor) -> None:
    if g.numel() and float(g.max()) > 0.0:
        raise ValueError("g must be a log-space decay <= 0")


@torch.no_grad()
def recurrence(q, k, v, g, beta, scale, initial_state):
    """Serial recurrence S_t = (I - b k k^T) diag(exp g_t) S_{t-1} + b k v^T, o_t = S_t^T (scale q_t).

    The definition the chunked form is tested against. Vectorised over batch and heads, serial over time, in fp64
    (fp32 above FP64_LIMIT).

    Returns:
        (o [B,T,H,V], final state [B,H,K,V]), both in the accumulation dtype.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_gate(g)
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
    return o, state


def _chunk_len(g: torch.Tensor) -> int:
    """CHUNK, halved until a chunk's decay can span at most MAX_CHUNK_DECAY nats; 0 when one token exceeds it."""
    steepest = float(-g.min()) if g.numel() else 0.0
    c = CHUNK
    while c and c * steepest > MAX_CHUNK_DECAY:
        c //= 2
    return c


def _chunks(x: torch.Tensor, n0: int, n1: int, c: int) -> torch.Tensor:
    """Chunks n0..n1-1 of [B, T, H, *D] as [B*H, n1 - n0, c, *D] fp64, zero-padded past T."""
    B, T, H = x.shape[:3]
    x = x[:, n0 * c:n1 * c].to(torch.float64)
    pad = torch.zeros(B, (n1 - n0) * c - x.shape[1], *x.shape[2:], dtype=x.dtype, device=x.device)
    x = torch.cat([x, pad], 1).reshape(B, n1 - n0, c, *x.shape[2:])
    return x.movedim(3, 1).reshape(B * H, n1 - n0, c, *x.shape[4:])


@torch.no_grad()
def chunked(q, k, v, g, beta, scale, initial_state, chunk: int | None = None):
    """The recurrence in the chunked WY/UT form (KERNELS.md 1.3), fp64, vectorised over batch, heads and chunks.

    Per chunk of C tokens, with G_r the sum of g over the chunk's rows <= r and zero padding past T (g = k = v =
    beta = 0: padded rows neither decay the state nor add to it):
        L = strictly-lower beta_r k_r.(exp(G_r - G_j) k_j),   Aqk = lower-incl. scale q_r.(exp(G_r - G_j) k_j),
        W = (I + L)^-1 (beta exp(G) K),   U = (I + L)^-1 (beta V),   kg = exp(G_C - G) K,   qg = scale exp(G) Q,
    then serially over chunks: V' = U - W S;  O = qg S + Aqk V';  S <- diag(exp G_C) S + kg^T V'.

    exp(G_r - G_j) is the product exp(G_r) exp(-G_j): every factor lies in [exp(-600), exp(600)] because the chunk
    is shortened until C * max|g| <= MAX_CHUNK_DECAY (64 tokens for the task's g >= -5, at most 320 nats), so
    nothing overflows or goes subnormal in fp64, and each entry keeps a relative error near C * 1e-16. Entries
    above the diagonal (exp(G_r - G_j) >= 1, at most exp(600) * |q| |k|) stay finite and are masked. Where a
    single token decays by more than MAX_CHUNK_DECAY nats the token recurrence runs instead.

    Args:
        chunk: tokens per chunk (default: _chunk_len of g); the tests use small ones to cross many chunks.

    Returns:
        (o [B,T,H,V], final state [B,H,K,V]), both fp64 (the recurrence's dtype where it runs instead).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    _check_gate(g)
    c = chunk or _chunk_len(g)
    if c == 0:
        return recurrence(q, k, v, g, beta, scale, initial_state)
    n = -(-T // c)
    dev = q.device
    f64 = torch.float64
    state = torch.zeros(B * H, K, V, dtype=f64, device=dev)
    if initial_state is not None:
        state = state + initial_state.reshape(B * H, K, V).to(f64)
    o = torch.empty(B * H, n, c, V, dtype=f64, device=dev)
    strict = torch.ones(c, c, dtype=torch.bool, device=dev).tril(-1)
    eye = torch.eye(c, dtype=f64, device=dev)
    per = max(1, _BLOCK_BYTES // (B * H * c * max(K, V, c) * 8))
    for n0 in range(0, n, per):
        qc, kc, vc, gc = (_chunks(x, n0, min(n, n0 + per), c) for x in (q, k, v, g))
        bc = _chunks(beta.unsqueeze(-1), n0, min(n, n0 + per), c)  # [BH, blk, c, 1]
        G = gc.cumsum(2)
        kpos = kc * G.exp()
        kneg = kc * (-G).exp()
        qpos = qc * G.exp() * scale
        lower = bc * (kpos @ kneg.transpose(-1, -2)).masked_fill(~strict, 0.0)
        aqk = (qpos @ kneg.transpose(-1, -2)).masked_fill(strict.T, 0.0)
        rhs = torch.cat([bc * kpos, bc * vc], -1)
        wu = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
        w, u = wu[..., :K], wu[..., K:]
        g_end = G[:, :, -1:]  # [BH, blk, 1, K]
        kg = kc * (g_end - G).exp()
        decay = g_end.exp().transpose(-1, -2)  # [BH, blk, K, 1]
        for i in range(w.shape[1]):
            vp = u[:, i] - w[:, i] @ state
            o[:, n0 + i] = qpos[:, i] @ state + aqk[:, i] @ vp
            state = state * decay[:, i] + kg[:, i].transpose(-1, -2) @ vp
    return o.reshape(B, H, n * c, V)[:, :, :T].transpose(1, 2), state.reshape(B, H, K, V)


def forward_recurrent(q, k, v, g, beta, scale, initial_state):
    """The token recurrence with the task's output dtypes: (o [B,T,H,V] in v's dtype, final_state fp32)."""
    o, state = recurrence(q, k, v, g, beta, scale, initial_state)
    return o.to(v.dtype), state.to(torch.float32)


def forward(q, k, v, g, beta, scale, initial_state):
    """The oracle: the chunked form with the task's output dtypes (o in v's dtype, final_state fp32)."""
    o, state = chunked(q, k, v, g, beta, scale, initial_state)
    return o.to(v.dtype), state.to(torch.float32)
