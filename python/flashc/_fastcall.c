/* _fastcall.c : the Python package's prepared calls (interface._Recipe) in C, the
 * module flashc._fastcall.
 *
 * A decode loop calls flash_attn_with_kvcache (or flash_attn_func) with the same
 * shapes every step. interface.py records the first call of a signature (every
 * tensor's shape, strides, dtype and device, and every option) as an args struct and
 * params, and replays it for later calls with only the data pointers set. In Python
 * that replay costs ~12 us a call (bench/NOTES.md), torch's own SDPA call ~4: the key
 * of the signature and the replay are the two functions here, the same steps as
 * _Recipe.signature and _Recipe.call, with no interpreter in between.
 *
 *   key(tag, tensors, options) -> bytes, or None where the call must go the whole way
 *   call(entry, tensors)       -> [outputs], or None where it must run in Python
 *
 * key answers None where _Recipe.signature does (see there), and two calls get the
 * same key where signature gives them equal keys, with these differences, none of which
 * changes a result: key answers None for an option of an int beyond 64 bits, for a
 * tensor of a dtype flashc does not take or of more than FC_MAX_NDIM dimensions, and
 * for a key past 1024 bytes (the whole way then runs, and fails where
 * the dtype or the dimensions are wrong), where signature gives a key; NaN options,
 * which the whole way refuses, get equal keys here; and a tensor without strides
 * (sparse) answers None here where signature raises (the whole way raises then).
 *
 * It links neither libflashc nor torch, nor any one Python: it is built on the stable
 * ABI (Py_LIMITED_API, CPython 3.9 on), the library's entry points come as addresses
 * from the ctypes binding (_lib.py), torch's functions as Python callables (setup),
 * and the args struct and params as the bytes the whole way's call was given. The
 * library call runs with the GIL released, as ctypes runs it.
 */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- what setup() hands over ---- */
static PyObject *fc_plain_types; /* torch.Tensor, nn.Parameter (interface._PLAIN) */
static PyObject *fc_dtypes;      /* the dtypes flashc takes, in flashc_dtype's order */
static PyObject *fc_uint8;       /* torch.uint8 (a CUDA workspace) */
/* _direct's questions to torch: each answers a false value for a plain call */
/* (len_torch_dispatch_stack, a torch function mode, the tracing state, the functorch
 * stack); is_compiling is the caller's to ask, before key: torch.compile must not trace
 * into this module */
static PyObject *fc_checks;
static PyObject *fc_grad_enabled, *fc_empty, *fc_increment_version;
static PyObject *fc_current_device, *fc_raw_stream; /* None without CUDA */
static PyObject *fc_fail;        /* fail(name, status, rename): raises the library's error */
static PyObject *fc_s_get_device, *fc_s_stride, *fc_s_shape, *fc_s_dtype, *fc_s_is_cpu,
    *fc_s_is_cuda, *fc_s_requires_grad, *fc_s_is_neg, *fc_s_data_ptr, *fc_s_device,
    *fc_k_dtype, *fc_k_device;

enum { FC_MAX_NDIM = 8, FC_MAX_STRUCT = 4096, FC_WORKSPACE_ALIGN = 256 };
/* The module's PROTOCOL: setup's arguments, the key's and the entry's layout. _lib.py
 * loads a module of its own protocol only; a change to any of them bumps it. */
enum { FC_PROTOCOL = 2 };
typedef int (*fc_entry_fn)(const void *args, const void *params, void *workspace, size_t bytes);
typedef int (*fc_size_fn)(const void *args, const void *params, size_t *bytes);

/* A growing byte string: the key under construction. */
typedef struct fc_key {
    unsigned char bytes[1024];
    size_t n;
} fc_key;

static int fc_put(fc_key *k, const void *p, size_t n) {
    if (k->n + n > sizeof k->bytes) return 0;
    memcpy(k->bytes + k->n, p, n);
    k->n += n;
    return 1;
}

static int fc_put_i64(fc_key *k, int64_t v) { return fc_put(k, &v, sizeof v); }

/* obj's method `name` called without arguments, as an int64; -1 with an error set
 * (*ok 0) where it is none. */
static int64_t fc_call_i64(PyObject *obj, PyObject *name, int *ok) {
    PyObject *r = PyObject_CallMethodObjArgs(obj, name, NULL);
    int64_t v = r ? PyLong_AsLongLong(r) : -1;
    Py_XDECREF(r);
    *ok = !PyErr_Occurred();
    return v;
}

