"""Service functions h(n_p, n_q): what serving a request "costs" its client in fairness accounting.

VTC charges h(n_p, 0) at admission and h(n_p, n_q) - h(n_p, n_q - 1) for each new output token
(VTC paper, Algorithm 4). Both functions are vectorised over numpy arrays.
"""

from __future__ import annotations

import numpy as np

from simulator.core.errors import ConfigError

SERVICES = ("linear", "profiled")


class LinearService:
    """h = w_p * n_p + w_q * n_q, the paper's default (w_p = 1, w_q = 2)."""

    name = "linear"

    def __init__(self, input_price: float = 1.0, output_price: float = 2.0) -> None:
        for label, price in (("input_price", input_price), ("output_price", output_price)):
            if not (np.isfinite(price) and price >= 0):
                raise ConfigError(f"policy.{label} must be a number >= 0, got {price!r}")
        self.input_price, self.output_price = float(input_price), float(output_price)

    def __call__(self, n_p: np.ndarray | float, n_q: np.ndarray | float) -> np.ndarray:
        return self.input_price * np.asarray(n_p, float) + self.output_price * np.asarray(
            n_q, float
        )


class ProfiledService:
    """The VTC paper's profiled cost function (its Appendix B.2), with the coefficients of the
    artifact's code (`cost_func` in fair_bench/plot/visualize.py), which produced the paper's
    Tables 3 and 4: h(x, y) = 0.21001891 x + 0.10075395 y + 0.0039868 x y + 0.00324733 y^2 +
    1.14601454. Appendix B.2 prints coefficients ten times larger (2.1, 1, 0.04, 0.032, 11.46).
    A fairness accounting function, not the engine's step time."""

    name = "profiled"
    COEFFS = (0.21001891, 0.10075395, 0.0039868, 0.00324733, 1.14601454)

    def __call__(self, n_p: np.ndarray | float, n_q: np.ndarray | float) -> np.ndarray:
        x, y = np.asarray(n_p, float), np.asarray(n_q, float)
        a, b, c, d, e = self.COEFFS
        return a * x + b * y + c * x * y + d * y * y + e


def make_service(
    name: str, input_price: float = 1.0, output_price: float = 2.0
) -> LinearService | ProfiledService:
    if name == "linear":
        return LinearService(input_price, output_price)
    if name == "profiled":
        return ProfiledService()
    raise ConfigError(f"policy.service must be one of {SERVICES}, got {name!r}")
