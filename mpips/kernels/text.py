"""Byte-level pieces the text parsers share: where a line ends, and decimal and hexadecimal
digits read eight bytes at a time (one 64-bit word holds eight characters, the first one in
its lowest byte: x86 and ARM are little-endian). Pure numba over uint8 buffers.

A call that passes an array costs numba a reference count up and down (atomic), more than
parsing a key: the word helpers take scalars, and the parsers call them on the common path.
"""
import numpy as np

from .jit import intrinsic, njit, numba_name

trailing_zeros = numba_name("numba.cpython.unsafe.numbers", "trailing_zeros")

NL, CR = 10, 13
ZEROS = np.uint64(0x3030303030303030)   # '0' in every byte
_SIXES = np.uint64(0x0606060606060606)
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_LOW_BYTES, _LOW_SHORTS = np.uint64(0x00FF00FF00FF00FF), np.uint64(0x0000FFFF0000FFFF)
_LOW_INTS = np.uint64(0xFFFFFFFF)
_U1, _U4, _U6, _U8, _U9, _U10, _U16, _U32 = (np.uint64(v) for v in (1, 4, 6, 8, 9, 10, 16, 32))
_U100, _U10000 = np.uint64(100), np.uint64(10000)
# Per byte below 128, x + _AT_LEAST_C has its high bit set iff x >= 'C', x + _ABOVE_C iff
# x > 'C' (no carry leaves a byte).
_ONES = np.uint64(0x0101010101010101)
_AT_LEAST_0, _AT_LEAST_A, _AT_LEAST_a = (_ONES * np.uint64(128 - ord(c)) for c in "0Aa")
_ABOVE_9, _ABOVE_F, _ABOVE_f = (_ONES * np.uint64(127 - ord(c)) for c in "9Ff")
_LOW7, _HIGH = np.uint64(0x7F7F7F7F7F7F7F7F), np.uint64(0x8080808080808080)
_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)


@njit(cache=True, nogil=True, inline="always")
def ends_line(buf, i, n):
    """Whether a line of buf[:n] ends at byte i: '\\n', '\\r\\n', or n ('\\r' just before
    n too: the text's last line without its newline)."""
    if i >= n:
        return True
    c = buf[i]
    return c == NL or (c == CR and (i + 1 == n or buf[i + 1] == NL))


@intrinsic
def load8(typingctx, buf, i):
    """buf[i:i + 8] as one uint64, first byte lowest (the caller keeps i + 8 <= len)."""
    # Imported here, where numba compiles: a process of kernels compiled ahead loads no numba.
    from llvmlite import ir
    from numba import types

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        word = ir.IntType(64).as_pointer()
        return builder.load(builder.bitcast(builder.gep(array.data, [args[1]]), word), align=1)

    return types.uint64(buf, i), codegen


@njit(cache=True, nogil=True, inline="always")
def first_set_byte(mask):
    """The index of the first byte of `mask` that is not zero (8 if none is)."""
    return np.int64(trailing_zeros(mask)) >> 3 if mask != 0 else 8


@njit(cache=True, nogil=True, inline="always")
def non_digits(x):
    """Given 8 bytes of text minus '0' in each (x = word ^ ZEROS), a high-nibble bit in each
    byte that is not a digit: exact up to the first such byte (carries only go up)."""
    return ((x + _SIXES) | x) & _HIGH_NIBBLES


@njit(cache=True, nogil=True, inline="always")
def eight_digits(x):
    """The number the 8 digit values in x's bytes spell, first byte first."""
    x = (x * _U10 + (x >> _U8)) & _LOW_BYTES
    x = (x * _U100 + (x >> _U16)) & _LOW_SHORTS
    return (x * _U10000 + (x >> _U32)) & _LOW_INTS


@njit(cache=True, nogil=True, inline="always")
def first_bytes(x, r):
    """x with all but its first r (0 to 7) bytes zero, those moved to the top: as leading
    zeros, they leave the number the first r digits spell."""
    return (x << np.uint64(63 - 8 * r)) << _U1


@njit(cache=True, nogil=True, inline="always")
def leading_digits(x, r):
    """The number the first r (0 to 7) digit values of x spell."""
    return eight_digits(first_bytes(x, r))


@njit(cache=True, nogil=True, inline="always")
def _within(x, low7, at_least, above):
    """The high bit of each byte of x that lies in [at_least, above] (given x & _LOW7)."""
    return (low7 + at_least) & ~(low7 + above) & ~x & _HIGH


@njit(cache=True, nogil=True, inline="always")
def hex_digits(x):
    """How many of the 8 bytes of text in word x are hexadecimal digits before another."""
    low7 = x & _LOW7
    hex_ = (_within(x, low7, _AT_LEAST_0, _ABOVE_9) | _within(x, low7, _AT_LEAST_A, _ABOVE_F)
            | _within(x, low7, _AT_LEAST_a, _ABOVE_f))
    return first_set_byte(~hex_ & _HIGH)


@njit(cache=True, nogil=True, inline="always")
def hex_value(x, r):
    """The number the first r (0 to 8) hexadecimal digits in word x spell."""
    v = (x & _NIBBLES) + ((x >> _U6) & _ONES) * _U9   # 'a' and 'A' are 1 + 9
    if r < 8:
        v = first_bytes(v, r)
    v = ((v << _U4) | (v >> _U8)) & _LOW_BYTES
    v = ((v << _U8) | (v >> _U16)) & _LOW_SHORTS
    return ((v << _U16) | (v >> _U32)) & _LOW_INTS