/* Whether obj's type is one of setup's plain tensor types (a subclass is not). */
static int fc_plain(PyObject *obj) {
    for (Py_ssize_t i = 0; i < PyTuple_Size(fc_plain_types); i++)
        if ((PyObject *)Py_TYPE(obj) == PyTuple_GetItem(fc_plain_types, i)) return 1;
    return 0;
}

/* The truth of obj.name (an attribute); -1 with an error set. */
static int fc_attr_true(PyObject *obj, PyObject *name) {
    PyObject *r = PyObject_GetAttr(obj, name);
    int v = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    return v;
}

/* 1 where the call may skip torch's dispatcher (interface._direct's global part, but
 * for is_compiling; grad mode in *grad), 0 where not, -1 on error. */
static int fc_direct_globals(int *grad) {
    Py_ssize_t n = PyTuple_Size(fc_checks);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyObject_CallObject(PyTuple_GetItem(fc_checks, i), NULL);
        if (!r) return -1;
        /* each answers None, False or 0 when idle (the dispatch stack's length, a torch
         * function mode; the tracing state and the functorch stack, None) */
        int idle = r == Py_None || r == Py_False || (PyLong_Check(r) && PyLong_AsLong(r) == 0);
        Py_DECREF(r);
        if (PyErr_Occurred()) return -1;
        if (!idle) return 0;
    }
    PyObject *g = PyObject_CallObject(fc_grad_enabled, NULL);
    if (!g) return -1;
    *grad = PyObject_IsTrue(g);
    Py_DECREF(g);
    return *grad < 0 ? -1 : 1;
}

/* An option into the key: (type, value) of a plain scalar (int, float, bool, None),
 * as _options_key; 0 for anything else. */
static int fc_put_scalar(fc_key *k, PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    if (o == Py_None) return fc_put(k, "n", 1);
    if (t == &PyBool_Type) return fc_put(k, o == Py_True ? "T" : "F", 1);
    if (t == &PyLong_Type) {
        int over = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &over);
        if (over || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        return fc_put(k, "i", 1) && fc_put_i64(k, v);
    }
    if (t == &PyFloat_Type) {
        double v = PyFloat_AsDouble(o) + 0.0; /* -0.0 == 0.0, as in signature's key */
        return fc_put(k, "f", 1) && fc_put(k, &v, sizeof v);
    }
    return 0;
}

/* A tensor argument into the key: its shape, strides and dtype; 0 where the call
 * must go the whole way (another device, a last stride other than 1), -1 on error. */
static int fc_put_tensor(fc_key *k, PyObject *t, int64_t device) {
    int ok;
    if (fc_call_i64(t, fc_s_get_device, &ok) != device || !ok) return ok ? 0 : -1;
    PyObject *shape = PyObject_GetAttr(t, fc_s_shape);
    PyObject *stride = shape ? PyObject_CallMethodObjArgs(t, fc_s_stride, NULL) : NULL;
    PyObject *dtype = stride ? PyObject_GetAttr(t, fc_s_dtype) : NULL;
    int r = -1;
    if (!dtype) goto done;
    Py_ssize_t nd = PyTuple_Size(stride), ns = PyObject_Size(shape);
    if (nd < 0 || ns < 0) goto done;
    r = 0;
    if (nd > FC_MAX_NDIM || ns != nd) goto done;
    int64_t d[2 * FC_MAX_NDIM];
    r = -1;
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *s = PySequence_GetItem(shape, i);
        if (!s) goto done;
        d[i] = PyLong_AsLongLong(s);
        Py_DECREF(s);
        d[nd + i] = PyLong_AsLongLong(PyTuple_GetItem(stride, i));
        if (PyErr_Occurred()) goto done;
    }
    r = 0;
    if (nd && d[2 * nd - 1] != 1 && d[nd - 1] > 1) goto done;
    int64_t code = -1;
    for (Py_ssize_t i = 0; i < PyTuple_Size(fc_dtypes); i++)
        if (PyTuple_GetItem(fc_dtypes, i) == dtype) code = i;
    if (code < 0) goto done; /* a dtype flashc does not take: the whole way says so */
    r = fc_put(k, "t", 1) && fc_put_i64(k, code) && fc_put_i64(k, nd) &&
        fc_put(k, d, (size_t)(2 * nd) * sizeof d[0]);
