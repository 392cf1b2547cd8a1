"""A software prefetch for numba kernels: LLVM's llvm.prefetch on a row of an array.

A table lookup per key waits about one memory latency for its row; asking for the
rows of keys a few places ahead lets those misses overlap with the work on this one.
"""
from .jit import intrinsic

AHEAD = 16   # rows a lookup asks for ahead of the one it probes: enough to overlap the misses
# An update does less a row than a probe, so more rows go by while one arrives: it asks
# twice as far ahead (AdaGrad over a minibatch's 18,335 rows of a 64 MB table, 0.22 -> 0.18
# ms; a lookup gains nothing past 16).
UPDATE_AHEAD = 2 * AHEAD


@intrinsic
def prefetch(typingctx, array, row):
    """Hint that array[row] (along the first axis) will be read soon. No effect on results; a
    prefetch never faults, but keep `row` in bounds all the same."""
    # Imported here, where numba compiles: a process of kernels compiled ahead loads no numba.
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    sig = types.void(array, row)

    def codegen(context, builder, signature, args):
        view = context.make_array(signature.args[0])(context, builder, args[0])
        stride = cgutils.unpack_tuple(builder, view.strides, signature.args[0].ndim)[0]
        i64 = ir.IntType(64)
        offset = builder.mul(builder.sext(args[1], i64) if args[1].type != i64 else args[1],
                             stride)
        byte_ptr = ir.IntType(8).as_pointer()
        address = builder.inttoptr(builder.add(builder.ptrtoint(view.data, i64), offset),
                                   byte_ptr)
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            "llvm.prefetch.p0")
        # read, high temporal locality, data cache
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen
