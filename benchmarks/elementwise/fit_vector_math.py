#!/usr/bin/env python3
"""Fits the polynomial coefficients of src/kernels/vector_math_impl.hpp (near-minimax, by Lawson's
iteratively reweighted least squares in f64 on a dense grid), rounds them to f32 and prints them
with the fit's error before f32 evaluation. Needs numpy and math only (any Python with numpy, e.g.
/work/venvs/torch/bin/python). Rerun after changing an interval or degree; the kernels' stated
bounds come from tests/test_vector_math.cpp, which measures the f32 code itself."""
import math
import numpy as np


def lawson(x, target, basis, weight, iters=60):
    """Coefficients c minimising max |weight * (basis @ c - target)|."""
    a = basis * weight[:, None]
    b = target * weight
    w = np.ones_like(x) / len(x)
    for _ in range(iters):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
        err = np.abs(a @ c - b)
        w = w * err
        w /= w.sum()
    return c, np.max(np.abs(a @ c - b))


def show(name, coeffs, err):
    f32 = [float(np.float32(c)) for c in coeffs]
    print(f"{name}: max weighted error {err:.3e}")
    for k, c in enumerate(f32):
        print(f"  c{k} = {c.hex()}  // {c!r}")


def main():
    grid = 200001

    # exp(r) = 1 + r + r^2 * q(r) on |r| <= ln2/2; relative error.
    r = np.linspace(-math.log(2) / 2, math.log(2) / 2, grid)
    r_nz = np.where(r == 0, 1e-30, r)
    q_target = np.where(np.abs(r) < 1e-6, 0.5 + r / 6, (np.exp(r) - 1 - r) / (r_nz * r_nz))
    deg = 5
    c, err = lawson(r, q_target, np.vander(r, deg + 1, increasing=True), r * r / np.exp(r))
    show("exp q(r), degree 5", c, err)

    # log1p(f) = f + f^2 * R(f) on sqrt(1/2) - 1 <= f <= sqrt(2) - 1; relative error.
    f = np.linspace(math.sqrt(0.5) - 1, math.sqrt(2) - 1, grid)
    f = f[np.abs(f) > 1e-5]
    c, err = lawson(f, (np.log1p(f) - f) / (f * f), np.vander(f, 10, increasing=True), f * f / np.abs(np.log1p(f)))
    show("log1p R(f), degree 9", c, err)

    # tanh(x) = x + x^3 * p(x^2) on |x| <= 0.625; relative error.
    x = np.linspace(1e-4, 0.625, grid)
    z = x * x
    p_target = (np.tanh(x) - x) / (x ** 3)
    c, err = lawson(z, p_target, np.vander(z, 6, increasing=True), x ** 3 / np.tanh(x))
    show("tanh p(z), degree 5", c, err)

    # erf(x) = x * p(x^2) on |x| <= 0.875; relative error.
    erf = np.vectorize(math.erf)
    erfc = np.vectorize(math.erfc)
    x = np.linspace(1e-4, 0.875, grid)
    z = x * x
    c, err = lawson(z, erf(x) / x, np.vander(z, 7, increasing=True), x / erf(x))
    show("erf p(z), degree 6", c, err)

    # erfc(a) = exp(-a^2) * g(t), t = 1 / (1 + a / 2), on 0.875 <= a <= 4; absolute error in erf.
    a = np.linspace(0.875, 4.0, grid)
    t = 1.0 / (1.0 + 0.5 * a)
    g = erfc(a) * np.exp(a * a)
    for degree in (9,):
        c, err = lawson(t, g, np.vander(t, degree + 1, increasing=True), np.exp(-a * a))
        show(f"erfc g(t), degree {degree}", c, err)


if __name__ == "__main__":
    main()