done:
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(dtype);
    return r;
}

/* key(tag, tensors, options): see the top of the file. */
static PyObject *fc_key_of(PyObject *self, PyObject *args) {
    long long tag;
    PyObject *tensors, *options;
    (void)self;
    if (!PyArg_ParseTuple(args, "LO!O!", &tag, &PyTuple_Type, &tensors, &PyTuple_Type,
                          &options))
        return NULL;
    Py_ssize_t nt = PyTuple_Size(tensors);
    if (!fc_plain_types) {
        PyErr_SetString(PyExc_RuntimeError, "_fastcall.key before _fastcall.setup");
        return NULL;
    }
    PyObject *q = nt > 0 ? PyTuple_GetItem(tensors, 0) : NULL;
    if (!q || !fc_plain(q)) Py_RETURN_NONE;
    int grad = 0, direct = fc_direct_globals(&grad);
    if (direct <= 0) {
        if (direct < 0) return NULL;
        Py_RETURN_NONE;
    }
    /* _direct's per-tensor part, and signature's: None or a plain tensor (fc_plain) on the
     * CPU or a CUDA device, recording nothing for autograd, no lazy negation */
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *a = PyTuple_GetItem(tensors, i);
        if (a == Py_None) continue;
        if (!fc_plain(a)) Py_RETURN_NONE;
        int cpu = fc_attr_true(a, fc_s_is_cpu), cuda = cpu == 0 ? fc_attr_true(a, fc_s_is_cuda) : 0;
        if (cpu < 0 || cuda < 0) return NULL;
        if (!cpu && !cuda) Py_RETURN_NONE;
        if (grad) {
            int rg = fc_attr_true(a, fc_s_requires_grad);
            if (rg < 0) return NULL;
            if (rg) Py_RETURN_NONE;
        }
        PyObject *neg = PyObject_CallMethodObjArgs(a, fc_s_is_neg, NULL);
        int isneg = neg ? PyObject_IsTrue(neg) : -1;
        Py_XDECREF(neg);
        if (isneg < 0) return NULL;
        if (isneg) Py_RETURN_NONE;
    }
    fc_key k = {.n = 0};
    int ok;
    int64_t device = fc_call_i64(q, fc_s_get_device, &ok); /* -1: the CPU */
    if (!ok) return NULL;
    if (!fc_put_i64(&k, tag) || !fc_put_i64(&k, device)) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < PyTuple_Size(options); i++) {
        PyObject *o = PyTuple_GetItem(options, i);
        PyTypeObject *t = Py_TYPE(o);
        if (t == &PyTuple_Type || t == &PyList_Type) {
            Py_ssize_t n = PyObject_Size(o);
            if (!fc_put(&k, t == &PyTuple_Type ? "(" : "[", 1) || !fc_put_i64(&k, n))
                Py_RETURN_NONE;
            for (Py_ssize_t j = 0; j < n; j++) {
                PyObject *w = PySequence_GetItem(o, j);
                int put = w && fc_put_scalar(&k, w);
                Py_XDECREF(w);
                if (PyErr_Occurred()) return NULL;
                if (!put) Py_RETURN_NONE;
            }
        } else if (!fc_put_scalar(&k, o)) {
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = PyTuple_GetItem(tensors, i);
        if (t == Py_None) {
            if (!fc_put(&k, "-", 1)) Py_RETURN_NONE;
            continue;
        }
        int r = fc_put_tensor(&k, t, device);
        if (r < 0) return NULL;
        if (r == 0) Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)k.bytes, (Py_ssize_t)k.n);
}

/* A pointer from a Python int (an address from ctypes, a data_ptr()). */
static void *fc_ptr(PyObject *o) { return o == Py_None ? NULL : PyLong_AsVoidPtr(o); }

/* obj.data_ptr() into *p: 0, or -1 with an error set. */
static int fc_data_ptr(PyObject *obj, void **p) {
    PyObject *d = PyObject_CallMethodObjArgs(obj, fc_s_data_ptr, NULL);
    *p = d ? fc_ptr(d) : NULL;
    Py_XDECREF(d);
    return PyErr_Occurred() ? -1 : 0;
}

/* Write address p at byte `off` of buf. */
static void fc_set_ptr(char *buf, Py_ssize_t off, void *p) { memcpy(buf + off, &p, sizeof p); }

