/* The hot path in C: the per-step wrappers, their two records and the CUDA timer's start / stop.

Why C: between two scheduler steps SGLang issues hundreds of kernel launches that evict the
probe's code and data from the CPU caches, so what a step costs the probe is roughly its number of
interpreted Python operations times a cache-cold miss. On the H200 host the Python versions of
these functions cost ~34 us per step of interpreter work around ~13 us of driver calls (the tiny
launch-bound server, BENCHMARKS.md); the same logic in C is a few hundred instructions.

Each function here is the exact counterpart of the Python code it stands for (named in its
comment), which stays the fallback (SGL_PROBE_HOTPATH=python, or a platform where this did not
build); the tests run both and compare their records field by field. The rules are the Python
ones: SGLang's call runs exactly once with its own arguments and its exceptions propagate
unchanged; an Exception inside the probe's own work goes to ``hook.fail(exc)`` (one log line, the
hook switched off); a BaseException that is not an Exception propagates, as in Python.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <time.h>

static PyObject *s__capturing, *s__stream_key, *s__raw_stream, *s__streams, *s__pool, *s__record, *s__anchors;
static PyObject *s_is_verify;
static PyObject *s_cuda_stream, *s_cuda_event, *s__bad_anchor, *s__chain, *s__returned, *s__offset,
    *s__ANCHOR_TOLERANCE_NS, *s_popleft, *s_appendleft, *s_t_start, *s_t_end, *s_cuda, *s_cpu, *s_host,
    *s__with_start_event;
static PyObject *s_torch, *s_Tensor, *s__C, *s_TensorBase;
static PyObject *s_forward_mode, *s_seq_lens, *s_shape, *s_step, *s_decode, *s_DECODE, *s_graph_hook, *s_launch_ns;
static PyObject *s_perf_counter_ns, *s_cur, *s_enabled, *s_timer, *s_step_count, *s_max_pending, *s_fail, *s_ensure_timer,
    *s_drop, *s_start, *s_stop, *s_close_phase, *s_can_run_cuda_graph, *s_verify, *s_anchor_due, *s_anchor_busy, *s_last_end,
    *s__fresh, *s__ANCHOR_EVERY_NS, *s__ANCHOR_RETRY_NS, *s__GPU_RUN, *s_refresh_anchor, *s_lookup_stream, *s_pop,
    *s_first_anchor, *s_append;
static PyObject *s__c, *s_phases, *s_host1, *s_accept_length, *s_error, *s_phase;
static PyObject *s_data, *s_bounds, *s_add;
static PyObject *int_one, *int_minus_one;
static PyObject *perf_counter_ns;

#include "_sampling.h"

/* Section times, a benchmark-only build (``CC="cc -DSGL_PROBE_SECTION_TIMES"``; the GPU builder's
   ``--section-times``): where the wrappers' own time goes inside a real server, caches as they are
   there, which no timing layer around them can split; and the drain thread's C parts (``drain_*``:
   the ready checks; where the reads release the GIL, the reads ahead: collecting them with it,
   reading without it, getting it back; then per step its pop, its row with its reads where they
   keep the GIL, its events' release; the summary; the packed pass's metrics). ``start_anchor``
   is the part of ``phase_start`` that refreshes the CUDA timer's anchor (refresh_anchor_runtime, or
   Python's where that does not apply), ``start_lead`` the part that records a timed step's start
   event where the step before went untimed (start_event).
   A normal build compiles none of it. */
#ifdef SGL_PROBE_SECTION_TIMES
#define SECTIONS(X)                                                                                            \
    X(step_enter) X(step_read) X(step_exit) X(phase_enter) X(phase_read) X(phase_start) X(phase_exit)        \
    X(start_anchor) X(start_lead) X(stop_stream) X(stop_capture) X(stop_event) X(stop_record) X(stop_tail) X(mark)          \
    X(drain_ready) X(drain_collect) X(drain_reads) X(drain_regain) X(drain_pop) X(drain_resolve)               \
    X(drain_release) X(drain_summary) X(drain_metrics)
#define SECTION_ID(name) SEC_##name,
enum { SECTIONS(SECTION_ID) SEC_N };
#define SECTION_NAME(name) #name,
static const char *section_names[] = {SECTIONS(SECTION_NAME)};
static unsigned long long section_ns[SEC_N], section_calls[SEC_N];

static inline unsigned long long
section_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}
#define SECTION_T0(var) unsigned long long var = section_clock()
#define SECTION_RESTART(var) (var = section_clock())
#define SECTION_ADD(name, var)                                                                                 \
    do {                                                                                                       \
        unsigned long long t_ = section_clock();                                                               \
        section_ns[SEC_##name] += t_ - (var);                                                                  \
        section_calls[SEC_##name]++;                                                                           \
        (var) = t_;                                                                                            \
    } while (0)

/* {name: (ns, calls)} since the module was loaded. */
static PyObject *
hot_section_times(PyObject *mod, PyObject *unused)
{
    PyObject *out = PyDict_New();
    for (int i = 0; out != NULL && i < SEC_N; i++) {
        PyObject *v = Py_BuildValue("(KK)", section_ns[i], section_calls[i]);
        if (v == NULL || PyDict_SetItemString(out, section_names[i], v) < 0)
            Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}
#else
#define SECTION_T0(var)
#define SECTION_RESTART(var)
#define SECTION_ADD(name, var)
#endif

/* The lines each wrapper touched the last time it ran, fetched together when it runs again. Between
   two scheduler steps SGLang's own work evicts the probe's objects, and a wrapper reads them as a
   chain (the hook, the thread's list, the recorder's slots, the timer's C half, its pool, ...), one
   cache miss after another; most of them are the same objects step after step. Each wrapper notes
   the addresses it goes through (``warm_note``) and asks for them all at its next entry
   (``warm_issue``), so the misses overlap instead of queueing. A prefetch never faults, so a note
   that is stale by then (an object freed since) costs one wasted fetch, nothing else. Under the
   GIL, as every wrapper. */
enum { WARM_STEP_IN, WARM_STEP_OUT, WARM_PHASE_IN, WARM_PHASE_OUT, WARM_MARK, WARM_N };
#define WARM_MAX 32
static const void *warm_at[WARM_N][WARM_MAX];
static int warm_n[WARM_N];

/* One line fetched for writing: nearly every object the wrappers and the drain touch has its count
   changed (their references, the drain's release). */
static inline void
pf(const void *p)
{
    __builtin_prefetch(p, 1, 3);
}

static inline void
warm_issue(int w)
{
    const void *const *at = warm_at[w];
    for (int i = 0, n = warm_n[w]; i < n; i++)
        pf(at[i]);
    warm_n[w] = 0;
}

static inline void
warm_note(int w, const void *p)
{
    int n = warm_n[w];
    if (n < WARM_MAX) {
        warm_at[w][n] = p;
        warm_n[w] = n + 1;
    }
}

/* An object's first ``bytes`` bytes, a line each. */
static inline void
warm_note_span(int w, const void *p, size_t bytes)
{
    for (size_t off = 0; off < bytes; off += 64)
        warm_note(w, (const char *)p + off);
}

/* time.perf_counter_ns(): CLOCK_MONOTONIC on Linux (what CPython itself reads there). */
static PyObject *
clock_ns(void)
{
#if defined(__linux__)
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0)
        return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec);
#endif
    return PyObject_CallNoArgs(perf_counter_ns);
}

/* getattr(obj, name, default) without building the AttributeError where the type can say "absent"
   directly (as getattr() itself does): 1 found (*out a new reference), 0 absent, -1 error. */
static int
lookup_attr(PyObject *obj, PyObject *name, PyObject **out)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(obj, name, out);
#else
    return _PyObject_LookupAttr(obj, name, out);
#endif
}

/* getattr(obj, name, None) as a new reference; NULL only on an error other than AttributeError. */
static PyObject *
getattr_or_none(PyObject *obj, PyObject *name)
{
    PyObject *v;
    int found = lookup_attr(obj, name, &v);
    if (found < 0)
        return NULL;
    return found ? v : Py_NewRef(Py_None);
}

/* ---- the records (recorder.PhaseRecord / recorder.StepRecord) ------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *phase, *mode, *batch_size, *num_tokens, *host0, *host1, *t_start, *t_end, *graph, *graph_hook,
        *launch_ns, *no_graph_reason, *error, *accept_length, *target;
} PhaseRecordObject;

typedef struct {
    PyObject_HEAD
    PyObject *index, *mode, *batch_size, *num_tokens, *host0, *host1, *phases, *error;
} StepRecordObject;

#define N_PHASE_FIELDS 15
#define N_STEP_FIELDS 8
#define FIELDS(o) ((PyObject **)((char *)(o) + sizeof(PyObject)))

static PyTypeObject PhaseRecordType, StepRecordType;

static int
record_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_ssize_t n = Py_TYPE(self) == &PhaseRecordType ? N_PHASE_FIELDS : N_STEP_FIELDS;
    PyObject **f = FIELDS(self);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_VISIT(f[i]);
    return 0;
}

static int
record_clear(PyObject *self)
{
    Py_ssize_t n = Py_TYPE(self) == &PhaseRecordType ? N_PHASE_FIELDS : N_STEP_FIELDS;
    PyObject **f = FIELDS(self);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_CLEAR(f[i]);
    return 0;
}

/* Every type here: untrack, clear through its own tp_clear, free. */
static void
tracked_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_TYPE(self)->tp_clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* The garbage collector and the records. A record lives from its step to the drain pass that
   resolves it (about a second), so a tracked one survives the young collections, is scanned by
   each, and ends up in the oldest generation, where it counts toward the next full collection of
   the whole server's heap. The C wrappers' records hold only strings, numbers, None, bools, the
   timer's tokens and their phases (never a cycle), so they start untracked: the collector neither
   scans nor promotes them. One that is given anything else (an exception, whose traceback may
   lead back to it; any attribute set from Python to something other than an atom) is tracked
   from then on, its step and that step's phases list with it. Records made from Python
   (``PhaseRecord(...)``) are tracked as any object. */

/* What can never lead back to a record: None, a bool, an int, a float, a str (exact types). */
static inline int
is_atom(PyObject *v)
{
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) ||
           PyUnicode_CheckExact(v);
}

static inline void
gc_track(PyObject *o)
{
    if (o != NULL && PyObject_IS_GC(o) && !PyObject_GC_IsTracked(o))
        PyObject_GC_Track(o);
}

/* Free lists of the two records. Allocating a collector-aware object counts toward the next young
   collection until it is freed, tracked or not: a second's records waiting for the drain (~1,000
   on a launch-bound server) would start collections of their own, which promote SGLang's young
   objects toward the full collection. A record the drain is done with is kept here, its fields
   cleared, and the next step's record is made from it: in a steady run nothing is allocated. A
   step keeps its emptied phases list when nothing else holds it. Under the GIL, as every
   allocation. */
#define FREE_MAX 2048
static PyObject *free_records[2][FREE_MAX];
static int n_free[2];

static void
record_dealloc(PyObject *self)
{
    int kind = Py_IS_TYPE(self, &StepRecordType);
    PyObject_GC_UnTrack(self);
    PyObject *keep = NULL;
    if (kind) {
        /* The phases list, emptied, stays with the step where this step was its only holder. */
        StepRecordObject *st = (StepRecordObject *)self;
        if (st->phases != NULL && PyList_CheckExact(st->phases) && Py_REFCNT(st->phases) == 1 &&
            !PyObject_GC_IsTracked(st->phases)) {
            keep = st->phases;
            st->phases = NULL;
        }
    }
    record_clear(self);
    if (keep != NULL && PyList_SetSlice(keep, 0, PyList_GET_SIZE(keep), NULL) < 0) {
        PyErr_Clear();
        Py_CLEAR(keep);
    }
    if (n_free[kind] < FREE_MAX && (keep != NULL || !kind)) {
        if (kind)
            ((StepRecordObject *)self)->phases = keep;
        free_records[kind][n_free[kind]++] = self;
        return;
    }
    Py_XDECREF(keep);
    Py_TYPE(self)->tp_free(self);
}

/* A record from the free list (fields NULL, but a step's kept phases list) or a new one. */
static PyObject *
record_alloc(PyTypeObject *type)
{
    int kind = type == &StepRecordType;
    if (n_free[kind] > 0)
        return PyObject_Init(free_records[kind][--n_free[kind]], type);
    PyObject *o = PyObject_GC_New(PyObject, type);
    if (o != NULL)
        memset(FIELDS(o), 0, type->tp_basicsize - sizeof(PyObject));
    return o;
}

/* The four facts of a reader's result: a tuple of exactly four, as tuple unpacking demands. */
static int
unpack_facts(PyObject *facts, PyObject **out)
{
    if (!PyTuple_Check(facts) || PyTuple_GET_SIZE(facts) != 4) {
        PyErr_Format(PyExc_ValueError, "sgl-probe: a reader returned %.100s, not four facts",
                     Py_TYPE(facts)->tp_name);
        return -1;
    }
    for (int i = 0; i < 4; i++)
        out[i] = PyTuple_GET_ITEM(facts, i);
    return 0;
}

/* ``track``: 0 for the C wrappers' records (see is_atom). */
static PyObject *
phase_record_from(PyObject **fx, PyObject *target, PyObject *host0, PyObject *t_start, int track)
{
    PhaseRecordObject *ph = (PhaseRecordObject *)record_alloc(&PhaseRecordType);
    if (ph == NULL)
        return NULL;
    ph->phase = Py_NewRef(fx[0]);
    ph->mode = Py_NewRef(fx[1]);
    ph->batch_size = Py_NewRef(fx[2]);
    ph->num_tokens = Py_NewRef(fx[3]);
    ph->target = Py_NewRef(target);
    ph->host0 = Py_NewRef(host0);
    ph->host1 = Py_NewRef(host0);
    ph->t_start = Py_NewRef(t_start);
    ph->t_end = Py_NewRef(Py_None);
    ph->graph = Py_NewRef(Py_None);
    ph->graph_hook = Py_NewRef(Py_False);
    ph->launch_ns = PyLong_FromLong(0);
    ph->no_graph_reason = Py_NewRef(Py_None);
    ph->error = Py_NewRef(Py_None);
    ph->accept_length = Py_NewRef(Py_None);
    if (track)
        PyObject_GC_Track((PyObject *)ph);
    return (PyObject *)ph;
}

static PyObject *
phase_record_make(PyObject *facts, PyObject *target, PyObject *host0, PyObject *t_start)
{
    PyObject *fx[4];
    if (unpack_facts(facts, fx) < 0)
        return NULL;
    return phase_record_from(fx, target, host0, t_start, 1);
}

static PyObject *
step_record_from(PyObject *index, PyObject **fx, PyObject *host0, int track)
{
    StepRecordObject *st = (StepRecordObject *)record_alloc(&StepRecordType);
    if (st == NULL)
        return NULL;
    PyObject *phases = st->phases; /* an emptied list kept by the free list, or none */
    if (phases == NULL && (phases = PyList_New(0)) == NULL) {
        Py_DECREF(st);
        return NULL;
    }
    if (track)
        gc_track(phases);
    else
        PyObject_GC_UnTrack(phases);
    st->index = Py_NewRef(index);
    st->mode = Py_NewRef(fx[1]);
    st->batch_size = Py_NewRef(fx[2]);
    st->num_tokens = Py_NewRef(fx[3]);
    st->host0 = Py_NewRef(host0);
    st->host1 = Py_NewRef(host0);
    st->phases = phases;
    st->error = Py_NewRef(Py_None);
    if (track)
        PyObject_GC_Track((PyObject *)st);
    return (PyObject *)st;
}

static PyObject *
step_record_make(PyObject *index, PyObject *facts, PyObject *host0)
{
    PyObject *fx[4];
    if (unpack_facts(facts, fx) < 0)
        return NULL;
    return step_record_from(index, fx, host0, 1);
}

static PyObject *
phase_record_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"facts", "target", "host0", "t_start", NULL};
    PyObject *facts, *target, *host0, *t_start;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:PhaseRecord", kw, &facts, &target, &host0, &t_start))
        return NULL;
    return phase_record_make(facts, target, host0, t_start);
}

static PyObject *
step_record_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"index", "facts", "host0", NULL};
    PyObject *index, *facts, *host0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:StepRecord", kw, &index, &facts, &host0))
        return NULL;
    return step_record_make(index, facts, host0);
}

/* Tracked from now on (see is_atom), a step with its phases list. */
static void
record_track(PyObject *self)
{
    gc_track(self);
    if (Py_IS_TYPE(self, &StepRecordType))
        gc_track(((StepRecordObject *)self)->phases);
}

static int
record_setattro(PyObject *self, PyObject *name, PyObject *value)
{
    if (PyObject_GenericSetAttr(self, name, value) < 0)
        return -1;
    if (value != NULL && !is_atom(value))
        record_track(self);
    return 0;
}

#define PM(name) {#name, T_OBJECT_EX, offsetof(PhaseRecordObject, name), 0, NULL}
static PyMemberDef phase_members[] = {
    PM(phase), PM(mode), PM(batch_size), PM(num_tokens), PM(host0), PM(host1), PM(t_start), PM(t_end),
    PM(graph), PM(graph_hook), PM(launch_ns), PM(no_graph_reason), PM(error), PM(accept_length), PM(target),
    {NULL}};
#define SM(name) {#name, T_OBJECT_EX, offsetof(StepRecordObject, name), 0, NULL}
static PyMemberDef step_members[] = {
    SM(index), SM(mode), SM(batch_size), SM(num_tokens), SM(host0), SM(host1), SM(phases), SM(error), {NULL}};

static PyTypeObject PhaseRecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sgl_probe._hot.PhaseRecord",
    .tp_doc = "recorder.PhaseRecord, built in C by the C phase wrapper.",
    .tp_basicsize = sizeof(PhaseRecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = phase_record_new,
    .tp_dealloc = record_dealloc,
    .tp_traverse = record_traverse,
    .tp_clear = record_clear,
    .tp_members = phase_members,
    .tp_setattro = record_setattro,
};

static PyTypeObject StepRecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sgl_probe._hot.StepRecord",
    .tp_doc = "recorder.StepRecord, built in C by the C step wrapper.",
    .tp_basicsize = sizeof(StepRecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = step_record_new,
    .tp_dealloc = record_dealloc,
    .tp_traverse = record_traverse,
    .tp_clear = record_clear,
    .tp_members = step_members,
    .tp_setattro = record_setattro,
};

/* A record's attribute: the C record's field directly, a Python record's (the two paths may mix)
   through getattr (new reference). */
static PyObject *
record_get(PyObject *obj, PyTypeObject *type, Py_ssize_t offset, PyObject *name)
{
    if (!Py_IS_TYPE(obj, type))
        return PyObject_GetAttr(obj, name);
    PyObject *v = *(PyObject **)((char *)obj + offset);
    if (v == NULL)
        PyErr_SetObject(PyExc_AttributeError, name);
    return Py_XNewRef(v);
}

#define STEP_GET(st, field) record_get((st), &StepRecordType, offsetof(StepRecordObject, field), s_##field)
#define PHASE_GET(ph, field) record_get((ph), &PhaseRecordType, offsetof(PhaseRecordObject, field), s_##field)

/* ---- the wrappers (Recorder.step_method / Recorder.phase_method) --------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *rec, *tls, *spec, *hook, *target, *read, *orig;
    PyObject *clock_from;   /* the namespace whose ``perf_counter_ns`` the Python version reads */
    PyObject *queue_append; /* step: rec.steps.append; phase: rec.awaiting_accept.append */
    PyObject *queue;        /* step: rec.steps */
    PyObject *name, *leave, *why; /* phase only */
    PyObject *mode_names, *phase_of; /* readers._MODE_NAMES / readers._PHASE_OF, for the C readers */
    /* The last (member, name) entry of mode_names the C reader used: SGLang passes the same
       ForwardMode member step after step, and this skips an int's allocation and a dict look-up.
       Held, so the member (the entry's first item) stays alive and its address means it; None
       before the first. */
    PyObject *mode_seen;
    /* The recorder's timer last seen by timer_call and its C half (a CudaFast), held; None before
       the first, or for a timer without one. */
    PyObject *timer_seen, *fast_seen;
    /* torch.Tensor, held, where its base torch._C.TensorBase has a C length (tensor_rows); None
       otherwise or before the first read. */
    PyObject *tensor_type;
    lenfunc tensor_len;
    int tensor_checked;
    int leave_attr;
    /* Where ``hook.enabled`` lives when the hook's class keeps it in a slot (instrument.Hook's
       ``__slots__``): read there directly instead of through the attribute machinery (the type's
       look-up and the instance's, a few cache-cold lines on every wrapped call); -1 otherwise. */
    Py_ssize_t enabled_offset;
    /* The same for the recorder's ``timer``, ``step_count`` and ``max_pending`` (Recorder's
       ``__slots__``): read (and the count written) on every step. */
    Py_ssize_t timer_offset, count_offset, max_pending_offset;
    /* This hook's entry in the watched clock namespaces (now_ns), or -1. */
    int clock_slot;
    int fast_read; /* FAST_STEP / FAST_FORWARD: the reader's common case in C (see read_fast) */
    int mark;      /* MarkHook: MARK_GRAPH or MARK_LAUNCH */
} HookObject;

#define N_HOOK_OBJS 20
enum { FAST_NONE = 0, FAST_STEP = 1, FAST_FORWARD = 2 };
enum { MARK_GRAPH = 1, MARK_LAUNCH = 2 };
#define HOOK_OBJS(h) (&(h)->dict)

static int
hook_traverse(HookObject *h, visitproc visit, void *arg)
{
    PyObject **f = HOOK_OBJS(h);
    for (int i = 0; i < N_HOOK_OBJS; i++)
        Py_VISIT(f[i]);
    return 0;
}

static int
hook_clear(HookObject *h)
{
    PyObject **f = HOOK_OBJS(h);
    for (int i = 0; i < N_HOOK_OBJS; i++)
        Py_CLEAR(f[i]);
    return 0;
}

/* As a function in a class: bound to an instance, itself when read from the class. */
static PyObject *
hook_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* Dicts an answer was read from, kept until the dict changes (CPython 3.12+ can watch a dict): the
   clock namespaces (the recorder module's globals, which tests patch) whose ``perf_counter_ns`` was
   seen to be time.perf_counter_ns, so a clock read does not look the name up in a cache-cold module
   dict each time; the CUDA timers' instance dicts seen to hold their C half's own start and stop
   (timer_call). Any change to a watched dict (a patched clock, a replaced method, any attribute set)
   sets its slot's answer to WATCH_CHANGED, and the next read looks again. Slots are borrowed: a
   dict's deallocation clears its own, a timer's C half gives its own back when it goes. */
#define WATCH_SLOTS 16
enum { WATCH_CHANGED = 0 };
#if PY_VERSION_HEX >= 0x030C0000
#define DICT_WATCH 1
static int dict_watcher = -1;
static PyObject *watched_dicts[WATCH_SLOTS];
static int watched_answer[WATCH_SLOTS]; /* WATCH_CHANGED, or what its user last found there */

static int
watched_dict_changed(PyDict_WatchEvent event, PyObject *dict, PyObject *key, PyObject *new_value)
{
    (void)key;
    (void)new_value;
    for (int i = 0; i < WATCH_SLOTS; i++)
        if (watched_dicts[i] == dict) {
            watched_answer[i] = WATCH_CHANGED;
            if (event == PyDict_EVENT_DEALLOCATED)
                watched_dicts[i] = NULL;
        }
    return 0;
}

/* The slot watching ``dict``: the one that does already, else a free one (the dict watched from
   now on, its answer WATCH_CHANGED); -1 where none is free or CPython refused the watch. */
static int
watch_slot(PyObject *dict)
{
    for (int i = 0; i < WATCH_SLOTS; i++)
        if (watched_dicts[i] == dict)
            return i;
    for (int i = 0; i < WATCH_SLOTS; i++)
        if (watched_dicts[i] == NULL) {
            if (PyDict_Watch(dict_watcher, dict) < 0) {
                PyErr_Clear();
                return -1;
            }
            watched_dicts[i] = dict;
            watched_answer[i] = WATCH_CHANGED;
            return i;
        }
    return -1;
}

/* h's namespace holds time.perf_counter_ns: remember it (watching the dict from now on). */
static void
clock_seen_default(HookObject *h)
{
    if (dict_watcher < 0)
        return;
    int slot = h->clock_slot;
    if (slot < 0 || watched_dicts[slot] != h->clock_from) {
        slot = watch_slot(h->clock_from);
        if (slot < 0)
            return; /* all taken: this namespace is looked up every time, as before */
        h->clock_slot = slot;
    }
    watched_answer[slot] = 1; /* holds time.perf_counter_ns */
}
#endif

/* The clock the Python version reads (its module's ``perf_counter_ns``, which tests replace): the
   C clock itself while that is time.perf_counter_ns. */
static PyObject *
now_ns(HookObject *h)
{
#ifdef DICT_WATCH
    if (h->clock_slot >= 0 && watched_answer[h->clock_slot] && watched_dicts[h->clock_slot] == h->clock_from)
        return clock_ns();
#endif
    PyObject *fn = PyDict_GetItemWithError(h->clock_from, s_perf_counter_ns);
    if (fn == perf_counter_ns) {
#ifdef DICT_WATCH
        clock_seen_default(h);
#endif
        return clock_ns();
    }
    if (fn == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_NameError, "perf_counter_ns");
        return NULL;
    }
    return PyObject_CallNoArgs(fn);
}

/* The exception being raised, taken off and normalized, its traceback attached (as ``except E as
   exc`` sees it); PyErr_Restore puts it back. */
static void
fetch_exception(PyObject **type, PyObject **value, PyObject **tb)
{
    PyErr_Fetch(type, value, tb);
    PyErr_NormalizeException(type, value, tb);
    if (*tb != NULL && *value != NULL)
        PyException_SetTraceback(*value, *tb);
}

/* The probe's own work raised. An Exception goes to hook.fail (0: carry on without the probe); a
   BaseException that is not one (KeyboardInterrupt, SystemExit) stays set (-1: propagate), as the
   Python versions' ``except Exception`` do. */
