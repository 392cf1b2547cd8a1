"""The numbers the parsers share with the checks of a job's options, which load no numba: a
key's field in its top byte, and the columns of Criteo's and Avazu's lines."""
import numpy as np

FIELD_SHIFT = np.uint64(56)   # a key of data with fields: its field in the top byte
LOW_BITS = np.uint64((1 << 56) - 1)
MAX_FIELDS = 255              # fields 0..254: the top byte 255 is the bias's and the models'

CRITEO_INTEGERS, CRITEO_CATEGORICALS = 13, 26   # a Criteo line's fields after its label
CRITEO_FIELDS = CRITEO_INTEGERS + CRITEO_CATEGORICALS
AVAZU_COLUMNS = 24            # id, click, hour, and 21 categorical columns
AVAZU_FEATURES = 2 + 21       # hour of day, weekday, the categorical columns
