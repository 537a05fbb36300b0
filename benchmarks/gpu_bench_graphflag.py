"""gpu_bench section graphflag: sglang.cuda_graph on every exported span vs what each step ran,
and whether every probed step was exported."""

from __future__ import annotations

import gpu_common as gc


def section_graphflag(rcv: gc.ReceiverProcess, loops: dict) -> dict:
    def phases_of(spans: list, tag: str) -> list:
        return [x for x in spans if x["name"] != "sglang.step" and
                x["attributes"].get("sgl_probe.target", "").endswith("Worker_%s.forward_batch_generation" % tag)]

    spans = rcv.spans_when(lambda got: all(len(phases_of(got, info["probe_tag"])) >= info["steps_run"]["probe"]
                                           for info in loops.values()))
    out = {}
    for name, info in loops.items():
        phases = phases_of(spans, info["probe_tag"])
        graph_true = sum(1 for x in phases if x["attributes"].get("sglang.cuda_graph") is True)
        expect_graph = name.startswith("graph")
        out[name] = {
            "phase_spans": len(phases), "steps_run_with_probe": info["steps_run"]["probe"],
            "phase_names": sorted({x["name"] for x in phases}),
            "cuda_graph_true": graph_true, "cuda_graph_false": len(phases) - graph_true,
            "flag_correct_on_every_span": (graph_true == len(phases)) if expect_graph else (graph_true == 0),
            "all_steps_exported": len(phases) == info["steps_run"]["probe"],
        }
    return out