static int
probe_failed(HookObject *h)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *tb;
    fetch_exception(&type, &value, &tb);
    PyObject *r = PyObject_CallMethodOneArg(h->hook, s_fail, value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The last thread state read on this OS thread and its ``cur`` list. A thread's ``cur`` is one
   list for the life of its thread state (recorder._ThreadState; a fork's reset empties it in
   place), and reading it through the ``threading.local`` costs several cache-cold dict look-ups on
   every wrapped call; this costs a pointer compare. Both are held (strong references), so the
   thread state's address cannot be reused by another object while it is remembered. */
static _Thread_local PyObject *tls_seen, *cur_seen;

/* The thread's [open step, open phase] list (recorder._ThreadState.cur). */
static PyObject *
thread_cur(HookObject *h)
{
    if (h->tls == tls_seen)
        return Py_NewRef(cur_seen);
    PyObject *cur = PyObject_GetAttr(h->tls, s_cur);
    if (cur != NULL && (!PyList_CheckExact(cur) || PyList_GET_SIZE(cur) != 2)) {
        Py_DECREF(cur);
        PyErr_SetString(PyExc_TypeError, "sgl-probe: the thread state is not a [step, phase] list");
        return NULL;
    }
    if (cur != NULL) {
        Py_XSETREF(cur_seen, Py_NewRef(cur));
        Py_XSETREF(tls_seen, Py_NewRef(h->tls));
    }
    return cur;
}

static void
cur_set(PyObject *cur, Py_ssize_t i, PyObject *v)
{
    PyObject *old = PyList_GET_ITEM(cur, i);
    PyList_SET_ITEM(cur, i, Py_NewRef(v));
    Py_XDECREF(old);
}

/* The offset of attribute ``name`` in ``obj`` where its class keeps it in a plain object slot
   (``__slots__``), else -1 (the attribute machinery reads it, as for any other object). */
static Py_ssize_t
slot_offset(PyObject *obj, PyObject *name)
{
    PyObject *d = PyObject_GetAttr((PyObject *)Py_TYPE(obj), name);
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && m->offset > 0 && !(m->flags & READONLY)
            && PyObject_TypeCheck(obj, PyDescr_TYPE(d)))
            off = m->offset;
    }
    Py_DECREF(d);
    return off;
}

/* ``obj.<name>`` (new reference), from its slot where ``off`` is one (slot_offset). */
static inline PyObject *
attr_at(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + off);
        if (v != NULL)
            return Py_NewRef(v);
        /* unset: the attribute machinery raises the AttributeError Python would */
    }
    return PyObject_GetAttr(obj, name);
}

/* ``obj.<name> = v``, into its slot where ``off`` is one. */
static inline int
attr_set_at(PyObject *obj, Py_ssize_t off, PyObject *name, PyObject *v)
{
    if (off >= 0) {
        Py_XSETREF(*(PyObject **)((char *)obj + off), Py_NewRef(v));
        return 0;
    }
    return PyObject_SetAttr(obj, name, v);
}

static int
hook_enabled(HookObject *h)
{
    if (h->enabled_offset >= 0) {
        PyObject *v = *(PyObject **)((char *)h->hook + h->enabled_offset);
        if (v == Py_True)
            return 1;
        if (v == Py_False)
            return 0;
        if (v != NULL)
            return PyObject_IsTrue(v);
        /* unset: the attribute machinery raises the AttributeError Python would */
    }
    PyObject *v = PyObject_GetAttr(h->hook, s_enabled);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* The lines every wrapper goes through: the hook, the thread's [step, phase] list, the hook's
   ``enabled`` slot, the recorder's slots, the clock's watched namespace. */
static void
warm_note_hook(int w, HookObject *h, PyObject *cur)
{
    warm_note_span(w, h, sizeof(HookObject));
    warm_note(w, &tls_seen);
    warm_note(w, cur);
    warm_note(w, ((PyListObject *)cur)->ob_item);
    if (h->enabled_offset >= 0)
        warm_note(w, (char *)h->hook + h->enabled_offset);
    if (h->timer_offset >= 0)
        warm_note(w, (char *)h->rec + h->timer_offset);
    if (h->count_offset >= 0)
        warm_note(w, (char *)h->rec + h->count_offset);
#ifdef DICT_WATCH
    if (h->clock_slot >= 0) {
        warm_note(w, &watched_dicts[h->clock_slot]);
        warm_note(w, &watched_answer[h->clock_slot]);
    }
#endif
}

/* read(target, args, kwargs, spec) with the call's arguments after self. */
static PyObject *
call_reader(HookObject *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *tuple = PyTuple_New(nargs > 1 ? nargs - 1 : 0);
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 1; i < nargs; i++)
        PyTuple_SET_ITEM(tuple, i - 1, Py_NewRef(args[i]));
    PyObject *kwargs = PyDict_New();
    if (kwargs == NULL) {
        Py_DECREF(tuple);
        return NULL;
    }
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                Py_DECREF(tuple);
                Py_DECREF(kwargs);
                return NULL;
            }
        }
    }
    PyObject *call[4] = {h->target, tuple, kwargs, h->spec};
    PyObject *facts = PyObject_Vectorcall(h->read, call, 4, NULL);
    Py_DECREF(tuple);
    Py_DECREF(kwargs);
    return facts;
}


/* ``getattr(obj, name)`` where it exists (new reference); NULL with no error set where it does not. */
static PyObject *
getattr_maybe(PyObject *obj, PyObject *name)
{
    PyObject *v = NULL;
    lookup_attr(obj, name, &v);
    return v;
}

/* The first dimension of SGLang's sequence lengths where they are a plain torch.Tensor, from
   torch._C.TensorBase's own C length: ``seq_lens.shape`` builds a torch.Size (freed at once) on
   every call, and torch.Tensor's own __len__ is Python code. The base's length is the shape's first
   item for a tensor of one or more dimensions (0 for a 0-d one, which, as an empty batch, takes the
   shape's way); a subclass may answer otherwise and takes it too. Which type is torch.Tensor is
   settled at the hook's first read, from the torch this process has imported (none: never).
   > 0: the rows; 0: ask the shape; -1: the probe's own BaseException (a KeyboardInterrupt), which
   propagates as everywhere in the wrappers. An Exception on the way means the shape's way. */
static Py_ssize_t
tensor_rows(HookObject *h, PyObject *seq)
{
    if (!h->tensor_checked) {
        h->tensor_checked = 1;
        PyObject *torch = PyImport_GetModule(s_torch), *tensor = NULL, *c = NULL, *base = NULL;
        if (torch != NULL && (tensor = getattr_maybe(torch, s_Tensor)) != NULL && (c = getattr_maybe(torch, s__C)) != NULL)
            base = getattr_maybe(c, s_TensorBase);
        int interrupted = PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception);
        if (!interrupted) {
            PyErr_Clear();
            if (tensor != NULL && base != NULL && PyType_Check(tensor) && PyType_Check(base) &&
                ((PyTypeObject *)tensor)->tp_base == (PyTypeObject *)base &&
                ((PyTypeObject *)base)->tp_as_mapping != NULL && ((PyTypeObject *)base)->tp_as_mapping->mp_length != NULL) {
                h->tensor_len = ((PyTypeObject *)base)->tp_as_mapping->mp_length;
                Py_SETREF(h->tensor_type, Py_NewRef(tensor));
            }
        }
        Py_XDECREF(torch);
        Py_XDECREF(tensor);
        Py_XDECREF(c);
        Py_XDECREF(base);
        if (interrupted)
            return -1;
    }
    if (h->tensor_len == NULL || (PyObject *)Py_TYPE(seq) != h->tensor_type)
        return 0;
    Py_ssize_t n = h->tensor_len(seq);
    if (n < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear(); /* the shape's way says what it says */
        return 0;
    }
    return n;
}

/* readers.step / readers.forward for what SGLang passes on every decode step: the batch first, a
   ForwardMode member the Python reader has already named (readers._MODE_NAMES), sequence lengths
   with a ``shape``; and for ``forward`` a mode whose phase is known (readers._PHASE_OF)
   and is "decode" (or none); keywords other than is_verify. Fills out[4] with new references: 1. Anything else, 0 (no error
   set): the Python reader runs, as it did. -1: an error. */
static int
read_fast(HookObject *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    if (nargs < 2 || args[1] == Py_None)
        return 0;
    if (h->fast_read == FAST_FORWARD) {
        /* is_verify given (positionally or by name): the Python reader decides. Other keywords
           (SGLang passes pp_proxy_tensors=) change nothing the reader reads. */
        if (nargs > 4)
            return 0;
        Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++)
            if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), s_is_verify) == 0)
                return 0;
    }
    /* The attribute reads first (they may run Python code, another thread's reader filling the
       tables included); then the table look-ups, which run none, and new references at once. */
    PyObject *batch = args[1];
    PyObject *fm = getattr_maybe(batch, s_forward_mode);
    if (fm == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int w = h->fast_read == FAST_STEP ? WARM_STEP_IN : WARM_PHASE_IN;
    warm_note(w, Py_TYPE(batch)); /* the batch itself is a new one each step; its class is not */
    warm_note(w, fm);
    warm_note(w, h->mode_seen);
    PyObject *key = NULL;
    if (h->mode_seen == Py_None || PyTuple_GET_ITEM(h->mode_seen, 0) != fm) {
        key = PyLong_FromVoidPtr(fm);
        if (key == NULL) {
            Py_DECREF(fm);
            return -1;
        }
    }
    Py_DECREF(fm);
    PyObject *seq = getattr_maybe(batch, s_seq_lens);
    Py_ssize_t rows = seq == NULL ? 0 : tensor_rows(h, seq);
    PyObject *bs;
    if (rows < 0) {
        Py_DECREF(seq);
        Py_XDECREF(key);
        return -1;
    }
    if (rows > 0) {
        Py_DECREF(seq);
        bs = PyLong_FromSsize_t(rows);
        if (bs == NULL) {
            Py_XDECREF(key);
            return -1;
        }
    }
    else {
        PyObject *shape = seq == NULL ? NULL : getattr_maybe(seq, s_shape);
        Py_XDECREF(seq);
        if (shape == NULL || !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) == 0) {
            Py_XDECREF(key);
            Py_XDECREF(shape);
            return PyErr_Occurred() ? -1 : 0;
        }
        bs = Py_NewRef(PyTuple_GET_ITEM(shape, 0));
        Py_DECREF(shape);
    }
    PyObject *hit = h->mode_seen;
    if (key != NULL) {
        hit = PyDict_GetItemWithError(h->mode_names, key); /* (member, name) */
        Py_DECREF(key);
        if (hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 2 && PyTuple_GET_ITEM(hit, 0) == fm)
            Py_XSETREF(h->mode_seen, Py_NewRef(hit));
    }
    PyObject *mode = hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 2 ? PyTuple_GET_ITEM(hit, 1) : NULL;
    PyObject *phase = NULL;
    if (mode == NULL || !PyUnicode_Check(mode)) {
        phase = NULL;
    }
    else if (h->fast_read == FAST_STEP) {
        /* tokens = bs unless the mode is a prefill one (extend_tokens: the Python reader) */
        phase = PyUnicode_Compare(mode, s_DECODE) == 0 ? s_step : NULL;
    }
    else {
        phase = PyDict_GetItemWithError(h->phase_of, mode);
        if (phase != NULL && phase != Py_None && !(PyUnicode_Check(phase) && PyUnicode_Compare(phase, s_decode) == 0))
            phase = NULL;
    }
    if (phase == NULL) {
        Py_DECREF(bs);
        return PyErr_Occurred() ? -1 : 0;
    }
    out[0] = Py_NewRef(phase);
    out[1] = Py_NewRef(mode);
    out[2] = bs;
    out[3] = Py_NewRef(bs);
    return 1;
}

/* The four facts, from the C reader or the Python one (new references in out). */
static int
read_facts(HookObject *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    if (h->fast_read != FAST_NONE) {
        int got = read_fast(h, args, nargs, kwnames, out);
        if (got != 0)
            return got;
    }
    PyObject *facts = call_reader(h, args, nargs, kwnames);
    if (facts == NULL)
        return -1;
    PyObject *fx[4];
    if (unpack_facts(facts, fx) < 0) {
        Py_DECREF(facts);
        return -1;
    }
    for (int i = 0; i < 4; i++)
        out[i] = Py_NewRef(fx[i]);
    Py_DECREF(facts);
    return 1;
}

static void
facts_clear(PyObject **fx)
{
    for (int i = 0; i < 4; i++)
        Py_CLEAR(fx[i]);
}

/* The step wrapper's ``finally`` after SGLang's call: host1, then queue the step (or drop it). */
static int
step_finish(HookObject *h, StepRecordObject *st)
{
    PyObject *now = now_ns(h);
    if (now == NULL)
        return -1;
    Py_SETREF(st->host1, now);
    if (PyList_GET_SIZE(st->phases) == 0 && st->error == Py_None)
        return 0; /* nothing timed (e.g. an idle batch): not worth a span */
    /* A phase the Python wrappers made, or one holding an exception, may lead back to this step
       (a Python frame in its traceback): then the step is tracked too (see is_atom). */
    if (!PyObject_GC_IsTracked((PyObject *)st)) {
        for (Py_ssize_t i = 0, n = PyList_GET_SIZE(st->phases); i < n; i++) {
            PyObject *ph = PyList_GET_ITEM(st->phases, i);
            if (!Py_IS_TYPE(ph, &PhaseRecordType) || PyObject_GC_IsTracked(ph)) {
                record_track((PyObject *)st);
                break;
            }
        }
    }
    Py_ssize_t queued = PyObject_Size(h->queue);
    if (queued < 0)
        return -1;
    PyObject *maxp = attr_at(h->rec, h->max_pending_offset, s_max_pending);
    if (maxp == NULL)
        return -1;
    int room;
    Py_ssize_t limit = PyLong_CheckExact(maxp) ? PyLong_AsSsize_t(maxp) : -1;
    if (limit >= 0) {
        room = queued < limit;
    }
    else { /* not a plain int, or beyond Py_ssize_t: Python's comparison */
        PyErr_Clear();
        PyObject *n = PyLong_FromSsize_t(queued);
        room = n == NULL ? -1 : PyObject_RichCompareBool(n, maxp, Py_LT);
        Py_XDECREF(n);
    }
    Py_DECREF(maxp);
    if (room < 0)
        return -1;
    PyObject *r = room ? PyObject_CallOneArg(h->queue_append, (PyObject *)st)
                       : PyObject_CallMethodOneArg(h->rec, s_drop, (PyObject *)st);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *
step_call(HookObject *h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SECTION_T0(sec);
    warm_issue(WARM_STEP_IN);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *cur = thread_cur(h);
    if (cur == NULL)
        goto passthrough_failed;
    warm_note_hook(WARM_STEP_IN, h, cur);
    if (PyList_GET_ITEM(cur, 0) != Py_None)
        goto passthrough;
    int on = hook_enabled(h);
    if (on < 0)
        goto passthrough_failed;
    if (!on)
        goto passthrough;

    StepRecordObject *st = NULL;
    {
        PyObject *timer = attr_at(h->rec, h->timer_offset, s_timer);
        if (timer == NULL)
            goto probe_error;
        if (timer == Py_None) {
            Py_DECREF(timer);
            timer = PyObject_CallMethodNoArgs(h->rec, s_ensure_timer);
            if (timer == NULL)
                goto probe_error;
        }
        Py_DECREF(timer);
        PyObject *count = attr_at(h->rec, h->count_offset, s_step_count);
        if (count == NULL)
            goto probe_error;
        PyObject *index = PyNumber_Add(count, int_one);
        Py_DECREF(count);
        if (index == NULL)
            goto probe_error;
        warm_note(WARM_STEP_IN, index); /* the count read at the next step */
        if (attr_set_at(h->rec, h->count_offset, s_step_count, index) < 0) {
            Py_DECREF(index);
            goto probe_error;
        }
        PyObject *fx[4] = {NULL, NULL, NULL, NULL};
        SECTION_T0(sec_read);
        if (read_facts(h, args, nargs, kwnames, fx) < 0) {
            Py_DECREF(index);
            goto probe_error;
        }
        SECTION_ADD(step_read, sec_read);
        PyObject *now = now_ns(h);
        if (now != NULL)
            st = (StepRecordObject *)step_record_from(index, fx, now, 0);
        Py_XDECREF(now);
        Py_DECREF(index);
        facts_clear(fx);
        if (st == NULL)
            goto probe_error;
    }
    cur_set(cur, 0, (PyObject *)st);
    if (n_free[1] > 0) /* the next step's record, unless the drain frees others first */
        warm_note_span(WARM_STEP_IN, free_records[1][n_free[1] - 1], sizeof(StepRecordObject));
    SECTION_ADD(step_enter, sec);
    PyObject *result = PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    SECTION_RESTART(sec);
    warm_issue(WARM_STEP_OUT);
    warm_note_hook(WARM_STEP_OUT, h, cur);
    warm_note(WARM_STEP_OUT, h->queue);
    warm_note(WARM_STEP_OUT, h->queue_append);
    if (h->max_pending_offset >= 0)
        warm_note(WARM_STEP_OUT, (char *)h->rec + h->max_pending_offset);
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (result == NULL) {
        fetch_exception(&type, &value, &tb);
        if (value != NULL) {
            Py_SETREF(st->error, Py_NewRef(value));
            record_track((PyObject *)st);
        }
    }
    cur_set(cur, 0, Py_None);
    cur_set(cur, 1, Py_None);
    Py_DECREF(cur);
    if (step_finish(h, st) < 0 && probe_failed(h) < 0) {
        /* A BaseException of the probe's own: it replaces SGLang's result, as in Python. */
        Py_XDECREF(result);
        result = NULL;
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        type = value = tb = NULL;
    }
    else if (result == NULL) {
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(st);
    SECTION_ADD(step_exit, sec);
    return result;

probe_error:
    if (probe_failed(h) < 0) {
        Py_DECREF(cur);
        return NULL;
    }
passthrough:
    Py_DECREF(cur);
    return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
passthrough_failed:
    /* The thread state itself could not be read: the Python wrapper would fail before its try
       blocks too; here the hook is switched off and SGLang's call runs. */
    if (probe_failed(h) < 0)
        return NULL;
    return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
}

static PyObject *timer_call(HookObject *h, PyObject *name, PyObject *const *args, Py_ssize_t n);

/* After SGLang's phase call returned: stop the timer, keep the phase, read the graph flag and, for a
   phase without a graph, why. 1: done; 0: a graph was being captured (nothing recorded); -1: error. */
static int
phase_finish(HookObject *h, PyObject *self_obj, StepRecordObject *st, PhaseRecordObject *ph, PyObject *result)
{
    PyObject *now = now_ns(h);
    if (now == NULL)
        return -1;
    PyObject *stop_args[2] = {ph->t_start, now};
    PyObject *t_end = timer_call(h, s_stop, stop_args, 2);
    if (t_end == NULL) {
        Py_DECREF(now);
        return -1;
    }
    Py_SETREF(ph->t_end, t_end);
    if (t_end == Py_None) {
        Py_DECREF(now);
        return 0;
    }
    Py_SETREF(ph->host1, now);
    if (PyList_Append(st->phases, (PyObject *)ph) < 0)
        return -1;
    int ask_why;
    if (h->leave != Py_None) {
        PyObject *graph = h->leave_attr ? getattr_or_none(result, s_can_run_cuda_graph) : Py_NewRef(Py_None);
        if (graph == NULL)
            return -1;
        if (!PyBool_Check(graph)) {
            Py_DECREF(graph);
            graph = PyObject_CallOneArg(h->leave, result);
            if (graph == NULL)
                return -1;
        }
        Py_SETREF(ph->graph, graph);
        int truth = PyObject_IsTrue(graph);
        if (truth < 0)
            return -1;
        if (truth)
            ask_why = 0;
        else if (graph == Py_False)
            ask_why = 1;
        else if ((ask_why = PyObject_Not(ph->graph_hook)) < 0)
            return -1;
    }
    else if ((ask_why = PyObject_Not(ph->graph_hook)) < 0) {
        return -1;
    }
    if (ask_why) {
        PyObject *why_args[3] = {self_obj, ph->mode, ph->batch_size};
        PyObject *reason = PyObject_Vectorcall(h->why, why_args, 3, NULL);
        if (reason == NULL)
            return -1;
        Py_SETREF(ph->no_graph_reason, reason);
    }
    if (PyUnicode_Check(ph->phase) && PyUnicode_Compare(ph->phase, s_verify) == 0) {
        PyObject *r = PyObject_CallOneArg(h->queue_append, (PyObject *)ph);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 1;
}

static PyObject *
phase_call(HookObject *h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SECTION_T0(sec);
    warm_issue(WARM_PHASE_IN);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *cur = thread_cur(h);
    if (cur == NULL) {
        if (probe_failed(h) < 0)
            return NULL;
        return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    }
    warm_note_hook(WARM_PHASE_IN, h, cur);
    /* Outside a scheduler step (startup warmup, graph capture) or nested inside another phase
       (verify -> target forward): not a phase of its own. */
    StepRecordObject *st = (StepRecordObject *)PyList_GET_ITEM(cur, 0);
    int on = 0;
    if ((PyObject *)st == Py_None || PyList_GET_ITEM(cur, 1) != Py_None || (on = hook_enabled(h)) <= 0) {
        if (on < 0 && probe_failed(h) < 0) {
            Py_DECREF(cur);
            return NULL;
        }
        Py_DECREF(cur);
        return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    }
    Py_INCREF(st);
    PhaseRecordObject *ph = NULL;
    PyObject *fx[4] = {NULL, NULL, NULL, NULL};
    SECTION_T0(sec_part);
    if (read_facts(h, args, nargs, kwnames, fx) > 0) {
        SECTION_ADD(phase_read, sec_part);
        if (fx[0] != Py_None) {
            PyObject *now = now_ns(h);
            if (now != NULL) {
                /* (the step's index at its first phase: the CUDA timer decides per step) */
                PyObject *start_args[2] = {now, PyList_Check(st->phases) && PyList_GET_SIZE(st->phases) > 0
                                                    ? Py_None : st->index};
                PyObject *token = timer_call(h, s_start, start_args, 2);
                SECTION_ADD(phase_start, sec_part);
                if (token != NULL) {
                    ph = (PhaseRecordObject *)phase_record_from(fx, h->name, now, token, 0);
                    Py_DECREF(token);
                }
                Py_DECREF(now);
            }
        }
        facts_clear(fx);
    }
    if (ph == NULL && PyErr_Occurred() && probe_failed(h) < 0) {
        Py_DECREF(st);
        Py_DECREF(cur);
        return NULL;
    }
    if (ph == NULL) {
        Py_DECREF(st);
        Py_DECREF(cur);
        return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    }
    cur_set(cur, 1, (PyObject *)ph);
    if (n_free[0] > 0)
        warm_note_span(WARM_PHASE_IN, free_records[0][n_free[0] - 1], sizeof(PhaseRecordObject));
    SECTION_ADD(phase_enter, sec);
    PyObject *result = PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    SECTION_RESTART(sec);
    warm_issue(WARM_PHASE_OUT);
    warm_note_hook(WARM_PHASE_OUT, h, cur);
    warm_note(WARM_PHASE_OUT, st->phases);
    cur_set(cur, 1, Py_None);
    Py_DECREF(cur);
    if (result == NULL) {
        PyObject *type, *value, *tb;
        fetch_exception(&type, &value, &tb);
        PyObject *call_args[4] = {h->rec, (PyObject *)st, (PyObject *)ph, value ? value : Py_None};
        PyObject *r = PyObject_VectorcallMethod(s_close_phase, call_args, 4, NULL);
        int keep = 1;
        if (r == NULL)
            keep = probe_failed(h) == 0;
        Py_XDECREF(r);
        if (keep)
            PyErr_Restore(type, value, tb);
        else {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        Py_DECREF(st);
        Py_DECREF(ph);
        return NULL;
    }
    if (phase_finish(h, nargs > 0 ? args[0] : Py_None, st, ph, result) < 0 && probe_failed(h) < 0) {
        Py_CLEAR(result);
    }
    Py_DECREF(st);
    Py_DECREF(ph);
    SECTION_ADD(phase_exit, sec);
    return result;
}

/* Recorder.graph_method / launch_method: mark the open phase (a graph replayed; the host clock at
   its first graph launch), then SGLang's call. */
static PyObject *
mark_call(HookObject *h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SECTION_T0(sec);
    warm_issue(WARM_MARK);
    PyObject *cur = thread_cur(h);
    if (cur == NULL) {
        if (probe_failed(h) < 0)
            return NULL;
        return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    }
    warm_note_hook(WARM_MARK, h, cur);
    PyObject *ph = Py_NewRef(PyList_GET_ITEM(cur, 1));
    Py_DECREF(cur);
    if (ph != Py_None) {
        int err = 0;
        /* The C record's fields directly (a Python wrapper's record, where the two paths mix,
           through its attributes): no attribute look-up on a thread whose caches are cold. */
        PhaseRecordObject *pr = Py_IS_TYPE(ph, &PhaseRecordType) ? (PhaseRecordObject *)ph : NULL;
        if (h->mark == MARK_GRAPH) {
            if (pr != NULL)
                Py_XSETREF(pr->graph_hook, Py_NewRef(Py_True));
            else
                err = PyObject_SetAttr(ph, s_graph_hook, Py_True);
        }
        else {
            PyObject *seen = PHASE_GET(ph, launch_ns);
            int first = seen == NULL ? -1 : PyObject_Not(seen);
            Py_XDECREF(seen);
            int on = first > 0 ? hook_enabled(h) : first;
            if (on > 0) {
                PyObject *now = now_ns(h);
                if (now == NULL)
                    err = -1;
                else if (pr != NULL)
                    Py_XSETREF(pr->launch_ns, now);
                else {
                    err = PyObject_SetAttr(ph, s_launch_ns, now);
                    Py_DECREF(now);
                }
            }
            else if (on < 0) {
                err = -1;
            }
        }
        if (err < 0 && probe_failed(h) < 0) {
            Py_DECREF(ph);
            return NULL;
        }
    }
    Py_DECREF(ph);
    SECTION_ADD(mark, sec);
    return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
}

static PyObject *
hook_dict_get(PyObject *self, void *closure)
{
    return PyObject_GenericGetDict(self, closure);
}

/* ``sgl_probe_original``: the function the wrapper calls (what the Python wrappers keep in a closure
   cell); writable, so a profiler can put a timing layer between the two, as it can in a cell. */
static PyObject *
hook_original_get(HookObject *h, void *closure)
{
    return Py_NewRef(h->orig);
}

static int
hook_original_set(HookObject *h, PyObject *value, void *closure)
{
    if (value == NULL || !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "sgl_probe_original must be a callable");
        return -1;
    }
    Py_SETREF(h->orig, Py_NewRef(value));
    return 0;
}

static PyGetSetDef hook_getset[] = {
    {"sgl_probe_original", (getter)hook_original_get, (setter)hook_original_set, NULL, NULL},
    {"__dict__", hook_dict_get, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

/* A wrapper with the fields every kind has; the others None (the constructors fill in theirs).
   ``queue``: where the wrapper appends (its bound ``append`` is kept), or None. */
static HookObject *
hook_alloc(PyTypeObject *type, vectorcallfunc call, PyObject *tls, PyObject *hook, PyObject *orig, PyObject *clock_from,
           PyObject *rec, PyObject *spec, PyObject *target, PyObject *read, PyObject *queue)
{
    PyObject *append = queue == Py_None ? Py_NewRef(Py_None) : PyObject_GetAttr(queue, s_append);
    if (append == NULL)
        return NULL;
    HookObject *h = PyObject_GC_New(HookObject, type);
    if (h == NULL) {
        Py_DECREF(append);
        return NULL;
    }
    h->vectorcall = call;
    h->dict = NULL;
    PyObject **f = HOOK_OBJS(h);
    for (int i = 1; i < N_HOOK_OBJS; i++)
        f[i] = Py_NewRef(Py_None);
    Py_SETREF(h->tls, Py_NewRef(tls));
    Py_SETREF(h->hook, Py_NewRef(hook));
    Py_SETREF(h->orig, Py_NewRef(orig));
    Py_SETREF(h->clock_from, Py_NewRef(clock_from));
    Py_SETREF(h->rec, Py_NewRef(rec));
    Py_SETREF(h->spec, Py_NewRef(spec));
    Py_SETREF(h->target, Py_NewRef(target));
    Py_SETREF(h->read, Py_NewRef(read));
    Py_SETREF(h->queue, Py_NewRef(queue));
    Py_SETREF(h->queue_append, append);
    h->leave_attr = 0;
    h->fast_read = FAST_NONE;
    h->mark = 0;
    h->clock_slot = -1;
    h->tensor_len = NULL;
    h->tensor_checked = 0;
    h->enabled_offset = slot_offset(hook, s_enabled);
    h->timer_offset = slot_offset(rec, s_timer);
    h->count_offset = slot_offset(rec, s_step_count);
    h->max_pending_offset = slot_offset(rec, s_max_pending);
    return h;
}

static PyObject *
step_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"rec", "tls", "steps", "spec", "hook", "target", "read", "orig", "clock_from", "fast_read",
                         "mode_names", "phase_of", NULL};
    PyObject *rec, *tls, *steps, *spec, *hook, *target, *read, *orig, *clock_from, *mode_names, *phase_of;
    int fast_read;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOO!iO!O!:StepHook", kw, &rec, &tls, &steps, &spec, &hook,
                                     &target, &read, &orig, &PyDict_Type, &clock_from, &fast_read, &PyDict_Type,
                                     &mode_names, &PyDict_Type, &phase_of))
        return NULL;
    HookObject *h = hook_alloc(type, (vectorcallfunc)step_call, tls, hook, orig, clock_from, rec, spec, target, read,
                               steps);
    if (h == NULL)
        return NULL;
    Py_SETREF(h->mode_names, Py_NewRef(mode_names));
    Py_SETREF(h->phase_of, Py_NewRef(phase_of));
    h->fast_read = fast_read;
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

static PyObject *
phase_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"rec", "tls", "awaiting", "spec", "hook", "target", "name", "read", "leave", "leave_attr",
                         "why", "orig", "clock_from", "fast_read", "mode_names", "phase_of", NULL};
    PyObject *rec, *tls, *awaiting, *spec, *hook, *target, *name, *read, *leave, *why, *orig, *clock_from, *mode_names,
        *phase_of;
    int leave_attr, fast_read;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOOpOOO!iO!O!:PhaseHook", kw, &rec, &tls, &awaiting, &spec,
                                     &hook, &target, &name, &read, &leave, &leave_attr, &why, &orig, &PyDict_Type,
                                     &clock_from, &fast_read, &PyDict_Type, &mode_names, &PyDict_Type, &phase_of))
        return NULL;
    HookObject *h = hook_alloc(type, (vectorcallfunc)phase_call, tls, hook, orig, clock_from, rec, spec, target, read,
                               awaiting);
    if (h == NULL)
        return NULL;
    Py_SETREF(h->name, Py_NewRef(name));
    Py_SETREF(h->leave, Py_NewRef(leave));
    Py_SETREF(h->why, Py_NewRef(why));
    Py_SETREF(h->mode_names, Py_NewRef(mode_names));
    Py_SETREF(h->phase_of, Py_NewRef(phase_of));
    h->leave_attr = leave_attr;
    h->fast_read = fast_read;
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

