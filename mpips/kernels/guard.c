/* The call guard of the kernels compiled ahead of time (see ahead.py).
 *
 * numba's ahead-of-time exports take their arguments unchecked: an array of another dtype,
 * rank, layout or a read-only one would be read or written as if it were the declared
 * kind. A Guarded kernel holds a kernel's exports, each with the kinds of its arguments,
 * and calls the first whose kinds the arguments have, checking in C (about what numba's own
 * dispatcher costs); arguments no export takes go to a Python fallback (numba's JIT). An
 * export with a direct entry (run/ahead_natives: written for each build and compiled with
 * this file as `mpips_entries`) is called through it, into the kernel's native function,
 * instead of through numba's wrapper; a kernel that raised is called again through the
 * wrapper, which raises its exception.
 *
 * An argument's kind is 4 bytes: what (0 array, 1 scalar), numpy's type character
 * ('i', 'u', 'f', 'b'), the item size, and for an array its rank in the low 4 bits of the
 * last byte with flags above: 0x10 C-contiguous, 0x20 F-contiguous, 0x40 writeable,
 * 0x80 read-only. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL mpips_guard_ARRAY_API
#include <numpy/arrayobject.h>
#include <structmember.h>
#include <dlfcn.h>

typedef PyObject *(*entry_t)(void *, PyObject *const *);
extern entry_t mpips_entries[];
extern const Py_ssize_t mpips_entry_count;

#define C_CONTIGUOUS 0x10
#define F_CONTIGUOUS 0x20
#define WRITEABLE 0x40
#define READ_ONLY 0x80

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name;
    PyObject *exports;   /* tuple of (callable, bytes of kinds[, file, native symbol, entry]) */
    PyObject *fallback;  /* callable(*args, **kwargs) */
    void **natives;      /* per export: its native function, or NULL */
    entry_t *entries;    /* per export: the direct entry that calls it */
    Py_ssize_t direct;   /* exports called through a direct entry */
    PyObject *py_func;   /* the kernel's Python source function */
    Py_ssize_t hits;
    Py_ssize_t misses;
} Guarded;

static int scalar_kind(PyObject *o, char *type, int *size)
{
    if (PyBool_Check(o)) { *type = 'b'; *size = 1; return 1; }
    if (PyLong_CheckExact(o)) { *type = 'i'; *size = 8; return 1; }
    if (PyFloat_CheckExact(o)) { *type = 'f'; *size = 8; return 1; }
    if (PyArray_IsScalar(o, Generic)) {
        PyArray_Descr *d = PyArray_DescrFromScalar(o);
        if (d == NULL) { PyErr_Clear(); return 0; }
        *type = d->kind;
        *size = (int)PyDataType_ELSIZE(d);
        Py_DECREF(d);
        return 1;
    }
    return 0;
}

static int takes(const unsigned char *kinds, PyObject *const *args, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *k = kinds + 4 * i;
        PyObject *o = args[i];
        if (k[0] == 0) {
            if (!PyArray_Check(o))
                return 0;
            PyArrayObject *a = (PyArrayObject *)o;
            int flags = PyArray_FLAGS(a);
            if (PyArray_DESCR(a)->kind != (char)k[1] || PyArray_ITEMSIZE(a) != k[2]
                    || PyArray_NDIM(a) != (k[3] & 0x0f) || !PyArray_ISNOTSWAPPED(a)
                    || !(flags & NPY_ARRAY_ALIGNED))
                return 0;
            if ((k[3] & C_CONTIGUOUS) && !(flags & NPY_ARRAY_C_CONTIGUOUS))
                return 0;
            if ((k[3] & F_CONTIGUOUS) && !(flags & NPY_ARRAY_F_CONTIGUOUS))
                return 0;
            if ((k[3] & WRITEABLE) && !(flags & NPY_ARRAY_WRITEABLE))
                return 0;
            if ((k[3] & READ_ONLY) && (flags & NPY_ARRAY_WRITEABLE))
                return 0;
        } else {
            char type;
            int size;
            if (!scalar_kind(o, &type, &size) || type != (char)k[1] || size != k[2])
                return 0;
        }
    }
    return 1;
}

static PyObject *guarded_call(PyObject *self_, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    Guarded *self = (Guarded *)self_;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        Py_ssize_t count = PyTuple_GET_SIZE(self->exports);
        for (Py_ssize_t e = 0; e < count; e++) {
            PyObject *pair = PyTuple_GET_ITEM(self->exports, e);
            PyObject *kinds = PyTuple_GET_ITEM(pair, 1);
            if (PyBytes_GET_SIZE(kinds) != 4 * n)
                continue;
            if (takes((const unsigned char *)PyBytes_AS_STRING(kinds), args, n)) {
                self->hits++;
                if (self->natives[e] != NULL) {
                    PyObject *result = self->entries[e](self->natives[e], args);
                    if (result != NULL || PyErr_Occurred())
                        return result;
                }
                return PyObject_Vectorcall(PyTuple_GET_ITEM(pair, 0), args, nargsf, NULL);
            }
        }
    }
    self->misses++;
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* The native function and direct entry of an export (callable, kinds, file, symbol, entry):
 * NULL where it has none, where its file is not loaded or the symbol is not in it (the
 * export's wrapper is called). -1 on an error. */
static int find_native(PyObject *pair, void **native, entry_t *entry)
{
    *native = NULL;
    if (PyTuple_GET_SIZE(pair) != 5)
        return 0;
    Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 4));
    if (index == -1 && PyErr_Occurred())
        return -1;
    if (index < 0 || index >= mpips_entry_count)
        return 0;
    const char *file = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 2));
    const char *symbol = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 3));
    if (file == NULL || symbol == NULL)
        return -1;
    void *handle = dlopen(file, RTLD_NOW | RTLD_NOLOAD);   /* (loaded: its module is) */
    if (handle == NULL)
        return 0;
    *native = dlsym(handle, symbol);
    *entry = mpips_entries[index];
    dlclose(handle);   /* (the count dlopen added: the module keeps it loaded) */
    return 0;
}

