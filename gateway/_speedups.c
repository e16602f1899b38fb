/* The streamed relay's per-event path in C: what runs once per SSE event at a real decode pace.

Two base types, each the twin of a pure-Python class that stays the reference and the fallback
(gateway/speedups.py): `FrameEntry`, the upstream connection's `data_received`, and
`FrameSplice`, the relay's `frame`. Subclassed by gateway/transport/h1.py's connection and
gateway/api/splice.py's Splice, which keep everything that runs once per request in Python.

Why C: at a real pace each upstream read is one chunk frame holding one event, and the Python
around that event (a frame for `data_received`, one for `frame`, their attribute reads) was the
gateway's remaining per-event cost against vllm-router (docs/benchmarks.md, issue 16). Here an
event that is one whole frame of whole events, without usage or [DONE], costs no Python frame:
uvloop calls `data_received`, which checks the frame, stamps the inter-token gap and writes the
upstream's frame to the client as it came. Anything else goes to the Python code as before.

This file imports nothing from the gateway: any layer may use it. Behaviour must match the
Python twins exactly; tests/gateway/test_speedups.py runs both on the same inputs.
*/
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyObject *s_write_paused, *s_parse, *s_frame, *s_frame_stopped;
/* FrameSplice's own `frame` descriptor: a subclass that overrides `frame` is called through it. */
static PyObject *c_frame_descr;

/* ---- FrameSplice: the relay's whole-frame entry ---------------------------------------------- */

/* What is read per event lives in these structs where it can: at ~350 open streams each further
   object an event touches (the relay, the request's Deadline) is a likely cache miss, and
   reading them cost ~2% of the gateway's CPU at 250 req/s (docs/benchmarks.md, issue 16). */
typedef struct {
    PyObject_HEAD
    PyObject *gaps;    /* list of float: inter-token gaps, one per event */
    PyObject *write;   /* the client transport's write */
    PyObject *closing; /* the client transport's is_closing */
    PyObject *flow;    /* the server's write flow control (`write_paused`) */
    double last;       /* the previous event's time */
    char blocked;      /* stopped because the client's buffer is full */
    char held;         /* the relay holds a partial event: frames are refused (kept by Python) */
} FrameSplice;

static PyTypeObject FrameSpliceType;

static inline int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int truthy_attr(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* An unset slot, read where the twin reads it: the same AttributeError. */
static int missing(const char *name)
{
    PyErr_Format(PyExc_AttributeError, "'FrameSplice' object has no attribute '%s'", name);
    return -2;
}

/* -1: not a frame this sink takes; 0: taken, stop feeding; 1: taken, go on; -2: error set.
   The checks run in the twin's order, so an attribute that raises does so in the same cases. */
static int splice_frame(FrameSplice *self, PyObject *data, PyObject *nowobj)
{
    if (!PyBytes_CheckExact(data)) return -1;
    const char *p = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    /* The size line's CRLF, within the first 18 bytes (16 hex digits at most). */
    Py_ssize_t end = -1;
    for (Py_ssize_t j = 0; j + 1 < n && j + 1 < 18; j++) {
        if (p[j] == '\r' && p[j + 1] == '\n') {
            end = j;
            break;
        }
    }
    if (end <= 0 || n < 4 || memcmp(p + n - 4, "\n\n\r\n", 4) != 0) return -1;
    if (self->held) return -1;
    if (memmem(p, (size_t)n, "\"usage\":", 8) != NULL) return -1;
    if (n >= 16 && memcmp(p + n - 16, "data: [DONE]\n\n\r\n", 16) == 0) return -1;
    /* Hex digits only (no sign, space, 0x or extension), and the payload's own size: at least
       one event end, so the frame goes to the client as it came. */
    uint64_t size = 0;
    for (Py_ssize_t j = 0; j < end; j++) {
        int v = hexval(p[j]);
        if (v < 0) return -1;
        size = size * 16 + (uint64_t)v;
    }
    if (size < 2 || size != (uint64_t)(n - end - 4)) return -1;

    /* One gap for the frame, 0 for each further event in it (as the parsed path records). */
    double now = PyFloat_AsDouble(nowobj);
    if (now == -1.0 && PyErr_Occurred()) return -2;
    if (self->gaps == NULL) return missing("gaps");
    if (!PyList_Check(self->gaps)) {
        PyErr_SetString(PyExc_TypeError, "FrameSplice.gaps must be a list");
        return -2;
    }
    PyObject *g = PyFloat_FromDouble(now - self->last);
    if (g == NULL) return -2;
    int rc = PyList_Append(self->gaps, g);
    Py_DECREF(g);
    if (rc < 0) return -2;
    self->last = now;
    Py_ssize_t events = 0;
    const char *q = p + end + 2, *stop = p + n;
    while (q < stop && (q = memmem(q, (size_t)(stop - q), "\n\n", 2)) != NULL) {
        events++;
        q += 2;
    }
    if (events > 1) {
        PyObject *zero = PyFloat_FromDouble(0.0);
        if (zero == NULL) return -2;
        for (Py_ssize_t k = 1; k < events; k++) {
            if (PyList_Append(self->gaps, zero) < 0) {
                Py_DECREF(zero);
                return -2;
            }
        }
        Py_DECREF(zero);
    }
    /* As uvicorn's send: a closing client's event is dropped; the disconnect cancels the relay. */
    /* Strong references across each call: the callee may rebind the attribute it came from. */
    PyObject *fn = self->closing;
    if (fn == NULL) return missing("_closing");
    Py_INCREF(fn);
    PyObject *c = PyObject_CallNoArgs(fn);
    Py_DECREF(fn);
    if (c == NULL) return -2;
    int closing = PyObject_IsTrue(c);
    Py_DECREF(c);
    if (closing < 0) return -2;
    if (closing) return 1;
    fn = self->write;
    if (fn == NULL) return missing("_write");
    Py_INCREF(fn);
    PyObject *r = PyObject_CallOneArg(fn, data);
    Py_DECREF(fn);
    if (r == NULL) return -2;
    Py_DECREF(r);
    PyObject *flow = self->flow;
    if (flow == NULL) return missing("_flow");
    Py_INCREF(flow);
    int paused = truthy_attr(flow, s_write_paused);
    Py_DECREF(flow);
    if (paused < 0) return -2;
    if (paused) {
        self->blocked = 1;
        return 0;
    }
    return 1;
}

static PyObject *FrameSplice_frame(FrameSplice *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "frame(data, now) takes 2 arguments");
        return NULL;
    }
    switch (splice_frame(self, args[0], args[1])) {
    case -2: return NULL;
    case -1: Py_RETURN_NONE;
    case 0: Py_RETURN_FALSE;
    default: Py_RETURN_TRUE;
    }
}

