"""TEST STAND-INS for the speculative-decoding CPU ops of the compiled ``sgl_kernel``.

Not the real kernels. The CPU build of sgl-kernel (``csrc/cpu/spec.cpp`` in sgl-project/sglang)
is not published on PyPI, and SGLang 0.5.23's EAGLE worker imports and calls these ops when it
runs on the CPU engine (``SGLANG_USE_CPU_ENGINE=1``). They are written in plain torch/Python
from the semantics of that C++ file and of SGLang's own Triton twins, for the tiny test models
only: slow (Python loops over the batch), no AMX, no validation beyond what the tests need.

Each op is checked against SGLang's own Triton kernel run in Triton's CPU interpreter
(``TRITON_INTERPRET=1``), or against a straightforward re-derivation where SGLang has no Triton
twin, on random inputs: ``tests/test_kernel_standins.py`` (driver:
``tests/harness/check_kernel_standins.py``). The SGLang call site and the reference are named
in each docstring.

Signatures follow the call sites in SGLang 0.5.23 (positional order of the C++ schema; the
``retrive_*`` keyword spelling of ``verify_tree_greedy_cpu`` included).
"""

from __future__ import annotations

from typing import Optional

import torch


def _ints(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                           seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                                           pool_len: int, topk: int, num_steps: int) -> None:
    """Each request's ``topk * num_steps`` draft slots, read from its ``req_to_token`` row from
    ``seq_lens[b]`` on, written contiguously to ``out_cache_loc``.

    Call site: ``kernels/ops/speculative/cache_locs.py`` ``assign_draft_cache_locs_contiguous_func``;
    reference: Triton ``assign_draft_cache_locs_contiguous`` (same file)."""
    n = topk * num_steps
    rows = req_to_token.view(-1, pool_len)
    for b, (r, s) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens))):
        out_cache_loc[b * n:(b + 1) * n] = rows[r, s:s + n].to(out_cache_loc.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Concatenation over b of ``req_to_token[req_pool_indices[b], start[b]:end[b]]``.

    Call sites: ``cache_locs.py`` ``assign_extend_cache_locs_func`` and
    ``fill_front_out_cache_loc_func``; reference: Triton ``assign_extend_cache_locs``."""
    rows = req_to_token.view(-1, pool_len)
    off = 0
    for r, s, e in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        out_cache_loc[off:off + e - s] = rows[r, s:e].to(out_cache_loc.dtype)
        off += e - s


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """The inverse of ``assign_extend_cache_locs_cpu``: scatter consecutive slices of
    ``out_cache_loc`` into ``req_to_token[req_pool_indices[b], start[b]:end[b]]``.

    Call site: ``srt/mem_cache/allocation.py`` ``assign_req_to_token_pool_func`` (spec decode
    allocation); reference: Triton ``assign_req_to_token_pool`` (same file)."""
    rows = req_to_token.view(-1, pool_len)
    off = 0
    for r, s, e in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        rows[r, s:e] = out_cache_loc[off:off + e - s].to(rows.dtype)
        off += e - s


def build_draft_decode_metadata_cpu(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                                    seq_lens: torch.Tensor, topk: int, num_steps: int,
                                    pool_len: int) -> torch.Tensor:
    """A private ``[bs * topk, pool_len]`` req->token table for the multi-step draft decode:
    row ``b * topk + k`` is request b's committed prefix ``req_to_token[r, :seq_len]`` followed
    by candidate k's ``num_steps`` draft slots ``req_to_token[r, seq_len + k * num_steps :
    seq_len + (k + 1) * num_steps]`` (page size 1).

    Call site: ``srt/layers/attention/intel_amx_backend.py``
    ``IntelAMXMultiStepDraftBackend.init_forward_metadata``. No Triton twin of this op; the GPU
    backends build the same per-step index lists with Triton ``generate_draft_decode_kv_indices``
    (``cache_locs.py``), which the unit test uses as the reference."""
    rows = req_to_token.view(-1, pool_len)
    bs = int(seq_lens.numel())
    out = torch.zeros((bs * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for b, (r, s) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens))):
        for k in range(topk):
            row = out[b * topk + k]
            row[:s] = rows[r, :s]
            row[s:s + num_steps] = rows[r, s + k * num_steps:s + (k + 1) * num_steps]
    return out


def build_tree_kernel_efficient_cpu(parent_list: torch.Tensor, selected_index: torch.Tensor,
                                    verified_seq_len: torch.Tensor, tree_mask: torch.Tensor,
                                    positions: torch.Tensor, retrive_index: torch.Tensor,
                                    retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
                                    topk: int, depth: int, draft_token_num: int,
                                    tree_mask_mode: int) -> None:
    """The EAGLE draft tree of each request from its draft results: node 0 is the bonus (root)
    token, node i (1..N-1) is draft ``selected_index[b, i-1]``, whose parent is found through
    ``parent_list``. Fills retrive_index (``b*N + i``), first-child links (retrive_next_token),
    next-sibling links (retrive_next_sibling; the caller pre-fills both with -1), positions
    (``seq_len + depth``) and the ancestor mask, either FULL (``[sum(seq_len)*N + bs*N*N]``,
    mode 0, prefix columns left as the caller filled them) or QLEN_ONLY (``[bs*N*N]``, mode 1,
    the one SGLang's CPU path uses). Mode 2 (bit-packed) is rejected, as by the C++ op.

    Call site: ``kernels/ops/speculative/spec_tree.py`` ``build_tree_kernel_efficient_func``;
    reference: Triton ``sgl_build_tree_kernel_efficient_triton`` (same file)."""
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise NotImplementedError(f"sgl_kernel test stand-in: tree_mask_mode {mode} is not supported")
    n = draft_token_num
    seq = _ints(verified_seq_len)
    mask = tree_mask.view(-1)
    ri, nt, ns = retrive_index.view(-1, n), retrive_next_token.view(-1, n), retrive_next_sibling.view(-1, n)
    pos = positions.view(-1)
    prefix = 0
    for b, sl in enumerate(seq):
        sel = _ints(selected_index[b])[: n - 1]
        par = _ints(parent_list[b]) if parent_list.dim() > 1 else _ints(parent_list)

        def node_of_parent(node: int) -> Optional[int]:
            """Tree node (0 = root) holding the parent of ``node``; None when not in the tree."""
            parent_slot = sel[node - 1] // topk
            if parent_slot == 0:
                return 0
            want = par[parent_slot]
            return sel.index(want) + 1 if want in sel else None

        pos[b * n] = sl
        ri[b, 0] = b * n
        for i in range(n - 1, 0, -1):  # reverse order: first child ends up the lowest index
            ri[b, i] = b * n + i
            p = node_of_parent(i)
            if p is None:
                continue
            old = int(nt[b, p])
            nt[b, p] = i
            if old != -1:
                ns[b, i] = old
        for x in range(n):
            if mode == 0:
                row0 = n * n * b + prefix * n + (sl + n) * x + sl  # column of the root token
            else:
                row0 = n * n * b + n * x
            mask[row0] = True
            mask[row0 + 1:row0 + n] = False
            if x == 0:
                continue
            node, d = x, 0
            for _ in range(depth):
                d += 1
                mask[row0 + node] = True
                p = node_of_parent(node)
                if p is None or p == 0:
                    break
                node = p
            pos[b * n + x] = sl + d
        prefix += sl


def verify_tree_greedy_cpu(predicts: torch.Tensor, accept_index: torch.Tensor,
                           accept_token_num: torch.Tensor, candidates: torch.Tensor,
                           retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                           retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor) -> None:
    """Greedy tree verification: from the root, at each level take the first child (then its
    siblings, in link order) whose draft token equals the target's argmax at the last accepted
    node; record its flat index in ``accept_index[b, 1..]``. ``accept_token_num[b]`` = accepted
    drafts (bonus excluded); ``predicts`` gets the target token at every accepted node and at
    the last one (the bonus token).

    Call site: ``spec_tree.py`` ``verify_tree_greedy_func``; reference: Triton
    ``verify_tree_greedy_kernel_triton`` (same file)."""
    bs, n = candidates.shape[0], candidates.shape[1]
    steps = accept_index.shape[1]
    target = target_predict.reshape(-1)
    pred = predicts.view(-1)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        num = 0
        cur = 0
        for _ in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            want = int(target[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == want:
                    pred[last] = want
                    num += 1
                    last = int(retrive_index[b, cur])
                    accept_index[b, num] = last
                    matched = True
                    break
                cur = int(retrive_next_sibling[b, cur])
            if not matched:
                break
        accept_token_num[b] = num
        pred[last] = target[last]


def fill_accept_out_cache_loc_cpu(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                                  accept_out_cache_loc: torch.Tensor, size: Optional[int] = None) -> None:
    """Compact ``out_cache_loc[accept_index[i]]`` over the entries with ``accept_index != -1``,
    in order, to the front of ``accept_out_cache_loc`` (the rest is left untouched).

    Call site: ``kernels/ops/speculative/eagle.py`` ``fill_accept_out_cache_loc_func``;
    reference: Triton ``fill_accept_out_cache_loc`` (same file)."""
    idx = accept_index.reshape(-1)
    if size is not None:
        idx = idx[:size]
    idx = idx[idx != -1].long()
    accept_out_cache_loc[: idx.numel()] = out_cache_loc[idx].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens: torch.Tensor, accept_lens: torch.Tensor,
                          bonus_tokens: torch.Tensor, accept_stride: int) -> None:
    """``bonus[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]`` (accept_lens
    includes the bonus token).

    Call site: ``eagle.py`` ``fill_bonus_tokens_func``; reference: Triton ``fill_bonus_tokens``."""
    flat = accept_tokens.reshape(-1)
    for b, n in enumerate(_ints(accept_lens)):
        bonus_tokens[b] = flat[accept_stride * b + n - 1]


def rotate_input_ids_cpu(input_ids: torch.Tensor, extend_start_loc: torch.Tensor,
                         extend_seq_lens: torch.Tensor, topk_index: torch.Tensor,
                         select_index: Optional[torch.Tensor] = None) -> None:
    """Per request: shift its extend segment of ``input_ids`` left by one and write the new
    token ``topk_index[b]`` at the segment's end (or at ``select_index[b]`` when given).
    Multi-layer EAGLE only (not reached by EAGLE-3); kept so the module is complete.

    Call site: ``kernels/ops/speculative/multi_layer_eagle.py`` ``rotate_input_ids``;
    reference: Triton ``rotate_input_ids_kernel`` (same file)."""
    new = _ints(topk_index)
    sel = _ints(select_index) if select_index is not None else None
    for b, (s, n) in enumerate(zip(_ints(extend_start_loc), _ints(extend_seq_lens))):
        if n <= 0:
            continue
        input_ids[s:s + n - 1] = input_ids[s + 1:s + n].clone()
        input_ids[sel[b] if sel is not None else s + n - 1] = new[b]
