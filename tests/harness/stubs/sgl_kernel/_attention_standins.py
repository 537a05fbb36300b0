"""TEST STAND-INS for the CPU attention ops of the compiled ``sgl_kernel`` (not the real thing).

SGLang's ``intel_amx`` attention backend (``srt/layers/attention/intel_amx_backend.py``) calls
``torch.ops.sgl_kernel.extend_attention_cpu`` / ``decode_attention_cpu``. It is the only CPU
backend that supports the EAGLE draft decode, draft extend and the target's TARGET_VERIFY pass,
and the C++ CPU build of sgl-kernel that provides these ops is not on PyPI. These versions are
plain torch, float32 internally, one request at a time: a reference-quality implementation for
the tiny test models, checked against ``torch.nn.functional.scaled_dot_product_attention`` on
gathered keys with independently built masks (``tests/harness/check_kernel_standins.py``).

They are attached to ``torch.ops.sgl_kernel`` as plain attributes (see ``__init__``), so
``cpu_has_amx_support()`` (``hasattr(torch.ops.sgl_kernel, "convert_weight_packed")``) stays
False and every other CPU path of SGLang is unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"sgl_kernel test stand-in: {what} is not supported")


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, logit_cap: float,
            visible: Optional[torch.Tensor]) -> torch.Tensor:
    """q [Lq, H, D], k/v [Lk, Hkv, D(v)], visible [Lq, Lk] bool or None -> [Lq, H, Dv] float32."""
    h, hkv = q.shape[1], k.shape[1]
    if hkv != h:
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scaling
    if logit_cap and logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    if visible is not None:
        s = s.masked_fill(~visible.unsqueeze(0), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v.float())


def _check_common(is_cross_attention: Any, sliding_window: Any, sinks: Any) -> None:
    if is_cross_attention:
        raise _unsupported("cross attention")
    if sliding_window is not None and int(sliding_window) > 0:
        raise _unsupported("sliding-window attention")
    if sinks is not None:
        raise _unsupported("attention sinks")


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                         req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                         max_len_extend, sm_scale, logit_cap, is_cross_attention, sliding_window,
                         encoder_lens, sinks, tree_mask, is_causal) -> None:
    """Prefill / draft-extend / target-verify attention.

    Request b has ``seq_lens[b]`` tokens, the last ``extend_seq_lens[b]`` of them new (queries at
    ``extend_start_loc[b]``). Prefix keys come from the KV buffers through ``req_to_token``; the
    new tokens' keys from ``k_extend``/``v_extend`` (the buffer when those are None). Visibility:
    ``tree_mask`` when given, in either layout SGLang builds (QLEN_ONLY ``[sum E*E]``: an E x E
    ancestor block over the new tokens, prefix fully visible; FULL ``[sum E*L]``: row-major
    E x L), else causal (query i sees keys ``< prefix + i + 1``) when ``is_causal``, else all.
    """
    _check_common(is_cross_attention, sliding_window, sinks)
    seq = [int(x) for x in seq_lens.tolist()]
    ext = [int(x) for x in extend_seq_lens.tolist()]
    starts = [int(x) for x in extend_start_loc.tolist()]
    rows = [int(x) for x in req_pool_indices.tolist()]
    layout = None
    if tree_mask is not None:
        flat = tree_mask.reshape(-1)
        if flat.numel() == sum(e * e for e in ext):
            layout = "qlen"
        elif flat.numel() == sum(e * l for e, l in zip(ext, seq)):
            layout = "full"
        else:
            raise _unsupported(f"a tree mask of {flat.numel()} elements for extend lengths {ext}")
    off = 0
    for b, (length, e, st, r) in enumerate(zip(seq, ext, starts, rows)):
        if e == 0:
            continue
        p = length - e
        idx = req_to_token[r, :length].long()
        kb = k_buffer[idx].float() * float(k_scale)
        vb = v_buffer[idx].float() * float(v_scale)
        if k_extend is not None and v_extend is not None:
            kb[p:] = k_extend[st:st + e].reshape(e, *k_buffer.shape[1:]).float()
            vb[p:] = v_extend[st:st + e].reshape(e, *v_buffer.shape[1:]).float()
        if layout == "qlen":
            block = flat[off:off + e * e].view(e, e).bool()
            off += e * e
            visible = torch.cat([torch.ones((e, p), dtype=torch.bool, device=block.device), block], dim=1)
        elif layout == "full":
            visible = flat[off:off + e * length].view(e, length).bool()
            off += e * length
        elif is_causal:
            visible = torch.arange(length).unsqueeze(0) <= (p + torch.arange(e)).unsqueeze(1)
        else:
            visible = None
        q = q_extend[st:st + e]
        o_extend[st:st + e] = _attend(q, kb, vb, float(sm_scale), logit_cap, visible).to(o_extend.dtype)


def decode_attention_cpu(q, k_buffer, v_buffer, k_scale, v_scale, o, k, v, loc, attn_logits, req_to_token,
                         req_pool_indices, seq_lens, sm_scale, logit_cap, is_cross_attention,
                         sliding_window, encoder_lens, sinks) -> None:
    """One query per request. Writes the new token's K/V (when given) to the buffers at ``loc``
    first, as the C++ op does, then attends over ``req_to_token[req_pool_indices[b],
    :seq_lens[b]]``. ``attn_logits`` (the C++ split-KV scratch) is not used."""
    _check_common(is_cross_attention, sliding_window, sinks)
    if k is not None and v is not None:
        at = loc.long()
        k_buffer[at] = k.reshape(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[at] = v.reshape(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    for b, (r, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        idx = req_to_token[int(r), :int(length)].long()
        kb = k_buffer[idx].float() * float(k_scale)
        vb = v_buffer[idx].float() * float(v_scale)
        o[b:b + 1] = _attend(q[b:b + 1], kb, vb, float(sm_scale), logit_cap, None).to(o.dtype)
