"""A software prefetch for numba kernels: LLVM's llvm.prefetch on an array element.

A table lookup per key waits about one memory latency for its row; asking for the
rows of keys a few places ahead lets those misses overlap with the work on this one.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, flat, index):
    """Hint that flat[index] (a 1-D contiguous array) will be read soon. No effect on results;
    an index out of bounds is harmless (a prefetch never faults)."""
    sig = types.void(flat, index)

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        byte_ptr = ir.IntType(8).as_pointer()
        address = builder.bitcast(builder.gep(array.data, [args[1]]), byte_ptr)
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            "llvm.prefetch.p0")
        # read, high temporal locality, data cache
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen
