"""Run the Triton GAE kernel in Triton's CPU interpreter against the float64 reference.

Run as a script (``tests/gae/test_gae.py`` does, in a subprocess, because
TRITON_INTERPRET must be set before triton is imported). Prints one JSON
line: the worst errors and the list of failures.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pdsr_sdk.gae import compute_gae  # noqa: E402
from pdsr_sdk.gae.reference import reference_gae  # noqa: E402
from pdsr_sdk.gae.triton_kernel import triton_gae  # noqa: E402
from test_gae import GAMMA_LAM, MASKS, make_inputs, seed_of, tolerance  # noqa: E402

# (shape, block, segments, carry, prefetch): one tile and several tiles per row, one segment and several (the
# summary kernel plus the fold over later segments), a partial last tile, the next tile's loads issued before
# this tile's scan or not
CASES = [((3, 37), 8, 1, "float32", False), ((3, 37), 8, 1, "float32", True), ((2, 40), 8, 3, "float64", True)]


def main() -> None:
    failures: list[str] = []
    worst = 0.0
    checked = 0
    for mask_kind in MASKS:
        for gamma, lam in GAMMA_LAM:
            for shape, block, segments, carry, prefetch in CASES:
                r, v, m = make_inputs(seed_of(shape, mask_kind, "triton"), *shape, mask_kind)
                r[~m] = np.nan   # masked rewards never enter the state
                adv, ret = triton_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(m), gamma, lam,
                                      carry_dtype=carry, block=block, segments=segments, prefetch=prefetch)
                adv_ref, ret_ref = reference_gae(r, v, m, gamma, lam)
                err = max(float(np.abs(adv.numpy() - adv_ref).max()), float(np.abs(ret.numpy() - ret_ref).max()))
                worst = max(worst, err)
                checked += 1
                if not err <= tolerance(gamma, lam, adv_ref):
                    failures.append(f"{mask_kind} gamma={gamma} lam={lam} {shape} block={block} "
                                    f"segments={segments} prefetch={prefetch} {carry}: error {err:.3g}")
    # through compute_gae: numpy in/out, float64 data, tensors with out buffers aliasing the inputs, empty
    r, v, m = make_inputs(7, 2, 33, "interior")
    adv, ret = compute_gae(r, v, m, 0.99, 0.95, backend="triton")
    adv_ref, ret_ref = reference_gae(r, v, m, 0.99, 0.95)
    api = {"numpy_kind": type(adv).__name__, "numpy_dtype": str(adv.dtype),
           "numpy_err": float(np.abs(adv - adv_ref).max())}
    r64, v64 = torch.from_numpy(r.astype(np.float64)), torch.from_numpy(v.astype(np.float64))
    out = (v64.clone(), r64.clone())   # advantages over the values, returns over the rewards
    got = compute_gae(out[1], out[0], torch.from_numpy(m), 0.99, 0.95, backend="triton", out=out)
    api["alias_same_objects"] = got[0] is out[0] and got[1] is out[1]
    api["alias_dtype"] = str(got[0].dtype)
    api["alias_err"] = max(float(np.abs(got[0].numpy() - adv_ref).max()),
                           float(np.abs(got[1].numpy() - ret_ref).max()))
    empty = compute_gae(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), None, 1.0, 1.0,
                        backend="triton")
    api["empty_shape"] = list(empty[0].shape)
    print(json.dumps({"checked": checked, "worst": worst, "failures": failures, "api": api}))


if __name__ == "__main__":
    main()