/* torch.empty(*shape, dtype=dtype, device=device), shape a tuple of ints (the sizes
 * as arguments of their own: torch parses them in 0.9 us where it takes 1.3 for one
 * tuple, bench/NOTES.md) */
static PyObject *fc_new_empty(PyObject *shape, PyObject *dtype, PyObject *device) {
    PyObject *a = PyTuple_Size(shape) ? shape : PyTuple_Pack(1, shape), *kw = PyDict_New();
    PyObject *t = NULL;
    if (a == shape) Py_INCREF(a);
    if (a && kw && PyDict_SetItem(kw, fc_k_dtype, dtype) == 0 &&
        PyDict_SetItem(kw, fc_k_device, device) == 0)
        t = PyObject_Call(fc_empty, a, kw);
    Py_XDECREF(a);
    Py_XDECREF(kw);
    return t;
}

/* 1 where o is a tuple of n items (any number where n < 0), else 0 with ValueError. */
static int fc_tuple_of(PyObject *o, Py_ssize_t n, const char *what) {
    if (PyTuple_Check(o) && (n < 0 || PyTuple_Size(o) == n)) return 1;
    if (n < 0)
        PyErr_Format(PyExc_ValueError, "_fastcall.call: the entry's %s is not a tuple", what);
    else
        PyErr_Format(PyExc_ValueError, "_fastcall.call: the entry's %s is not a tuple of %zd",
                     what, n);
    return 0;
}

/* 1 where o (a Python int: an offset or an index) lies in [lo, hi], else 0 with an
 * error set. */
static int fc_in(PyObject *o, Py_ssize_t lo, Py_ssize_t hi) {
    Py_ssize_t v = PyLong_AsSsize_t(o);
    if (PyErr_Occurred()) return 0;
    if (v >= lo && v <= hi) return 1;
    PyErr_Format(PyExc_ValueError, "_fastcall.call: the entry's %zd lies outside [%zd, %zd]", v,
                 lo, hi);
    return 0;
}

/* The entry's layout (see call below), every offset inside its buffer and every index
 * inside tensors (nt of them): 1, else 0 with an error set. */
static int fc_entry_ok(PyObject *entry, Py_ssize_t nt) {
    if (!fc_tuple_of(entry, 10, "whole")) return 0;
    PyObject *tmpl = PyTuple_GetItem(entry, 2), *prm = PyTuple_GetItem(entry, 3);
    if (!PyBytes_Check(tmpl) || !PyBytes_Check(prm) || PyBytes_Size(tmpl) > FC_MAX_STRUCT ||
        PyBytes_Size(prm) > FC_MAX_STRUCT) {
        PyErr_SetString(PyExc_ValueError, "_fastcall.call: the struct and params are bytes of "
                                          "at most 4096");
        return 0;
    }
    /* a pointer's offset in the struct (nb bytes) or params, a tensor's index */
    const Py_ssize_t nb = PyBytes_Size(tmpl), last = nb - (Py_ssize_t)sizeof(void *);
    if (!fc_in(PyTuple_GetItem(entry, 4), 0, PyBytes_Size(prm) - (Py_ssize_t)sizeof(void *)))
        return 0;
    PyObject *fields = PyTuple_GetItem(entry, 5), *outputs = PyTuple_GetItem(entry, 6),
             *mutated = PyTuple_GetItem(entry, 7);
    if (!fc_tuple_of(fields, -1, "fields") || !fc_tuple_of(outputs, -1, "outputs") ||
        !fc_tuple_of(mutated, -1, "mutated"))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_Size(fields); i++) {
        PyObject *f = PyTuple_GetItem(fields, i);
        if (!fc_tuple_of(f, 2, "field") || !fc_in(PyTuple_GetItem(f, 0), 0, last) ||
            !fc_in(PyTuple_GetItem(f, 1), 0, nt - 1))
            return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(outputs); i++) {
        PyObject *o = PyTuple_GetItem(outputs, i);
        if (!fc_tuple_of(o, 3, "output") || !fc_in(PyTuple_GetItem(o, 0), -1, last))
            return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(mutated); i++)
        if (!fc_in(PyTuple_GetItem(mutated, i), 0, nt - 1))
            return 0;
    return 1;
}