static PyObject *
mark_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"tls", "hook", "orig", "mark", "clock_from", NULL};
    PyObject *tls, *hook, *orig, *clock_from;
    const char *mark;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOsO!:MarkHook", kw, &tls, &hook, &orig, &mark, &PyDict_Type,
                                     &clock_from))
        return NULL;
    int which = strcmp(mark, "graph") == 0 ? MARK_GRAPH : strcmp(mark, "launch") == 0 ? MARK_LAUNCH : 0;
    if (!which) {
        PyErr_SetString(PyExc_ValueError, "mark: 'graph' or 'launch'");
        return NULL;
    }
    HookObject *h = hook_alloc(type, (vectorcallfunc)mark_call, tls, hook, orig, clock_from, Py_None, Py_None, Py_None,
                               Py_None, Py_None);
    if (h == NULL)
        return NULL;
    h->mark = which;
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

#define HOOK_FLAGS                                                                                             \
    (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR)

/* The three wrapper types differ only in name, doc and constructor (each sets its vectorcall). */
#define HOOK_TYPE(var, name, doc, new_fn)                                                                      \
    static PyTypeObject var = {                                                                                \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_probe._hot." name,                                       \
        .tp_doc = doc,                                                                                         \
        .tp_basicsize = sizeof(HookObject),                                                                    \
        .tp_flags = HOOK_FLAGS,                                                                                \
        .tp_new = new_fn,                                                                                      \
        .tp_dealloc = tracked_dealloc,                                                                \
        .tp_traverse = (traverseproc)hook_traverse,                                                            \
        .tp_clear = (inquiry)hook_clear,                                                                       \
        .tp_vectorcall_offset = offsetof(HookObject, vectorcall),                                              \
        .tp_call = PyVectorcall_Call,                                                                          \
        .tp_descr_get = hook_descr_get,                                                                        \
        .tp_dictoffset = offsetof(HookObject, dict),                                                           \
        .tp_getset = hook_getset,                                                                              \
    }

HOOK_TYPE(StepHookType, "StepHook", "Recorder.step_method's wrapper in C: a scheduler iteration, the parent of its phases.",
          step_hook_new);
HOOK_TYPE(PhaseHookType, "PhaseHook", "Recorder.phase_method's wrapper in C: a timed call inside a step.",
          phase_hook_new);
HOOK_TYPE(MarkHookType, "MarkHook", "Recorder.graph_method / launch_method's wrapper in C: marks the open phase.",
          mark_hook_new);

/* ---- the CUDA timer's hot side (timing.CudaTimer.start / .stop, the fast-stream variant) ----- */

/* The CUDA runtime's own entry points (cudaError_t and the capture status are C ints). */
typedef int (*event_record_fn)(void *event, void *stream);
typedef int (*stream_is_capturing_fn)(void *stream, int *status);
typedef int (*get_last_error_fn)(void);
typedef int (*stream_query_fn)(void *stream);
/* torch's C shim for the current stream (``aoti_torch_get_current_cuda_stream``: 0 success). */
typedef int32_t (*current_stream_fn)(int32_t device_index, void **stream);
#define CUDA_ERROR_NOT_READY 600 /* cudaErrorNotReady: the stream still has work queued */

static int as_ll(PyObject *v, long long *out);
static int attr_ll(PyObject *obj, PyObject *name, long long *out);
static int gpu_run_check(long long n);

typedef struct {
    PyObject_HEAD
    PyObject *timer, *state;
    /* The timer's attributes read or written on every phase: ``_anchor_due``, ``_anchor_busy``,
       ``_last_end``, ``_pool``, ``_anchors``, ``_raw_stream`` by start / stop on the scheduler thread, ``_chain``
       (the last end token the drain mapped, and where) by the drain. Kept here instead of in the
       timer's instance dict, where each look-up costs a few cache-cold lines; CudaTimer's
       attributes of those names read and write these once the timer has its C half (KEPT). */
    long long anchor_due, chain_t;
    int anchor_busy;
    PyObject *last_end, *chain_end, *pool, *anchors, *raw_stream;
    /* ``runtime``: the phase end's capture check and event record go straight to libcudart, with
       the GIL held. torch's ``Event.record`` releases the GIL around the call (another thread may
       take it, and the scheduler thread waits to get it back) and sets the device around it;
       its capture check is a Python call of its own. NULL: torch's calls, as in Python. */
    event_record_fn event_record;
    stream_is_capturing_fn is_capturing;
    get_last_error_fn get_last_error;
    /* The anchor's refresh through the runtime as well (refresh_anchor_runtime): the stream's query,
       and the timer's _ANCHOR_EVERY_NS / _ANCHOR_RETRY_NS as they were when this was made. */
    stream_query_fn stream_query;
    long long anchor_every, anchor_retry;
    PyObject *on_fail; /* called once with a message when a runtime call failed (then torch's) */
    /* The runtime path's stream look-up: torch's raw handle of the current stream (an int) ->
       (torch's key for it, the probe's Stream), filled by the full look-up (current_stream). */
    PyObject *handles;
    /* torch's own C entry point for the current stream's raw handle, where the timer checked it
       names what torch's Python call names (timing._torch_stream_entry): the same answer without
       a Python call, an int made and a dict look-up, on a thread whose caches SGLang keeps cold.
       NULL: the Python call. And the last handle mapped and its (key, Stream) pair, held: a
       scheduler names one stream phase after phase. */
    current_stream_fn get_stream;
    void *last_sh;
    PyObject *last_hit;
    /* Event object -> its cudaEvent_t (event_handle), or NULL before the first. */
    struct EvHandle *evh;
    Py_ssize_t evh_n;
    /* The last event the drain read that the table does not hold (held) and its handle: the
       anchor, which every phase of ~100 ms of steps maps through. */
    PyObject *last_read;
    void *last_read_handle;
    /* This timer's entry in the watched timer dicts (timer_call); -1 none yet, -2 none was free. */
    int watch_slot;
    /* The steps' sampling (CudaTimer's class doc, timed_step): gpu_every (0: every step timed),
       the last step's start and the steps' running period, the steps timed together (gpu_run, a
       power of two); step_host, the current step is not timed. */
    long long gpu_every, last_step, period, stride, gpu_run;
    int step_host;
} CudaFastObject;

/* The kept objects in field order (last_end ... raw_stream), and the attribute each comes from
   (none for the chain's end, which comes with the chain). */
enum { KEPT_LAST_END, KEPT_CHAIN_END, KEPT_POOL, KEPT_ANCHORS, KEPT_RAW_STREAM, KEPT_N };
#define KEPT_AT(f, i) (&(f)->last_end + (i))
static PyObject **kept_names[KEPT_N] = {&s_last_end, NULL, &s__pool, &s__anchors, &s__raw_stream};

/* torch's events' raw handles by object, open addressing on the object's address. The pool cycles
   a bounded set of events (those of the steps the drain has not taken yet, ~a second's), and
   reading ``event.cuda_event`` (a property returning a new int) on every phase's end and twice per
   phase in the drain costs several cache-cold lines each; one slot here costs one. A handle never
   changes once torch has created the event, and the table holds each event (a strong reference),
   so an address cannot come back as another event. Only the hot side's pool events are added (the
   drain only looks up: the anchors it also reads are made anew every 100 ms and would fill the
   table with events nothing else holds); a pool that keeps making new events fills it at half its
   size, and then it starts again empty, letting go of events only it still held. */
#define EVH_CAP 8192
struct EvHandle {
    PyObject *ev;
    void *handle;
};

static inline size_t
evh_slot(PyObject *ev)
{
    return (size_t)(((uint64_t)(uintptr_t)ev >> 4) * 0x9E3779B97F4A7C15ULL >> 51) & (EVH_CAP - 1);
}

static void evh_free(CudaFastObject *f);
static int handle_of(PyObject *obj, PyObject *name, void **out);

/* ev's raw handle (0: torch has not created the event yet): from the table, else from torch and,
   with ``add`` (the hot side's pool events), into the table; without (the drain's reads), the last
   such event is remembered instead. */
static int
event_handle(CudaFastObject *f, PyObject *ev, int add, void **out)
{
    struct EvHandle *t = f == NULL ? NULL : f->evh;
    if (t != NULL) {
        for (size_t i = evh_slot(ev); t[i].ev != NULL; i = (i + 1) & (EVH_CAP - 1))
            if (t[i].ev == ev) {
                *out = t[i].handle;
                return 0;
            }
    }
    if (!add && f != NULL && ev == f->last_read) {
        *out = f->last_read_handle;
        return 0;
    }
    if (handle_of(ev, s_cuda_event, out) < 0)
        return -1;
    if (*out == NULL || f == NULL) /* not created yet: nothing to keep */
        return 0;
    if (!add) {
        Py_XSETREF(f->last_read, Py_NewRef(ev));
        f->last_read_handle = *out;
        return 0;
    }
    if (f->evh_n >= EVH_CAP / 2)
        evh_free(f);
    if ((t = f->evh) == NULL && (t = f->evh = PyMem_Calloc(EVH_CAP, sizeof(struct EvHandle))) == NULL)
        return 0; /* no table: read from torch each time */
    size_t i = evh_slot(ev);
    while (t[i].ev != NULL)
        i = (i + 1) & (EVH_CAP - 1);
    t[i].ev = Py_NewRef(ev);
    t[i].handle = *out;
    f->evh_n++;
    return 0;
}

static void
evh_free(CudaFastObject *f)
{
    struct EvHandle *t = f->evh;
    f->evh = NULL;
    f->evh_n = 0;
    if (t == NULL)
        return;
    for (Py_ssize_t i = 0; i < EVH_CAP; i++)
        Py_XDECREF(t[i].ev);
    PyMem_Free(t);
}

/* A timer's answer in its watched dict (see watch_slot): a phase's start and end call the C half
   without looking the name up in a cache-cold dict and checking what it found, twice a phase, while
   its start and stop are known to be its own; where one of the two is not, the answer is kept too,
   and the next call through the C half looks again only once the dict changed. */
enum { METHODS_STALE = WATCH_CHANGED, METHODS_OWN = 1, METHODS_OTHER = 2 };

/* f's start and stop, as the attribute machinery finds them on its timer, are still its own C
   methods, known without a look-up (a watched dict that has not changed since they were). */
static inline int
fast_methods_known(CudaFastObject *f)
{
#ifdef DICT_WATCH
    int slot = f->watch_slot;
    return slot >= 0 && watched_dicts[slot] == f->state && watched_answer[slot] == METHODS_OWN;
#else
    (void)f;
    return 0;
#endif
}

/* Whether fast_methods_seen has anything to find out: a watched dict changed since it last looked,
   or none is watched yet (and a slot may be free). */
static inline int
fast_methods_stale(CudaFastObject *f)
{
#ifdef DICT_WATCH
    int slot = f->watch_slot;
    if (slot == -2 || dict_watcher < 0)
        return 0;
    return slot < 0 || watched_dicts[slot] != f->state || watched_answer[slot] == METHODS_STALE;
#else
    (void)f;
    return 0;
#endif
}

static PyObject *fast_start(CudaFastObject *f, PyObject *const *args, Py_ssize_t nargs);
static PyObject *fast_stop(CudaFastObject *f, PyObject *const *args, Py_ssize_t nargs);

#ifdef DICT_WATCH
static int
fast_is_own(CudaFastObject *f, PyObject *m, PyCFunction meth)
{
    return m != NULL && PyCFunction_Check(m) && PyCFunction_GET_SELF(m) == (PyObject *)f &&
           PyCFunction_GET_FUNCTION(m) == meth;
}
#endif

/* Whether both of f's methods in its state are its own, remembered (METHODS_OWN or METHODS_OTHER)
   while the dict is watched from now on. */
static void
fast_methods_seen(CudaFastObject *f)
{
#ifdef DICT_WATCH
    PyObject *a = PyDict_GetItemWithError(f->state, s_start);
    PyObject *b = a == NULL ? NULL : PyDict_GetItemWithError(f->state, s_stop);
    int own = fast_is_own(f, a, (PyCFunction)(void (*)(void))fast_start) &&
              fast_is_own(f, b, (PyCFunction)(void (*)(void))fast_stop);
    PyErr_Clear();
    int slot = f->watch_slot;
    if (slot < 0 || watched_dicts[slot] != f->state) {
        slot = watch_slot(f->state);
        if (slot < 0) { /* all taken: this timer's methods are looked up every time, as before */
            f->watch_slot = -2;
            return;
        }
        f->watch_slot = slot;
    }
    watched_answer[slot] = own ? METHODS_OWN : METHODS_OTHER;
#else
    (void)f;
#endif
}

/* Gives f's slot back (its state about to be let go). */
static void
fast_unwatch(CudaFastObject *f)
{
#ifdef DICT_WATCH
    int slot = f->watch_slot;
    f->watch_slot = -1;
    if (slot >= 0 && f->state != NULL && watched_dicts[slot] == f->state) {
        if (PyDict_Unwatch(dict_watcher, f->state) < 0)
            PyErr_Clear();
        watched_dicts[slot] = NULL;
        watched_answer[slot] = WATCH_CHANGED;
    }
#else
    (void)f;
#endif
}

static int
fast_traverse(CudaFastObject *f, visitproc visit, void *arg)
{
    Py_VISIT(f->timer);
    Py_VISIT(f->state);
    Py_VISIT(f->on_fail);
    Py_VISIT(f->handles);
    Py_VISIT(f->last_end);
    Py_VISIT(f->chain_end);
    Py_VISIT(f->pool);
    Py_VISIT(f->anchors);
    Py_VISIT(f->raw_stream);
    Py_VISIT(f->last_hit);
    return 0;
}

static int
fast_clear(CudaFastObject *f)
{
    fast_unwatch(f);
    Py_CLEAR(f->timer);
    Py_CLEAR(f->state);
    Py_CLEAR(f->on_fail);
    Py_CLEAR(f->handles);
    Py_CLEAR(f->last_read);
    Py_CLEAR(f->last_end);
    Py_CLEAR(f->chain_end);
    Py_CLEAR(f->pool);
    Py_CLEAR(f->anchors);
    Py_CLEAR(f->raw_stream);
    Py_CLEAR(f->last_hit);
    evh_free(f);
    return 0;
}

/* The kept values' current ones in the timer's dict (``due``, ``chain_t`` and new references in
   ``kept``, None where absent), taken out of it: CudaTimer reads them in its C half from now on.
   -1 on error, with nothing held. */
static int
kept_take(PyObject *state, long long *due, int *busy, long long *chain_t, PyObject **kept)
{
    *due = *chain_t = 0;
    *busy = 0;
    for (int i = 0; i < KEPT_N; i++)
        kept[i] = Py_None;
    PyObject *v = PyDict_GetItemWithError(state, s_anchor_due);
    if ((v != NULL && as_ll(v, due) < 0) || PyErr_Occurred())
        return -1;
    v = PyDict_GetItemWithError(state, s_anchor_busy);
    if ((v != NULL && (*busy = PyObject_IsTrue(v)) < 0) || PyErr_Occurred())
        return -1;
    if ((v = PyDict_GetItemWithError(state, s__chain)) != NULL) {
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2 || as_ll(PyTuple_GET_ITEM(v, 1), chain_t) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "sgl-probe: the CUDA timer's _chain is not (end, t)");
            return -1;
        }
        kept[KEPT_CHAIN_END] = PyTuple_GET_ITEM(v, 0);
    }
    for (int i = 0; i < KEPT_N && !PyErr_Occurred(); i++)
        if (kept_names[i] != NULL && (v = PyDict_GetItemWithError(state, *kept_names[i])) != NULL)
            kept[i] = v;
    if (PyErr_Occurred())
        return -1;
    for (int i = 0; i < KEPT_N; i++)
        Py_INCREF(kept[i]);
    /* Out of the dict: the kept objects' names, and the three plain values'. */
    PyObject **names[KEPT_N + 3] = {&s_anchor_due, &s_anchor_busy, &s__chain};
    memcpy(names + 3, kept_names, sizeof(kept_names));
    for (int i = 0; i < KEPT_N + 3; i++) {
        if (names[i] == NULL || PyDict_DelItem(state, *names[i]) == 0)
            continue;
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
            for (int k = 0; k < KEPT_N; k++)
                Py_DECREF(kept[k]);
            return -1;
        }
        PyErr_Clear();
    }
    return 0;
}

static PyObject *
fast_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"timer", "state", "runtime", NULL};
    PyObject *timer, *state, *runtime = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!|O:CudaFast", kw, &timer, &PyDict_Type, &state, &runtime))
        return NULL;
    void *record = NULL, *capturing = NULL, *last_error = NULL, *query = NULL, *get_stream = NULL;
    PyObject *on_fail = NULL;
    if (runtime != Py_None) {
        /* (cudaEventRecord, cudaStreamIsCapturing, cudaGetLastError, cudaStreamQuery addresses, on_fail
           [, torch's current-stream entry point or None]) */
        PyObject *a, *b, *c, *d, *e = Py_None;
        if (!PyArg_ParseTuple(runtime, "OOOOO|O:runtime", &a, &b, &c, &d, &on_fail, &e))
            return NULL;
        record = PyLong_AsVoidPtr(a);
        capturing = PyLong_AsVoidPtr(b);
        last_error = PyLong_AsVoidPtr(c);
        query = PyLong_AsVoidPtr(d);
        if (e != Py_None)
            get_stream = PyLong_AsVoidPtr(e);
        if (PyErr_Occurred())
            return NULL;
        if (record == NULL || capturing == NULL || last_error == NULL || query == NULL || !PyCallable_Check(on_fail)) {
            PyErr_SetString(PyExc_ValueError, "runtime: four function addresses and a callable");
            return NULL;
        }
    }
    long long every, retry;
    if (attr_ll(timer, s__ANCHOR_EVERY_NS, &every) < 0 || attr_ll(timer, s__ANCHOR_RETRY_NS, &retry) < 0)
        return NULL;
    long long gpu_every = 0, gpu_run = 1;
    if (attr_ll(timer, s__GPU_RUN, &gpu_run) < 0 || gpu_run_check(gpu_run) < 0)
        return NULL;
    PyObject *every_v = PyDict_GetItemString(state, "_every_ns"); /* borrowed; absent: every step */
    if (every_v != NULL && as_ll(every_v, &gpu_every) < 0)
        return NULL;
    long long due, chain_t;
    int busy;
    PyObject *kept[KEPT_N];
    if (kept_take(state, &due, &busy, &chain_t, kept) < 0)
        return NULL;
    PyObject *handles = PyDict_New();
    CudaFastObject *f = handles == NULL ? NULL : PyObject_GC_New(CudaFastObject, type);
    if (f == NULL) {
        Py_XDECREF(handles);
        for (int k = 0; k < KEPT_N; k++)
            Py_DECREF(kept[k]);
        return NULL;
    }
    f->anchor_due = due;
    f->anchor_busy = busy;
    f->chain_t = chain_t;
    for (int k = 0; k < KEPT_N; k++)
        *KEPT_AT(f, k) = kept[k];
    f->handles = handles;
    f->evh = NULL;
    f->evh_n = 0;
    f->last_read = NULL;
    f->last_read_handle = NULL;
    f->get_stream = (current_stream_fn)get_stream;
    f->watch_slot = -1;
    f->last_sh = NULL;
    f->last_hit = NULL;
    f->timer = Py_NewRef(timer);
    f->state = Py_NewRef(state);
    f->event_record = (event_record_fn)record;
    f->is_capturing = (stream_is_capturing_fn)capturing;
    f->get_last_error = (get_last_error_fn)last_error;
    f->stream_query = (stream_query_fn)query;
    f->anchor_every = every;
    f->anchor_retry = retry;
    f->gpu_every = gpu_every;
    f->gpu_run = gpu_run;
    f->last_step = f->period = 0;
    f->stride = 1;
    f->step_host = 0;
    f->on_fail = Py_XNewRef(on_fail);
    PyObject_GC_Track(f);
    return (PyObject *)f;
}

/* An attribute of the timer, read from its instance dict as the Python methods read ``self.x``
   (borrowed; None when absent). */
static PyObject *
state_get(CudaFastObject *f, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(f->state, name);
    if (v == NULL && !PyErr_Occurred())
        v = Py_None;
    return v;
}

/* As state_get, for an attribute that must be there: a container or a callable of the timer. */
static PyObject *
state_need(CudaFastObject *f, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(f->state, name);
    if (v == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_AttributeError, "sgl-probe: the CUDA timer has no %U", name);
    return v;
}

static int refresh_anchor_runtime(CudaFastObject *f, long long now_v, PyObject *now);

