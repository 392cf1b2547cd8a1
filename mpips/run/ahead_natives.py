"""Direct entries into the kernels compiled ahead: C functions that call a kernel's native
function with the fields of its arguments, instead of numba's wrapper of it.

numba's ahead compiler exports each kernel behind a wrapper that makes a tuple of the
arguments, unboxes each array into a new record of numba's runtime and frees it after the
call: 40-70 ns an argument, 0.6 us of a 0.9 us call of the 13 arguments of a pull's lookup.
The build keeps each kernel's native function visible as `native_symbol(export)`, with the C
calling convention and every argument (`keep_natives`: numba's optimiser would otherwise
make it private, change its calling convention and drop arguments it does not read), and
writes one C entry per form (`entries`) that passes the arguments as numba's native
functions take them:

  an array    its record's fields: the runtime's record (NULL: nothing of the kernel keeps
              the array), its Python object (NULL: nothing is reflected back), items, item
              size, data, then its shape and strides, a word each per dimension
  a scalar    int64, uint64, double, or a byte for a boolean

and a kernel's result through a pointer, its status (0, or -2 for None) returned. The call
guard (kernels/guard.c) has checked every argument's kind before an entry is called. A
kernel whose result is an array or a tuple keeps numba's wrapper; a status that says the
kernel raised sends the call to numba's wrapper, which raises the exception as numba does.
"""

NATIVE_SUFFIX = "__native"
# results an entry returns (numba's type name -> C type, the Python object made of it)
RESULTS = {"none": ("int64_t", "Py_NewRef(Py_None)"),
           "int64": ("int64_t", "PyLong_FromLongLong(ret)"),
           "uint64": ("uint64_t", "PyLong_FromUnsignedLongLong(ret)"),
           "float64": ("double", "PyFloat_FromDouble(ret)"),
           "bool": ("uint8_t", "PyBool_FromLong(ret)")}
# a scalar argument's kind (its type character and size) -> C type, its reading
SCALARS = {("i", 8): ("int64_t", "PyLong_AsLongLong({o})"),
           ("u", 8): ("uint64_t", "PyLong_AsUnsignedLongLongMask({o})"),
           ("f", 8): ("double", "PyFloat_AsDouble({o})"),
           ("b", 1): ("uint8_t", "(uint8_t)PyObject_IsTrue({o})")}


def native_symbol(export: str) -> str:
    return export + NATIVE_SUFFIX


def _kinds(taken: str) -> list[bytes]:
    raw = bytes.fromhex(taken)
    return [raw[j:j + 4] for j in range(0, len(raw), 4)]


def has_entry(taken: str, result: str) -> bool:
    """Whether a form (its arguments' kinds, its result's numba type) gets a direct entry."""
    return result in RESULTS and all(
        k[0] == 0 or (chr(k[1]), k[2]) in SCALARS for k in _kinds(taken))


def entry(index: int, taken: str, result: str) -> str:
    """The C source of direct entry `index` of a form: (native function, arguments) ->
    its result, or NULL without an error set if the kernel raised."""
    params, values, reads = ["void *", "void *"], ["&ret", "&exc"], []
    for i, k in enumerate(_kinds(taken)):
        if k[0] == 0:
            ndim = k[3] & 0x0F
            a = f"((PyArrayObject *)args[{i}])"
            params += ["void *", "void *", "int64_t", "int64_t", "void *"]
            params += ["int64_t"] * (2 * ndim)
            values += ["NULL", "NULL", f"PyArray_SIZE({a})", f"PyArray_ITEMSIZE({a})",
                       f"PyArray_DATA({a})"]
            values += [f"PyArray_DIM({a}, {d})" for d in range(ndim)]
            values += [f"PyArray_STRIDE({a}, {d})" for d in range(ndim)]
        else:
            ctype, read = SCALARS[(chr(k[1]), k[2])]
            reads.append(f"    {ctype} s{i} = {read.format(o=f'args[{i}]')};")
            params.append(ctype)
            values.append(f"s{i}")
    ctype, box = RESULTS[result]
    lines = [f"static PyObject *entry_{index}(void *native, PyObject *const *args)", "{",
             f"    {ctype} ret = 0;", "    void *exc = NULL;", "    int32_t status;", *reads,
             "    if (PyErr_Occurred())", "        return NULL;",
             "    Py_BEGIN_ALLOW_THREADS",
             f"    status = ((int32_t (*)({', '.join(params)}))native)(",
             f"        {', '.join(values)});",
             "    Py_END_ALLOW_THREADS",
             "    if (status != 0 && status != -2)", "        return NULL;",
             f"    return {box};", "}", ""]
    return "\n".join(lines)


def entries(forms: list[tuple[str, str]]) -> str:
    """The C source of the direct entries of `forms` ([(kinds, result)], each with an
    entry: has_entry), as the table `mpips_entries` the guard is compiled with."""
    head = ["/* Written by mpips.run.ahead_natives for this build: do not edit. */",
            "#define PY_SSIZE_T_CLEAN", "#include <Python.h>",
            "#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION",
            "#define NO_IMPORT_ARRAY", "#define PY_ARRAY_UNIQUE_SYMBOL mpips_guard_ARRAY_API",
            "#include <numpy/arrayobject.h>", "#include <stdint.h>", "",
            "typedef PyObject *(*entry_t)(void *, PyObject *const *);", ""]
    body = [entry(i, taken, result) for i, (taken, result) in enumerate(forms)]
    table = ["entry_t mpips_entries[] = {",
             *[f"    entry_{i}," for i in range(len(forms))], "    NULL,", "};",
             f"const Py_ssize_t mpips_entry_count = {len(forms)};", ""]
    return "\n".join(head + body + table)


def keep_natives() -> None:
    """numba's ahead compiler to keep each export's native function visible, under
    `native_symbol` of the export's name, with the C calling convention and all its
    arguments: made external before the library is optimised (see the module's docstring).
    For the process that compiles a group of kernels (ahead_build._build_group)."""
    from numba.pycc import cc, compiler
    compiled: list = []
    compile_extra = compiler.compile_extra

    def compiling(*args, **kwargs):
        result = compile_extra(*args, **kwargs)
        compiled.append(result)
        return result

    class KeepingNatives(compiler.ModuleCompiler):
        def _emit_python_wrapper(self, llvm_module):
            # (after every export is compiled and made internal, before the library's
            # optimisation: the names and linkage set here are those it optimises)
            for export, result in zip(self.export_entries, compiled):
                function = result.library.get_function(result.fndesc.llvm_func_name)
                function.name = native_symbol(export.symbol)
                function.linkage = "external"
                self.dll_exports.append(function.name)
            return super()._emit_python_wrapper(llvm_module)

    compiler.compile_extra = compiling
    cc.ModuleCompiler = KeepingNatives  # type: ignore[misc]