/* call(entry, tensors): a prepared call. entry is the tuple _Recipe.record made:
 * (fn, size_fn, template, params, stream_offset, fields, outputs, mutated, name,
 * rename): the entry point and its size query as addresses, the args struct and
 * params as bytes, the byte offset of params.stream, ((offset of a tensor's data
 * pointer in the struct, its index in tensors), ...), ((offset or -1, shape, dtype),
 * ...) of the outputs to make, the indices of the tensors the op mutates, the entry
 * point's name and the renaming of its error messages. Returns the outputs, or None
 * where q's CUDA device is not the current one (interface switches to it). */
static PyObject *fc_call(PyObject *self, PyObject *args) {
    PyObject *entry, *tensors;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &entry, &PyTuple_Type, &tensors))
        return NULL;
    if (!fc_empty) {
        PyErr_SetString(PyExc_RuntimeError, "_fastcall.call before _fastcall.setup");
        return NULL;
    }
    if (PyTuple_Size(tensors) < 1) {
        PyErr_SetString(PyExc_ValueError, "_fastcall.call: no tensors");
        return NULL;
    }
    if (!fc_entry_ok(entry, PyTuple_Size(tensors))) return NULL;
    fc_entry_fn fn = (fc_entry_fn)fc_ptr(PyTuple_GetItem(entry, 0));
    fc_size_fn size_fn = (fc_size_fn)fc_ptr(PyTuple_GetItem(entry, 1));
    PyObject *tmpl = PyTuple_GetItem(entry, 2), *prm = PyTuple_GetItem(entry, 3);
    Py_ssize_t stream_off = PyLong_AsSsize_t(PyTuple_GetItem(entry, 4));
    PyObject *fields = PyTuple_GetItem(entry, 5), *outputs = PyTuple_GetItem(entry, 6);
    PyObject *mutated = PyTuple_GetItem(entry, 7);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t nb = PyBytes_Size(tmpl), np = PyBytes_Size(prm);
    union {
        char c[FC_MAX_STRUCT];
        int64_t align;
    } a, p;
    memcpy(a.c, PyBytes_AsString(tmpl), (size_t)nb);
    memcpy(p.c, PyBytes_AsString(prm), (size_t)np);

    PyObject *q = PyTuple_GetItem(tensors, 0), *device = NULL, *made = NULL, *ws = NULL;
    int ok, status = 0;
    void *wp = NULL;
    size_t wbytes = 0;
    int64_t dev = fc_call_i64(q, fc_s_get_device, &ok);
    if (!ok) return NULL;
    if (dev >= 0) { /* CUDA: q's device must be current, the stream is its current one */
        if (fc_current_device == Py_None || fc_raw_stream == Py_None) Py_RETURN_NONE;
        PyObject *cur = PyObject_CallObject(fc_current_device, NULL);
        int64_t c = cur ? PyLong_AsLongLong(cur) : -1;
        Py_XDECREF(cur);
        if (PyErr_Occurred()) return NULL;
        if (c != dev) Py_RETURN_NONE;
        PyObject *s = PyObject_CallFunction(fc_raw_stream, "L", (long long)dev);
        void *sp = s ? fc_ptr(s) : NULL;
        Py_XDECREF(s);
        if (PyErr_Occurred()) return NULL;
        fc_set_ptr(p.c, stream_off, sp);
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(fields); i++) {
        PyObject *f = PyTuple_GetItem(fields, i);
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GetItem(f, 0));
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GetItem(f, 1));
        if (PyErr_Occurred()) goto fail;
        void *ptr;
        if (fc_data_ptr(PyTuple_GetItem(tensors, at), &ptr) < 0) goto fail;
        fc_set_ptr(a.c, off, ptr);
    }
    device = PyObject_GetAttr(q, fc_s_device);
    made = device ? PyList_New(0) : NULL;
    if (!made) goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_Size(outputs); i++) {
        PyObject *o = PyTuple_GetItem(outputs, i);
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GetItem(o, 0));
        if (PyErr_Occurred()) goto fail;
        PyObject *t = fc_new_empty(PyTuple_GetItem(o, 1), PyTuple_GetItem(o, 2), device);
        if (!t) goto fail;
        int added = PyList_Append(made, t);
        Py_DECREF(t);
        if (added < 0) goto fail;
        if (off >= 0) {
            void *ptr;
            if (fc_data_ptr(t, &ptr) < 0) goto fail;
            fc_set_ptr(a.c, off, ptr);
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_Size(mutated); i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GetItem(mutated, i));
        if (PyErr_Occurred()) goto fail;
        PyObject *r = PyObject_CallFunctionObjArgs(fc_increment_version,
                                                   PyTuple_GetItem(tensors, at), NULL);
        if (!r) goto fail;
        Py_DECREF(r);
    }
    if (dev >= 0) { /* a workspace of the size the library asks for, from torch */
        Py_BEGIN_ALLOW_THREADS status = size_fn(a.c, p.c, &wbytes);
        Py_END_ALLOW_THREADS
        if (status == 0 && wbytes) {
            PyObject *n = Py_BuildValue("(n)", (Py_ssize_t)(wbytes + FC_WORKSPACE_ALIGN));
            ws = n ? fc_new_empty(n, fc_uint8, device) : NULL;
            Py_XDECREF(n);
            void *w;
            if (!ws || fc_data_ptr(ws, &w) < 0) goto fail;
            wp = (void *)(((uintptr_t)w + FC_WORKSPACE_ALIGN - 1) / FC_WORKSPACE_ALIGN *
                          FC_WORKSPACE_ALIGN);
        }
    }
    if (status == 0) {
        Py_BEGIN_ALLOW_THREADS status = fn(a.c, p.c, wp, wbytes);
        Py_END_ALLOW_THREADS
    }
    /* freeing ws now is safe on CUDA: torch's caching allocator reuses it only for work
     * ordered after this call on the same stream */
    Py_XDECREF(ws);
    ws = NULL;
    if (status != 0) {
        PyObject *r = PyObject_CallFunction(fc_fail, "OiO", PyTuple_GetItem(entry, 8), status,
                                            PyTuple_GetItem(entry, 9));
        Py_XDECREF(r);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "_fastcall.call: the library failed");
        goto fail;
    }
    Py_DECREF(device);
    return made;