static int FrameSplice_traverse(FrameSplice *self, visitproc visit, void *arg)
{
    Py_VISIT(self->gaps);
    Py_VISIT(self->write);
    Py_VISIT(self->closing);
    Py_VISIT(self->flow);
    return 0;
}

static int FrameSplice_clear(FrameSplice *self)
{
    Py_CLEAR(self->gaps);
    Py_CLEAR(self->write);
    Py_CLEAR(self->closing);
    Py_CLEAR(self->flow);
    return 0;
}

static void FrameSplice_dealloc(FrameSplice *self)
{
    PyObject_GC_UnTrack(self);
    FrameSplice_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef FrameSplice_methods[] = {
    {"frame", (PyCFunction)(void (*)(void))FrameSplice_frame, METH_FASTCALL,
     "frame(data, now): a read taken whole (True/False, as __call__) or None."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef FrameSplice_members[] = {
    {"gaps", T_OBJECT_EX, offsetof(FrameSplice, gaps), 0, NULL},
    {"_write", T_OBJECT_EX, offsetof(FrameSplice, write), 0, NULL},
    {"_closing", T_OBJECT_EX, offsetof(FrameSplice, closing), 0, NULL},
    {"_flow", T_OBJECT_EX, offsetof(FrameSplice, flow), 0, NULL},
    {"last", T_DOUBLE, offsetof(FrameSplice, last), 0, NULL},
    {"blocked", T_BOOL, offsetof(FrameSplice, blocked), 0, NULL},
    {"held", T_BOOL, offsetof(FrameSplice, held), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FrameSpliceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._speedups.FrameSplice",
    .tp_doc = "The relay's whole-frame entry, in C (twin: gateway.speedups.PyFrameSplice).",
    .tp_basicsize = sizeof(FrameSplice),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)FrameSplice_dealloc,
    .tp_traverse = (traverseproc)FrameSplice_traverse,
    .tp_clear = (inquiry)FrameSplice_clear,
    .tp_methods = FrameSplice_methods,
    .tp_members = FrameSplice_members,
};

/* ---- FrameEntry: the upstream connection's data_received ------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *frame;    /* the armed sink's whole-frame entry, or NULL/None */
    PyObject *time;     /* the loop's clock */
    double last_read;   /* the loop time of the last read taken whole (the Deadline follows it) */
    char between;       /* the parser stands between two chunks of a chunked body */
} FrameEntry;

static PyObject *FrameEntry_data_received(FrameEntry *self, PyObject *data)
{
    PyObject *sink = self->frame;
    if (sink != NULL && sink != Py_None && self->between && self->time != NULL) {
        /* Strong references: the clock, the sink and the write may run code that rebinds them. */
        Py_INCREF(sink);
        PyObject *clock = self->time;
        Py_INCREF(clock);
        PyObject *nowobj = PyObject_CallNoArgs(clock);
        Py_DECREF(clock);
        if (nowobj == NULL) {
            Py_DECREF(sink);
            return NULL;
        }
        int more;
        PyObject *r = NULL;
        if (PyObject_TypeCheck(sink, &FrameSpliceType)
            && _PyType_Lookup(Py_TYPE(sink), s_frame) == c_frame_descr) {
            more = splice_frame((FrameSplice *)sink, data, nowobj);
        }
        else {
            r = PyObject_CallMethodObjArgs(sink, s_frame, data, nowobj, NULL);
            more = r == NULL ? -2 : r == Py_None ? -1 : 2; /* 2: taken, truth read below */
        }
        Py_DECREF(sink);
        if (more >= 0) {
            /* Taken whole: the parser was not fed and still stands between two chunks. */
            double now = PyFloat_AsDouble(nowobj);
            if (now == -1.0 && PyErr_Occurred()) more = -2;
            else self->last_read = now;
            if (more == 2) { /* as the twin: `not more` is asked after the read's time is kept */
                more = PyObject_IsTrue(r);
                if (more < 0) more = -2;
            }
        }
        Py_XDECREF(r);
        Py_DECREF(nowobj);
        if (more == -2) return NULL;
        if (more >= 0) {
            if (!more) {
                PyObject *out = PyObject_CallMethodNoArgs((PyObject *)self, s_frame_stopped);
                if (out == NULL) return NULL;
                Py_DECREF(out);
            }
            Py_RETURN_NONE;
        }
    }
    PyObject *out = PyObject_CallMethodOneArg((PyObject *)self, s_parse, data);
    if (out == NULL) return NULL;
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static int FrameEntry_traverse(FrameEntry *self, visitproc visit, void *arg)
{
    Py_VISIT(self->frame);
    Py_VISIT(self->time);
    return 0;
}

static int FrameEntry_clear(FrameEntry *self)
{
    Py_CLEAR(self->frame);
    Py_CLEAR(self->time);
    return 0;
}

static void FrameEntry_dealloc(FrameEntry *self)
{
    PyObject_GC_UnTrack(self);
    FrameEntry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef FrameEntry_methods[] = {
    {"data_received", (PyCFunction)FrameEntry_data_received, METH_O,
     "asyncio.Protocol.data_received: a whole frame to the armed sink, else self._parse(data)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef FrameEntry_members[] = {
    {"_frame", T_OBJECT, offsetof(FrameEntry, frame), 0, NULL},
    {"_last_read", T_DOUBLE, offsetof(FrameEntry, last_read), 0, NULL},
    {"_time", T_OBJECT, offsetof(FrameEntry, time), 0, NULL},
    {"_between_chunks", T_BOOL, offsetof(FrameEntry, between), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FrameEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._speedups.FrameEntry",
    .tp_doc = "The connection's data_received, in C (twin: gateway.speedups.PyFrameEntry).",
    .tp_basicsize = sizeof(FrameEntry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)FrameEntry_dealloc,
    .tp_traverse = (traverseproc)FrameEntry_traverse,
    .tp_clear = (inquiry)FrameEntry_clear,
    .tp_methods = FrameEntry_methods,
    .tp_members = FrameEntry_members,
};

/* ---- the module ------------------------------------------------------------------------------ */

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "gateway._speedups",
    "The streamed relay's per-event path in C (see gateway/_speedups.c).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    if (PyType_Ready(&FrameSpliceType) < 0 || PyType_Ready(&FrameEntryType) < 0) return NULL;
    s_write_paused = PyUnicode_InternFromString("write_paused");
    s_parse = PyUnicode_InternFromString("_parse");
    s_frame = PyUnicode_InternFromString("frame");
    s_frame_stopped = PyUnicode_InternFromString("_frame_stopped");
    if (!s_write_paused || !s_parse || !s_frame || !s_frame_stopped)
        return NULL;
    c_frame_descr = PyDict_GetItemWithError(FrameSpliceType.tp_dict, s_frame);
    if (c_frame_descr == NULL) return NULL;
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) return NULL;
    Py_INCREF(&FrameSpliceType);
    if (PyModule_AddObject(m, "FrameSplice", (PyObject *)&FrameSpliceType) < 0) {
        Py_DECREF(&FrameSpliceType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&FrameEntryType);
    if (PyModule_AddObject(m, "FrameEntry", (PyObject *)&FrameEntryType) < 0) {
        Py_DECREF(&FrameEntryType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
