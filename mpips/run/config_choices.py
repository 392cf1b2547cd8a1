"""The closed choices of a training job's configuration, as enums (`Choice`: a str enum),
and their reading from an option's value with an error naming the flag."""
from ..base.choices import Choice
from ..base.errors import ConfigError


class Solver(Choice):
    MINIBATCH = "minibatch"   # the servers' optimizers, a push per minibatch
    LBFGS = "lbfgs"           # full batch over dense tables (see fullbatch_part)


class Consistency(Choice):
    BSP = "bsp"
    SSP = "ssp"
    ASP = "asp"


class Balance(Choice):
    """Who trains which rows of an epoch (see data.balance)."""
    STATIC = "static"     # each worker its own part, whatever its speed (bitwise repeatable)
    DYNAMIC = "dynamic"   # chunks handed out as the workers ask, shares following speed


class Schedule(Choice):
    """A pipeline's schedule (pipeline.schedule.POLICIES)."""
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


class PushValues(Choice):
    """How pushed values travel (wire.encoding.ENCODINGS)."""
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"


class DataFormat(Choice):
    """The text formats --format names (data.textfile.FORMATS)."""
    SVMLIGHT = "svmlight"
    LIBFFM = "libffm"
    CRITEO = "criteo"
    AVAZU = "avazu"


def choice(kind: type[Choice], value, flag: str):
    """`value` as a member of `kind`; ConfigError naming `flag` if it is none of them."""
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{flag} must be one of {', '.join(kind)}, got {value!r}") from None


def set_choice(part, name: str, kind: type[Choice], flag: str) -> None:
    """`part.name` (a frozen dataclass's field) as a member of `kind`, if set."""
    value = getattr(part, name)
    if value is not None:
        object.__setattr__(part, name, choice(kind, value, flag))
