"""EAGLE-3 speculative decoding on CPU: the tiny target + copy draft, and the launch flags.

Stdlib only (runs under the test runner's Python). The draft is written by
``make_eagle_draft.py`` inside a harness venv; the kernel ops EAGLE needs on CPU come from the
test stand-ins in ``stubs/sgl_kernel`` (see that package).

Why these flags (SGLang 0.5.23 on a CPU without AMX):

- ``--attention-backend torch_native`` (the harness default) cannot run the target's
  TARGET_VERIFY pass (a verify batch has no ``extend_prefix_lens``); ``--prefill-attention-backend
  intel_amx`` makes the target a hybrid backend whose prefill *and* verify go to ``intel_amx``
  (``speculative_attention_mode`` defaults to "prefill"), i.e. to the ``extend_attention_cpu``
  stand-in. The non-AMX rewrite of ``intel_amx`` to ``torch_native`` only looks at
  ``--attention-backend``, so this one sticks.
- ``--speculative-draft-attention-backend intel_amx``: the draft decode / draft extend need it
  (``decode_attention_cpu`` / ``extend_attention_cpu`` and ``build_draft_decode_metadata_cpu``).
- ``--dtype float32``: greedy equality with the plain server is exact only in fp32; the random
  tiny model has logit margins below one bf16 ulp.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .model import MODEL_MARKER, build_cached, ensure_tiny_model
from .venv import venv_python

MAKE_EAGLE_DRAFT = Path(__file__).resolve().parent / "make_eagle_draft.py"
TARGET_NAME = "tiny-llama4"  # EAGLE-3 captures target layers 0, 1, 2: four layers are needed
TARGET_LAYERS = 4

ATTENTION_ARGS = ("--prefill-attention-backend", "intel_amx", "--speculative-draft-attention-backend", "intel_amx")


def ensure_eagle_models(venv: Path) -> tuple[Path, Path]:
    """``(target, draft)``: the 4-layer tiny Llama and its EAGLE-3 copy draft, built on first use
    under ``HARNESS_DIR/models`` (a few seconds each)."""
    target = ensure_tiny_model(venv, name=TARGET_NAME, layers=TARGET_LAYERS)
    spec = json.dumps({
        "script": hashlib.sha256(MAKE_EAGLE_DRAFT.read_bytes()).hexdigest()[:16],
        "target": (target / MODEL_MARKER).read_text(),
    }, sort_keys=True)
    out = build_cached(f"{TARGET_NAME}-eagle3-copy", spec,
                       lambda tmp: [str(venv_python(venv)), str(MAKE_EAGLE_DRAFT), str(target), str(tmp)],
                       what=f"EAGLE-3 copy draft with {venv}")
    return target, out


def eagle_args(draft: Path, *, topk: int, num_steps: int, num_draft_tokens: int) -> tuple[str, ...]:
    """Extra ``sglang.launch_server`` arguments for EAGLE-3 on this CPU (add ``--dtype float32``)."""
    return (
        *ATTENTION_ARGS,
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(num_steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(num_draft_tokens),
    )


def draft_info(draft: Path) -> dict:
    return json.loads((Path(draft) / "harness_draft.json").read_text())
