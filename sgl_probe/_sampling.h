/* The drain's sampling decision in C (included by _hot.c): sampling.StepSampling.keep_row for a
ratio sampler (or always_off), so that a sampled server's drain takes its packed pass too instead
of making a row per step and deciding it in Python (~3 us a step on the CPU machine, more than
exporting every step through the packed pass).

The rules are sampling.py's, value for value: the step's trace id is spans.step_trace_id's
(BLAKE2b, 16-byte digest, of "<run>/dp<rank>/step/<index>"; its low 64 bits against the ratio
sampler's bound, as TraceIdRatioBased decides), and a step the sampler drops is kept when it is
slower than the running p99 of its forward mode (SlowSteps: the last ``window`` durations, the
p99 refreshed every ``refresh`` steps once ``min_seen`` were seen). BLAKE2b is RFC 7693's; the
tests compare it with hashlib's on every length around its block size. */

#include <limits.h>
#include <stdint.h>
#include <string.h>

/* ---- BLAKE2b (RFC 7693), unkeyed ---------------------------------------------------------------- */

typedef struct {
    uint64_t h[8], t[2];
    uint8_t buf[128];
    size_t buflen, outlen;
} Blake2b;

static const uint64_t b2b_iv[8] = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
                                   0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                                   0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t b2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t
b2b_rotr(uint64_t x, int n)
{
    return (x >> n) | (x << (64 - n));
}

static inline uint64_t
b2b_load(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#define B2B_G(a, b, c, d, x, y)                                                                                 \
    do {                                                                                                       \
        v[a] = v[a] + v[b] + (x);                                                                              \
        v[d] = b2b_rotr(v[d] ^ v[a], 32);                                                                      \
        v[c] = v[c] + v[d];                                                                                    \
        v[b] = b2b_rotr(v[b] ^ v[c], 24);                                                                      \
        v[a] = v[a] + v[b] + (y);                                                                              \
        v[d] = b2b_rotr(v[d] ^ v[a], 16);                                                                      \
        v[c] = v[c] + v[d];                                                                                    \
        v[b] = b2b_rotr(v[b] ^ v[c], 63);                                                                      \
    } while (0)

static void
b2b_compress(Blake2b *s, const uint8_t *block, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = b2b_iv[i];
    }
    v[12] ^= s->t[0];
    v[13] ^= s->t[1];
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++)
        m[i] = b2b_load(block + 8 * i);
    for (int r = 0; r < 12; r++) {
        const uint8_t *g = b2b_sigma[r];
        B2B_G(0, 4, 8, 12, m[g[0]], m[g[1]]);
        B2B_G(1, 5, 9, 13, m[g[2]], m[g[3]]);
        B2B_G(2, 6, 10, 14, m[g[4]], m[g[5]]);
        B2B_G(3, 7, 11, 15, m[g[6]], m[g[7]]);
        B2B_G(0, 5, 10, 15, m[g[8]], m[g[9]]);
        B2B_G(1, 6, 11, 12, m[g[10]], m[g[11]]);
        B2B_G(2, 7, 8, 13, m[g[12]], m[g[13]]);
        B2B_G(3, 4, 9, 14, m[g[14]], m[g[15]]);
    }
    for (int i = 0; i < 8; i++)
        s->h[i] ^= v[i] ^ v[i + 8];
}
#undef B2B_G

static void
b2b_count(Blake2b *s, uint64_t n)
{
    s->t[0] += n;
    if (s->t[0] < n)
        s->t[1]++;
}

static void
b2b_init(Blake2b *s, size_t outlen)
{
    memset(s, 0, sizeof(*s));
    memcpy(s->h, b2b_iv, sizeof(s->h));
    s->h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    s->outlen = outlen;
}

/* The last block stays in the buffer until b2b_final: it is the one compressed as the last. */
static void
b2b_update(Blake2b *s, const uint8_t *in, size_t n)
{
    while (n > 0) {
        if (s->buflen == sizeof(s->buf)) {
            b2b_count(s, sizeof(s->buf));
            b2b_compress(s, s->buf, 0);
            s->buflen = 0;
        }
        size_t take = sizeof(s->buf) - s->buflen;
        if (take > n)
            take = n;
        memcpy(s->buf + s->buflen, in, take);
        s->buflen += take;
        in += take;
        n -= take;
    }
}

