"""The link's STEPS messages packed by the C extension (wire.PACKED): read back as the very rows
that were packed (types included), by the C reader and by wire.unpack_steps alike; what the layout
has no tag for is pickled as before; a message that does not parse is a ValueError, never a crash;
the pipeline packs with the C hot path and pickles with the Python one."""

from __future__ import annotations

import logging
import math
import pickle
import random

import pytest

from sgl_probe import config, wire
from sgl_probe.export import Pipeline
from sgl_probe.recorder import Recorder
from tests.hotpaths import c_module

STRINGS = ("decode", "DECODE", "ModelRunner.forward", "gpu_event", "graphs_disabled", "KeyError: 'x'", "",
           "ünïcödé ✓", "日本語", "a" * 300)


def _scalar(rnd: random.Random):
    return rnd.choice((
        None, True, False, 0, 1, -1, 16, 2**63 - 1, -(2**63), rnd.randrange(-(2**62), 2**62),
        1_700_000_000_000_000_000 + rnd.randrange(10**9), 0.0, -0.0, 1.5, rnd.random() * 1e6, math.inf, -math.inf,
        rnd.choice(STRINGS)))


def _rows(seed: int, n: int) -> list:
    """Rows in the drain's shape (a step's fields, its phases, each phase's fields) with values of
    every kind the layout has, in every position."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        phases = tuple(tuple(_scalar(rnd) for _ in range(14)) for _ in range(rnd.choice((0, 1, 1, 2, 3))))
        step = [_scalar(rnd) for _ in range(10)]
        step[0], step[8] = i, phases
        rows.append(tuple(step))
    return rows


def _same(a, b) -> bool:
    """Equal with the same types all the way down (True is not 1; nan equals nan; -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


@pytest.fixture
def hot():
    return c_module()


def test_packed_steps_read_back_as_the_rows_packed_by_either_reader(hot):
    for seed in range(20):
        rows = _rows(seed, random.Random(seed).randrange(0, 60))
        slow = [random.Random(seed + i).random() < 0.2 for i in range(len(rows))]
        data = hot.pack_steps(rows, slow)
        assert data[:4] == wire.PACKED
        for read in (hot.unpack_steps, wire.unpack_steps):
            got_rows, got_slow = read(data)
            assert got_slow == slow and all(type(f) is bool for f in got_slow)
            assert len(got_rows) == len(rows) and all(_same(a, b) for a, b in zip(got_rows, rows))
        # The exporter's decode sees what a pickled message of the same rows gives it.
        assert wire.decode(data)[0] == wire.STEPS
        kind, (p_rows, p_slow) = wire.decode(wire.encode(wire.STEPS, (rows, slow)))
        assert all(_same(a, b) for a, b in zip(wire.decode(data)[1][0], p_rows)) and p_slow == slow
    nan = [(0, math.nan, 1, None, None, None, 0.0, "cuda", (), None)]
    assert math.isnan(hot.unpack_steps(hot.pack_steps(nan, [False]))[0][0][1])


@pytest.mark.parametrize("odd", [2**63, -(2**63) - 1, [1], {"a": 1}, ((((1,),),),), 1 + 2j, "\ud800", bytearray(b"x")])
def test_what_the_layout_has_no_tag_for_is_pickled_as_before(hot, odd):
    rows = _rows(1, 5)
    rows[3] = rows[3][:4] + (odd,) + rows[3][5:]
    assert hot.pack_steps(rows, [False] * 5) is None
    (data, spans), = wire.encode_steps(rows, [False] * 5, hot.pack_steps)
    assert data[:1] == b"\x80"  # pickle's
    assert wire.decode(data) == (wire.STEPS, (rows, [False] * 5))
    assert spans == 5 + sum(len(r[8]) for r in rows)


def test_a_packer_that_fails_leaves_the_message_pickled():
    rows = _rows(5, 4)

    def broken(steps, slow):
        raise MemoryError("no room")

    (data, spans), = wire.encode_steps(rows, [False] * 4, broken)
    assert wire.decode(data) == (wire.STEPS, (rows, [False] * 4)) and data[:1] == b"\x80"


def test_kept_slow_flags_that_are_not_bools_are_pickled_and_mismatched_lists_refused(hot):
    rows = _rows(2, 3)
    assert hot.pack_steps(rows, [False, 1, True]) is None
    with pytest.raises(TypeError):
        hot.pack_steps(rows, [False])
    with pytest.raises(TypeError):
        hot.pack_steps(tuple(rows), [False] * 3)


def test_a_message_that_does_not_parse_is_a_value_error_for_both_readers(hot):
    rows = _rows(3, 12)
    data = hot.pack_steps(rows, [False] * 12)
    for bad in [data[:k] for k in range(len(data))] + [data + b"\x00"]:  # short or long: never parses
        for read in (hot.unpack_steps, wire.unpack_steps):
            with pytest.raises(ValueError):
                read(bad)
    rnd = random.Random(0)
    broken = []
    for _ in range(300):
        b = bytearray(data)
        b[rnd.randrange(4, len(b))] = rnd.randrange(256)
        broken.append(bytes(b))
    for bad in broken:
        for read in (hot.unpack_steps, wire.unpack_steps):
            try:
                got = read(bad)
            except ValueError:
                continue
            # A flipped byte inside a value can still parse (another number, another flag): then it
            # is a message of the same shape.
            assert len(got[0]) == len(got[1]) == 12, read


def test_encode_steps_packs_splits_under_the_message_limit_and_counts_spans(hot):
    many = [(i, 0, 1, "DECODE", 8, 8, 0.1, "cuda",
             tuple(("verify", i, i + 1, True, "TARGET_VERIFY", 8, 32, 0.2, "t", 2.5, "gpu_event", None, None, 0.1)
                   for _ in range(40)), None) for i in range(300)]
    slow = [i % 7 == 0 for i in range(300)]
    msgs = wire.encode_steps(many, slow, hot.pack_steps)
    assert len(msgs) > 300 // wire.CHUNK_STEPS + 1  # split below the limit
    got_rows, got_slow = [], []
    for data, spans in msgs:
        assert data[:4] == wire.PACKED and len(data) <= wire.MAX_MESSAGE
        kind, (r, s) = wire.decode(data)
        assert spans == len(r) * 41
        got_rows += r
        got_slow += s
    assert got_rows == many and got_slow == slow


def test_the_pipeline_packs_with_the_c_hot_path_and_pickles_with_the_python_one(hot, tmp_path, monkeypatch):
    monkeypatch.setenv("SGL_PROBE_TRACE_DIR", str(tmp_path))
    cfg = config.load()
    log = logging.getLogger("sgl_probe.test")
    for choice, pack in (("c", hot.pack_steps), ("python", None)):
        pipe = Pipeline(Recorder("cpu", 100, log, choice), cfg, "run", {"tp_rank": 0}, None)
        try:
            assert pipe.sink.pack is pack
        finally:
            pipe.sink.shutdown(1.0)


def test_a_pickled_message_still_decodes_as_it_did():
    rows = _rows(4, 3)
    data = pickle.dumps((wire.STEPS, (rows, [True, False, False])), protocol=pickle.HIGHEST_PROTOCOL)
    assert wire.decode(data) == (wire.STEPS, (rows, [True, False, False]))


@pytest.mark.parametrize("asked", [8 << 10, 16 << 10, 4 << 20])
def test_a_links_largest_message_goes_through_its_socket_in_one_piece(monkeypatch, asked):
    """``wire.max_message``: what the kernel granted the link (whatever ``pair`` asked for, capped by
    the host), never above MAX_MESSAGE; a message of that size is taken whole, and one of twice the
    send buffer the kernel reports is refused as too large (what the limit keeps the drain from)."""
    import socket

    monkeypatch.setattr(wire, "_BUFFER", asked)
    ours, theirs = wire.pair()
    try:
        limit = wire.max_message(ours)
        granted = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert 1024 <= limit <= wire.MAX_MESSAGE and limit <= granted // 2
        ours.send(b"x" * limit)
        assert len(theirs.recv(1 << 20)) == limit
        with pytest.raises(OSError):
            ours.send(b"x" * (2 * granted))
    finally:
        ours.close()
        theirs.close()
