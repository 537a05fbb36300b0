"""Check the sgl_kernel test stand-ins against SGLang's own kernels, on random inputs.

Runs INSIDE an SGLang harness venv (torch, triton, sglang and the stand-in ``sgl_kernel``),
started by ``tests/test_kernel_standins.py`` with ``TRITON_INTERPRET=1`` (SGLang's Triton
kernels then run in Triton's CPU interpreter), ``SGLANG_USE_CPU_ENGINE=1`` (so SGLang's own
``*_func`` dispatchers route to the stand-ins, checking the call signatures too) and
``TORCHDYNAMO_DISABLE=1``.

Each check feeds identical copies of random inputs to the stand-in (through SGLang's CPU
dispatch where there is one) and to the reference, and compares every output exactly (integer
ops) or to 1e-5 (attention). Draft trees come from SGLang's own ``select_top_k_tokens`` and
``organize_draft_results`` fed random draft scores.

usage: python check_kernel_standins.py [--seed 0] [--rounds N]   -> one JSON object on stdout:
    {"triton_interpret": bool, "ops": {op: {"reference": str, "cases": int, "failures": [str]}},
     "coverage": {...}}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import traceback
from typing import Callable

import torch
import torch.nn.functional as F

RESULTS: dict[str, dict] = {}
COVERAGE: dict[str, dict] = {}  # what the random inputs exercised, for the test to assert on


def record(op: str, reference: str, fn: Callable[[random.Random], None], rounds: int, rng: random.Random) -> None:
    entry = RESULTS.setdefault(op, {"reference": reference, "cases": 0, "failures": []})
    for i in range(rounds):
        state = rng.getstate()
        try:
            fn(rng)
        except Exception as exc:  # a failed comparison or a crash: both are failures
            tb = traceback.format_exc(limit=3)
            entry["failures"].append(f"case {i} (rng state hash {hash(state) & 0xffff}): {exc!r}\n{tb}")
        entry["cases"] += 1


def same(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape or not torch.equal(a.long() if a.dtype != b.dtype else a, b.long() if a.dtype != b.dtype else b):
        raise AssertionError(f"{name} differs:\n stand-in  {a.tolist()}\n reference {b.tolist()}")


def close(name: str, a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    if a.shape != b.shape or not torch.allclose(a.float(), b.float(), atol=tol, rtol=tol):
        raise AssertionError(f"{name} differs by {(a.float() - b.float()).abs().max().item():.3g}")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# -- random inputs ------------------------------------------------------------------------------

def random_pool(rng: random.Random, bs: int, pool_len: int, min_free: int):
    """A req->token table with ``bs`` random rows in use, and per-request lengths that leave
    ``min_free`` columns after them."""
    n_rows = bs + rng.randint(0, 3)
    req_to_token = torch.randperm(n_rows * pool_len, generator=torch.Generator().manual_seed(rng.randint(0, 1 << 30)))
    req_to_token = req_to_token.view(n_rows, pool_len).to(torch.int32)
    rows = torch.tensor(rng.sample(range(n_rows), bs), dtype=torch.int64)
    seq_lens = torch.tensor([rng.randint(1, pool_len - min_free) for _ in range(bs)], dtype=torch.int64)
    return req_to_token, rows, seq_lens


def random_tree(rng: random.Random, bs: int, topk: int, steps: int, num_draft: int, vocab: int = 50):
    """Draft results the way EagleDraftWorker.draft_forward produces them, from random scores."""
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    g = torch.Generator().manual_seed(rng.randint(0, 1 << 30))

    def topk_of(rows: int):
        probs = torch.softmax(torch.randn(rows, vocab, generator=g), dim=-1)
        return torch.topk(probs, topk, dim=-1)

    score_list, token_list, parents_list = [], [], []
    topk_p, topk_index = topk_of(bs)
    scores = None
    for i in range(steps):
        _, _, scores, tree_info = select_top_k_tokens(i, topk_p, topk_index, None, scores, topk)
        score_list.append(tree_info[0])
        token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        if i < steps - 1:
            topk_p, topk_index = topk_of(bs * topk)
    parent_list, top_scores_index, draft_tokens = organize_draft_results(
        score_list, token_list, parents_list, num_draft)
    return parent_list, top_scores_index, draft_tokens


def tree_shape(rng: random.Random):
    topk = rng.randint(1, 3)
    steps = rng.randint(1, 4)
    max_draft = 1 + topk + (steps - 1) * topk * topk
    num_draft = rng.randint(2, min(9, max_draft))
    return rng.randint(1, 4), topk, steps, num_draft


# -- speculative ops ----------------------------------------------------------------------------

def check_assign_draft_cache_locs(rng: random.Random) -> None:
    from sglang.kernels.ops.speculative import cache_locs

    bs, topk, steps = rng.randint(1, 5), rng.randint(1, 3), rng.randint(1, 4)
    req_to_token, rows, seq_lens = random_pool(rng, bs, 48, topk * steps)
    ours = torch.full((bs * topk * steps,), -7, dtype=torch.int64)
    ref = ours.clone()
    cache_locs.assign_draft_cache_locs_contiguous_func(rows, req_to_token, seq_lens, ours, topk, steps)
    cache_locs.assign_draft_cache_locs_contiguous[(bs,)](
        rows, req_to_token, seq_lens, ref, req_to_token.shape[1], topk, steps, BS=bs)
    same("out_cache_loc", ours, ref)


def check_assign_extend_cache_locs(rng: random.Random) -> None:
    from sglang.kernels.ops.speculative import cache_locs

    import sgl_kernel

    bs = rng.randint(1, 5)
    req_to_token, rows, seq_lens = random_pool(rng, bs, 48, 8)
    # SGLang's dispatcher: every request extends by the same number of draft tokens.
    ntok = rng.randint(1, 8)
    start = seq_lens.clone()
    ours = cache_locs.assign_extend_cache_locs_func(rows, req_to_token, start, start + ntok, bs, ntok, "cpu")
    ref = torch.empty(bs * ntok, dtype=torch.int64)
    cache_locs.assign_extend_cache_locs[(bs,)](
        rows, req_to_token, start, start + ntok, ref, req_to_token.shape[1], next_pow2(bs))
    same("out_cache_loc", ours, ref)
    # The op itself also takes ragged lengths.
    end = seq_lens + torch.tensor([rng.randint(0, 8) for _ in range(bs)])
    total = int((end - start).sum())
    ours = torch.full((total,), -1, dtype=torch.int64)
    ref = ours.clone()
    sgl_kernel.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, ours, req_to_token.shape[1])
    cache_locs.assign_extend_cache_locs[(bs,)](
        rows, req_to_token, start, end, ref, req_to_token.shape[1], next_pow2(bs))
    same("out_cache_loc (ragged)", ours, ref)
    # The other CPU call site, fill_front_out_cache_loc_func: the first n slots of each window.
    width = rng.randint(1, 6)
    window = torch.tensor([rng.randint(0, 999) for _ in range(bs * width)], dtype=torch.int64)
    front = torch.tensor([rng.randint(1, width) for _ in range(bs)], dtype=torch.int64)
    ours2 = torch.zeros(bs * width, dtype=torch.int64)
    ref2 = ours2.clone()
    cache_locs.fill_front_out_cache_loc_func(front, window, ours2)
    cache_locs.assign_extend_cache_locs[(bs,)](
        torch.arange(bs), window.view(bs, width), torch.zeros_like(front), front, ref2, width, next_pow2(bs))
    same("front_out_cache_loc", ours2, ref2)


def check_assign_req_to_token_pool(rng: random.Random) -> None:
    from sglang.srt.mem_cache import allocation

    bs = rng.randint(1, 5)
    req_to_token, rows, seq_lens = random_pool(rng, bs, 48, 8)
    lens = [rng.randint(0, 8) for _ in range(bs)]
    start = seq_lens.clone()
    end = seq_lens + torch.tensor(lens)
    out_cache_loc = torch.tensor([rng.randint(0, 9999) for _ in range(sum(lens))], dtype=torch.int64)
    ours, ref = req_to_token.clone(), req_to_token.clone()
    allocation.assign_req_to_token_pool_func(rows, ours, start, end, out_cache_loc, bs)
    allocation.assign_req_to_token_pool[(bs,)](
        rows, ref, start, end, out_cache_loc, ref.shape[1], next_pow2(bs))
    same("req_to_token", ours, ref)


def check_build_draft_decode_metadata(rng: random.Random) -> None:
    """Reference: the per-step KV index lists the GPU backends build with Triton
    ``generate_draft_decode_kv_indices``; row b*topk+k of the stand-in's table, cut at
    ``seq_len + step + 1``, must equal that candidate's list at every step."""
    import sgl_kernel
    from sglang.kernels.ops.speculative import cache_locs

    bs, topk, steps = rng.randint(1, 4), rng.randint(1, 3), rng.randint(2, 4)
    req_to_token, rows, seq_lens = random_pool(rng, bs, 40, topk * steps)
    pool_len = req_to_token.shape[1]
    table = sgl_kernel.build_draft_decode_metadata_cpu(req_to_token, rows, seq_lens, topk, steps, pool_len)
    assert table.shape == (bs * topk, pool_len) and table.dtype == req_to_token.dtype
    width = int(seq_lens.sum()) * topk + bs * topk * steps
    kv_indices = torch.full((steps, width), -1, dtype=torch.int64)
    kv_indptr = torch.zeros((steps, bs * topk + 1), dtype=torch.int64)
    positions = seq_lens.repeat_interleave(topk)
    cache_locs.generate_draft_decode_kv_indices[(steps, bs, topk)](
        rows, req_to_token, seq_lens, kv_indices, kv_indptr, positions, pool_len,
        kv_indices.shape[1], kv_indptr.shape[1], next_pow2(bs), next_pow2(steps), next_pow2(bs * topk), 1)
    for i in range(steps - 1):  # SGLang's draft decode runs steps - 1 attention steps
        for b in range(bs):
            for k in range(topk):
                z = b * topk + k
                lo, hi = int(kv_indptr[i, z]), int(kv_indptr[i, z + 1])
                n = int(seq_lens[b]) + i + 1
                assert hi - lo == n, (i, b, k, lo, hi, n)
                same(f"step {i} row {z}", table[z, :n].long(), kv_indices[i, lo:hi])


def tree_inputs(rng: random.Random):
    bs, topk, steps, num_draft = tree_shape(rng)
    parent_list, top_scores_index, draft_tokens = random_tree(rng, bs, topk, steps, num_draft)
    seq_lens = torch.tensor([rng.randint(1, 12) for _ in range(bs)], dtype=torch.int64)
    return bs, topk, steps, num_draft, parent_list, top_scores_index, draft_tokens, seq_lens


def tree_buffers(bs: int, n: int, seq_lens: torch.Tensor, mode: int):
    size = bs * n * n + (int(seq_lens.sum()) * n if mode == 0 else 0)
    return (torch.full((size,), True, dtype=torch.bool), torch.full((bs * n,), -5, dtype=torch.int64),
            torch.full((3, bs, n), -1, dtype=torch.int64))


def check_build_tree(rng: random.Random) -> None:
    from sglang.kernels.ops.speculative import spec_tree

    bs, topk, steps, n, parent_list, sel, _, seq_lens = tree_inputs(rng)
    for mode in (spec_tree.TreeMaskMode.QLEN_ONLY, spec_tree.TreeMaskMode.FULL_MASK):
        mask_a, pos_a, ret_a = tree_buffers(bs, n, seq_lens, int(mode))
        mask_b, pos_b, ret_b = tree_buffers(bs, n, seq_lens, int(mode))
        spec_tree.build_tree_kernel_efficient_func(
            parent_list, sel, seq_lens, mask_a, pos_a, ret_a[0], ret_a[1], ret_a[2], topk, steps, n, mode)
        spec_tree.sgl_build_tree_kernel_triton(
            parent_list, sel, seq_lens, mask_b, pos_b, ret_b[0], ret_b[1], ret_b[2], topk, steps, n, mode)
        same(f"tree_mask ({mode.name})", mask_a, mask_b)
        same(f"positions ({mode.name})", pos_a, pos_b)
        same(f"retrieve index/next_token/next_sibling ({mode.name})", ret_a, ret_b)


def check_verify_tree_greedy(rng: random.Random) -> None:
    """Targets agree with some child's draft token 60% of the time, so multi-token accepts,
    sibling matches and early stops all occur."""
    from sglang.kernels.ops.speculative import spec_tree

    bs, topk, steps, n, parent_list, sel, draft_tokens, seq_lens = tree_inputs(rng)
    mask, pos, ret = tree_buffers(bs, n, seq_lens, 1)
    spec_tree.sgl_build_tree_kernel_triton(
        parent_list, sel, seq_lens, mask, pos, ret[0], ret[1], ret[2], topk, steps, n, spec_tree.TreeMaskMode.QLEN_ONLY)
    bonus = torch.tensor([rng.randint(0, 49) for _ in range(bs)], dtype=torch.int64)
    candidates = torch.cat([bonus.unsqueeze(1), draft_tokens], dim=1)
    target = torch.empty((bs, n), dtype=torch.int64)
    for b in range(bs):
        for x in range(n):
            kids, c = [], int(ret[1, b, x])
            while c != -1:
                kids.append(c)
                c = int(ret[2, b, c])
            if kids and rng.random() < 0.6:
                target[b, x] = candidates[b, rng.choice(kids)]
            else:
                target[b, x] = rng.randint(0, 49)
    outs = []
    for fn in ("ours", "ref"):
        predict = torch.zeros(bs * n, dtype=torch.int32)
        accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
        accept_num = torch.full((bs,), -3, dtype=torch.int32)
        if fn == "ours":
            spec_tree.verify_tree_greedy_func(predict, accept_index, accept_num, candidates, ret[0], ret[1], ret[2],
                                              target, topk=topk)
        else:
            spec_tree.verify_tree_greedy_triton(predict, accept_index, accept_num, candidates, ret[0], ret[1],
                                                ret[2], target)
        outs.append((predict, accept_index, accept_num))
    for name, a, b in zip(("predicts", "accept_index", "accept_token_num"), outs[0], outs[1]):
        same(name, a, b)
    cov = COVERAGE.setdefault("verify_tree_greedy_cpu", {"accepted_histogram": {}, "trees_with_siblings": 0})
    for n_acc in outs[0][2].tolist():
        cov["accepted_histogram"][str(n_acc)] = cov["accepted_histogram"].get(str(n_acc), 0) + 1
    cov["trees_with_siblings"] += int((ret[2] != -1).any())


def check_fill_accept_out_cache_loc(rng: random.Random) -> None:
    from sglang.kernels.ops.speculative import eagle as eagle_ops

    bs, width = rng.randint(1, 5), rng.randint(1, 5)
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    for b in range(bs):
        k = rng.randint(1, width)
        accept_index[b, :k] = torch.tensor(sorted(rng.sample(range(b * 8, b * 8 + 8), k)), dtype=torch.int32)
    if rng.random() < 0.3:  # holes, not only a -1 tail
        accept_index.view(-1)[rng.randrange(bs * width)] = -1
    out_cache_loc = torch.tensor([rng.randint(0, 9999) for _ in range(bs * 8)], dtype=torch.int64)
    size = bs * width
    ours = torch.zeros(size, dtype=torch.int64)
    ref = ours.clone()
    eagle_ops.fill_accept_out_cache_loc_func(accept_index, out_cache_loc, ours, size)
    eagle_ops.fill_accept_out_cache_loc[(size,)](accept_index, out_cache_loc, ref, next_pow2(size))
    same("accept_out_cache_loc", ours, ref)


def check_fill_bonus_tokens(rng: random.Random) -> None:
    from sglang.kernels.ops.speculative import eagle as eagle_ops

    bs, stride = rng.randint(1, 6), rng.randint(1, 5)
    accept_tokens = torch.tensor([rng.randint(0, 999) for _ in range(bs * stride)], dtype=torch.int32)
    accept_lens = torch.tensor([rng.randint(1, stride) for _ in range(bs)], dtype=torch.int32)
    ours = torch.full((bs,), -1, dtype=torch.int32)
    ref = ours.clone()
    eagle_ops.fill_bonus_tokens_func(accept_tokens, accept_lens, ours, stride, bs)
    eagle_ops.fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, ref, stride)
    same("bonus_tokens", ours, ref)


def check_rotate_input_ids(rng: random.Random) -> None:
    from sglang.kernels.ops.speculative import multi_layer_eagle as mle

    bs = rng.randint(1, 5)
    lens = [rng.randint(0, 6) for _ in range(bs)]
    starts = [sum(lens[:b]) for b in range(bs)]
    total = sum(lens)
    ids = torch.tensor([rng.randint(0, 999) for _ in range(total)], dtype=torch.int64)
    new = torch.tensor([rng.randint(1000, 1999) for _ in range(bs)], dtype=torch.int64)
    use_select = rng.random() < 0.5
    select = None
    if use_select:
        select = torch.tensor([s + rng.randint(0, max(0, n - 1)) for s, n in zip(starts, lens)], dtype=torch.int64)
    start_t, lens_t = torch.tensor(starts, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64)
    ours, ref = ids.clone(), ids.clone()
    mle.rotate_input_ids(ours, start_t, lens_t, new, select)
    mle.rotate_input_ids_kernel[(bs,)](ref, start_t, lens_t, new, select, BLOCK_SIZE=4096 if use_select else 8)
    same("input_ids", ours, ref)


# -- attention and KV copy (re-derivations: no Triton twin of the CPU ops' layouts) -------------

def _kv_setup(rng: random.Random, bs: int, lens: list[int], hq: int = 4, hkv: int = 2, d: int = 8):
    g = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    slots = sum(lens) + 16
    k_buffer = torch.randn(slots, hkv, d, generator=g)
    v_buffer = torch.randn(slots, hkv, d, generator=g)
    perm = torch.randperm(slots, generator=g)
    pool_len = max(lens) + 4
    n_rows = bs + 2
    req_to_token = torch.zeros(n_rows, pool_len, dtype=torch.int32)
    rows = rng.sample(range(n_rows), bs)
    off = 0
    for b, length in enumerate(lens):
        req_to_token[rows[b], :length] = perm[off:off + length].to(torch.int32)
        off += length
    return g, k_buffer, v_buffer, req_to_token, torch.tensor(rows, dtype=torch.int64)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [H, D], k/v [L, Hkv, D] -> [H, D]: unmasked attention of one query over given keys."""
    rep = q.shape[0] // k.shape[1]
    kk = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [H, L, D]
    vv = v.repeat_interleave(rep, dim=1).transpose(0, 1)
    return F.scaled_dot_product_attention(q.unsqueeze(1), kk, vv, scale=scale).squeeze(1)


def check_extend_attention(rng: random.Random) -> None:
    """Per query, the reference gathers exactly the keys it may see (prefix, then the visible
    new tokens: causal, or the draft tree's ancestors) and runs unmasked SDPA over them."""
    import sgl_kernel
    from sglang.kernels.ops.speculative import spec_tree

    kind = rng.choice(["causal", "tree_qlen", "tree_full", "noncausal"])
    if kind.startswith("tree"):
        bs, topk, steps, n, parent_list, sel, _, _ = tree_inputs(rng)
        ext = [n] * bs
    else:
        bs = rng.randint(1, 3)
        ext = [rng.randint(1, 5) for _ in range(bs)]
    prefix = [rng.randint(0, 6) for _ in range(bs)]
    lens = [p + e for p, e in zip(prefix, ext)]
    g, k_buffer, v_buffer, req_to_token, rows = _kv_setup(rng, bs, lens)
    hq, hkv, d = 4, k_buffer.shape[1], k_buffer.shape[2]
    total = sum(ext)
    q = torch.randn(total, hq, d, generator=g)
    k_ext = torch.randn(total, hkv, d, generator=g)
    v_ext = torch.randn(total, hkv, d, generator=g)
    starts = [sum(ext[:b]) for b in range(bs)]
    visible = []  # per request: E x E bool over the new tokens
    tree_mask = None
    if kind.startswith("tree"):
        mode = spec_tree.TreeMaskMode.QLEN_ONLY if kind == "tree_qlen" else spec_tree.TreeMaskMode.FULL_MASK
        seq_t = torch.tensor(prefix, dtype=torch.int64)
        tree_mask, pos, ret = tree_buffers(bs, n, seq_t, int(mode))
        spec_tree.sgl_build_tree_kernel_triton(
            parent_list, sel, seq_t, tree_mask, pos, ret[0], ret[1], ret[2], topk, steps, n, mode)
        # ancestors from the first-child / next-sibling links, independently of the mask
        for b in range(bs):
            parent = {0: None}
            stack = [0]
            while stack:
                x = stack.pop()
                c = int(ret[1, b, x])
                while c != -1:
                    parent[c] = x
                    stack.append(c)
                    c = int(ret[2, b, c])
            m = torch.zeros(n, n, dtype=torch.bool)
            for x in range(n):
                y = x
                while y is not None and y in parent:
                    m[x, y] = True
                    y = parent[y]
            visible.append(m)
    else:
        for e in ext:
            visible.append(torch.tril(torch.ones(e, e, dtype=torch.bool)) if kind == "causal"
                           else torch.ones(e, e, dtype=torch.bool))
    o = torch.zeros(total, hq, d)
    scale = 0.3
    sgl_kernel.extend_attention_cpu(
        q, k_ext, v_ext, o, k_buffer, v_buffer, 1.0, 1.0, req_to_token, rows,
        torch.tensor(lens, dtype=torch.int64), torch.tensor(ext, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32), max(ext), scale, 0.0, False, 0, None, None,
        tree_mask, kind != "noncausal")
    for b in range(bs):
        r, p, e, st = int(rows[b]), prefix[b], ext[b], starts[b]
        kp = k_buffer[req_to_token[r, :p].long()]
        vp = v_buffer[req_to_token[r, :p].long()]
        for i in range(e):
            cols = visible[b][i].nonzero().flatten()
            ref = _sdpa(q[st + i], torch.cat([kp, k_ext[st + cols]]), torch.cat([vp, v_ext[st + cols]]), scale)
            close(f"{kind} request {b} query {i}", o[st + i], ref)


def check_decode_attention(rng: random.Random) -> None:
    import sgl_kernel

    bs = rng.randint(1, 4)
    lens = [rng.randint(1, 9) for _ in range(bs)]
    g, k_buffer, v_buffer, req_to_token, rows = _kv_setup(rng, bs, lens)
    hq, hkv, d = 4, k_buffer.shape[1], k_buffer.shape[2]
    q = torch.randn(bs, hq, d, generator=g)
    k_new = torch.randn(bs, hkv, d, generator=g)
    v_new = torch.randn(bs, hkv, d, generator=g)
    loc = torch.stack([req_to_token[int(rows[b]), lens[b] - 1] for b in range(bs)]).long()
    kb, vb = k_buffer.clone(), v_buffer.clone()
    o = torch.zeros(bs, hq, d)
    scale = 0.25
    sgl_kernel.decode_attention_cpu(
        q, kb, vb, 1.0, 1.0, o, k_new, v_new, loc, torch.zeros(bs, hq, 8, d + 1), req_to_token, rows,
        torch.tensor(lens, dtype=torch.int64), scale, 0.0, False, 0, None, None)
    expect_k, expect_v = k_buffer.clone(), v_buffer.clone()
    expect_k[loc], expect_v[loc] = k_new, v_new
    close("k_buffer after the in-kernel write", kb, expect_k, 0)
    close("v_buffer after the in-kernel write", vb, expect_v, 0)
    for b in range(bs):
        idx = req_to_token[int(rows[b]), :lens[b]].long()
        close(f"request {b}", o[b], _sdpa(q[b], expect_k[idx], expect_v[idx], scale))


def check_copy_all_layer_kv_cache(rng: random.Random) -> None:
    import sgl_kernel

    g = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    bufs = [torch.randn(20, rng.choice([2, 4]), 8, generator=g) for _ in range(rng.randint(1, 4))]
    n = rng.randint(1, 6)
    src = torch.tensor(rng.sample(range(20), n), dtype=torch.int64)
    tgt = torch.tensor(rng.sample(range(20), n), dtype=torch.int64)
    expect = [b.clone() for b in bufs]
    for e in expect:
        e[tgt] = e[src].clone()
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in bufs], dtype=torch.int64)
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for i, (b, e) in enumerate(zip(bufs, expect)):
        close(f"buffer {i}", b, e, 0)


