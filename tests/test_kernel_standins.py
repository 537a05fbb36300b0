"""The sgl_kernel CPU test stand-ins EAGLE needs, against SGLang's own kernels.

``tests/harness/stubs/sgl_kernel`` replaces compiled kernels that have no CPU build on PyPI
(test venvs only). Here every op EAGLE-3 reaches on SGLang 0.5.23's CPU path is run on random
inputs next to SGLang's own Triton kernel executed by Triton's CPU interpreter
(``TRITON_INTERPRET=1``), called where possible through SGLang's own CPU dispatcher (so the
call signatures are checked too), or, for the attention ops and the raw-pointer KV copy, next
to a straightforward re-derivation. The driver, ``tests/harness/check_kernel_standins.py``,
runs inside the SGLang venv (torch, triton, sglang).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.harness.venv import ensure_venv, venv_python

pytestmark = pytest.mark.sglang

CHECK = Path(__file__).resolve().parent / "harness" / "check_kernel_standins.py"
ROUNDS = 40
OPS = (
    "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu", "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu", "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
    "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu", "rotate_input_ids_cpu", "extend_attention_cpu",
    "decode_attention_cpu", "copy_all_layer_kv_cache_cpu",
)
TRITON_CHECKED = OPS[:9]


@pytest.fixture(scope="module")
def report() -> dict:
    venv = ensure_venv("0.5.23")
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1"}
    out = subprocess.run([str(venv_python(venv)), str(CHECK), "--rounds", str(ROUNDS), "--seed", "0"],
                         capture_output=True, text=True, timeout=900, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)


def test_reference_kernels_ran_in_tritons_interpreter(report):
    assert report["triton_interpret"] and report["sglang_cpu_engine"]
    assert "/site-packages/sgl_kernel/" in report["sgl_kernel_file"], "the venv's copy of the stand-ins"
    assert set(report["ops"]) == set(OPS)
    for op in TRITON_CHECKED:
        assert report["ops"][op]["reference"].startswith("triton:"), op


@pytest.mark.parametrize("op", OPS)
def test_standin_matches_reference(report, op):
    res = report["ops"][op]
    assert res["cases"] == ROUNDS
    assert res["failures"] == [], "\n".join(res["failures"][:3])


def test_verify_cases_cover_accepts_and_sibling_trees(report):
    """The random targets exercise what matters: zero, one and several accepted drafts, and
    trees with siblings (topk > 1)."""
    cov = report["coverage"]["verify_tree_greedy_cpu"]
    hist = {int(k): v for k, v in cov["accepted_histogram"].items()}
    assert hist.get(0) and hist.get(1) and sum(v for k, v in hist.items() if k >= 2) > 0, hist
    assert cov["trees_with_siblings"] > 0
