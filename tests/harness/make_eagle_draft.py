"""Write a tiny EAGLE-3 draft (``LlamaForCausalLMEagle3``) for a tiny Llama target: a *copy* draft.

Runs INSIDE a harness venv (torch, safetensors); called by ``tests/harness/eagle.py``.

A random draft never gets a draft token accepted (accept length 1.0), which leaves SGLang's
accept path untested. This draft is built by hand instead, so that it predicts "the next token
repeats the current one"; the tiny random target often falls into repeating a token, and then
the drafts are accepted. How the weights do that (SGLang 0.5.23 ``models/llama_eagle3.py``;
the draft shares the target's embedding, EAGLE-3 keeps its own lm_head):

- ``fc = 0``: the target's hidden states contribute nothing, so the residual stream starts at 0
  and the layer's attention input is ``[rmsnorm(embed(token)), 0]``.
- attention: K and V are fixed projections of the normalised token embedding, Q is K scaled by
  ``--q-scale``; a query scores far higher on keys of its own token (itself, at distance 0,
  always among them) than on any other, and every such key carries the same V. The attention
  output is therefore a function of the current token only.
- ``o_proj`` places the two KV heads' values in the first 64 hidden dims, the MLP's
  ``down_proj = 0``, so the final hidden is ``rmsnorm(z(token))``.
- ``lm_head`` row y = ``z(y) / |z(y)|``: by Cauchy-Schwarz the argmax for hidden ``z(x)`` is x.
- ``d2t = 0`` (draft vocab = target vocab, identity map).

The script checks itself before writing: an fp32 re-implementation of the draft layer (RoPE
included) over random contexts must predict "copy" for at least 99% of positions.

usage: python make_eagle_draft.py TARGET_DIR OUT_DIR [--seed 0] [--q-scale 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

AUX_LAYER_IDS = [0, 1, 2]  # target layers whose outputs EAGLE-3 captures (target needs >= 4 layers here)


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (what SGLang's Llama uses), x [L, heads, d]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :], torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--q-scale", type=float, default=20.0)
    a = ap.parse_args()

    cfg = json.load(open(os.path.join(a.target, "config.json")))
    if cfg["num_hidden_layers"] < max(AUX_LAYER_IDS) + 2:
        raise SystemExit(f"target needs >= {max(AUX_LAYER_IDS) + 2} layers for aux layers {AUX_LAYER_IDS}")
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    eps = cfg["rms_norm_eps"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    if nkv * hd > h:
        raise SystemExit("the copy construction needs num_key_value_heads * head_dim <= hidden_size")

    target = load_file(os.path.join(a.target, "model.safetensors"))
    embed = target["model.embed_tokens.weight"].float()
    g = torch.Generator().manual_seed(a.seed)

    def orthonormal_rows(n: int, dim: int) -> torch.Tensor:
        q, _ = torch.linalg.qr(torch.randn(dim, n, generator=g))
        return q.T.contiguous()  # [n, dim]

    # K and V projections per KV head, reading only the embedding half of the 2h-wide input.
    kproj = [orthonormal_rows(hd, h) for _ in range(nkv)]
    vproj = [orthonormal_rows(hd, h) for _ in range(nkv)]
    group = nh // nkv

    def pad_in(w: torch.Tensor) -> torch.Tensor:  # [n, h] -> [n, 2h] (target-hidden half = 0)
        return torch.cat([w, torch.zeros_like(w)], dim=1)

    q_w = pad_in(torch.cat([a.q_scale * kproj[i // group] for i in range(nh)]))
    k_w = pad_in(torch.cat(kproj))
    v_w = pad_in(torch.cat(vproj))
    o_w = torch.zeros(h, nh * hd)
    for kv in range(nkv):  # the first query head of each group carries that KV head's value
        head = kv * group
        o_w[kv * hd:(kv + 1) * hd, head * hd:(head + 1) * hd] = torch.eye(hd)

    def z_of(tokens: torch.Tensor) -> torch.Tensor:
        n = rms(embed[tokens], eps)
        return torch.cat([n @ v.T for v in vproj] + [torch.zeros(len(tokens), h - nkv * hd)], dim=1)

    z_all = z_of(torch.arange(vocab))
    lm_head = z_all / z_all.norm(dim=-1, keepdim=True).clamp_min(1e-6)

    # -- self-check: the draft layer, re-implemented, copies its input token ------------------
    live = (embed.abs().sum(-1) > 0).nonzero().flatten()  # pad has an all-zero embedding
    hits = total = 0
    for trial in range(20):
        length = 64
        toks = live[torch.randint(len(live), (length,), generator=g)]
        if trial % 2:  # contexts with repeats, as a looping target produces
            toks[length // 2:] = toks[length // 2 - 1]
        x = torch.cat([rms(embed[toks], eps), torch.zeros(length, h)], dim=1)
        pos = torch.arange(length)
        q = rope((x @ q_w.T).view(length, nh, hd), pos, theta)
        k = rope((x @ k_w.T).view(length, nkv, hd), pos, theta).repeat_interleave(group, dim=1)
        v = (x @ v_w.T).view(length, nkv, hd).repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
        s = s.masked_fill(~torch.tril(torch.ones(length, length, dtype=torch.bool)), float("-inf"))
        att = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(length, nh * hd)
        out = rms(att @ o_w.T, eps) @ lm_head.T
        hits += int((out.argmax(-1) == toks).sum())
        total += length
    copy_rate = hits / total
    if copy_rate < 0.99:
        raise SystemExit(f"copy draft self-check failed: copies {copy_rate:.4f} of positions")

    sd = {
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": q_w,
        "midlayer.self_attn.k_proj.weight": k_w,
        "midlayer.self_attn.v_proj.weight": v_w,
        "midlayer.self_attn.o_proj.weight": o_w,
        "midlayer.mlp.gate_proj.weight": torch.randn(inter, h, generator=g) * 0.02,
        "midlayer.mlp.up_proj.weight": torch.randn(inter, h, generator=g) * 0.02,
        "midlayer.mlp.down_proj.weight": torch.zeros(h, inter),
        "fc.weight": torch.zeros(h, len(AUX_LAYER_IDS) * h),
        "norm.weight": torch.ones(h),
        "lm_head.weight": lm_head,
        "d2t": torch.zeros(vocab, dtype=torch.int64),
        "t2d": torch.ones(vocab, dtype=torch.bool),
    }
    os.makedirs(a.out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(a.out, "model.safetensors"),
              metadata={"format": "pt"})
    dcfg = dict(cfg)
    dcfg.update(num_hidden_layers=1, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=vocab,
                tie_word_embeddings=False, dtype="float32",
                eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS})
    dcfg.pop("torch_dtype", None)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(dcfg, f, indent=2)
    for name in os.listdir(a.target):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja",
                                                    "generation_config.json"):
            shutil.copy(os.path.join(a.target, name), a.out)
    info = {"kind": "eagle3-copy", "copy_rate_selfcheck": copy_rate, "q_scale": a.q_scale,
            "aux_layer_ids": AUX_LAYER_IDS, "tensors": len(sd)}
    with open(os.path.join(a.out, "harness_draft.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