static void
b2b_final(Blake2b *s, uint8_t *out)
{
    b2b_count(s, s->buflen);
    memset(s->buf + s->buflen, 0, sizeof(s->buf) - s->buflen);
    b2b_compress(s, s->buf, 1);
    for (size_t i = 0; i < s->outlen; i++)
        out[i] = (uint8_t)(s->h[i / 8] >> (8 * (i % 8)));
}

/* ---- StepSampler ---------------------------------------------------------------------------------- */

/* One forward mode's recent step durations (SlowSteps' deque, a ring here) and its p99. */
typedef struct {
    PyObject *mode; /* held */
    long long *ring;
    Py_ssize_t n, pos, since;
    int has_p99;
    long long p99;
} SlowWindow;

typedef struct {
    PyObject_HEAD
    Blake2b prefix; /* "<run>/dp<rank>/step/" absorbed */
    int has_prefix;
    uint64_t bound; /* keep a trace id whose low 64 bits are under it */
    int all;        /* the bound is beyond every 64-bit value (a rate of 1) */
    Py_ssize_t window, min_seen, refresh;
    SlowWindow *modes;
    Py_ssize_t n_modes, cap_modes;
    long long *scratch;
    Py_ssize_t sampled_out, kept_slow;
} SamplerObject;

static PyTypeObject StepSamplerType;

/* What one decision changed (sampler_undo puts it back): the window's place and p99, the ring's
   value it overwrote, the count it added to. */
typedef struct {
    Py_ssize_t window; /* -1: nothing to put back */
    Py_ssize_t pos, n, since;
    int has_p99;
    long long p99, overwritten;
    Py_ssize_t *counted;
} SamplerUndo;

/* The k-th smallest of a[0..n) (a reordered): what sorted(a)[k] is. */
static long long
select_kth(long long *a, Py_ssize_t n, Py_ssize_t k)
{
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        long long x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
        long long pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (a[j] > pivot)
                j--;
            if (i <= j) {
                long long t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return a[k];
    }
    return a[k];
}

/* SlowSteps.is_slow_row: records ``dur`` under ``mode`` (what it changed in ``u``); 1 slower than
   the p99 before it, 0 not, -1 error (no memory, a mode that does not compare). */