static int current_stream_runtime(CudaFastObject *f, PyObject **key_out, PyObject **stream_out, void **handle_out);
static int torch_record(CudaFastObject *f, PyObject *ev, PyObject *stream);
static PyObject *pop_event(CudaFastObject *f);
static int record_runtime(CudaFastObject *f, PyObject **key, PyObject **stream, PyObject **ev, int timed);
static int runtime_failed(CudaFastObject *f, const char *what, int err);

/* CudaTimer._GPU_RUN's rule (timed_step masks the index with it): a power of two. 0, or -1 with
   ValueError. */
static int
gpu_run_check(long long n)
{
    if (n >= 1 && n <= (1LL << 20) && (n & (n - 1)) == 0)
        return 0;
    PyErr_SetString(PyExc_ValueError, "sgl-probe: CudaTimer._GPU_RUN must be a power of two");
    return -1;
}

/* CudaTimer._with_start_event(token) (a timed step after an untimed one), recorded as the phase end
   records its event (record_runtime): torch's record releases the GIL, and the scheduler thread
   then waits to get it back from the drain: ~3 µs a step on average where every few steps lead,
   h100-24. Through Python where the runtime calls are off. */
static PyObject *
start_event(CudaFastObject *f, PyObject *token)
{
    if (f->event_record == NULL)
        return PyObject_CallMethodOneArg(f->timer, s__with_start_event, token);
    PyObject *key = NULL, *stream = NULL, *ev = NULL, *r = NULL;
    int rec = record_runtime(f, &key, &stream, &ev, 0);
    if (rec == 0) /* a graph is being captured: no event, as _with_start_event */
        r = Py_NewRef(token);
    else if (rec > 0 && (r = PyTuple_Pack(3, PyTuple_GET_ITEM(token, 0), PyTuple_GET_ITEM(token, 1), ev)) != NULL)
        PyObject_GC_UnTrack(r); /* as fast_start's token */
    Py_XDECREF(ev);
    Py_XDECREF(stream);
    Py_XDECREF(key);
    return r;
}

/* CudaTimer._timed_step(now_ns, index), the same integer arithmetic: the steps' running period
   (from one step's start to the next, at most gpu_every), k the largest power of two with k such
   periods within gpu_every, and the step timed where its index modulo gpu_run * k is below gpu_run. */
static int
timed_step(CudaFastObject *f, long long now_v, PyObject *index)
{
    long long last = f->last_step, every = f->gpu_every;
    f->last_step = now_v;
    if (last != 0) {
        long long dt = now_v - last;
        dt = dt < 0 ? 0 : dt > every ? every : dt;
        long long d = dt - f->period, q = d / 8;
        if (d % 8 != 0 && d < 0) /* Python's // */
            q--;
        f->period = f->period == 0 ? dt : f->period + q;
    }
    long long p = f->period;
    unsigned long long k = 1;
    if (p > 0)
        while ((long long)(k << 1) * p <= every)
            k <<= 1;
    f->stride = (long long)k;
    if (k == 1)
        return 1;
    unsigned long long i = PyLong_Check(index) ? PyLong_AsUnsignedLongLongMask(index) : 0;
    if (i == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    unsigned long long run = (unsigned long long)f->gpu_run;
    return (i & (k * run - 1)) < run;
}

/* CudaTimer.start */
static PyObject *
fast_start(CudaFastObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "start(now_ns[, step])");
        return NULL;
    }
    PyObject *now = args[0];
    long long now_v;
    if (as_ll(now, &now_v) < 0)
        return NULL;
    int lead = 0; /* a timed step after an untimed one: a start event of its own (CudaTimer.start) */
    if (f->gpu_every > 0) {
        if (nargs == 2 && args[1] != Py_None) { /* a step's first phase: its index decides */
            int host = !timed_step(f, now_v, args[1]);
            lead = !host && f->step_host;
            f->step_host = host;
        }
        if (f->step_host)
            return Py_NewRef(now);
    }
    if (now_v >= f->anchor_due) {
        /* Every 100 ms, or every _ANCHOR_RETRY_NS while the stream is busy: it sets anchor_due and
           anchor_busy (Python's through the timer's kept attributes). */
        SECTION_T0(sec);
        int done = refresh_anchor_runtime(f, now_v, now);
        if (done == 0) {
            PyObject *r = PyObject_CallMethodOneArg(f->timer, s_refresh_anchor, now);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
        }
        SECTION_ADD(start_anchor, sec); /* part of phase_start: the anchor's refresh */
        if (done < 0)
            return NULL;
    }
    warm_note_span(WARM_PHASE_IN, f, sizeof(CudaFastObject));
    warm_note(WARM_PHASE_IN, f->last_end);
    int busy = f->anchor_busy;
    PyObject *last = f->last_end;
    /* Untracked (see is_atom): a token holds the clock, the previous end token, torch's event and
       stream objects and an anchor, none of which can lead back to a token. */
    PyObject *token = busy ? PyTuple_Pack(3, now, last, Py_None) : PyTuple_Pack(2, now, last);
    if (token != NULL)
        PyObject_GC_UnTrack(token);
    if (lead && token != NULL) {
        SECTION_T0(sec_lead);
        Py_SETREF(token, start_event(f, token));
        SECTION_ADD(start_lead, sec_lead); /* part of phase_start: a timed step's start event */
    }
    return token;
}

/* A runtime call failed: clear the runtime's last error (torch checks it after its own launches,
   and must not see ours), say so once, and use torch's calls from now on. -1 if on_fail raised. */
static int
runtime_failed(CudaFastObject *f, const char *what, int err)
{
    if (f->get_last_error != NULL)
        f->get_last_error();
    f->event_record = NULL;
    f->is_capturing = NULL;
    f->get_last_error = NULL;
    f->stream_query = NULL;
    PyObject *r = PyObject_CallFunction(f->on_fail, "s", what);
    (void)err;
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* A C pointer held by a torch object's attribute (``cuda_stream``, ``cuda_event``); 0 for none. */
static int
handle_of(PyObject *obj, PyObject *name, void **out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

/* The current stream: torch's key for it, and the probe's Stream object for that key. */
static int
current_stream(CudaFastObject *f, PyObject **key_out, PyObject **stream_out)
{
    PyObject *fn_key = state_need(f, s__stream_key);
    if (fn_key == NULL)
        return -1;
    PyObject *key = PyObject_CallOneArg(fn_key, int_minus_one);
    if (key == NULL)
        return -1;
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 2) {
        PyErr_SetString(PyExc_TypeError, "sgl-probe: torch's current-stream key is not a tuple");
        Py_DECREF(key);
        return -1;
    }
    PyObject *streams = state_need(f, s__streams);
    if (streams == NULL || !PyDict_Check(streams)) {
        if (streams != NULL)
            PyErr_SetString(PyExc_TypeError, "sgl-probe: the CUDA timer's streams are not a dict");
        Py_DECREF(key);
        return -1;
    }
    PyObject *stream = PyDict_GetItemWithError(streams, key);
    if (stream != NULL) {
        Py_INCREF(stream);
    }
    else {
        PyObject *found = PyErr_Occurred() ? NULL : PyObject_CallMethodNoArgs(f->timer, s_lookup_stream);
        stream = found == NULL ? NULL : PySequence_GetItem(found, 0);
        Py_XDECREF(found);
        if (stream == NULL) {
            Py_DECREF(key);
            return -1;
        }
    }
    *key_out = key;
    *stream_out = stream;
    return 0;
}

/* Distinct raw handles kept before the map starts again (as the timer's _STREAMS_MAX). */
#define HANDLES_MAX 256

/* current_stream for the runtime path, which needs the stream's raw handle as well: torch's
   ``_cuda_getCurrentRawStream`` (the timer's ``_raw_stream``, None where torch lacks it) returns
   that handle as an int, one call where the full look-up takes three (torch's key, a tuple; the
   dict; the Stream's ``cuda_stream``) on a thread whose caches SGLang keeps cold. A handle is
   mapped after the full look-up has named the same stream. Handles 0-2 (the legacy and
   per-thread default streams) are the same on every device, so those always take the full
   look-up; any other names one stream of one device (torch never frees its pool's streams). */
static int
current_stream_runtime(CudaFastObject *f, PyObject **key_out, PyObject **stream_out, void **handle_out)
{
    PyObject *raw = f->raw_stream;
    PyObject *h = NULL;
    if (raw != Py_None) {
        void *sh = NULL;
        int have = 0;
        if (f->get_stream != NULL) {
            if (f->get_stream(-1, &sh) == 0)
                have = 1;
            else /* torch's own error (it threw): its Python call below raises it, as without this */
                f->get_stream = NULL;
        }
        if (have && sh == f->last_sh && f->last_hit != NULL) {
            *handle_out = sh;
            *key_out = Py_NewRef(PyTuple_GET_ITEM(f->last_hit, 0));
            *stream_out = Py_NewRef(PyTuple_GET_ITEM(f->last_hit, 1));
            return 0;
        }
        if (have) {
            h = PyLong_FromVoidPtr(sh);
        }
        else {
            Py_INCREF(raw); /* held across the call: a Python reader could replace the kept one */
            h = PyObject_CallOneArg(raw, int_minus_one);
            Py_DECREF(raw);
        }
        if (h == NULL)
            return -1;
        PyObject *hit = PyDict_GetItemWithError(f->handles, h);
        if (hit != NULL) {
            *handle_out = PyLong_AsVoidPtr(h);
            Py_DECREF(h);
            if (have) {
                f->last_sh = sh;
                Py_XSETREF(f->last_hit, Py_NewRef(hit));
            }
            *key_out = Py_NewRef(PyTuple_GET_ITEM(hit, 0));
            *stream_out = Py_NewRef(PyTuple_GET_ITEM(hit, 1));
            return 0;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(h);
            return -1;
        }
    }
    if (current_stream(f, key_out, stream_out) < 0) {
        Py_XDECREF(h);
        return -1;
    }
    if (handle_of(*stream_out, s_cuda_stream, handle_out) < 0)
        goto fail;
    if (h != NULL) {
        void *named = PyLong_AsVoidPtr(h);
        if (named == NULL && PyErr_Occurred())
            goto fail;
        if (named == *handle_out && (uintptr_t)named > 2) {
            if (PyDict_GET_SIZE(f->handles) >= HANDLES_MAX)
                PyDict_Clear(f->handles);
            PyObject *v = PyTuple_Pack(2, *key_out, *stream_out);
            int err = v == NULL ? -1 : PyDict_SetItem(f->handles, h, v);
            Py_XDECREF(v);
            if (err < 0)
                goto fail;
        }
        Py_DECREF(h);
    }
    return 0;
fail:
    Py_XDECREF(h);
    Py_CLEAR(*key_out);
    Py_CLEAR(*stream_out);
    return -1;
}

/* torch's capture check (the timer's ``_capturing``): 1 capturing, 0 not, -1 error. */
static int
torch_capturing(CudaFastObject *f)
{
    PyObject *fn = state_need(f, s__capturing);
    if (fn == NULL)
        return -1;
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL)
        return -1;
    int cap = PyObject_IsTrue(r);
    Py_DECREF(r);
    return cap;
}

static int
torch_record(CudaFastObject *f, PyObject *ev, PyObject *stream)
{
    PyObject *fn = state_need(f, s__record);
    if (fn == NULL)
        return -1;
    PyObject *rec_args[2] = {ev, stream};
    PyObject *r = PyObject_Vectorcall(fn, rec_args, 2, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* An event from the pool (CudaTimer._pop where it is empty). */
static PyObject *
pop_event(CudaFastObject *f)
{
    PyObject *pool = f->pool;
    Py_ssize_t n = PyList_Check(pool) ? PyList_GET_SIZE(pool) : 0;
    if (n == 0)
        return PyObject_CallMethodNoArgs(f->timer, s_pop);
    PyObject *ev = Py_NewRef(PyList_GET_ITEM(pool, n - 1));
    if (PyList_SetSlice(pool, n - 1, n, NULL) < 0) {
        Py_DECREF(ev);
        return NULL;
    }
    return ev;
}

/* A pool event recorded now on the current stream through the runtime, the GIL held: the record
   sequence a phase end and a timed step's start event share (the stream first: the capture check
   asks it by its handle). A runtime call that fails hands over to torch's calls for good
   (runtime_failed). 1 recorded (*key, *stream, *ev: new references), 0 a graph is being captured
   (nothing recorded, nothing set), -1 error. ``timed``: count it into the phase end's sections. */
static int
record_runtime(CudaFastObject *f, PyObject **key, PyObject **stream, PyObject **ev, int timed)
{
    SECTION_T0(sec);
    void *sh = NULL, *eh = NULL;
    if (current_stream_runtime(f, key, stream, &sh) < 0)
        return -1;
    if (timed)
        SECTION_ADD(stop_stream, sec);
    int status = 0, err = f->is_capturing(sh, &status), cap = status != 0;
    if (timed)
        SECTION_ADD(stop_capture, sec);
    if (err != 0 && (runtime_failed(f, "cudaStreamIsCapturing", err) < 0 || (cap = torch_capturing(f)) < 0))
        goto fail;
    if (cap) {
        Py_CLEAR(*key);
        Py_CLEAR(*stream);
        return 0;
    }
    if ((*ev = pop_event(f)) == NULL)
        goto fail;
    if (f->event_record != NULL && event_handle(f, *ev, 1, &eh) < 0)
        goto fail;
    if (timed)
        SECTION_ADD(stop_event, sec);
    if (f->event_record != NULL && eh != NULL) {
        err = f->event_record(eh, sh);
        if (timed)
            SECTION_ADD(stop_record, sec);
        if (err != 0 && (runtime_failed(f, "cudaEventRecord", err) < 0 || torch_record(f, *ev, *stream) < 0))
            goto fail;
    }
    else if (torch_record(f, *ev, *stream) < 0) { /* also an event never recorded: torch creates it */
        goto fail;
    }
    return 1;
fail:
    Py_CLEAR(*ev);
    Py_CLEAR(*key);
    Py_CLEAR(*stream);
    return -1;
}

/* CudaTimer._refresh_anchor through the runtime, the GIL held throughout: torch's record releases
   it (the drain thread takes it, and the scheduler thread waits to get it back: 20-30 µs a refresh
   measured, h100-3 and h100-4) and a new torch event is created at its first record. The event
   comes from the timer's ``_fresh`` stock for this device (events the drain thread recorded once,
   CudaTimer.replenish, which stocks one again only once no end token maps through it). 1 done
   (refreshed, found busy or a capture running), 0 not here (no runtime calls, no stocked event, an
   answer other than idle or busy: Python's refresh decides, through torch), -1 error. */
static int
refresh_anchor_runtime(CudaFastObject *f, long long now_v, PyObject *now)
{
    if (f->event_record == NULL || f->stream_query == NULL)
        return 0;
    PyObject *fresh = PyDict_GetItemWithError(f->state, s__fresh);
    if (fresh == NULL || !PyDict_Check(fresh) || PyDict_GET_SIZE(fresh) == 0) /* none stocked yet */
        return PyErr_Occurred() ? -1 : 0;
    PyObject *key = NULL, *stream = NULL, *ev = NULL, *anchor = NULL;
    void *sh = NULL, *eh = NULL;
    int rc = 0;
    if (current_stream_runtime(f, &key, &stream, &sh) < 0)
        return -1;
    PyObject *device = PyTuple_GET_ITEM(key, 1);
    PyObject *stock = PyDict_GetItemWithError(fresh, device);
    if (stock == NULL || !PyList_CheckExact(stock) || PyList_GET_SIZE(stock) == 0) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    int status = 0;
    if (f->is_capturing(sh, &status) != 0) /* Python's refresh asks torch; the stop reports it */
        goto done;
    if (status) {
        f->anchor_busy = 0;
        rc = 1;
        goto done;
    }
    int q = f->stream_query(sh);
    if (q == CUDA_ERROR_NOT_READY) {
        /* Cleared, as torch's Stream.query clears it: the next launch check must not see it. */
        f->get_last_error();
        f->anchor_busy = 1;
        f->anchor_due = now_v + f->anchor_retry;
        rc = 1;
        goto done;
    }
    if (q != 0) /* an error of earlier work: torch's query raises it as without the probe's C */
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(stock);
    ev = Py_NewRef(PyList_GET_ITEM(stock, n - 1));
    if (handle_of(ev, s_cuda_event, &eh) < 0) { /* not in the pool's table: an anchor, not a pool event */
        rc = -1;
        goto done;
    }
    if (eh == NULL) /* never recorded after all: Python's refresh records a new one through torch */
        goto done;
    int err = f->event_record(eh, sh);
    if (err != 0) {
        rc = runtime_failed(f, "cudaEventRecord", err) < 0 ? -1 : 0;
        goto done;
    }
    if (PyList_SetSlice(stock, n - 1, n, NULL) < 0 || (anchor = PyTuple_Pack(2, ev, now)) == NULL ||
        !PyDict_Check(f->anchors) || PyDict_SetItem(f->anchors, device, anchor) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "sgl-probe: the CUDA timer's anchors are not a dict");
        rc = -1;
        goto done;
    }
    f->anchor_due = now_v + f->anchor_every;
    f->anchor_busy = 0;
    rc = 1;
done:
    Py_XDECREF(anchor);
    Py_XDECREF(ev);
    Py_XDECREF(stream);
    Py_XDECREF(key);
    return rc;
}

/* What the next phase end goes through: the timer's C half, the current stream's cached pair, the
   pool and the event it hands out next (and that event's slot in the handle table), the anchors. */
static void
warm_stop_note(CudaFastObject *f, PyObject *anchors, PyObject *anchor)
{
    warm_note_span(WARM_PHASE_OUT, f, sizeof(CudaFastObject));
    PyObject *hit = f->last_hit;
    if (hit != NULL && PyTuple_Check(hit) && PyTuple_GET_SIZE(hit) == 2) {
        warm_note(WARM_PHASE_OUT, hit);
        warm_note(WARM_PHASE_OUT, PyTuple_GET_ITEM(hit, 0));
        warm_note(WARM_PHASE_OUT, PyTuple_GET_ITEM(hit, 1));
    }
    PyObject *pool = f->pool;
    if (PyList_Check(pool)) {
        warm_note(WARM_PHASE_OUT, pool);
        Py_ssize_t n = PyList_GET_SIZE(pool);
        if (n > 0) {
            PyObject *next = PyList_GET_ITEM(pool, n - 1);
            warm_note(WARM_PHASE_OUT, &((PyListObject *)pool)->ob_item[n - 1]);
            warm_note(WARM_PHASE_OUT, next);
            if (f->evh != NULL)
                warm_note(WARM_PHASE_OUT, &f->evh[evh_slot(next)]);
        }
    }
    warm_note(WARM_PHASE_OUT, anchors);
    if (PyDict_Check(anchors))
        warm_note(WARM_PHASE_OUT, ((PyDictObject *)anchors)->ma_keys);
    warm_note(WARM_PHASE_OUT, anchor);
}

/* CudaTimer.stop: the capture check, the current stream, an event from the pool recorded on it,
   and the end token with this device's anchor. */
static PyObject *
fast_stop(CudaFastObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "stop(token, now_ns)");
        return NULL;
    }
    PyObject *now = args[1];
    if (PyLong_CheckExact(args[0])) /* an untimed step (CudaTimer's class doc): its host clock */
        return Py_NewRef(now);
    PyObject *key = NULL, *stream = NULL, *ev = NULL, *end = NULL;
    if (f->event_record == NULL) {
        int cap = torch_capturing(f);
        if (cap != 0)
            return cap < 0 ? NULL : Py_NewRef(Py_None);
        if (current_stream(f, &key, &stream) < 0)
            return NULL;
        if ((ev = pop_event(f)) == NULL || torch_record(f, ev, stream) < 0)
            goto done;
    }
    else {
        int rec = record_runtime(f, &key, &stream, &ev, 1);
        if (rec <= 0) {
            end = rec == 0 ? Py_NewRef(Py_None) : NULL;
            goto done;
        }
    }
    SECTION_T0(sec_ev);
    PyObject *device = PyTuple_GET_ITEM(key, 1);
    PyObject *anchors = f->anchors;
    if (!PyDict_Check(anchors)) {
        PyErr_SetString(PyExc_TypeError, "sgl-probe: the CUDA timer's anchors are not a dict");
        goto done;
    }
    PyObject *anchor = PyDict_GetItemWithError(anchors, device);
    if (anchor == NULL) {
        if (!PyErr_Occurred()) {
            PyObject *fa[5] = {f->timer, ev, stream, device, now};
            end = PyObject_VectorcallMethod(s_first_anchor, fa, 5, NULL);
        }
    }
    else {
        end = PyTuple_Pack(4, ev, stream, now, anchor);
        if (end != NULL)
            PyObject_GC_UnTrack(end); /* as fast_start's token */
        if (end != NULL)
            Py_SETREF(f->last_end, Py_NewRef(end));
        SECTION_ADD(stop_tail, sec_ev);
    }
    warm_stop_note(f, anchors, anchor);
done:
    Py_XDECREF(ev);
    Py_XDECREF(stream);
    Py_XDECREF(key);
    return end;
}

/* ---- the drain's side of the CUDA timer (drain.take_ready's loop: resolve_row, interval_kind,
   release) -------------------------------------------------------------------------------------- */

typedef int (*elapsed_time_fn)(float *ms, void *start, void *end);

/* One elapsed time read ahead (read_ahead): the two events (held) and the runtime's answer. */
typedef struct {
    PyObject *a, *b;
    float ms;
    int err;
} Ahead;

/* What one take() call reads once. */
typedef struct {
    PyObject *elapsed;       /* (a, b) -> ms: the thread's reader (CudaTimer._prepared.elapsed or torch's) */
    elapsed_time_fn direct;  /* cudaEventElapsedTime, once the runtime's answers were checked; or NULL */
    int keep_gil;
    PyObject *gpu_event, *host_clock, *error_text;
    long long offset, tolerance;
    int host; /* the CPU timer's tokens: host clock values, nothing to map or release */
    Ahead *ahead;            /* the pass's elapsed times, read with one release of the GIL (keep_gil off) */
    Py_ssize_t n_ahead, next_ahead;
    PyObject *timer;         /* the CUDA timer (borrowed), whose reader takes over once the runtime refused */
    CudaFastObject *fast;    /* its C side (borrowed; the events' handles), or NULL */
    PyObject *reader_now;    /* that reader (held), or NULL */
} TakeCtx;