static PyObject *guarded_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *name, *exports, *fallback, *py_func;
    static char *names[] = {"name", "exports", "fallback", "py_func", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UO!OO:Guarded", names, &name, &PyTuple_Type,
                                     &exports, &fallback, &py_func))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(exports);
    for (Py_ssize_t e = 0; e < count; e++) {
        PyObject *pair = PyTuple_GET_ITEM(exports, e);
        if (!PyTuple_Check(pair)
                || (PyTuple_GET_SIZE(pair) != 2 && PyTuple_GET_SIZE(pair) != 5)
                || !PyCallable_Check(PyTuple_GET_ITEM(pair, 0))
                || !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))
                || PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1)) % 4
                || (PyTuple_GET_SIZE(pair) == 5
                    && (!PyUnicode_Check(PyTuple_GET_ITEM(pair, 2))
                        || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 3))
                        || !PyLong_Check(PyTuple_GET_ITEM(pair, 4))))) {
            PyErr_SetString(PyExc_TypeError,
                            "exports: a tuple of (callable, bytes of 4 per argument[, file, "
                            "native symbol, entry])");
            return NULL;
        }
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback: a callable");
        return NULL;
    }
    Guarded *self = (Guarded *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->natives = PyMem_Calloc(count + 1, sizeof(void *));
    self->entries = PyMem_Calloc(count + 1, sizeof(entry_t));
    if (self->natives == NULL || self->entries == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t e = 0; e < count; e++)
        if (find_native(PyTuple_GET_ITEM(exports, e), &self->natives[e], &self->entries[e])) {
            Py_DECREF(self);
            return NULL;
        } else if (self->natives[e] != NULL) {
            self->direct++;
        }
    self->vectorcall = guarded_call;
    Py_INCREF(name);
    Py_INCREF(exports);
    Py_INCREF(fallback);
    Py_INCREF(py_func);
    self->py_func = py_func;
    self->name = name;
    self->exports = exports;
    self->fallback = fallback;
    return (PyObject *)self;
}

static int guarded_traverse(Guarded *self, visitproc visit, void *arg)
{
    Py_VISIT(self->exports);
    Py_VISIT(self->fallback);
    Py_VISIT(self->py_func);
    return 0;
}

static int guarded_clear(Guarded *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->exports);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->py_func);
    return 0;
}

static void guarded_dealloc(Guarded *self)
{
    PyObject_GC_UnTrack(self);
    guarded_clear(self);
    PyMem_Free(self->natives);
    PyMem_Free(self->entries);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *guarded_repr(Guarded *self)
{
    return PyUnicode_FromFormat("<kernel %U: %zd exports compiled ahead>", self->name,
                                PyTuple_GET_SIZE(self->exports));
}

static PyMemberDef guarded_members[] = {
    {"name", T_OBJECT, offsetof(Guarded, name), READONLY, "the kernel's module.function"},
    {"exports", T_OBJECT, offsetof(Guarded, exports), READONLY,
     "(callable, kinds) of each export, tried in order"},
    {"fallback", T_OBJECT, offsetof(Guarded, fallback), READONLY,
     "what takes the arguments no export takes"},
    {"py_func", T_OBJECT, offsetof(Guarded, py_func), READONLY,
     "the Python function the kernel was compiled from"},
    {"hits", T_PYSSIZET, offsetof(Guarded, hits), READONLY, "calls an export took"},
    {"direct", T_PYSSIZET, offsetof(Guarded, direct), READONLY,
     "exports called through a direct entry into their native function"},
    {"misses", T_PYSSIZET, offsetof(Guarded, misses), READONLY, "calls the fallback took"},
    {NULL},
};

static PyTypeObject GuardedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_guard.Guarded",
    .tp_basicsize = sizeof(Guarded),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A kernel's exports compiled ahead, each called only with the kinds it takes.",
    .tp_new = guarded_new,
    .tp_dealloc = (destructor)guarded_dealloc,
    .tp_traverse = (traverseproc)guarded_traverse,
    .tp_clear = (inquiry)guarded_clear,
    .tp_repr = (reprfunc)guarded_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Guarded, vectorcall),
    .tp_members = guarded_members,
};

static struct PyModuleDef guard_module = {
    PyModuleDef_HEAD_INIT, "_guard",
    "The call guard of mpips's kernels compiled ahead of time.", -1, NULL,
};

PyMODINIT_FUNC PyInit__guard(void)
{
    import_array();
    if (PyType_Ready(&GuardedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&guard_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&GuardedType);
    if (PyModule_AddObject(m, "Guarded", (PyObject *)&GuardedType) < 0) {
        Py_DECREF(&GuardedType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