static int
sampler_slow(SamplerObject *s, PyObject *mode, long long dur, SamplerUndo *u)
{
    SlowWindow *w = NULL;
    for (Py_ssize_t i = 0; i < s->n_modes && w == NULL; i++) {
        PyObject *m = s->modes[i].mode;
        int eq = m == mode ? 1 : PyObject_RichCompareBool(m, mode, Py_EQ);
        if (eq < 0)
            return -1;
        if (eq)
            w = &s->modes[i];
    }
    if (w == NULL) {
        if (s->n_modes == s->cap_modes) {
            Py_ssize_t cap = s->cap_modes ? 2 * s->cap_modes : 8;
            SlowWindow *grown = PyMem_Realloc(s->modes, cap * sizeof(SlowWindow));
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            s->modes = grown;
            s->cap_modes = cap;
        }
        long long *ring = PyMem_Malloc(s->window * sizeof(long long));
        if (ring == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        w = &s->modes[s->n_modes++];
        memset(w, 0, sizeof(*w));
        w->mode = Py_NewRef(mode);
        w->ring = ring;
    }
    int had = w->has_p99;
    long long p99 = w->p99;
    *u = (SamplerUndo){w - s->modes, w->pos, w->n, w->since, had, p99, w->ring[w->pos], NULL};
    w->ring[w->pos] = dur;
    w->pos = (w->pos + 1) % s->window;
    if (w->n < s->window)
        w->n++;
    w->since++;
    if (w->since >= s->refresh && w->n >= s->min_seen) {
        memcpy(s->scratch, w->ring, w->n * sizeof(long long));
        w->p99 = select_kth(s->scratch, w->n, (Py_ssize_t)(0.99 * (double)(w->n - 1)));
        w->has_p99 = 1;
        w->since = 0;
    }
    return had && dur > p99;
}

/* StepSampling._sampled by the ratio rule: 1 keep, 0 drop; -1 a BaseException (any Exception on
   the way keeps the step, as the Python ``except Exception`` does). */
static int
sampler_sampled(SamplerObject *s, PyObject *index)
{
    if (s->all)
        return 1;
    if (!s->has_prefix)
        return 1;
    char digits[32];
    const char *text = digits;
    Py_ssize_t len = -1;
    PyObject *str = NULL;
    if (PyLong_CheckExact(index)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
        if (!(v == -1 && PyErr_Occurred()) && !overflow)
            len = snprintf(digits, sizeof(digits), "%lld", v);
        PyErr_Clear();
    }
    if (len < 0) { /* str(index), as the Python key is made */
        str = PyObject_Str(index);
        text = str == NULL ? NULL : PyUnicode_AsUTF8AndSize(str, &len);
        if (text == NULL) {
            Py_XDECREF(str);
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return -1;
            PyErr_Clear();
            return 1;
        }
    }
    Blake2b h = s->prefix;
    b2b_update(&h, (const uint8_t *)text, (size_t)len);
    Py_XDECREF(str);
    uint8_t d[16];
    b2b_final(&h, d);
    uint64_t hi = 0, lo = 0;
    for (int i = 0; i < 8; i++) {
        hi = (hi << 8) | d[i];
        lo = (lo << 8) | d[8 + i];
    }
    if (hi == 0 && lo == 0) /* spans._trace_id: a zero id is 1 */
        lo = 1;
    return lo < s->bound;
}

/* StepSampling.keep_row: ``*keep`` export it, ``*slow`` only because it was slow; counts both,
   and keeps in ``u`` what to put back should the step be decided again elsewhere. 0, or -1 with an
   error set (as keep_row raises it: only the trace id's errors keep the step). */
static int
sampler_keep(SamplerObject *s, PyObject *index, long long start, long long end, PyObject *mode, int *keep, int *slow,
             SamplerUndo *u)
{
    u->window = -1;
    long long dur;
    if (__builtin_sub_overflow(end, start, &dur))
        dur = end > start ? LLONG_MAX : LLONG_MIN;
    int is_slow = sampler_slow(s, mode, dur, u);
    if (is_slow < 0)
        return -1;
    int sampled = sampler_sampled(s, index);
    if (sampled < 0)
        return -1;
    *keep = 1;
    *slow = 0;
    if (sampled)
        return 0;
    if (is_slow) {
        s->kept_slow++;
        u->counted = &s->kept_slow;
        *slow = 1;
        return 0;
    }
    s->sampled_out++;
    u->counted = &s->sampled_out;
    *keep = 0;
    return 0;
}

/* The decision ``u`` recorded, undone: the step goes to keep_row after all, which decides it
   from the same state. */
static void
sampler_undo(SamplerObject *s, SamplerUndo *u)
{
    if (u->window < 0)
        return;
    SlowWindow *w = &s->modes[u->window];
    w->pos = u->pos;
    w->n = u->n;
    w->since = u->since;
    w->has_p99 = u->has_p99;
    w->p99 = u->p99;
    w->ring[u->pos] = u->overwritten;
    if (u->counted != NULL)
        (*u->counted)--;
    u->window = -1;
}

static PyObject *
sampler_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"bound", "window", "min_seen", "refresh", NULL};
    PyObject *bound;
    Py_ssize_t window = 1024, min_seen = 100, refresh = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|nnn:StepSampler", kw, &PyLong_Type, &bound, &window, &min_seen,
                                     &refresh))
        return NULL;
    if (window < 1 || min_seen < 0 || refresh < 0) {
        PyErr_SetString(PyExc_ValueError, "StepSampler: window >= 1, min_seen and refresh >= 0");
        return NULL;
    }
    int negative = PyObject_RichCompareBool(bound, int_minus_one, Py_LE);
    if (negative != 0) {
        if (negative > 0)
            PyErr_SetString(PyExc_ValueError, "StepSampler: a bound >= 0");
        return NULL;
    }
    SamplerObject *s = (SamplerObject *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    unsigned long long b = PyLong_AsUnsignedLongLong(bound);
    if (b == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            Py_DECREF(s);
            return NULL;
        }
        PyErr_Clear();
        s->all = 1; /* beyond 64 bits: every trace id's low 64 bits are under it */
    }
    s->bound = b;
    s->window = window;
    s->min_seen = min_seen;
    s->refresh = refresh;
    if ((s->scratch = PyMem_Malloc(window * sizeof(long long))) == NULL) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    return (PyObject *)s;
}