static int
as_ll(PyObject *v, long long *out)
{
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* as_ll(getattr(obj, name)): the timer's class constants. */
static int
attr_ll(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    int bad = v == NULL || as_ll(v, out) < 0;
    Py_XDECREF(v);
    return bad ? -1 : 0;
}

/* Python's a // b for b > 0. */
static long long
floordiv(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* The Python reader's elapsed(a, b) in ms. */
static int
reader_ms(TakeCtx *c, PyObject *a, PyObject *b, double *ms)
{
    PyObject *call[2] = {a, b};
    PyObject *r = PyObject_Vectorcall(c->elapsed, call, 2, NULL);
    if (r == NULL)
        return -1;
    *ms = PyFloat_AsDouble(r);
    Py_DECREF(r);
    return (*ms == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* round(elapsed(a, b) * 1e6): the GPU time from a to b in ns. */
static int
elapsed_ns(TakeCtx *c, PyObject *a, PyObject *b, long long *out)
{
    double ms;
    if (c->direct != NULL && c->next_ahead < c->n_ahead && c->ahead[c->next_ahead].a == a &&
        c->ahead[c->next_ahead].b == b) {
        Ahead *x = &c->ahead[c->next_ahead++];
        if (x->err == 0) {
            *out = (long long)nearbyint((double)x->ms * 1e6);
            return 0;
        }
        /* refused ahead: asked again below, as without the read-ahead */
    }
    if (c->direct != NULL) {
        void *ha, *hb;
        if (event_handle(c->fast, a, 0, &ha) < 0 || event_handle(c->fast, b, 0, &hb) < 0)
            return -1;
        float fms = 0.0f;
        int err;
        if (c->keep_gil) {
            err = c->direct(&fms, ha, hb);
        }
        else {
            Py_BEGIN_ALLOW_THREADS err = c->direct(&fms, ha, hb);
            Py_END_ALLOW_THREADS
        }
        if (err != 0) {
            /* The Python reader answers (and gives the runtime up, with its log line); the rest of
               the pass asks the reader the timer names after that (torch's), as the Python loop
               does, instead of the runtime and that reader again (a log line each). */
            c->direct = NULL;
            if (reader_ms(c, a, b, &ms) < 0)
                return -1;
            PyObject *now = c->timer == NULL ? NULL : PyObject_CallMethod(c->timer, "_c_reader", NULL);
            if (now != NULL && PyTuple_Check(now) && PyTuple_GET_SIZE(now) > 0) {
                Py_XSETREF(c->reader_now, Py_NewRef(PyTuple_GET_ITEM(now, 0)));
                c->elapsed = c->reader_now;
            }
            Py_XDECREF(now);
            if (PyErr_Occurred())
                return -1;
        }
        else {
            ms = (double)fms;
        }
    }
    else if (reader_ms(c, a, b, &ms) < 0) {
        return -1;
    }
    *out = (long long)nearbyint(ms * 1e6); /* round half to even, as round() */
    return 0;
}

/* CudaTimer.interval_kind(start, end) -> (t0, t1, kind) as C values; updates the timer's chain and,
   for an anchor caught mapping early, _bad_anchor and _anchor_due. */
static int
interval_kind(CudaFastObject *f, TakeCtx *c, PyObject *start, PyObject *end, long long *t0_out, long long *t1_out,
              PyObject **kind_out)
{
    if (!PyTuple_Check(end) || PyTuple_GET_SIZE(end) != 4 || !PyTuple_Check(start) || PyTuple_GET_SIZE(start) < 2) {
        PyErr_SetString(PyExc_TypeError, "sgl-probe: not a CUDA timer token");
        return -1;
    }
    PyObject *end_ev = PyTuple_GET_ITEM(end, 0), *stream = PyTuple_GET_ITEM(end, 1);
    PyObject *anchor = PyTuple_GET_ITEM(end, 3);
    if (!PyTuple_Check(anchor) || PyTuple_GET_SIZE(anchor) != 2) {
        PyErr_SetString(PyExc_TypeError, "sgl-probe: not an anchor");
        return -1;
    }
    PyObject *anchor_ev = PyTuple_GET_ITEM(anchor, 0);
    long long end_host, anchor_host, start_host, d;
    if (as_ll(PyTuple_GET_ITEM(end, 2), &end_host) < 0 || as_ll(PyTuple_GET_ITEM(anchor, 1), &anchor_host) < 0 ||
        as_ll(PyTuple_GET_ITEM(start, 0), &start_host) < 0)
        return -1;
    long long t1 = anchor_host + c->offset;
    if (anchor_ev != end_ev) {
        if (elapsed_ns(c, anchor_ev, end_ev, &d) < 0)
            return -1;
        t1 += d;
    }
    long long floor = end_host + c->offset;
    if (t1 < floor) {
        if (t1 < floor - c->tolerance) {
            PyObject *bad = state_get(f, s__bad_anchor);
            if (bad == NULL)
                return -1;
            if (bad != anchor_ev) {
                if (PyDict_SetItem(f->state, s__bad_anchor, anchor_ev) < 0)
                    return -1;
                f->anchor_due = 0;
            }
        }
        t1 = floor;
    }
    long long t0 = start_host + c->offset;
    PyObject *kind = c->host_clock;
    Py_ssize_t n = PyTuple_GET_SIZE(start);
    if (n > 2 && PyTuple_GET_ITEM(start, 2) != Py_None) { /* record_starts: the phase's own start event */
        if (elapsed_ns(c, anchor_ev, PyTuple_GET_ITEM(start, 2), &d) < 0)
            return -1;
        t0 = anchor_host + c->offset + d;
        kind = c->gpu_event;
    }
    else {
        PyObject *last = PyTuple_GET_ITEM(start, 1);
        if (last != Py_None && last == f->chain_end && PyTuple_Check(last) && PyTuple_GET_SIZE(last) >= 2) {
            long long chain_t = f->chain_t;
            PyObject *last_stream = PyTuple_GET_ITEM(last, 1);
            int same = last_stream == stream;
            if (!same && (same = PyObject_RichCompareBool(last_stream, stream, Py_EQ)) < 0)
                return -1;
            if (same && (chain_t > t0 || (n > 2 && chain_t > t0 - floordiv(start_host - anchor_host, 50000) -
                                                                 c->tolerance))) {
                t0 = chain_t;
                kind = c->gpu_event;
            }
        }
    }
    if (t1 < t0)
        t1 = t0;
    Py_SETREF(f->chain_end, Py_NewRef(end));
    f->chain_t = t1;
    *t0_out = t0;
    *t1_out = t1;
    *kind_out = kind;
    return 0;
}

/* None, or error_text(error). */
static PyObject *
error_or_none(TakeCtx *c, PyObject *error)
{
    if (error == Py_None)
        return Py_NewRef(Py_None);
    return PyObject_CallOneArg(c->error_text, error);
}

/* (t1 - t0) / div as Python computes it: the exact difference, rounded once to a float, divided.
   span_c: its C way, where both are ints that fit a long long and so does their difference (1 and
   ``*out``; 0 where it does not apply; -1 error); span_of: that, else Python's arithmetic. */
static int
span_c(PyObject *t0, PyObject *t1, double div, double *out)
{
    if (!PyLong_CheckExact(t0) || !PyLong_CheckExact(t1))
        return 0;
    int o0 = 0, o1 = 0;
    long long a = PyLong_AsLongLongAndOverflow(t0, &o0), b = PyLong_AsLongLongAndOverflow(t1, &o1);
    if ((a == -1 || b == -1) && PyErr_Occurred())
        return -1;
    long long d;
    if (o0 || o1 || __builtin_sub_overflow(b, a, &d))
        return 0;
    *out = (double)d / div;
    return 1;
}

static PyObject *
span_of(PyObject *t0, PyObject *t1, double div)
{
    double v;
    int r = span_c(t0, t1, div, &v);
    if (r != 0)
        return r < 0 ? NULL : PyFloat_FromDouble(v);
    PyObject *span = PyNumber_Subtract(t1, t0);
    if (span == NULL)
        return NULL;
    PyObject *by = PyFloat_FromDouble(div);
    PyObject *q = by == NULL ? NULL : PyNumber_TrueDivide(span, by);
    Py_XDECREF(by);
    Py_DECREF(span);
    return q;
}

/* A phase's or a step's host time in ms, from its host clock values. */
static PyObject *
ms_of(PyObject *t0, PyObject *t1)
{
    return span_of(t0, t1, 1e6);
}

/* A step resolved to C values: what resolve_row turns into a row, or pack_vals writes straight
   into a link message (the drain's packed pass, which makes no row). */
typedef struct {
    PhaseRecordObject *ph; /* borrowed: the step's phases list holds it */
    long long t0, t1;
    PyObject *kind;        /* borrowed: the timer's kinds or None */
    int graph;
    int has_graph_ms;
    double graph_ms;
    PyObject *error;       /* None or error_text(ph.error) */
} PhaseVals;

/* The phase's (t1 - t0) / div, as its row's ints would give it (span_of). */
static PyObject *
vals_span(PhaseVals *pv, double div)
{
    long long d;
    if (!__builtin_sub_overflow(pv->t1, pv->t0, &d))
        return PyFloat_FromDouble((double)d / div);
    PyObject *a = PyLong_FromLongLong(pv->t0), *b = PyLong_FromLongLong(pv->t1);
    PyObject *r = a && b ? span_of(a, b, div) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return r;
}

#define VALS_SMALL 4
typedef struct {
    PhaseVals small[VALS_SMALL];
    PhaseVals *ph;         /* the timed phases (a capture's has no end) */
    Py_ssize_t n;
    long long w0, w1;
    PyObject *error;       /* None or error_text(st.error) */
    int host;              /* a CUDA timer's untimed step: host times (timer kind "host") */
} StepVals;

static void
vals_free(StepVals *v)
{
    for (Py_ssize_t i = 0; i < v->n; i++)
        Py_XDECREF(v->ph[i].error);
    if (v->ph != v->small)
        PyMem_Free(v->ph);
    v->ph = v->small;
    v->n = 0;
    Py_CLEAR(v->error);
}

/* drain.resolve_row(st, timer)'s arithmetic for this timer, into ``v`` (vals_free it, whatever
   this returns). */
static int
resolve_vals(CudaFastObject *f, TakeCtx *c, StepRecordObject *st, StepVals *v)
{
    v->ph = v->small;
    v->n = 0;
    v->error = NULL;
    v->host = 0;
    Py_ssize_t n = PyList_GET_SIZE(st->phases), timed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ph = PyList_GET_ITEM(st->phases, i);
        timed += !Py_IS_TYPE(ph, &PhaseRecordType) || ((PhaseRecordObject *)ph)->t_end != Py_None;
    }
    if (timed > VALS_SMALL && (v->ph = PyMem_Malloc(timed * sizeof(PhaseVals))) == NULL) {
        v->ph = v->small;
        PyErr_NoMemory();
        return -1;
    }
    long long lo = 0, hi = 0;
    int any = 0;
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(st->phases); i++) {
        PhaseRecordObject *ph = (PhaseRecordObject *)PyList_GET_ITEM(st->phases, i);
        if (Py_TYPE(ph) != &PhaseRecordType) {
            PyErr_SetString(PyExc_TypeError, "sgl-probe: not a C phase record");
            return -1;
        }
        if (ph->t_end == Py_None)
            continue;
        long long t0, t1;
        PyObject *kind;
        if (c->host || PyLong_CheckExact(ph->t_end)) { /* (the CUDA timer's untimed step: host times) */
            v->host = !c->host;
            if (as_ll(ph->t_start, &t0) < 0 || as_ll(ph->t_end, &t1) < 0)
                return -1;
            t0 += c->offset;
            t1 += c->offset;
            kind = Py_None;
        }
        else {
            /* Held across interval_kind, which may release the GIL around the elapsed-time read. */
            PyObject *t_start = Py_NewRef(ph->t_start), *t_end = Py_NewRef(ph->t_end);
            int bad = interval_kind(f, c, t_start, t_end, &t0, &t1, &kind) < 0;
            Py_DECREF(t_start);
            Py_DECREF(t_end);
            if (bad)
                return -1;
        }
        if (!any || t0 < lo)
            lo = t0;
        if (!any || t1 > hi)
            hi = t1;
        any = 1;
        int graph = PyObject_IsTrue(ph->graph != Py_None ? ph->graph : ph->graph_hook);
        if (graph < 0)
            return -1;
        long long launch;
        if (as_ll(ph->launch_ns, &launch) < 0)
            return -1;
        if (v->n >= timed) { /* the phases list changed under the elapsed-time read */
            PyErr_SetString(PyExc_RuntimeError, "sgl-probe: a step's phases changed while it was resolved");
            return -1;
        }
        PhaseVals *pv = &v->ph[v->n];
        pv->ph = ph;
        pv->t0 = t0;
        pv->t1 = t1;
        pv->kind = kind;
        pv->graph = graph;
        pv->has_graph_ms = launch != 0;
        pv->graph_ms = 0.0;
        if (launch) {
            /* The GPU may still have been busy with earlier work when the graph was launched: then
               the graph's time starts where the phase's does. */
            launch += c->offset;
            double g = (double)(t1 - (launch > t0 ? launch : t0)) / 1e6;
            pv->graph_ms = g < 0 ? 0.0 : g;
        }
        if ((pv->error = error_or_none(c, ph->error)) == NULL)
            return -1;
        v->n++;
    }
    if (v->n != timed) {
        PyErr_SetString(PyExc_RuntimeError, "sgl-probe: a step's phases changed while it was resolved");
        return -1;
    }
    long long h0, h1;
    if (as_ll(st->host0, &h0) < 0 || as_ll(st->host1, &h1) < 0)
        return -1;
    v->w0 = h0 + c->offset;
    v->w1 = h1 + c->offset;
    if (any && lo < v->w0)
        v->w0 = lo;
    if (any && hi > v->w1)
        v->w1 = hi;
    return (v->error = error_or_none(c, st->error)) == NULL ? -1 : 0;
}

/* The row (see sgl_probe.drain) of a step resolve_vals resolved. */
static PyObject *
row_of_vals(TakeCtx *c, StepRecordObject *st, StepVals *v)
{
    PyObject *phases = PyTuple_New(v->n), *row = NULL;
    if (phases == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        PhaseVals *pv = &v->ph[k];
        PhaseRecordObject *ph = pv->ph;
        PyObject *graph_ms = pv->has_graph_ms ? PyFloat_FromDouble(pv->graph_ms) : Py_NewRef(Py_None);
        PyObject *o_t0 = PyLong_FromLongLong(pv->t0), *o_t1 = PyLong_FromLongLong(pv->t1);
        PyObject *host_ms = ms_of(ph->host0, ph->host1);
        PyObject *item = NULL;
        if (graph_ms && o_t0 && o_t1 && host_ms)
            item = PyTuple_Pack(14, ph->phase, o_t0, o_t1, pv->graph ? Py_True : Py_False, ph->mode, ph->batch_size,
                                ph->num_tokens, host_ms, ph->target, ph->accept_length, pv->kind,
                                pv->graph ? Py_None : ph->no_graph_reason, pv->error, graph_ms);
        Py_XDECREF(graph_ms);
        Py_XDECREF(o_t0);
        Py_XDECREF(o_t1);
        Py_XDECREF(host_ms);
        if (item == NULL)
            goto fail;
        PyTuple_SET_ITEM(phases, k, item);
    }
    PyObject *o_w0 = PyLong_FromLongLong(v->w0), *o_w1 = PyLong_FromLongLong(v->w1);
    PyObject *step_ms = ms_of(st->host0, st->host1);
    if (o_w0 && o_w1 && step_ms)
        row = PyTuple_Pack(10, st->index, o_w0, o_w1, st->mode, st->batch_size, st->num_tokens, step_ms,
                           c->host ? s_cpu : v->host ? s_host : s_cuda, phases, v->error);
    Py_XDECREF(o_w0);
    Py_XDECREF(o_w1);
    Py_XDECREF(step_ms);
fail:
    Py_DECREF(phases);
    return row;
}

/* CudaTimer.release for every phase of a step: its events back to the pool (``append``: the
   timer's _returned.append). */
static int
release_step(CudaFastObject *f, StepRecordObject *st, PyObject *append)
{
    Py_ssize_t n = PyList_GET_SIZE(st->phases);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ph = PyList_GET_ITEM(st->phases, i);
        PyObject *start = PHASE_GET(ph, t_start);
        PyObject *end = start == NULL ? NULL : PHASE_GET(ph, t_end);
        int rc = end == NULL ? -1 : 0;
        if (rc == 0 && PyTuple_Check(start) && PyTuple_GET_SIZE(start) > 2 && PyTuple_GET_ITEM(start, 2) != Py_None) {
            PyObject *r = PyObject_CallOneArg(append, PyTuple_GET_ITEM(start, 2));
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        if (rc == 0 && PyTuple_Check(end) && PyTuple_GET_SIZE(end) == 4) {
            PyObject *anchor = PyTuple_GET_ITEM(end, 3);
            if (!PyTuple_Check(anchor) || PyTuple_GET_SIZE(anchor) < 1 ||
                PyTuple_GET_ITEM(end, 0) != PyTuple_GET_ITEM(anchor, 0)) {
                PyObject *r = PyObject_CallOneArg(append, PyTuple_GET_ITEM(end, 0));
                rc = r == NULL ? -1 : 0;
                Py_XDECREF(r);
            }
        }
        Py_XDECREF(start);
        Py_XDECREF(end);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* The TakeCtx of a call's arguments (elapsed, elapsed_address, keep_gil, kinds[, error_text]). */
static int
take_ctx(CudaFastObject *f, TakeCtx *c, PyObject *const *args, PyObject *error_text)
{
    void *direct = PyLong_AsVoidPtr(args[1]);
    int keep_gil = PyObject_IsTrue(args[2]);
    if (PyErr_Occurred() || keep_gil < 0)
        return -1;
    PyObject *kinds = args[3];
    if (!PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != 2) {
        PyErr_SetString(PyExc_TypeError, "kinds: (gpu_event, host_clock)");
        return -1;
    }
    c->elapsed = args[0];
    c->direct = (elapsed_time_fn)direct;
    c->keep_gil = keep_gil;
    c->gpu_event = PyTuple_GET_ITEM(kinds, 0);
    c->host_clock = PyTuple_GET_ITEM(kinds, 1);
    c->error_text = error_text;
    c->host = 0;
    c->ahead = NULL;
    c->n_ahead = c->next_ahead = 0;
    c->timer = f->timer;
    c->fast = f;
    c->reader_now = NULL;
    PyObject *v = state_need(f, s__offset);
    if (v == NULL || as_ll(v, &c->offset) < 0)
        return -1;
    return attr_ll(f->timer, s__ANCHOR_TOLERANCE_NS, &c->tolerance);
}

/* What a take() call held: the reads ahead and the reader that took over. */
static void
take_ctx_free(TakeCtx *c)
{
    for (Py_ssize_t i = 0; i < c->n_ahead; i++) {
        Py_DECREF(c->ahead[i].a);
        Py_DECREF(c->ahead[i].b);
    }
    PyMem_Free(c->ahead);
    c->ahead = NULL;
    c->n_ahead = c->next_ahead = 0;
    Py_CLEAR(c->reader_now);
}

/* interval(start, end, elapsed, elapsed_address, keep_gil, kinds) -> (t0, t1, kind):
   CudaTimer.interval_kind. */
static PyObject *
fast_interval(CudaFastObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "interval(start, end, elapsed, elapsed_address, keep_gil, kinds)");
        return NULL;
    }
    TakeCtx c;
    long long t0, t1;
    PyObject *kind;
    if (take_ctx(f, &c, args + 2, Py_None) < 0)
        return NULL;
    PyObject *r = interval_kind(f, &c, args[0], args[1], &t0, &t1, &kind) < 0 ? NULL : Py_BuildValue("LLO", t0, t1, kind);
    take_ctx_free(&c);
    return r;
}

/* Appends the pair (a, b) to read ahead, with its events' handles; 0 stop collecting (no error
   set: the pair is read when it comes, as without the read-ahead), -1 out of memory. */
static int
ahead_add(TakeCtx *c, Py_ssize_t *cap, void ***handles, PyObject *a, PyObject *b)
{
    void *ha, *hb;
    if (event_handle(c->fast, a, 0, &ha) < 0 || event_handle(c->fast, b, 0, &hb) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (c->n_ahead == *cap) {
        Py_ssize_t more = *cap ? 2 * *cap : 32;
        Ahead *x = PyMem_Realloc(c->ahead, more * sizeof(Ahead));
        if (x != NULL)
            c->ahead = x;
        void **h = x == NULL ? NULL : PyMem_Realloc(*handles, 2 * more * sizeof(void *));
        if (h == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *handles = h;
        *cap = more;
    }
    Ahead *x = &c->ahead[c->n_ahead];
    x->a = Py_NewRef(a);
    x->b = Py_NewRef(b);
    x->err = -1;
    (*handles)[2 * c->n_ahead] = ha;
    (*handles)[2 * c->n_ahead + 1] = hb;
    c->n_ahead++;
    return 1;
}

/* Where the reads release the GIL (CudaTimer.elapsed_keeps_gil off: benchmarks measure it so):
   the elapsed times the loop over the first n steps will ask for, in the order interval_kind asks
   (anchor to end; anchor to start where the phase recorded one), read with one release of the GIL
   instead of one per read: a scheduler thread that takes the GIL at each release makes this
   thread wait for it again each time, which costs it a wake-up on cold caches. The loop takes each
   answer when it asks for that pair (elapsed_ns); anything else is read as it comes. */
static int
read_ahead(TakeCtx *c, PyObject *steps, Py_ssize_t n)
{
    if (c->direct == NULL || c->keep_gil || n <= 0)
        return 0;
    Py_ssize_t cap = 0;
    void **handles = NULL;
    int go = 1;
    SECTION_T0(sec);
    PyObject *it = PyObject_GetIter(steps);
    if (it == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n && go > 0; i++) {
        PyObject *st = PyIter_Next(it);
        if (st == NULL)
            break;
        if (Py_TYPE(st) != &StepRecordType) {
            Py_DECREF(st);
            break;
        }
        PyObject *phases = ((StepRecordObject *)st)->phases;
        for (Py_ssize_t j = 0; go > 0 && PyList_Check(phases) && j < PyList_GET_SIZE(phases); j++) {
            PhaseRecordObject *ph = (PhaseRecordObject *)PyList_GET_ITEM(phases, j);
            if (Py_TYPE(ph) != &PhaseRecordType || ph->t_end == Py_None)
                continue;
            PyObject *end = ph->t_end, *start = ph->t_start;
            if (PyLong_CheckExact(end)) /* an untimed step: nothing to read */
                continue;
            if (!PyTuple_Check(end) || PyTuple_GET_SIZE(end) != 4 || !PyTuple_Check(start) ||
                PyTuple_GET_SIZE(start) < 2 || !PyTuple_Check(PyTuple_GET_ITEM(end, 3)) ||
                PyTuple_GET_SIZE(PyTuple_GET_ITEM(end, 3)) != 2) {
                go = 0;
                break;
            }
            PyObject *anchor_ev = PyTuple_GET_ITEM(PyTuple_GET_ITEM(end, 3), 0);
            if (anchor_ev != PyTuple_GET_ITEM(end, 0))
                go = ahead_add(c, &cap, &handles, anchor_ev, PyTuple_GET_ITEM(end, 0));
            if (go > 0 && PyTuple_GET_SIZE(start) > 2 && PyTuple_GET_ITEM(start, 2) != Py_None)
                go = ahead_add(c, &cap, &handles, anchor_ev, PyTuple_GET_ITEM(start, 2));
        }
        Py_DECREF(st);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        PyMem_Free(handles);
        return -1;
    }
    SECTION_ADD(drain_collect, sec);
    if (c->n_ahead > 0) {
        Ahead *x = c->ahead;
        Py_ssize_t k = c->n_ahead;
        elapsed_time_fn direct = c->direct;
        Py_BEGIN_ALLOW_THREADS
        SECTION_RESTART(sec);
        for (Py_ssize_t i = 0; i < k; i++)
            x[i].err = direct(&x[i].ms, handles[2 * i], handles[2 * i + 1]);
        SECTION_ADD(drain_reads, sec); /* only the drain thread runs this section */
        Py_END_ALLOW_THREADS
        SECTION_ADD(drain_regain, sec);
    }
    PyMem_Free(handles);
    return 0;
}


/* The shapes of this call's recent phases (new references): a phase whose five shape fields are
   the very objects of one of them shares its tuple without building, hashing and looking up
   another (a steady server repeats a few shapes step after step). Each is ``seen``'s own tuple
   (so not a first call any more), or one ``seen`` had no room for (nor will it: it only grows). */
#define RECENT_SHAPES 8
typedef struct {
    PyObject *shape[RECENT_SHAPES];
    int n, next;
} RecentShapes;

/* What one summary_add call (or one packed take) reads once: Summary's containers and the two
   decode histories' ``append`` (graph, no graph). */
typedef struct SummaryCtx {
    PyObject *seen, *window, *launch, *accepts, *decode;
    Py_ssize_t max_shapes;
    PyObject *decode_append[2];
    RecentShapes recent;
} SummaryCtx;

static int summary_ctx(SummaryCtx *x, PyObject *const *args);
static void summary_ctx_free(SummaryCtx *x);

/* The packed pass (PackedSteps: defined with the link's layout). */
typedef struct PackedObject PackedObject;
static PyTypeObject PackedStepsType;
static int pack_sampled(PackedObject *pk, TakeCtx *c, StepRecordObject *st, StepVals *v, SamplerObject *smp);
static int packed_full(PackedObject *pk);
static int summary_vals(SummaryCtx *x, StepVals *v);

/* The packed pass's metrics (PhaseMetrics.c_state; the functions are metrics_add's). */
/* A histogram's list and bounds, read once, and the key it was found under (held: the packed
   pass's keys are the records' values, which the records let go of once taken). */
typedef struct {
    PyObject *hist, *data, *bounds;
    PyObject *k0, *k1, *k2;
} HistRef;

typedef struct MetricsCtx MetricsCtx;
/* What PhaseMetrics.observe_rows changes, and the series the last step and phase went to (held). */
struct MetricsCtx {
    PyObject *steps_of, *phase_of, *new_steps, *new_hist, *accept_hist; /* borrowed */
    PyObject *errors; /* the packed pass's: where an Exception goes (borrowed); NULL: raised */
    int off;          /* an Exception went there: nothing more this call */
    PyObject *last_mode, *last_steps;
    HistRef ph_ref, acc_ref;
};

static int metrics_vals(MetricsCtx *m, StepRecordObject *st, StepVals *v);

/* The steps take_loop has popped ahead of the one it takes (held, oldest at ``head``): each pass
   of the loop asks for the lines of the next steps a level deeper the nearer it comes (the step,
   its phases list, the list's items, the phase records, what their tokens hold), so the misses of
   several steps overlap instead of the loop waiting out each one in turn. On a server the records
   were written a second ago by another thread, and SGLang's work since has evicted them. */
#define TAKE_AHEAD 8
typedef struct {
    PyObject *st[TAKE_AHEAD];
    int head, n;
} Ahead8;

/* The prefetches for the step ``pos`` places ahead of the next one taken (0: the next). A level
   reads only what the level before it fetched one pass earlier. */
static void
take_warm_one(PyObject *o, int pos)
{
    if (pos >= 4) {
        pf(o);
        pf((char *)o + 64);
        return;
    }
    if (Py_TYPE(o) != &StepRecordType)
        return;
    StepRecordObject *st = (StepRecordObject *)o;
    PyObject *phases = st->phases;
    if (pos == 3) {
        pf(phases);
        pf(st->host0);
        pf(st->host1);
        pf(st->index);
        return;
    }
    if (phases == NULL || !PyList_CheckExact(phases))
        return;
    Py_ssize_t m = PyList_GET_SIZE(phases);
    if (m > 4)
        m = 4;
    PyObject **items = ((PyListObject *)phases)->ob_item;
    if (pos == 2) {
        pf(items);
        return;
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *ph = items[k];
        if (pos == 1) {
            pf(ph);
            pf((char *)ph + 64);
            pf((char *)ph + 128);
            continue;
        }
        if (Py_TYPE(ph) != &PhaseRecordType)
            continue;
        PhaseRecordObject *pr = (PhaseRecordObject *)ph;
        pf(pr->t_start);
        pf(pr->t_end);
        pf(pr->host0);
        pf(pr->host1);
        pf(pr->launch_ns);
    }
}

static void
take_warm(Ahead8 *ah)
{
    for (int j = 0; j < ah->n; j++)
        take_warm_one(ah->st[(ah->head + j) % TAKE_AHEAD], j);
}

/* The steps popped ahead back at the front of ``steps``, in order (their references given back). */
static int
ahead_return(PyObject *steps, Ahead8 *ah)
{
    int rc = 0;
    for (int j = ah->n - 1; j >= 0; j--) {
        PyObject *x = ah->st[(ah->head + j) % TAKE_AHEAD];
        if (rc == 0) {
            PyObject *r = PyObject_CallMethodOneArg(steps, s_appendleft, x);
            if (r == NULL)
                rc = -1;
            Py_XDECREF(r);
        }
        Py_DECREF(x);
    }
    ah->n = 0;
    return rc;
}

/* drain.take_ready's loop: pops n steps off ``steps``, appends each one's row to ``out`` and (CUDA
   timer, ``f``) releases its events; a step that cannot be resolved goes to on_drop(step, exc)
   instead, its events released all the same. Stops at a step the Python wrappers made (the
   caller's Python loop resolves it); returns how many it took.
   ``pk``: the packed pass. Each step is written into that link message instead of becoming a row,
   unless a value has no tag in the layout: then it is a row in ``out`` as without ``pk``; either
   way (``sx``) it is added to the summary here, in step order, and (``mx``) to the metrics, where
   an Exception turns them off for the rest of the call and is handed back (metrics_vals), not
   raised: the step is in the message already. Stops before a step once the message is full (its
   ``full`` says so). */
static PyObject *
take_loop(CudaFastObject *f, TakeCtx *c, PyObject *steps, Py_ssize_t n, PyObject *out, PyObject *on_drop,
          PackedObject *pk, SummaryCtx *sx, MetricsCtx *mx, SamplerObject *smp)
{
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "take: out is a list");
        return NULL;
    }
    /* The bound methods this loop calls for every step, read once. */
    PyObject *popleft = PyObject_GetAttr(steps, s_popleft), *release = NULL, *result = NULL;
    Ahead8 ah = {.head = 0, .n = 0};
    Py_ssize_t popped = 0;
    if (popleft == NULL)
        return NULL;
    if (f != NULL) {
        PyObject *returned = state_need(f, s__returned);
        if (returned == NULL || (release = PyObject_GetAttr(returned, s_append)) == NULL)
            goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pk != NULL && packed_full(pk)) {
            result = PyLong_FromSsize_t(i);
            goto done;
        }
        SECTION_T0(sec);
        while (ah.n < TAKE_AHEAD && popped < n) {
            PyObject *x = PyObject_CallNoArgs(popleft);
            if (x == NULL)
                goto done;
            ah.st[(ah.head + ah.n++) % TAKE_AHEAD] = x;
            popped++;
        }
        PyObject *st = ah.st[ah.head];
        ah.head = (ah.head + 1) % TAKE_AHEAD;
        ah.n--;
        take_warm(&ah);
        SECTION_ADD(drain_pop, sec);
        if (Py_TYPE(st) != &StepRecordType) {
            /* Back at the front of the ones popped ahead, which all go back below: the caller's
               Python loop takes it. */
            ah.head = (ah.head + TAKE_AHEAD - 1) % TAKE_AHEAD;
            ah.st[ah.head] = st;
            ah.n++;
            result = PyLong_FromSsize_t(i);
            goto done;
        }
        PyObject *row = NULL;
        int packed = 0, summed = 0;
        StepVals v;
        if (resolve_vals(f, c, (StepRecordObject *)st, &v) == 0) {
            if (pk != NULL && (packed = pack_sampled(pk, c, (StepRecordObject *)st, &v, smp)) < 0) {
                packed = 1;
                summed = -1;
            }
            if (!packed)
                row = row_of_vals(c, (StepRecordObject *)st, &v);
            SECTION_ADD(drain_resolve, sec);
            /* in step order, row or not; an untimed step's host times stay out of the summary */
            if (sx != NULL && !v.host && (packed || row != NULL) && summed >= 0) {
                if (summary_vals(sx, &v) < 0) {
                    summed = -1;
                    Py_CLEAR(row);
                }
                SECTION_ADD(drain_summary, sec);
            }
            if (mx != NULL && (packed || row != NULL) && summed >= 0) {
                if (metrics_vals(mx, (StepRecordObject *)st, &v) < 0) { /* a BaseException */
                    summed = -1;
                    Py_CLEAR(row);
                }
                SECTION_ADD(drain_metrics, sec);
            }
        }
        vals_free(&v);
        int rc = 0;
        if (row != NULL) {
            rc = PyList_Append(out, row);
            Py_DECREF(row);
        }
        else if (packed && summed >= 0) {
            /* in the message (and the summary) */
        }
        else if (!packed && summed >= 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyObject *type, *value, *tb;
            fetch_exception(&type, &value, &tb);
            PyObject *r = PyObject_CallFunctionObjArgs(on_drop, st, value ? value : Py_None, NULL);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        else { /* a BaseException, or the summary's error: released all the same (Python's
                  ``finally``), then raised */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            if (f != NULL && release_step(f, (StepRecordObject *)st, release) < 0)
                PyErr_Clear();
            PyErr_Restore(type, value, tb);
            Py_DECREF(st);
            goto done;
        }
        if (f != NULL && release_step(f, (StepRecordObject *)st, release) < 0)
            rc = -1;
        Py_DECREF(st);
        if (f != NULL) {
            SECTION_ADD(drain_release, sec);
        }
        if (rc < 0)
            goto done;
    }
    result = PyLong_FromSsize_t(n);
done:
    if (ah.n > 0) { /* stopped early: the steps popped ahead go back, in order, untaken */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (ahead_return(steps, &ah) < 0) { /* that error stands instead */
            Py_CLEAR(result);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        else {
            PyErr_Restore(type, value, tb);
        }
    }
    Py_DECREF(popleft);
    Py_XDECREF(release);
    return result;
}

static int metrics_ctx(MetricsCtx *m, PyObject *state);
static void metrics_ctx_free(MetricsCtx *m);

/* The packed pass's optional arguments: (packed, summary[, metrics[, sampler]]), summary None or
   summary_add's (seen, max_shapes, window, launch, accepts, decode), metrics None or
   PhaseMetrics.c_state()'s (steps_of, phase_of, new_steps, new_hist, accept_hist, errors), sampler
   None or StepSampling.c_state()'s StepSampler (a step it drops is summed up, not written). 1 given
   (``*sx`` / ``*mx`` set up where given: free them with packed_args_free), 0 not, -1 error. */
static int
take_packed_args(PyObject *const *args, Py_ssize_t extra, PackedObject **pk, SummaryCtx *sx, int *has_sx,
                 MetricsCtx *mx, int *has_mx, SamplerObject **smp)
{
    *pk = NULL;
    *smp = NULL;
    *has_sx = *has_mx = 0;
    if (extra == 0)
        return 0;
    if (extra < 2 || extra > 4 || !Py_IS_TYPE(args[0], &PackedStepsType) ||
        (args[1] != Py_None && (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 6)) ||
        (extra == 4 && args[3] != Py_None && !Py_IS_TYPE(args[3], &StepSamplerType))) {
        PyErr_SetString(PyExc_TypeError,
                        "take: packed is a PackedSteps, summary None or a 6-tuple, sampler None or a StepSampler");
        return -1;
    }
    *pk = (PackedObject *)args[0];
    if (extra == 4 && args[3] != Py_None)
        *smp = (SamplerObject *)args[3];
    if (args[1] != Py_None) {
        *has_sx = 1;
        if (summary_ctx(sx, &PyTuple_GET_ITEM(args[1], 0)) < 0)
            return -1;
    }
    if (extra >= 3 && args[2] != Py_None) {
        *has_mx = 1;
        if (metrics_ctx(mx, args[2]) < 0)
            return -1;
    }
    return 1;
}

static void
packed_args_free(SummaryCtx *sx, int has_sx, MetricsCtx *mx, int has_mx)
{
    if (has_sx)
        summary_ctx_free(sx);
    if (has_mx)
        metrics_ctx_free(mx);
}

/* take(steps, n, out, elapsed, elapsed_address, keep_gil, kinds, error_text, on_drop[, packed,
   summary[, metrics[, sampler]]]): take_loop for this CUDA timer. */
static PyObject *
fast_take(CudaFastObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 && (nargs < 11 || nargs > 13)) {
        PyErr_SetString(PyExc_TypeError, "take(steps, n, out, elapsed, elapsed_address, keep_gil, kinds, error_text, "
                                         "on_drop[, packed, summary[, metrics[, sampler]]])");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    PackedObject *pk;
    SamplerObject *smp;
    SummaryCtx sx;
    MetricsCtx mx;
    int has_sx, has_mx;
    int given = take_packed_args(args + 9, nargs - 9, &pk, &sx, &has_sx, &mx, &has_mx, &smp);
    TakeCtx c;
    PyObject *r = NULL;
    if (given >= 0 && take_ctx(f, &c, args + 3, args[7]) == 0) {
        if (read_ahead(&c, args[0], n) == 0)
            r = take_loop(f, &c, args[0], n, args[2], args[8], pk, has_sx ? &sx : NULL, has_mx ? &mx : NULL, smp);
        take_ctx_free(&c);
    }
    packed_args_free(&sx, has_sx, &mx, has_mx);
    return r;
}

/* take_host(steps, n, out, offset, error_text, on_drop[, packed, summary[, metrics[, sampler]]]):
   take_loop for the CPU timer (tokens are host-clock values, mapped by adding ``offset``). */
static PyObject *
hot_take_host(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 && (nargs < 8 || nargs > 10)) {
        PyErr_SetString(PyExc_TypeError,
                        "take_host(steps, n, out, offset, error_text, on_drop[, packed, summary[, metrics[, sampler]]])");
        return NULL;
    }
    TakeCtx c = {0};
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if ((n == -1 && PyErr_Occurred()) || as_ll(args[3], &c.offset) < 0)
        return NULL;
    c.host = 1;
    c.error_text = args[4];
    PackedObject *pk;
    SamplerObject *smp;
    SummaryCtx sx;
    MetricsCtx mx;
    int has_sx, has_mx;
    PyObject *r = NULL;
    if (take_packed_args(args + 6, nargs - 6, &pk, &sx, &has_sx, &mx, &has_mx, &smp) >= 0)
        r = take_loop(NULL, &c, args[0], n, args[2], args[5], pk, has_sx ? &sx : NULL, has_mx ? &mx : NULL, smp);
    packed_args_free(&sx, has_sx, &mx, has_mx);
    return r;
}

static PyObject *
fast_runtime_get(CudaFastObject *f, void *closure)
{
    return PyBool_FromLong(f->event_record != NULL);
}

static PyObject *
fast_methods_known_get(CudaFastObject *f, void *closure)
{
    return PyBool_FromLong(fast_methods_known(f));
}

static PyObject *
fast_stream_c_get(CudaFastObject *f, void *closure)
{
    return PyBool_FromLong(f->get_stream != NULL);
}

static PyObject *
fast_handles_kept_get(CudaFastObject *f, void *closure)
{
    return PyLong_FromSsize_t(f->evh_n);
}

/* The kept values (see CudaFastObject), as CudaTimer's ``_anchor_due``, ``_last_end``, ``_chain``. */
static PyObject *
fast_anchor_due_get(CudaFastObject *f, void *closure)
{
    return PyLong_FromLongLong(f->anchor_due);
}

static int
fast_anchor_due_set(CudaFastObject *f, PyObject *v, void *closure)
{
    long long due;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "anchor_due cannot be deleted");
        return -1;
    }
    if (as_ll(v, &due) < 0)
        return -1;
    f->anchor_due = due;
    return 0;
}

