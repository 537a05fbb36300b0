"""``sgl-probe report``: read spans back (trace dirs, Jaeger JSON, Jaeger's query API) and turn a
whole run into a phase table, a speculative-decoding verdict, a cross-rank straggler view, and
files people can open without a collector (Jaeger JSON, Perfetto trace events, plots).

Kept free of imports: ``sgl-probe doctor`` must not pay for it. The report imports the core
(:mod:`sgl_probe.contract` for names, :mod:`sgl_probe.stats` for statistics, the warm-up rule and
the verdict); the core never imports the report. One job per module:

=================  ==============================================================
``model``          the span record every reader yields; input problems
``anyvalue``       OTLP/JSON attribute values (``AnyValue`` / ``KeyValue``) decoding
``otlp``           OTLP/JSON lines (``SGL_PROBE_TRACE_DIR`` files) and documents
``jaeger_in``      Jaeger ``/api/traces`` JSON, from a file or over HTTP
``sources``        SOURCE arguments -> one stream of spans (format sniffing)
``reading``        sources -> an aggregator (one process, or ``parallel`` for big inputs)
``fields``         the attributes the aggregation reads, from raw or decoded spans
``aggregate``      streaming aggregation: phases, warm-up, steps, ranks, spec cycles, env
``speculative``    verdict inputs from aggregates (medians, batch-size matching, what-ifs)
``stragglers``     same step, ranks side by side
``diff``           what differs between two runs (env, fingerprint)
``keep``           the first N traces, kept whole for the file writers
``document``       the report as one JSON-able dict
``text``           the terminal rendering
``jaeger_out``     Jaeger UI "JSON file" upload format
``perfetto``       Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing)
``plot``           matplotlib PNG (optional extra)
``command``        the CLI glue
=================  ==============================================================
"""
