"""Write a tiny random-init Llama checkpoint and a locally trained tokenizer.

Runs INSIDE a harness venv (needs torch, transformers, tokenizers); called by
``tests/harness/model.py``. No hub access at all.

usage: python make_tiny_model.py OUT_DIR [--layers 2] [--seed 0]

Also writes ``harness_reference.json``: HF transformers' greedy ids for a fixed
prompt, so tests can check SGLang against an independent implementation.
"""

from __future__ import annotations

import argparse
import json
import os
import random

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

REFERENCE_PROMPT = "hello world the quick"
REFERENCE_NEW_TOKENS = 8

_WORDS = (
    "the quick brown fox jumps over lazy dog hello world sglang speculative decoding "
    "scheduler worker tensor parallel request token model cpu gpu once upon a time "
    "there was a tiny random model that said"
).split()


def train_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    # byte-level BPE: every input string encodes, so tests may send any text
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(_WORDS) for _ in range(20)) for _ in range(3000)]
    corpus += ["".join(chr(c) for c in range(32, 127))] * 10
    tk.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    # sglang's chat endpoint needs a template; keep it trivial
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    # the trained vocab comes out short of vocab_size; pad with plain tokens so
    # every id the random model can emit decodes to text
    if len(tok) < vocab_size:
        tok.add_tokens([f"<x{i}>" for i in range(vocab_size - len(tok))])
    assert len(tok) == vocab_size, (len(tok), vocab_size)
    return tok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.vocab % 64:
        raise SystemExit("--vocab must be a multiple of 64")

    os.makedirs(a.out, exist_ok=True)
    tok = train_tokenizer(a.vocab)
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True)
    tok.save_pretrained(a.out)

    # transformers 5 writes tokenizer_class "TokenizersBackend", which
    # transformers 4.x (sglang 0.5.9) cannot resolve; PreTrainedTokenizerFast
    # reads the same tokenizer.json under both.
    tc_path = os.path.join(a.out, "tokenizer_config.json")
    with open(tc_path) as f:
        tc = json.load(f)
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(tc_path, "w") as f:
        json.dump(tc, f, indent=2)

    # reload from disk, as a server would, for the reference ids
    tok2 = AutoTokenizer.from_pretrained(a.out)
    ref_model = AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32)
    ids = tok2(REFERENCE_PROMPT, return_tensors="pt").input_ids
    out = ref_model.generate(ids, max_new_tokens=REFERENCE_NEW_TOKENS, do_sample=False)
    ref = {
        "prompt": REFERENCE_PROMPT,
        "prompt_ids": ids[0].tolist(),
        "hf_greedy_output_ids": out[0, ids.shape[1]:].tolist(),
        "built_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "params": sum(p.numel() for p in model.parameters()),
    }
    with open(os.path.join(a.out, "harness_reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
    print(json.dumps(ref))


if __name__ == "__main__":
    main()