static PyObject *
fast_anchor_busy_get(CudaFastObject *f, void *closure)
{
    return PyBool_FromLong(f->anchor_busy);
}

static int
fast_anchor_busy_set(CudaFastObject *f, PyObject *v, void *closure)
{
    int busy = v == NULL ? -1 : PyObject_IsTrue(v);
    if (busy < 0) {
        if (v == NULL)
            PyErr_SetString(PyExc_AttributeError, "anchor_busy cannot be deleted");
        return -1;
    }
    f->anchor_busy = busy;
    return 0;
}

/* A kept object (closure: its KEPT index). */
static PyObject *
fast_kept_get(CudaFastObject *f, void *closure)
{
    return Py_NewRef(*KEPT_AT(f, (int)(intptr_t)closure));
}

static int
fast_kept_set(CudaFastObject *f, PyObject *v, void *closure)
{
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a kept attribute of the CUDA timer cannot be deleted");
        return -1;
    }
    Py_SETREF(*KEPT_AT(f, (int)(intptr_t)closure), Py_NewRef(v));
    return 0;
}

static PyObject *
fast_chain_get(CudaFastObject *f, void *closure)
{
    PyObject *t = PyLong_FromLongLong(f->chain_t);
    if (t == NULL)
        return NULL;
    PyObject *r = PyTuple_Pack(2, f->chain_end, t);
    Py_DECREF(t);
    return r;
}

static int
fast_chain_set(CudaFastObject *f, PyObject *v, void *closure)
{
    long long t;
    if (v == NULL || !PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
        PyErr_SetString(PyExc_TypeError, "chain: (end token, mapped ns)");
        return -1;
    }
    if (as_ll(PyTuple_GET_ITEM(v, 1), &t) < 0)
        return -1;
    Py_SETREF(f->chain_end, Py_NewRef(PyTuple_GET_ITEM(v, 0)));
    f->chain_t = t;
    return 0;
}

static PyObject *
fast_stride_get(CudaFastObject *f, void *closure)
{
    return PyLong_FromLongLong(f->stride);
}

static PyObject *
fast_gpu_run_get(CudaFastObject *f, void *closure)
{
    return PyLong_FromLongLong(f->gpu_run);
}

/* Benchmarks set it (the pause shim's SGL_BENCH_GPU_RUN) to measure runs against lone steps. */
static int
fast_gpu_run_set(CudaFastObject *f, PyObject *v, void *closure)
{
    long long n;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "gpu_run cannot be deleted");
        return -1;
    }
    if (as_ll(v, &n) < 0 || gpu_run_check(n) < 0)
        return -1;
    f->gpu_run = n;
    return 0;
}

static PyGetSetDef fast_getset[] = {
    {"stride", (getter)fast_stride_get, NULL, "CudaTimer.gpu_stride: one step in this many timed on the GPU", NULL},
    {"gpu_run", (getter)fast_gpu_run_get, (setter)fast_gpu_run_set, "CudaTimer._GPU_RUN", NULL},
    {"anchor_due", (getter)fast_anchor_due_get, (setter)fast_anchor_due_set, "CudaTimer._anchor_due", NULL},
    {"anchor_busy", (getter)fast_anchor_busy_get, (setter)fast_anchor_busy_set, "CudaTimer._anchor_busy", NULL},
    {"last_end", (getter)fast_kept_get, (setter)fast_kept_set, "CudaTimer._last_end", (void *)KEPT_LAST_END},
    {"pool", (getter)fast_kept_get, (setter)fast_kept_set, "CudaTimer._pool", (void *)KEPT_POOL},
    {"anchors", (getter)fast_kept_get, (setter)fast_kept_set, "CudaTimer._anchors", (void *)KEPT_ANCHORS},
    {"raw_stream", (getter)fast_kept_get, (setter)fast_kept_set, "CudaTimer._raw_stream", (void *)KEPT_RAW_STREAM},
    {"chain", (getter)fast_chain_get, (setter)fast_chain_set, "CudaTimer._chain", NULL},
    {"runtime", (getter)fast_runtime_get, NULL, "whether stop() calls the CUDA runtime itself", NULL},
    {"methods_known", (getter)fast_methods_known_get, NULL,
     "whether start / stop are known to be this object's own without a look-up (a watched dict)", NULL},
    {"stream_c", (getter)fast_stream_c_get, NULL, "whether the current stream comes from torch's C entry point", NULL},
    {"handles_kept", (getter)fast_handles_kept_get, NULL, "how many events' raw handles are kept", NULL},
    {NULL},
};

static PyMethodDef fast_methods[] = {
    {"start", (PyCFunction)(void (*)(void))fast_start, METH_FASTCALL, "CudaTimer.start(now_ns) -> token"},
    {"stop", (PyCFunction)(void (*)(void))fast_stop, METH_FASTCALL, "CudaTimer.stop(token, now_ns) -> end | None"},
    {"take", (PyCFunction)(void (*)(void))fast_take, METH_FASTCALL, "drain.take_ready's loop for this timer"},
    {"interval", (PyCFunction)(void (*)(void))fast_interval, METH_FASTCALL, "CudaTimer.interval_kind"},
    {NULL},
};

static PyTypeObject CudaFastType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sgl_probe._hot.CudaFast",
    .tp_doc = "CudaTimer's start / stop in C, over the timer's own state (its instance dict).",
    .tp_basicsize = sizeof(CudaFastObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = fast_new,
    .tp_dealloc = tracked_dealloc,
    .tp_traverse = (traverseproc)fast_traverse,
    .tp_clear = (inquiry)fast_clear,
    .tp_methods = fast_methods,
    .tp_getset = fast_getset,
};

/* ---- the phase wrapper's calls of its timer ---------------------------------------------- */

/* The timer's C half (its ``_c``, a CudaFast over this very timer), or NULL; remembered per timer
   object, so the look-up runs once per timer. -1 on error. */
static int
timer_fast(HookObject *h, PyObject *timer, CudaFastObject **out)
{
    if (timer != h->timer_seen) {
        PyObject *c = getattr_maybe(timer, s__c);
        if (c == NULL && PyErr_Occurred())
            return -1;
        if (c == NULL || !Py_IS_TYPE(c, &CudaFastType) || ((CudaFastObject *)c)->timer != timer)
            Py_XSETREF(c, Py_NewRef(Py_None));
        Py_SETREF(h->fast_seen, c);
        Py_SETREF(h->timer_seen, Py_NewRef(timer));
    }
    *out = h->fast_seen == Py_None ? NULL : (CudaFastObject *)h->fast_seen;
    return 0;
}

/* rec.timer.<name>(...). Where ``<name>`` is still the timer's C method (what CudaTimer sets in its
   instance dict, which tests and benchmarks may replace), it is called directly: the attribute
   machinery's look-ups (the class's, then the instance's) and the bound method's call are a few
   cache-cold reads on every phase's start and end. */
static PyObject *
timer_call(HookObject *h, PyObject *name, PyObject *const *args, Py_ssize_t n)
{
    PyObject *timer = attr_at(h->rec, h->timer_offset, s_timer);
    if (timer == NULL)
        return NULL;
    CudaFastObject *f;
    if (timer_fast(h, timer, &f) < 0) {
        Py_DECREF(timer);
        return NULL;
    }
    if (f != NULL) {
        if (fast_methods_known(f) && (name == s_start || name == s_stop)) {
            PyObject *r = name == s_start ? fast_start(f, args, n) : fast_stop(f, args, n);
            Py_DECREF(timer);
            return r;
        }
        PyObject *m = PyDict_GetItemWithError(f->state, name);
        if (m != NULL && PyCFunction_Check(m) && PyCFunction_GET_SELF(m) == (PyObject *)f) {
            PyCFunction meth = PyCFunction_GET_FUNCTION(m);
            PyObject *r = NULL;
            if (meth == (PyCFunction)(void (*)(void))fast_start)
                r = fast_start(f, args, n);
            else if (meth == (PyCFunction)(void (*)(void))fast_stop)
                r = fast_stop(f, args, n);
            else
                goto generic;
            if (r != NULL && fast_methods_stale(f))
                fast_methods_seen(f);
            Py_DECREF(timer);
            return r;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(timer);
            return NULL;
        }
    }
generic:;
    PyObject *fn = PyObject_GetAttr(timer, name);
    Py_DECREF(timer);
    if (fn == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
    Py_DECREF(fn);
    return r;
}

/* CpuTimer.start / .stop: the host clock itself is the token. */
static PyObject *
cpu_start(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "start(now_ns[, step])");
        return NULL;
    }
    return Py_NewRef(args[0]);
}

static PyObject *
cpu_stop(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "stop(token, now_ns)");
        return NULL;
    }
    return Py_NewRef(args[1]);
}

/* ---- module ---------------------------------------------------------------------------------- */

static PyObject *
hot_now_ns(PyObject *mod, PyObject *unused)
{
    return clock_ns();
}

/* ---- which steps the drain may take (drain.take_ready's checks) ----------------------------- */


/* A step's phases (C or Python record) as a fast sequence (new reference). */
static PyObject *
step_phases(PyObject *st)
{
    PyObject *phases = STEP_GET(st, phases);
    PyObject *seq = phases == NULL ? NULL : PySequence_Fast(phases, "sgl-probe: a step's phases");
    Py_XDECREF(phases);
    return seq;
}

/* drain._timers_done for a timer with ``ready_prefix``: the end tokens of the first n steps' timed
   phases in record order, asked at once; how many steps have all of theirs completed. */
static Py_ssize_t
timers_done(PyObject *steps, Py_ssize_t n, PyObject *prefix)
{
    Py_ssize_t result = -1, cap = 64, count = 0;
    Py_ssize_t *owner = PyMem_Malloc(cap * sizeof(Py_ssize_t));
    PyObject *ends = PyList_New(0), *it = PyObject_GetIter(steps);
    if (owner == NULL || ends == NULL || it == NULL) {
        if (owner == NULL)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyIter_Next(it);
        if (st == NULL) {
            if (PyErr_Occurred())
                goto done;
            break;
        }
        PyObject *seq = step_phases(st);
        Py_DECREF(st);
        if (seq == NULL)
            goto done;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
            PyObject *end = PHASE_GET(PySequence_Fast_GET_ITEM(seq, j), t_end);
            if (end == NULL) {
                Py_DECREF(seq);
                goto done;
            }
            /* (an untimed step's host clock ends: ready once the timed steps before them are) */
            if (end != Py_None && !PyLong_CheckExact(end)) {
                if (count == cap) {
                    Py_ssize_t *more = PyMem_Realloc(owner, 2 * cap * sizeof(Py_ssize_t));
                    if (more == NULL) {
                        PyErr_NoMemory();
                        Py_DECREF(end);
                        Py_DECREF(seq);
                        goto done;
                    }
                    owner = more;
                    cap *= 2;
                }
                owner[count++] = i;
                if (PyList_Append(ends, end) < 0) {
                    Py_DECREF(end);
                    Py_DECREF(seq);
                    goto done;
                }
            }
            Py_DECREF(end);
        }
        Py_DECREF(seq);
    }
    PyObject *got = PyObject_CallOneArg(prefix, ends);
    if (got == NULL)
        goto done;
    Py_ssize_t k = PyLong_AsSsize_t(got);
    Py_DECREF(got);
    if (k == -1 && PyErr_Occurred())
        goto done;
    if (k < 0 || k > count) {
        PyErr_SetString(PyExc_ValueError, "sgl-probe: ready_prefix answered outside its ends");
        goto done;
    }
    result = k == count ? n : owner[k];
done:
    PyMem_Free(owner);
    Py_XDECREF(ends);
    Py_XDECREF(it);
    return result;
}

/* Whether a step waits for SGLang's accept length: a verify phase without one and without an
   error. 1 waits, 0 not, -1 error. */
static int
awaits_accept(PyObject *st)
{
    PyObject *seq = step_phases(st);
    if (seq == NULL)
        return -1;
    int waits = 0;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq) && !waits; j++) {
        PyObject *ph = PySequence_Fast_GET_ITEM(seq, j);
        PyObject *phase = PHASE_GET(ph, phase);
        int verify = phase == NULL ? -1 : PyObject_RichCompareBool(phase, s_verify, Py_EQ);
        Py_XDECREF(phase);
        if (verify > 0) {
            PyObject *accept = PHASE_GET(ph, accept_length);
            PyObject *error = accept == NULL || accept != Py_None ? NULL : PHASE_GET(ph, error);
            if (accept == NULL || (accept == Py_None && error == NULL))
                verify = -1;
            else
                waits = accept == Py_None && error == Py_None;
            Py_XDECREF(accept);
            Py_XDECREF(error);
        }
        if (verify < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return waits;
}

/* ready_steps(prefix, steps, n, wait_from) -> how many of the first n steps drain.take_ready may
   take (not at shutdown): with ``prefix`` (the CUDA timer's ready_prefix; None for a host-clock
   timer) only steps whose timers all completed, then up to the first step ending after
   ``wait_from`` that still waits for an accept length. The same checks as take_ready's Python,
   for every step the server runs. (``prefix`` first: the timers bind it with functools.partial.) */
static PyObject *ready_steps_body(PyObject *const *args, Py_ssize_t nargs);

static PyObject *
hot_ready_steps(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    SECTION_T0(sec);
    PyObject *r = ready_steps_body(args, nargs);
    SECTION_ADD(drain_ready, sec);
    return r;
}

static PyObject *
ready_steps_body(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "ready_steps(prefix, steps, n, wait_from)");
        return NULL;
    }
    PyObject *prefix = args[0], *steps = args[1], *wait_from = args[3];
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (prefix != Py_None && n > 0 && (n = timers_done(steps, n, prefix)) < 0)
        return NULL;
    PyObject *it = PyObject_GetIter(steps);
    if (it == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *st = PyIter_Next(it);
        if (st == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(it);
                return NULL;
            }
            break;
        }
        PyObject *host1 = STEP_GET(st, host1);
        int old = host1 == NULL ? -1 : PyObject_RichCompareBool(host1, wait_from, Py_LE);
        Py_XDECREF(host1);
        int waits = old != 0 ? 0 : awaits_accept(st);
        Py_DECREF(st);
        if (old < 0 || waits < 0) {
            Py_DECREF(it);
            return NULL;
        }
        if (waits) {
            n = i;
            break;
        }
    }
    Py_DECREF(it);
    return PyLong_FromSsize_t(n);
}

/* ---- the summary's per-phase accounting (summary.Summary.add) -------------------------------- */

/* ``container[key]``, a list made and stored where it is missing (borrowed). */
static PyObject *
list_for(PyObject *container, PyObject *key)
{
    PyObject *got = PyDict_GetItemWithError(container, key);
    if (got != NULL || PyErr_Occurred())
        return got;
    got = PyList_New(0);
    if (got == NULL)
        return NULL;
    int err = PyDict_SetItem(container, key, got);
    Py_DECREF(got);
    return err < 0 ? NULL : got;
}

/* (ntok - 1).bit_length() if type(ntok) is int and ntok > 0 else None (new reference). */
static PyObject *
token_bucket(PyObject *ntok)
{
    if (!PyLong_CheckExact(ntok))
        return Py_NewRef(Py_None);
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(ntok, &overflow);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (overflow < 0 || (overflow == 0 && n <= 0))
        return Py_NewRef(Py_None);
    if (overflow > 0) { /* beyond a long long: Python's own arithmetic */
        PyObject *less = PyNumber_Subtract(ntok, int_one);
        PyObject *r = less == NULL ? NULL : PyObject_CallMethod(less, "bit_length", NULL);
        Py_XDECREF(less);
        return r;
    }
    unsigned long long m = (unsigned long long)(n - 1);
    int bits = 0;
    while (m) {
        bits++;
        m >>= 1;
    }
    return PyLong_FromLong(bits);
}