CHECKS = {
    "assign_draft_cache_locs_contiguous_cpu": ("triton:kernels/ops/speculative/cache_locs.py:assign_draft_cache_locs_contiguous", check_assign_draft_cache_locs),
    "assign_extend_cache_locs_cpu": ("triton:kernels/ops/speculative/cache_locs.py:assign_extend_cache_locs", check_assign_extend_cache_locs),
    "assign_req_to_token_pool_cpu": ("triton:srt/mem_cache/allocation.py:assign_req_to_token_pool", check_assign_req_to_token_pool),
    "build_draft_decode_metadata_cpu": ("triton:kernels/ops/speculative/cache_locs.py:generate_draft_decode_kv_indices", check_build_draft_decode_metadata),
    "build_tree_kernel_efficient_cpu": ("triton:kernels/ops/speculative/spec_tree.py:sgl_build_tree_kernel_efficient_triton", check_build_tree),
    "verify_tree_greedy_cpu": ("triton:kernels/ops/speculative/spec_tree.py:verify_tree_greedy_kernel_triton", check_verify_tree_greedy),
    "fill_accept_out_cache_loc_cpu": ("triton:kernels/ops/speculative/eagle.py:fill_accept_out_cache_loc", check_fill_accept_out_cache_loc),
    "fill_bonus_tokens_cpu": ("triton:kernels/ops/speculative/eagle.py:fill_bonus_tokens", check_fill_bonus_tokens),
    "rotate_input_ids_cpu": ("triton:kernels/ops/speculative/multi_layer_eagle.py:rotate_input_ids_kernel", check_rotate_input_ids),
    "extend_attention_cpu": ("re-derivation: per-query SDPA over the visible keys", check_extend_attention),
    "decode_attention_cpu": ("re-derivation: buffer write + SDPA over the request's keys", check_decode_attention),
    "copy_all_layer_kv_cache_cpu": ("re-derivation: tensor index copy", check_copy_all_layer_kv_cache),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--only", default=None, help="comma-separated op names")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    rng = random.Random(a.seed)
    torch.manual_seed(a.seed)
    for op, (reference, fn) in CHECKS.items():
        if only and op not in only:
            continue
        record(op, reference, fn, a.rounds, rng)
    import sgl_kernel

    out = {
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "sglang_cpu_engine": os.environ.get("SGLANG_USE_CPU_ENGINE") == "1",
        "sgl_kernel_file": sgl_kernel.__file__,
        "ops": RESULTS,
        "coverage": COVERAGE,
    }
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
