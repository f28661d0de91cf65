"""The model-level error bound of tests/test_bounds.h, for the Python references
(torch_decoder.py, hf_parity.py): the same formulas, kept in step with the C header.

u: unit roundoff of the compared arithmetic (fp32 2**-24). An operation summing n terms
is, with probability >= 1 - 2n exp(-lambda^2 / 2), the exact sum of its terms each
perturbed by at most lambda sqrt(n) u (Higham and Mary 2019, Theorem 3.1), in any
order; along the chain that ends in a compared value the term counts add to S
(chain_terms); the value's condition kappa is evaluated by the caller in float64 by
multiplying every parameter by 1 + eta xi (xi = +-1). One fp32 evaluation against a
float64 reference: lambda sqrt(S) u kappa (the reference's own error is ~1e-16);
two fp32 evaluations: twice that.
"""
import math

LAMBDA = 6.0
ETA = 2.0 ** -12
U_F32 = 2.0 ** -24


def chain_terms(D, H, Hk, Dh, F, V, L, T, qk_norm=False, post_norms=0, attn_cap=False, final_cap=False,
                backward=False, N=0):
    """tests/test_bounds.h tu_chain_terms: terms on the longest chain to a logit
    (backward False) or to a parameter gradient summed over N rows."""
    post = post_norms * D
    fwd = (D + D + (Dh if qk_norm else 0) + 2 + Dh + (2 if attn_cap else 0) + T + 2 + T + H * Dh + post + 1 + D + D
           + 2 + F + 1)
    S = L * fwd + D + D + (2 if final_cap else 0)
    if backward:
        bwd = D + 3 + 2 * F + D + 1 + D + Dh + T + 2 + T + (H + 2 * Hk) * Dh + D + 1 + post
        S += V + 2 + V + D + L * bwd + N
    return S


def bound(S, kappa, u=U_F32, sides=1):
    """sides * lambda sqrt(S) u kappa."""
    return sides * LAMBDA * math.sqrt(S) * u * kappa


def signs(shape, seed):
    """xi = +-1, independent (numpy's generator, seeded: the same on every machine)."""
    import numpy as np
    return np.random.default_rng(seed).integers(0, 2, size=shape) * 2.0 - 1.0


def adam_factor(b1, b2, k):
    """C_k with |m^| <= C_k sqrt(v^) after k steps (Cauchy-Schwarz on the bias-corrected
    moments: m^ = sum a_j g_j, v^ = sum c_j g_j^2, C_k = sqrt(sum a_j^2 / c_j))."""
    s = 0.0
    for j in range(1, k + 1):
        a = (1 - b1) * b1 ** (k - j) / (1 - b1 ** k)
        c = (1 - b2) * b2 ** (k - j) / (1 - b2 ** k)
        s += a * a / c
    return math.sqrt(s)


def adam_update_diff(D, s, C, eps):
    """Bound on |du| for the AdamW direction m^ / (sqrt(v^) + eps) when every gradient
    of the history moves by at most D (elementwise arrays): the moments move by at most
    D (convex combinations; sqrt(v^) a weighted l2 norm), so du <= D / (s + eps) +
    |m^| D / ((s + eps)(s - D + eps)) with |m^| <= C s, and never more than 2 C (each
    direction is at most C in size)."""
    import numpy as np
    d = D / (s + eps) + C * s * D / ((s + eps) * (np.maximum(s - D, 0.0) + eps))
    return np.minimum(d, 2.0 * C)