/* Whether ``phase`` is the interned name ``name`` (the drain's rows carry the contract's own
   strings) or equal to it; -1 error. */
static int
phase_is(PyObject *phase, PyObject *name)
{
    if (phase == name)
        return 1;
    return PyUnicode_Check(phase) ? PyUnicode_Compare(phase, name) == 0 : 0;
}


static PyObject *
recent_shape(RecentShapes *r, PyObject *const *fields)
{
    for (int i = 0; i < r->n; i++) {
        PyObject *k = r->shape[i];
        int same = 1;
        for (int j = 0; j < 5 && same; j++)
            same = PyTuple_GET_ITEM(k, j) == fields[j];
        if (same)
            return k;
    }
    return NULL;
}

static void
recent_keep(RecentShapes *r, PyObject *shape)
{
    if (r->n < RECENT_SHAPES)
        r->shape[r->n++] = Py_NewRef(shape);
    else {
        Py_SETREF(r->shape[r->next], Py_NewRef(shape));
        r->next = (r->next + 1) % RECENT_SHAPES;
    }
}

static void
recent_clear(RecentShapes *r)
{
    for (int i = 0; i < r->n; i++)
        Py_DECREF(r->shape[i]);
    r->n = 0;
}


/* (seen, max_shapes, window, launch, accepts, decode): the arguments summary_add takes after its
   first two. */
static int
summary_ctx(SummaryCtx *x, PyObject *const *args)
{
    x->seen = args[0];
    x->window = args[2];
    x->launch = args[3];
    x->accepts = args[4];
    x->decode = args[5];
    x->decode_append[0] = x->decode_append[1] = NULL;
    x->recent.n = x->recent.next = 0;
    if ((x->max_shapes = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return -1;
    if (!PyDict_Check(x->seen) || !PyDict_Check(x->window) || !PyDict_Check(x->launch) || !PyList_Check(x->accepts)) {
        PyErr_SetString(PyExc_TypeError, "summary_add: three dicts and a list");
        return -1;
    }
    for (int g = 0; g < 2; g++) {
        PyObject *q = PyObject_GetItem(x->decode, g == 0 ? Py_True : Py_False);
        x->decode_append[g] = q == NULL ? NULL : PyObject_GetAttr(q, s_append);
        Py_XDECREF(q);
        if (x->decode_append[g] == NULL)
            return -1;
    }
    return 0;
}

static void
summary_ctx_free(SummaryCtx *x)
{
    recent_clear(&x->recent);
    Py_CLEAR(x->decode_append[0]);
    Py_CLEAR(x->decode_append[1]);
}

static int summary_fields(SummaryCtx *x, PyObject *phase, PyObject *ms, PyObject *graph, PyObject *mode, PyObject *bs,
                          PyObject *ntok, PyObject *accept, PyObject *reason, PyObject *graph_ms);

/* One phase row into the summary's state; see summary_add. */
static int
summary_phase(SummaryCtx *x, PyObject *ph)
{
    if (!PyTuple_Check(ph) || PyTuple_GET_SIZE(ph) != 14) {
        PyErr_SetString(PyExc_ValueError, "sgl-probe: a phase row has 14 fields");
        return -1;
    }
    PyObject *ms = ms_of(PyTuple_GET_ITEM(ph, 1), PyTuple_GET_ITEM(ph, 2));
    if (ms == NULL)
        return -1;
    int rc = summary_fields(x, PyTuple_GET_ITEM(ph, 0), ms, PyTuple_GET_ITEM(ph, 3), PyTuple_GET_ITEM(ph, 4),
                            PyTuple_GET_ITEM(ph, 5), PyTuple_GET_ITEM(ph, 6), PyTuple_GET_ITEM(ph, 9),
                            PyTuple_GET_ITEM(ph, 11), PyTuple_GET_ITEM(ph, 13));
    Py_DECREF(ms);
    return rc;
}

/* A phase's fields into the summary's state: ``ms`` its GPU time, the rest as its row has them. */
static int
summary_fields(SummaryCtx *x, PyObject *phase, PyObject *ms, PyObject *graph, PyObject *mode, PyObject *bs,
               PyObject *ntok, PyObject *accept, PyObject *reason, PyObject *graph_ms)
{
    PyObject *seen = x->seen, *window = x->window, *launch = x->launch, *accepts = x->accepts, *decode = x->decode;
    Py_ssize_t max_shapes = x->max_shapes;
    PyObject *const *decode_append = x->decode_append;
    RecentShapes *recent = &x->recent;
    PyObject *key = NULL, *bucket = NULL;
    int rc = -1;
    int graph_true = PyObject_IsTrue(graph);
    if (graph_true < 0)
        goto done;
    if (graph_ms != Py_None && graph_true) { /* as the report: SGLang's graph flag decides */
        PyObject *got = list_for(launch, phase);
        PyObject *lead = got == NULL ? NULL : PyNumber_Subtract(ms, graph_ms);
        int err = lead == NULL ? -1 : PyList_Append(got, lead);
        Py_XDECREF(lead);
        if (err < 0)
            goto done;
    }
    if ((bucket = token_bucket(ntok)) == NULL)
        goto done;
    PyObject *fields[5] = {phase, mode, bs, graph, bucket};
    int first = 0;
    if ((key = Py_XNewRef(recent_shape(recent, fields))) == NULL) {
        if ((key = PyTuple_Pack(5, phase, mode, bs, graph, bucket)) == NULL)
            goto done;
        PyObject *known = PyDict_GetItemWithError(seen, key); /* borrowed */
        if (known != NULL)
            Py_SETREF(key, Py_NewRef(known));
        else if (PyErr_Occurred())
            goto done;
        else if ((first = PyDict_GET_SIZE(seen) < max_shapes) && PyDict_SetItem(seen, key, key) < 0)
            goto done;
        recent_keep(recent, key); /* seen's own now, or one it has no room for */
    }
    PyObject *cols = PyDict_GetItemWithError(window, phase); /* borrowed */
    if (cols == NULL) {
        if (PyErr_Occurred())
            goto done;
        PyObject *lists[5] = {NULL, NULL, NULL, NULL, NULL};
        for (int i = 0; i < 5; i++)
            if ((lists[i] = PyList_New(0)) == NULL)
                break;
        cols = lists[4] == NULL ? NULL : PyTuple_Pack(5, lists[0], lists[1], lists[2], lists[3], lists[4]);
        for (int i = 0; i < 5; i++)
            Py_XDECREF(lists[i]);
        int err = cols == NULL || PyDict_SetItem(window, phase, cols) < 0;
        Py_XDECREF(cols); /* the window holds it */
        if (err)
            goto done;
    }
    if (!PyTuple_Check(cols) || PyTuple_GET_SIZE(cols) != 5) {
        PyErr_SetString(PyExc_TypeError, "sgl-probe: a summary window is five lists");
        goto done;
    }
    PyObject *vals[5] = {ms, graph, reason, key, first ? Py_True : Py_False};
    for (int i = 0; i < 5; i++)
        if (PyList_Append(PyTuple_GET_ITEM(cols, i), vals[i]) < 0)
            goto done;
    if (phase_is(phase, s_verify)) {
        if (accept != Py_None && PyList_Append(accepts, accept) < 0)
            goto done;
    }
    else if (!first && phase_is(phase, s_decode)) {
        /* self._decode[graph]: the histories are keyed by the flag, a bool in the drain's rows */
        PyObject *r;
        if (graph == Py_True || graph == Py_False) {
            r = PyObject_CallOneArg(decode_append[graph == Py_True ? 0 : 1], ms);
        }
        else {
            PyObject *q = PyObject_GetItem(decode, graph);
            r = q == NULL ? NULL : PyObject_CallMethodOneArg(q, s_append, ms);
            Py_XDECREF(q);
        }
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    rc = 0;
done:
    Py_XDECREF(bucket);
    Py_XDECREF(key);
    return rc;
}

/* summary_add(rows, phases_at, seen, max_shapes, window, launch, accepts, decode): Summary.add over
   the phases of each row (the drain's rows, their phases at index ``phases_at``): the same
   arithmetic, the same containers changed in the same order. It runs on the drain thread for every
   phase the server runs. */
static PyObject *summary_add_body(PyObject *const *args, Py_ssize_t nargs);

static PyObject *
hot_summary_add(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    SECTION_T0(sec);
    PyObject *r = summary_add_body(args, nargs);
    SECTION_ADD(drain_summary, sec);
    return r;
}

static PyObject *
summary_add_body(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "summary_add(rows, phases_at, seen, max_shapes, window, launch, accepts, decode)");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    SummaryCtx x;
    if (summary_ctx(&x, args + 2) < 0) {
        summary_ctx_free(&x);
        return NULL;
    }
    PyObject *rows = PySequence_Fast(args[0], "summary_add: the rows are a sequence");
    if (rows == NULL) {
        summary_ctx_free(&x);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(rows); i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) <= at || !PyTuple_Check(PyTuple_GET_ITEM(row, at))) {
            PyErr_SetString(PyExc_ValueError, "sgl-probe: a step row without its phases");
            goto fail;
        }
        PyObject *phases = PyTuple_GET_ITEM(row, at);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(phases); j++) {
            if (summary_phase(&x, PyTuple_GET_ITEM(phases, j)) < 0)
                goto fail;
        }
    }
    summary_ctx_free(&x);
    Py_DECREF(rows);
    Py_RETURN_NONE;
fail:
    summary_ctx_free(&x);
    Py_DECREF(rows);
    return NULL;
}

/* ---- the phase metrics' per-step accounting (metrics.PhaseMetrics.observe_rows) -------------- */

/* A HistRef (see MetricsCtx) holds one series' Hist, read once per call while the steps repeat its
   key: its ``data`` (sum, min, max, then the counts) and ``bounds``, and the key's objects, compared
   by identity (all held). */
static void
hist_ref_clear(HistRef *r)
{
    Py_CLEAR(r->hist);
    Py_CLEAR(r->data);
    Py_CLEAR(r->bounds);
    Py_CLEAR(r->k0);
    Py_CLEAR(r->k1);
    Py_CLEAR(r->k2);
}

/* ``r`` for ``hist``: 0, or -1 where it is not laid out as metrics.Hist lays it out (an error). */
static int
hist_ref_set(HistRef *r, PyObject *hist)
{
    hist_ref_clear(r);
    r->hist = Py_NewRef(hist);
    r->data = PyObject_GetAttr(hist, s_data);
    r->bounds = r->data == NULL ? NULL : PyObject_GetAttr(hist, s_bounds);
    if (r->bounds == NULL)
        return -1;
    if (!PyList_CheckExact(r->data) || !PyTuple_CheckExact(r->bounds) ||
        PyList_GET_SIZE(r->data) != PyTuple_GET_SIZE(r->bounds) + 4) {
        PyErr_SetString(PyExc_TypeError, "sgl-probe: a histogram not laid out as metrics.Hist");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r->bounds); i++)
        if (!PyFloat_CheckExact(PyTuple_GET_ITEM(r->bounds, i))) {
            PyErr_SetString(PyExc_TypeError, "sgl-probe: a histogram's bounds are not floats");
            return -1;
        }
    return 0;
}

/* Hist.add(value) on ``r``: ``v`` is ``value`` as a double, exact for the ints and floats it is
   called with (others go to Hist.add itself). 1 done, 0 not here (a sum, min or max that is not a
   float or an int, e.g. an odd value Hist.add kept as its min: Hist.add itself), -1 error. */
static int
hist_add(HistRef *r, PyObject *value, double v)
{
    PyObject *data = r->data, *bounds = r->bounds;
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(bounds);
    while (lo < hi) { /* bisect_left */
        Py_ssize_t mid = (lo + hi) / 2;
        if (PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(bounds, mid)) < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    PyObject *count = PyList_GET_ITEM(data, 3 + lo);
    PyObject *sum = PyList_GET_ITEM(data, 0), *lo_v = PyList_GET_ITEM(data, 1), *hi_v = PyList_GET_ITEM(data, 2);
    if (!PyLong_CheckExact(count) || !PyFloat_CheckExact(sum) || !(PyFloat_CheckExact(lo_v) || PyLong_CheckExact(lo_v)) ||
        !(PyFloat_CheckExact(hi_v) || PyLong_CheckExact(hi_v)))
        return 0;
    long long n = PyLong_AsLongLong(count);
    double lo_d = PyFloat_CheckExact(lo_v) ? PyFloat_AS_DOUBLE(lo_v) : PyLong_AsDouble(lo_v);
    double hi_d = PyFloat_CheckExact(hi_v) ? PyFloat_AS_DOUBLE(hi_v) : PyLong_AsDouble(hi_v);
    if (PyErr_Occurred() || n < 0 || n == LLONG_MAX) { /* a count or a min / max no double holds */
        PyErr_Clear();
        return 0;
    }
    PyObject *count_new = PyLong_FromLongLong(n + 1), *sum_new = PyFloat_FromDouble(PyFloat_AS_DOUBLE(sum) + v);
    if (count_new == NULL || sum_new == NULL) {
        Py_XDECREF(count_new);
        Py_XDECREF(sum_new);
        return -1;
    }
    PyList_SetItem(data, 3 + lo, count_new);
    PyList_SetItem(data, 0, sum_new);
    if (v < lo_d)
        PyList_SetItem(data, 1, Py_NewRef(value));
    if (v > hi_d)
        PyList_SetItem(data, 2, Py_NewRef(value));
    return 1;
}

/* ``value`` into the Hist ``r``: in C where it is an int that a double holds exactly or a float,
   else through Hist.add. */
static int
hist_add_obj(HistRef *r, PyObject *value)
{
    int done = 0;
    if (PyFloat_CheckExact(value)) {
        done = hist_add(r, value, PyFloat_AS_DOUBLE(value));
    }
    else if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (n == -1 && PyErr_Occurred())
            return -1;
        if (!overflow && n <= (1LL << 53) && n >= -(1LL << 53))
            done = hist_add(r, value, (double)n);
    }
    if (done != 0)
        return done < 0 ? -1 : 0;
    PyObject *res = PyObject_CallMethodOneArg(r->hist, s_add, value);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
}

static void
metrics_ctx_init(MetricsCtx *m, PyObject *const *five, PyObject *errors)
{
    memset(m, 0, sizeof(*m));
    m->steps_of = five[0];
    m->phase_of = five[1];
    m->new_steps = five[2];
    m->new_hist = five[3];
    m->accept_hist = five[4];
    m->errors = errors;
}

static void
metrics_ctx_free(MetricsCtx *m)
{
    hist_ref_clear(&m->ph_ref);
    hist_ref_clear(&m->acc_ref);
    Py_CLEAR(m->last_mode);
    Py_CLEAR(m->last_steps);
}

/* PhaseMetrics.c_state()'s (steps_of, phase_of, new_steps, new_hist, accept_hist, errors) into m
   (metrics_ctx_free it, whatever this returns). */
static int
metrics_ctx(MetricsCtx *m, PyObject *state)
{
    memset(m, 0, sizeof(*m));
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 6 || !PyDict_Check(PyTuple_GET_ITEM(state, 0)) ||
        !PyDict_Check(PyTuple_GET_ITEM(state, 1)) || !PyList_Check(PyTuple_GET_ITEM(state, 5))) {
        PyErr_SetString(PyExc_TypeError, "take: metrics is (steps_of, phase_of, new_steps, new_hist, accept_hist, errors)");
        return -1;
    }
    metrics_ctx_init(m, &PyTuple_GET_ITEM(state, 0), PyTuple_GET_ITEM(state, 5));
    return 0;
}

/* One step of ``mode`` counted. */
static int
metrics_step(MetricsCtx *m, PyObject *mode)
{
    if (mode != m->last_mode || m->last_steps == NULL) {
        PyObject *steps = Py_XNewRef(PyDict_GetItemWithError(m->steps_of, mode));
        if (steps == NULL && (PyErr_Occurred() || (steps = PyObject_CallOneArg(m->new_steps, mode)) == NULL))
            return -1;
        Py_XSETREF(m->last_steps, steps);
        Py_XSETREF(m->last_mode, Py_NewRef(mode));
    }
    if (!PyList_CheckExact(m->last_steps) || PyList_GET_SIZE(m->last_steps) != 2) {
        PyErr_SetString(PyExc_TypeError, "sgl-probe: a step counter not laid out as [labels, count]");
        return -1;
    }
    PyObject *count = PyNumber_Add(PyList_GET_ITEM(m->last_steps, 1), int_one);
    if (count == NULL)
        return -1;
    PyList_SetItem(m->last_steps, 1, count);
    return 0;
}

/* One phase: ``secs`` into the (phase, mode, graph) histogram, ``accept`` (None: none) into the
   accept lengths'. */
static int
metrics_phase(MetricsCtx *m, PyObject *k0, PyObject *k1, PyObject *k2, PyObject *secs, PyObject *accept)
{
    HistRef *r = &m->ph_ref;
    if (secs == NULL) /* (no time to add: only the accept length) */
        goto add_accept;
    if (r->hist == NULL || k0 != r->k0 || k1 != r->k1 || k2 != r->k2) {
        PyObject *key = PyTuple_Pack(3, k0, k1, k2);
        if (key == NULL)
            return -1;
        PyObject *hist = Py_XNewRef(PyDict_GetItemWithError(m->phase_of, key));
        if (hist == NULL && !PyErr_Occurred())
            hist = PyObject_CallOneArg(m->new_hist, key);
        Py_DECREF(key);
        int bad = hist == NULL || hist_ref_set(r, hist) < 0;
        Py_XDECREF(hist);
        if (bad)
            return -1;
        r->k0 = Py_NewRef(k0);
        r->k1 = Py_NewRef(k1);
        r->k2 = Py_NewRef(k2);
    }
    if (hist_add_obj(r, secs) < 0)
        return -1;
add_accept:
    if (accept == Py_None)
        return 0;
    if (m->acc_ref.hist == NULL) {
        PyObject *hist = PyObject_CallNoArgs(m->accept_hist);
        int bad = hist == NULL || hist_ref_set(&m->acc_ref, hist) < 0;
        Py_XDECREF(hist);
        if (bad)
            return -1;
    }
    return hist_add_obj(&m->acc_ref, accept);
}

/* metrics_add(rows, mode_at, phases_at, phase_at, steps_of, phase_of, new_steps, new_hist,
   accept_hist): PhaseMetrics.observe_rows's loop over the drain's rows (``phase_at``: the phase
   row's phase, start, end, graph, mode and accept indices), the same containers changed the same
   way; a series' first step asks Python to make it (``new_steps(mode)``, ``new_hist(key)``,
   ``accept_hist()``). It runs on the drain thread for every step the server runs, with metrics on
   and steps the packed pass does not take (which feeds them the same way: metrics_vals). */
static PyObject *
hot_metrics_add(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "metrics_add(rows, mode_at, phases_at, phase_at, steps_of, phase_of, "
                                         "new_steps, new_hist, accept_hist)");
        return NULL;
    }
    Py_ssize_t mode_at = PyLong_AsSsize_t(args[1]), phases_at = PyLong_AsSsize_t(args[2]), at[6];
    if (PyErr_Occurred())
        return NULL;
    if (!PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != 6 || !PyDict_Check(args[4]) || !PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "metrics_add: six phase indices and two dicts");
        return NULL;
    }
    Py_ssize_t width = 0;
    for (int i = 0; i < 6; i++) {
        if ((at[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[3], i))) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "metrics_add: a negative index");
            return NULL;
        }
        if (at[i] >= width)
            width = at[i] + 1;
    }
    PyObject *rows = PySequence_Fast(args[0], "metrics_add: the rows are a sequence");
    if (rows == NULL)
        return NULL;
    MetricsCtx m;
    metrics_ctx_init(&m, args + 4, NULL);
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(rows); i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) <= mode_at || PyTuple_GET_SIZE(row) <= phases_at ||
            !PyTuple_Check(PyTuple_GET_ITEM(row, phases_at))) {
            PyErr_SetString(PyExc_ValueError, "sgl-probe: a step row without its mode or phases");
            goto done;
        }
        if (metrics_step(&m, PyTuple_GET_ITEM(row, mode_at)) < 0)
            goto done;
        PyObject *phases = PyTuple_GET_ITEM(row, phases_at);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(phases); j++) {
            PyObject *ph = PyTuple_GET_ITEM(phases, j);
            if (!PyTuple_Check(ph) || PyTuple_GET_SIZE(ph) < width) {
                PyErr_SetString(PyExc_ValueError, "sgl-probe: a phase row too short");
                goto done;
            }
            PyObject *secs = span_of(PyTuple_GET_ITEM(ph, at[1]), PyTuple_GET_ITEM(ph, at[2]), 1e9);
            int bad = secs == NULL || metrics_phase(&m, PyTuple_GET_ITEM(ph, at[0]), PyTuple_GET_ITEM(ph, at[4]),
                                                    PyTuple_GET_ITEM(ph, at[3]), secs, PyTuple_GET_ITEM(ph, at[5])) < 0;
            Py_XDECREF(secs);
            if (bad)
                goto done;
        }
    }
    result = Py_NewRef(Py_None);
done:
    metrics_ctx_free(&m);
    Py_DECREF(rows);
    return result;
}

/* The packed pass's step into the metrics, as metrics_add adds its row (the row's values, made
   by row_of_vals from the same ``v``). An Exception turns them off for the rest of the call and
   goes into ``errors`` (the caller's PhaseMetrics then switches itself off with its log line, as
   observe_rows does): the step is in the message and the summary already. -1: a BaseException. */
static int
metrics_vals(MetricsCtx *m, StepRecordObject *st, StepVals *v)
{
    if (m->off)
        return 0;
    int rc = metrics_step(m, st->mode);
    for (Py_ssize_t k = 0; rc == 0 && k < v->n; k++) {
        PhaseVals *pv = &v->ph[k];
        PhaseRecordObject *ph = pv->ph;
        if (v->host) { /* an untimed step: counted, its accept length kept, no host time in the histograms */
            rc = metrics_phase(m, ph->phase, ph->mode, pv->graph ? Py_True : Py_False, NULL, ph->accept_length);
            continue;
        }
        PyObject *secs = vals_span(pv, 1e9);
        rc = secs == NULL ? -1 : metrics_phase(m, ph->phase, ph->mode, pv->graph ? Py_True : Py_False, secs,
                                               ph->accept_length);
        Py_XDECREF(secs);
    }
    if (rc == 0)
        return 0;
    if (!PyErr_ExceptionMatches(PyExc_Exception) || m->errors == NULL)
        return -1;
    m->off = 1;
    PyObject *type, *value, *tb;
    fetch_exception(&type, &value, &tb);
    rc = PyList_Append(m->errors, value != NULL ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (rc < 0) /* no room to say so: nothing more this call, the step stays */
        PyErr_Clear();
    return 0;
}

/* ---- the link's STEPS message, packed (wire.encode_steps / wire.decode) ----------------------

   The drain hands the exporter process a second of steps at a time, as rows (tuples of ints,
   floats, strings, None, bools and the phases' tuples); pickling them cost the drain thread more
   than resolving them (~0.9 µs per step, its memo entry per tuple included). This writes the same
   rows in a fixed layout, ~5x faster, and reads them back as equal rows with the same types.
   wire.py holds the layout's description and a Python reader, the reference for this one.
   Anything the layout has no tag for (an int beyond 64 bits, any other type, tuples nested more
   than three deep): the packer says so (None) and the message is pickled, as before. */
#define PACK_MAGIC "\xa7SP1"
#define PACK_DEPTH 3 /* a row, its phases, a phase */

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
    PyObject *index;   /* str -> its number in the table */
    PyObject *strings; /* the table, in order */
    PyObject *seen_str[8];
    uint32_t seen_idx[8];
    int n_seen, next_seen;
} Packer;

static int
pk_room(Packer *p, Py_ssize_t n)
{
    if (p->len + n <= p->cap)
        return 0;
    Py_ssize_t cap = p->cap ? p->cap : 4096;
    while (cap < p->len + n)
        cap *= 2;
    char *b = PyMem_Realloc(p->buf, cap);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    p->buf = b;
    p->cap = cap;
    return 0;
}

static inline void
put_u32(char *at, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        at[i] = (char)((v >> (8 * i)) & 0xff);
}

static inline void
put_u64(char *at, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        at[i] = (char)((v >> (8 * i)) & 0xff);
}

static inline uint32_t
get_u32(const unsigned char *at)
{
    return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
}

static inline uint64_t
get_u64(const unsigned char *at)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | at[i];
    return v;
}

/* A string's number in the table (added at its first use); the last few strings by identity
   first (a message repeats a handful of the probe's own names row after row). 1 found or added,
   0 not a string the message can carry, -1 error. */
static int
pk_string(Packer *p, PyObject *v, uint32_t *out)
{
    for (int i = 0; i < p->n_seen; i++)
        if (p->seen_str[i] == v) {
            *out = p->seen_idx[i];
            return 1;
        }
    PyObject *got = PyDict_GetItemWithError(p->index, v);
    if (got != NULL) {
        *out = (uint32_t)PyLong_AsUnsignedLong(got);
    }
    else {
        if (PyErr_Occurred())
            return -1;
        /* Only strings the message can carry join the table (a lone surrogate is not UTF-8): a
           packed pass takes back a step that has one, and the table must not keep it. */
        Py_ssize_t len;
        if (PyUnicode_AsUTF8AndSize(v, &len) == NULL || len > UINT32_MAX) {
            PyErr_Clear();
            return 0;
        }
        *out = (uint32_t)PyList_GET_SIZE(p->strings);
        PyObject *n = PyLong_FromUnsignedLong(*out);
        int err = n == NULL || PyDict_SetItem(p->index, v, n) < 0 || PyList_Append(p->strings, v) < 0;
        Py_XDECREF(n);
        if (err)
            return -1;
    }
    int slot = p->n_seen < 8 ? p->n_seen++ : (p->next_seen = (p->next_seen + 1) % 8);
    p->seen_str[slot] = v; /* borrowed: the table holds it */
    p->seen_idx[slot] = *out;
    return 1;
}