static void
sampler_dealloc(SamplerObject *s)
{
    for (Py_ssize_t i = 0; i < s->n_modes; i++) {
        Py_XDECREF(s->modes[i].mode);
        PyMem_Free(s->modes[i].ring);
    }
    PyMem_Free(s->modes);
    PyMem_Free(s->scratch);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* set_prefix(key): the bytes every step's trace-id key starts with (spans.step_trace_prefix). */
static PyObject *
sampler_set_prefix(SamplerObject *s, PyObject *key)
{
    if (!PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "set_prefix(bytes)");
        return NULL;
    }
    b2b_init(&s->prefix, 16);
    b2b_update(&s->prefix, (const uint8_t *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
    s->has_prefix = 1;
    Py_RETURN_NONE;
}

/* keep(index, start_ns, end_ns, mode) -> (export it, only because it was slow) */
static PyObject *
sampler_keep_py(SamplerObject *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "keep(index, start_ns, end_ns, mode)");
        return NULL;
    }
    long long start = PyLong_AsLongLong(args[1]), end;
    if ((start == -1 && PyErr_Occurred()) || ((end = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred()))
        return NULL;
    int keep, slow;
    SamplerUndo u;
    if (sampler_keep(s, args[0], start, end, args[3], &keep, &slow, &u) < 0)
        return NULL;
    return PyTuple_Pack(2, keep ? Py_True : Py_False, slow ? Py_True : Py_False);
}

/* digest(data) -> blake2b(prefix + data, digest_size=16).digest(): for the tests. */
static PyObject *
sampler_digest(SamplerObject *s, PyObject *data)
{
    if (!PyBytes_Check(data) || !s->has_prefix) {
        PyErr_SetString(PyExc_TypeError, "digest(bytes), after set_prefix");
        return NULL;
    }
    Blake2b h = s->prefix;
    b2b_update(&h, (const uint8_t *)PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data));
    uint8_t d[16];
    b2b_final(&h, d);
    return PyBytes_FromStringAndSize((const char *)d, 16);
}

static PyMethodDef sampler_methods[] = {
    {"set_prefix", (PyCFunction)sampler_set_prefix, METH_O, "the bytes every step's trace-id key starts with"},
    {"keep", (PyCFunction)(void (*)(void))sampler_keep_py, METH_FASTCALL,
     "keep(index, start_ns, end_ns, mode) -> (export it, only because it was slow)"},
    {"digest", (PyCFunction)sampler_digest, METH_O, "BLAKE2b-128 of the prefix and these bytes"},
    {NULL}};

static PyMemberDef sampler_members[] = {
    {"sampled_out", T_PYSSIZET, offsetof(SamplerObject, sampled_out), READONLY, "steps the sampler dropped"},
    {"kept_slow", T_PYSSIZET, offsetof(SamplerObject, kept_slow), READONLY, "steps kept only because slow"},
    {NULL}};

static PyTypeObject StepSamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_probe._hot.StepSampler",
    .tp_basicsize = sizeof(SamplerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StepSampler(bound, window=1024, min_seen=100, refresh=64): sampling.StepSampling's "
              "ratio rule and slow-step keep, for the drain's packed pass",
    .tp_new = sampler_new,
    .tp_dealloc = (destructor)sampler_dealloc,
    .tp_methods = sampler_methods,
    .tp_members = sampler_members,
};
