"""The models there are (ModelName) and the sizes each takes, checked without building one:
checking a job's options loads no numba (models.catalog builds them, with their kernels)."""
from ..base.choices import Choice
from ..base.errors import ConfigError
from ..kernels.shapes import MAX_FIELDS


class ModelName(Choice):
    """--model: the models there are (catalog.MODELS)."""
    LR = "lr"
    FM = "fm"
    WIDEDEEP = "widedeep"


NAMES = tuple(name.value for name in ModelName)


def check_factors(factors: int) -> None:
    """ConfigError unless a factorization machine can have `factors` (--factors)."""
    if not 1 <= factors <= 1024:
        raise ConfigError(f"--factors must be from 1 to 1024, got {factors}")


def deep_inputs(embedding_dim: int, fields: int) -> int:
    """Wide & Deep's network's input width: k, or the concatenated fields' F k."""
    return embedding_dim * max(fields, 1)


def check_network(embedding_dim: int, hidden: tuple, fields: int) -> None:
    """ConfigError unless Wide & Deep can have these sizes (--embedding-dim, --hidden,
    --fields)."""
    if not 1 <= embedding_dim <= 1024:
        raise ConfigError(f"--embedding-dim must be from 1 to 1024, got {embedding_dim}")
    if not hidden or not all(1 <= h <= 4096 for h in hidden):
        raise ConfigError(f"--hidden must be layer widths from 1 to 4096, got "
                          f"{','.join(map(str, hidden)) or 'none'}")
    if not 0 <= fields < MAX_FIELDS:
        raise ConfigError(f"--fields must be from 0 (sum the embeddings) to "
                          f"{MAX_FIELDS - 1}, got {fields}")
    if deep_inputs(embedding_dim, fields) > 1 << 16:
        raise ConfigError(f"--fields {fields} x --embedding-dim {embedding_dim}: the "
                          f"network's input would be {deep_inputs(embedding_dim, fields)} "
                          f"wide, more than {1 << 16}")


def check(name: str, factors: int, embedding_dim: int, hidden: tuple, fields: int) -> None:
    """The ConfigError that building the model `name` (a ModelName) with these sizes would
    raise (catalog.model_of), if any."""
    if name == ModelName.FM:
        check_factors(factors)
    elif name == ModelName.WIDEDEEP:
        check_network(embedding_dim, tuple(hidden), fields)