/* 1 written, 0 not a value the layout has, -1 error. */
static int
pk_value(Packer *p, PyObject *v, int depth)
{
    if (pk_room(p, 9) < 0)
        return -1;
    char *at = p->buf + p->len;
    if (v == Py_None || v == Py_True || v == Py_False) {
        at[0] = v == Py_None ? 'N' : v == Py_True ? 'T' : 'F';
        p->len += 1;
        return 1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return 0;
        if (x == -1 && PyErr_Occurred())
            return -1;
        at[0] = 'i';
        put_u64(at + 1, (uint64_t)x);
        p->len += 9;
        return 1;
    }
    if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        at[0] = 'd';
        put_u64(at + 1, bits);
        p->len += 9;
        return 1;
    }
    if (PyUnicode_CheckExact(v)) {
        uint32_t idx;
        int r = pk_string(p, v, &idx);
        if (r <= 0)
            return r;
        at = p->buf + p->len; /* unchanged: pk_string does not grow the buffer */
        at[0] = 's';
        put_u32(at + 1, idx);
        p->len += 5;
        return 1;
    }
    if (PyTuple_CheckExact(v) && depth <= PACK_DEPTH) {
        Py_ssize_t n = PyTuple_GET_SIZE(v);
        at[0] = 't';
        put_u32(at + 1, (uint32_t)n);
        p->len += 5;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = pk_value(p, PyTuple_GET_ITEM(v, i), depth + 1);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    return 0;
}

/* The message of the ``n`` rows ``p`` holds: magic, u32 rows, u32 strings, each string (u32 length,
   UTF-8), a byte per row (kept because slow: ``slow``'s items, or none where NULL), then the rows;
   None where a string is not UTF-8. */
static PyObject *
pk_message(Packer *p, Py_ssize_t n, PyObject *slow, const unsigned char *flags, Py_ssize_t n_flags)
{
    Py_ssize_t ns = PyList_GET_SIZE(p->strings), size = 12 + n + p->len;
    const char **utf = PyMem_Malloc(sizeof(char *) * (ns + 1));
    Py_ssize_t *lens = PyMem_Malloc(sizeof(Py_ssize_t) * (ns + 1));
    PyObject *out = NULL;
    int ok = 1;
    if (utf == NULL || lens == NULL) {
        PyMem_Free(utf);
        PyMem_Free(lens);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < ns && ok > 0; i++) {
        utf[i] = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(p->strings, i), &lens[i]);
        if (utf[i] == NULL || lens[i] > UINT32_MAX) {
            PyErr_Clear(); /* e.g. a lone surrogate: not UTF-8; pickle takes it */
            ok = 0;
        }
        else
            size += 4 + lens[i];
    }
    if (ok == 0)
        out = Py_NewRef(Py_None);
    else if ((out = PyBytes_FromStringAndSize(NULL, size)) != NULL) {
        char *w = PyBytes_AS_STRING(out);
        memcpy(w, PACK_MAGIC, 4);
        put_u32(w + 4, (uint32_t)n);
        put_u32(w + 8, (uint32_t)ns);
        w += 12;
        for (Py_ssize_t i = 0; i < ns; i++) {
            put_u32(w, (uint32_t)lens[i]);
            memcpy(w + 4, utf[i], lens[i]);
            w += 4 + lens[i];
        }
        for (Py_ssize_t i = 0; i < n; i++)
            *w++ = slow != NULL ? PyList_GET_ITEM(slow, i) == Py_True : i < n_flags && flags[i];
        memcpy(w, p->buf, p->len);
    }
    PyMem_Free(utf);
    PyMem_Free(lens);
    return out;
}

/* pack_steps(rows, kept_slow) -> bytes, or None where a value has no tag in the layout:
   magic, u32 rows, u32 strings, each string (u32 length, UTF-8), a byte per row (kept because
   slow), then each row as a value (tag 'N' 'T' 'F'; 'i' int64, 'd' float64, 's' u32 string
   number, 't' u32 count and the items); little-endian. */
static PyObject *
hot_pack_steps(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pack_steps(rows, kept_slow): two lists of one length");
        return NULL;
    }
    PyObject *rows = args[0], *slow = args[1], *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    Packer p = {NULL, 0, 0, PyDict_New(), PyList_New(0), {NULL}, {0}, 0, 0};
    if (p.index == NULL || p.strings == NULL || pk_room(&p, 64 + 192 * n) < 0) /* ~160 bytes a step */
        goto done;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok > 0; i++) {
        PyObject *f = PyList_GET_ITEM(slow, i);
        if (f != Py_True && f != Py_False)
            ok = 0;
        else
            ok = PyTuple_CheckExact(PyList_GET_ITEM(rows, i)) ? pk_value(&p, PyList_GET_ITEM(rows, i), 1) : 0;
    }
    if (ok >= 0)
        out = ok == 0 ? Py_NewRef(Py_None) : pk_message(&p, n, slow, NULL, 0);
done:
    PyMem_Free(p.buf);
    Py_XDECREF(p.index);
    Py_XDECREF(p.strings);
    return out;
}

/* ---- the packed pass: steps written straight into the link's message -------------------------

   The drain's rows exist to be read twice, by the summary and by pack_steps, and freed: with
   every step exported, no sampler and no metrics, the packed pass skips them. take() writes each
   step, resolved, into a PackedSteps (the same bytes pack_steps writes for its row) and adds it to
   the summary; finish() makes the message. */
struct PackedObject {
    PyObject_HEAD
    Packer p;
    Py_ssize_t rows, spans, max_bytes;
    int full;
    unsigned char *slow; /* a byte per row, kept because slow (rows past slow_cap: 0) */
    Py_ssize_t slow_cap;
};

/* Room for row ``row``'s kept-because-slow byte. */
static int
packed_slow_room(PackedObject *pk, Py_ssize_t row)
{
    if (row >= pk->slow_cap) {
        Py_ssize_t cap = pk->slow_cap ? pk->slow_cap : 256;
        while (cap <= row)
            cap *= 2;
        unsigned char *grown = PyMem_Realloc(pk->slow, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(grown + pk->slow_cap, 0, cap - pk->slow_cap);
        pk->slow = grown;
        pk->slow_cap = cap;
    }
    return 0;
}

/* A tag and its value: a u32 (``wide`` 0: a tuple's count) or 64 bits (an int64, a float64). */
static int
pk_tagged(Packer *p, char tag, uint64_t v, int wide)
{
    Py_ssize_t n = wide ? 9 : 5;
    if (pk_room(p, n) < 0)
        return -1;
    p->buf[p->len] = tag;
    if (wide)
        put_u64(p->buf + p->len + 1, v);
    else
        put_u32(p->buf + p->len + 1, (uint32_t)v);
    p->len += n;
    return 1;
}

#define pk_head(p, tag, n) pk_tagged((p), (tag), (uint64_t)(n), 0)
#define pk_bits(p, tag, bits) pk_tagged((p), (tag), (bits), 1)

static int
pk_double(Packer *p, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, 8);
    return pk_bits(p, 'd', bits);
}

static int
pk_flag(Packer *p, PyObject *v)
{
    return pk_value(p, v, 1); /* None, True, False */
}

/* The step's row (row_of_vals's) written as pk_value writes a row: 1, or 0 where a value has no tag
   in the layout (nothing written: the caller makes the row), -1 error (nothing written). */
static int
pack_vals(PackedObject *pk, TakeCtx *c, StepRecordObject *st, StepVals *v)
{
    Packer *p = &pk->p;
    Py_ssize_t mark = p->len;
    double step_ms, host_ms;
    int r = span_c(st->host0, st->host1, 1e6, &step_ms);
#define PK(call)                                                                                               \
    if (r > 0)                                                                                                 \
    r = (call)
    /* depths as pk_value gives them: the row 1, its items 2, a phase 3, a phase's items 4 */
    PK(pk_head(p, 't', 10));
    PK(pk_value(p, st->index, 2));
    PK(pk_bits(p, 'i', (uint64_t)v->w0));
    PK(pk_bits(p, 'i', (uint64_t)v->w1));
    PK(pk_value(p, st->mode, 2));
    PK(pk_value(p, st->batch_size, 2));
    PK(pk_value(p, st->num_tokens, 2));
    PK(pk_double(p, step_ms));
    PK(pk_value(p, c->host ? s_cpu : v->host ? s_host : s_cuda, 2));
    PK(pk_head(p, 't', (uint32_t)v->n));
    for (Py_ssize_t k = 0; k < v->n && r > 0; k++) {
        PhaseVals *pv = &v->ph[k];
        PhaseRecordObject *ph = pv->ph;
        PK(span_c(ph->host0, ph->host1, 1e6, &host_ms));
        PK(pk_head(p, 't', 14));
        PK(pk_value(p, ph->phase, 4));
        PK(pk_bits(p, 'i', (uint64_t)pv->t0));
        PK(pk_bits(p, 'i', (uint64_t)pv->t1));
        PK(pk_flag(p, pv->graph ? Py_True : Py_False));
        PK(pk_value(p, ph->mode, 4));
        PK(pk_value(p, ph->batch_size, 4));
        PK(pk_value(p, ph->num_tokens, 4));
        PK(pk_double(p, host_ms));
        PK(pk_value(p, ph->target, 4));
        PK(pk_value(p, ph->accept_length, 4));
        PK(pk_value(p, pv->kind, 4));
        PK(pk_value(p, pv->graph ? Py_None : ph->no_graph_reason, 4));
        PK(pk_value(p, pv->error, 4));
        PK(pv->has_graph_ms ? pk_double(p, pv->graph_ms) : pk_flag(p, Py_None));
    }
    PK(pk_value(p, v->error, 2));
#undef PK
    if (r <= 0) {
        p->len = mark;
        return r;
    }
    pk->rows++;
    pk->spans += 1 + v->n;
    return 1;
}

/* The sampler's decision (``smp``; none: every step goes), then pack_vals for a step it keeps. 1
   written, or dropped by the sampler (summed up all the same); 0 not written (a value with no tag,
   no memory): the step becomes a row, its decision undone, and keep_row decides it; -1 the
   sampler's error, raised as keep_row raises it. */
static int
pack_sampled(PackedObject *pk, TakeCtx *c, StepRecordObject *st, StepVals *v, SamplerObject *smp)
{
    SamplerUndo undo = {.window = -1};
    int keep = 1, slow = 0;
    if (smp != NULL) {
        /* an untimed step's host times: a p99 of their own (SlowSteps.is_slow_row) */
        PyObject *mode = v->host ? PyTuple_Pack(2, s_host, st->mode) : Py_NewRef(st->mode);
        int bad = mode == NULL || sampler_keep(smp, st->index, v->w0, v->w1, mode, &keep, &slow, &undo) < 0;
        Py_XDECREF(mode);
        if (bad)
            return -1;
    }
    if (!keep)
        return 1;
    int packed = slow ? packed_slow_room(pk, pk->rows) : 0; /* its flag's room first: nothing to take back */
    if (packed == 0)
        packed = pack_vals(pk, c, st, v);
    if (packed < 0) {
        PyErr_Clear();
        packed = 0;
    }
    if (packed > 0 && slow)
        pk->slow[pk->rows - 1] = 1;
    if (packed == 0 && smp != NULL)
        sampler_undo(smp, &undo);
    return packed;
}

/* No more steps for this message (one at least, then ``max_bytes``). */
static int
packed_full(PackedObject *pk)
{
    if (pk->rows > 0 && pk->p.len >= pk->max_bytes)
        pk->full = 1;
    return pk->full;
}

/* A packed step's phases into the summary, as summary_add adds its row's. */
static int
summary_vals(SummaryCtx *x, StepVals *v)
{
    for (Py_ssize_t k = 0; k < v->n; k++) {
        PhaseVals *pv = &v->ph[k];
        PhaseRecordObject *ph = pv->ph;
        PyObject *ms = vals_span(pv, 1e6);
        PyObject *graph_ms = pv->has_graph_ms ? PyFloat_FromDouble(pv->graph_ms) : Py_NewRef(Py_None);
        int rc = ms == NULL || graph_ms == NULL ? -1
                 : summary_fields(x, ph->phase, ms, pv->graph ? Py_True : Py_False, ph->mode, ph->batch_size,
                                  ph->num_tokens, ph->accept_length, pv->graph ? Py_None : ph->no_graph_reason,
                                  graph_ms);
        Py_XDECREF(ms);
        Py_XDECREF(graph_ms);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static PyObject *
packed_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t max_bytes;
    static char *kw[] = {"max_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kw, &max_bytes))
        return NULL;
    PackedObject *pk = (PackedObject *)type->tp_alloc(type, 0);
    if (pk == NULL)
        return NULL;
    pk->max_bytes = max_bytes;
    if ((pk->p.index = PyDict_New()) == NULL || (pk->p.strings = PyList_New(0)) == NULL) {
        Py_DECREF(pk);
        return NULL;
    }
    return (PyObject *)pk;
}

static void
packed_dealloc(PackedObject *pk)
{
    PyMem_Free(pk->p.buf);
    PyMem_Free(pk->slow);
    Py_XDECREF(pk->p.index);
    Py_XDECREF(pk->p.strings);
    Py_TYPE(pk)->tp_free((PyObject *)pk);
}

/* finish() -> the message of the steps written so far (None where there are none), and an empty
   PackedSteps for the next. */
static PyObject *
packed_finish(PackedObject *pk, PyObject *unused)
{
    if (pk->rows == 0)
        Py_RETURN_NONE;
    PyObject *msg = pk_message(&pk->p, pk->rows, NULL, pk->slow, pk->slow_cap);
    if (msg == NULL)
        return NULL;
    if (pk->slow != NULL)
        memset(pk->slow, 0, pk->slow_cap);
    PyObject *index = PyDict_New(), *strings = PyList_New(0);
    if (index == NULL || strings == NULL) {
        Py_XDECREF(index);
        Py_XDECREF(strings);
        Py_DECREF(msg);
        return NULL;
    }
    Py_SETREF(pk->p.index, index);
    Py_SETREF(pk->p.strings, strings);
    pk->p.len = 0;
    pk->p.n_seen = pk->p.next_seen = 0;
    pk->rows = pk->spans = 0;
    pk->full = 0;
    return msg;
}

static PyMethodDef packed_methods[] = {
    {"finish", (PyCFunction)packed_finish, METH_NOARGS, "the message so far (None: no steps), and start afresh"},
    {NULL}};

static PyMemberDef packed_members[] = {
    {"rows", T_PYSSIZET, offsetof(PackedObject, rows), READONLY, "steps written"},
    {"spans", T_PYSSIZET, offsetof(PackedObject, spans), READONLY, "their spans (a step and its phases)"},
    {"nbytes", T_PYSSIZET, offsetof(PackedObject, p.len), READONLY, "bytes of rows written"},
    {"full", T_INT, offsetof(PackedObject, full), READONLY, "take stopped: max_bytes reached"},
    {"max_bytes", T_PYSSIZET, offsetof(PackedObject, max_bytes), READONLY, "bytes of rows that make it full"},
    {NULL}};

static PyTypeObject PackedStepsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_probe._hot.PackedSteps",
    .tp_basicsize = sizeof(PackedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PackedSteps(max_bytes): a link message the drain's take() writes steps into",
    .tp_new = packed_new,
    .tp_dealloc = (destructor)packed_dealloc,
    .tp_methods = packed_methods,
    .tp_members = packed_members,
};

typedef struct {
    const unsigned char *at, *end;
    PyObject *strings;
} Unpacker;

static PyObject *
unpack_bad(void)
{
    PyErr_SetString(PyExc_ValueError, "sgl-probe: a packed steps message that does not parse");
    return NULL;
}

static PyObject *
up_value(Unpacker *u, int depth)
{
    if (u->at >= u->end)
        return unpack_bad();
    unsigned char tag = *u->at++;
    switch (tag) {
    case 'N':
        return Py_NewRef(Py_None);
    case 'T':
        return Py_NewRef(Py_True);
    case 'F':
        return Py_NewRef(Py_False);
    case 'i':
    case 'd': {
        if (u->end - u->at < 8)
            return unpack_bad();
        uint64_t bits = get_u64(u->at);
        u->at += 8;
        if (tag == 'i')
            return PyLong_FromLongLong((long long)bits);
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case 's': {
        if (u->end - u->at < 4)
            return unpack_bad();
        uint32_t i = get_u32(u->at);
        u->at += 4;
        if (i >= (uint32_t)PyList_GET_SIZE(u->strings))
            return unpack_bad();
        return Py_NewRef(PyList_GET_ITEM(u->strings, i));
    }
    case 't': {
        if (u->end - u->at < 4 || depth > PACK_DEPTH)
            return unpack_bad();
        uint32_t n = get_u32(u->at);
        u->at += 4;
        if (n > (uint32_t)(u->end - u->at)) /* every item takes a byte at least */
            return unpack_bad();
        PyObject *t = PyTuple_New(n);
        for (uint32_t i = 0; t != NULL && i < n; i++) {
            PyObject *item = up_value(u, depth + 1);
            if (item == NULL)
                Py_CLEAR(t);
            else
                PyTuple_SET_ITEM(t, i, item);
        }
        return t;
    }
    default:
        return unpack_bad();
    }
}

/* unpack_steps(data) -> (rows, kept_slow): pack_steps's message read back. */
static PyObject *
hot_unpack_steps(PyObject *mod, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Unpacker u = {view.buf, (const unsigned char *)view.buf + view.len, NULL};
    PyObject *rows = NULL, *slow = NULL, *out = NULL;
    if (view.len < 12 || memcmp(view.buf, PACK_MAGIC, 4) != 0) {
        unpack_bad();
        goto done;
    }
    uint32_t n = get_u32(u.at + 4), ns = get_u32(u.at + 8);
    u.at += 12;
    if (ns > (uint32_t)(u.end - u.at) / 4 || (u.strings = PyList_New(ns)) == NULL) {
        if (!PyErr_Occurred())
            unpack_bad();
        goto done;
    }
    for (uint32_t i = 0; i < ns; i++) {
        uint32_t len;
        PyObject *str = NULL;
        if (u.end - u.at >= 4 && (len = get_u32(u.at)) <= (uint32_t)(u.end - u.at - 4)) {
            str = PyUnicode_DecodeUTF8((const char *)u.at + 4, len, "strict");
            u.at += 4 + len;
        }
        if (str == NULL) {
            if (!PyErr_Occurred())
                unpack_bad();
            goto done;
        }
        PyList_SET_ITEM(u.strings, i, str);
    }
    if (n > (uint32_t)(u.end - u.at) || (rows = PyList_New(n)) == NULL || (slow = PyList_New(n)) == NULL) {
        if (!PyErr_Occurred())
            unpack_bad();
        goto done;
    }
    for (uint32_t i = 0; i < n; i++)
        PyList_SET_ITEM(slow, i, Py_NewRef(u.at[i] ? Py_True : Py_False));
    u.at += n;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *row = up_value(&u, 1);
        if (row == NULL)
            goto done;
        PyList_SET_ITEM(rows, i, row);
    }
    if (u.at != u.end) {
        unpack_bad();
        goto done;
    }
    out = PyTuple_Pack(2, rows, slow);
done:
    Py_XDECREF(u.strings);
    Py_XDECREF(rows);
    Py_XDECREF(slow);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef module_methods[] = {
#ifdef SGL_PROBE_SECTION_TIMES
    {"section_times", hot_section_times, METH_NOARGS, "{section: (ns, calls)}: the benchmark-only build's timers."},
#endif
    {"now_ns", hot_now_ns, METH_NOARGS, "The clock the C wrappers read (time.perf_counter_ns)."},
    {"cpu_start", (PyCFunction)(void (*)(void))cpu_start, METH_FASTCALL, "CpuTimer.start(now_ns) -> now_ns"},
    {"cpu_stop", (PyCFunction)(void (*)(void))cpu_stop, METH_FASTCALL, "CpuTimer.stop(token, now_ns) -> now_ns"},
    {"take_host", (PyCFunction)(void (*)(void))hot_take_host, METH_FASTCALL, "drain.take_ready's loop, CPU timer"},
    {"summary_add", (PyCFunction)(void (*)(void))hot_summary_add, METH_FASTCALL, "Summary.add over the rows' phases"},
    {"ready_steps", (PyCFunction)(void (*)(void))hot_ready_steps, METH_FASTCALL, "drain.take_ready's checks"},
    {"pack_steps", (PyCFunction)(void (*)(void))hot_pack_steps, METH_FASTCALL, "the link's STEPS message, packed"},
    {"metrics_add", (PyCFunction)(void (*)(void))hot_metrics_add, METH_FASTCALL, "PhaseMetrics.observe_rows's loop"},
    {"unpack_steps", hot_unpack_steps, METH_O, "pack_steps's message read back: (rows, kept_slow)"},
    {NULL},
};

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT, "sgl_probe._hot",
    "The probe's hot path in C (see recorder.py and timing.py for the Python versions it mirrors).", -1,
    module_methods,
};

#define INTERN(var, text)                                                                                      \
    do {                                                                                                       \
        if ((var = PyUnicode_InternFromString(text)) == NULL)                                                  \
            return NULL;                                                                                       \
    } while (0)

PyMODINIT_FUNC
PyInit__hot(void)
{
    INTERN(s_perf_counter_ns, "perf_counter_ns");
    INTERN(s_forward_mode, "forward_mode");
    INTERN(s_cuda_stream, "cuda_stream");
    INTERN(s_cuda_event, "cuda_event");
    INTERN(s_is_verify, "is_verify");
    INTERN(s__bad_anchor, "_bad_anchor");
    INTERN(s__chain, "_chain");
    INTERN(s__returned, "_returned");
    INTERN(s__offset, "_offset");
    INTERN(s__ANCHOR_TOLERANCE_NS, "_ANCHOR_TOLERANCE_NS");
    INTERN(s_popleft, "popleft");
    INTERN(s_appendleft, "appendleft");
    INTERN(s_t_start, "t_start");
    INTERN(s_t_end, "t_end");
    INTERN(s_cuda, "cuda");
    INTERN(s_cpu, "cpu");
    INTERN(s_host, "host");
    INTERN(s__with_start_event, "_with_start_event");
    INTERN(s_seq_lens, "seq_lens");
    INTERN(s_shape, "shape");
    INTERN(s_torch, "torch");
    INTERN(s_Tensor, "Tensor");
    INTERN(s__C, "_C");
    INTERN(s_TensorBase, "TensorBase");
    INTERN(s_step, "step");
    INTERN(s_decode, "decode");
    INTERN(s_DECODE, "DECODE");
    INTERN(s_graph_hook, "graph_hook");
    INTERN(s_launch_ns, "launch_ns");
    INTERN(s__capturing, "_capturing");
    INTERN(s__stream_key, "_stream_key");
    INTERN(s__raw_stream, "_raw_stream");
    INTERN(s__streams, "_streams");
    INTERN(s__pool, "_pool");
    INTERN(s__record, "_record");
    INTERN(s__anchors, "_anchors");
    INTERN(s_cur, "cur");
    INTERN(s_enabled, "enabled");
    INTERN(s_timer, "timer");
    INTERN(s_step_count, "step_count");
    INTERN(s_max_pending, "max_pending");
    INTERN(s_fail, "fail");
    INTERN(s_ensure_timer, "ensure_timer");
    INTERN(s_drop, "drop");
    INTERN(s_start, "start");
    INTERN(s__c, "_c");
    INTERN(s_stop, "stop");
    INTERN(s_close_phase, "close_phase");
    INTERN(s_can_run_cuda_graph, "can_run_cuda_graph");
    INTERN(s_verify, "verify");
    INTERN(s_anchor_due, "_anchor_due");
    INTERN(s_anchor_busy, "_anchor_busy");
    INTERN(s__fresh, "_fresh");
    INTERN(s__ANCHOR_EVERY_NS, "_ANCHOR_EVERY_NS");
    INTERN(s__GPU_RUN, "_GPU_RUN");
    INTERN(s__ANCHOR_RETRY_NS, "_ANCHOR_RETRY_NS");
    INTERN(s_last_end, "_last_end");
    INTERN(s_refresh_anchor, "_refresh_anchor");
    INTERN(s_lookup_stream, "_lookup_stream");
    INTERN(s_pop, "_pop");
    INTERN(s_first_anchor, "_first_anchor");
    INTERN(s_append, "append");
    INTERN(s_phases, "phases");
    INTERN(s_host1, "host1");
    INTERN(s_accept_length, "accept_length");
    INTERN(s_error, "error");
    INTERN(s_phase, "phase");
    INTERN(s_data, "data");
    INTERN(s_bounds, "bounds");
    INTERN(s_add, "add");
    if ((int_one = PyLong_FromLong(1)) == NULL || (int_minus_one = PyLong_FromLong(-1)) == NULL)
        return NULL;
    PyObject *time_mod = PyImport_ImportModule("time");
    if (time_mod == NULL)
        return NULL;
    perf_counter_ns = PyObject_GetAttrString(time_mod, "perf_counter_ns");
    Py_DECREF(time_mod);
    if (perf_counter_ns == NULL)
        return NULL;
#ifdef DICT_WATCH
    if ((dict_watcher = PyDict_AddWatcher(watched_dict_changed)) < 0)
        PyErr_Clear(); /* none free: the clock and the timers' methods are looked up every time */
#endif
    PyTypeObject *types[] = {&PhaseRecordType, &StepRecordType, &StepHookType, &PhaseHookType, &MarkHookType,
                             &CudaFastType, &PackedStepsType, &StepSamplerType};
    const char *names[] = {"PhaseRecord", "StepRecord", "StepHook", "PhaseHook", "MarkHook", "CudaFast",
                           "PackedSteps", "StepSampler"};
    const int n_types = (int)(sizeof(types) / sizeof(types[0]));
    for (int i = 0; i < n_types; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&hot_module);
    if (m == NULL)
        return NULL;
    for (int i = 0; i < n_types; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