fail:
    Py_XDECREF(ws);
    Py_XDECREF(made);
    Py_XDECREF(device);
    return NULL;
}

/* setup(plain_types, dtypes, checks, is_grad_enabled, empty, increment_version,
 * current_device, raw_stream, fail): the torch objects and functions the two calls
 * use (current_device and raw_stream None without CUDA). */
static PyObject *fc_setup(PyObject *self, PyObject *args) {
    PyObject *v[9];
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOO", &PyTuple_Type, &v[0], &PyTuple_Type, &v[1],
                          &PyTuple_Type, &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]))
        return NULL;
    PyObject **slot[9] = {&fc_plain_types, &fc_dtypes,        &fc_checks,
                          &fc_grad_enabled, &fc_empty,         &fc_increment_version,
                          &fc_current_device, &fc_raw_stream, &fc_fail};
    for (int i = 0; i < 9; i++) {
        Py_INCREF(v[i]);
        Py_XDECREF(*slot[i]);
        *slot[i] = v[i];
    }
    PyObject *torch = PyImport_ImportModule("torch");
    if (!torch) return NULL;
    Py_XDECREF(fc_uint8);
    fc_uint8 = PyObject_GetAttrString(torch, "uint8");
    Py_DECREF(torch);
    if (!fc_uint8) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef fc_methods[] = {
    {"setup", fc_setup, METH_VARARGS, "The torch objects the calls use."},
    {"key", fc_key_of, METH_VARARGS, "The key of a prepared call's signature, or None."},
    {"call", fc_call, METH_VARARGS, "A prepared call: its outputs, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fc_module = {
    PyModuleDef_HEAD_INIT, "_fastcall", "The Python package's prepared calls in C.", -1,
    fc_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void) {
    PyObject **names[] = {&fc_s_get_device, &fc_s_stride, &fc_s_shape, &fc_s_dtype,
                          &fc_s_is_cpu, &fc_s_is_cuda, &fc_s_requires_grad, &fc_s_is_neg,
                          &fc_s_data_ptr, &fc_s_device, &fc_k_dtype, &fc_k_device};
    const char *text[] = {"get_device", "stride", "shape", "dtype", "is_cpu", "is_cuda",
                          "requires_grad", "is_neg", "data_ptr", "device", "dtype", "device"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i] = PyUnicode_InternFromString(text[i]))) return NULL;
    PyObject *m = PyModule_Create(&fc_module);
    if (m && PyModule_AddIntConstant(m, "PROTOCOL", FC_PROTOCOL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
