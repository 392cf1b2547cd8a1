"""Every model implements the Model protocol (models.catalog): its attributes, and its
methods with the protocol's parameters (more only with defaults)."""
import inspect

import pytest

from mpips.models.catalog import MODELS, Model, model_of
from mpips.models.specs import ModelName

PROTOCOL_METHODS = [name for name, member in vars(Model).items()
                    if inspect.isfunction(member) and not name.startswith("_")]


def test_every_model_name_has_a_model():
    assert set(MODELS) == set(ModelName)
    assert {"init", "gradient", "margins", "reserved_keys", "describe"} <= set(PROTOCOL_METHODS)


@pytest.mark.parametrize("name", list(ModelName))
def test_the_model_implements_the_protocol(name):
    cls, model = MODELS[name], model_of(name)
    assert isinstance(model, cls) and isinstance(model, Model)
    assert model.name == name and model.width >= 1 and isinstance(model.starts_at_zero, bool)
    for method in PROTOCOL_METHODS:
        wanted = list(inspect.signature(getattr(Model, method)).parameters.values())
        given = list(inspect.signature(getattr(cls, method)).parameters.values())
        assert [p.name for p in given[:len(wanted)]] == [p.name for p in wanted], \
            f"{cls.__name__}.{method}{inspect.signature(getattr(cls, method))}"
        assert all(p.default is not inspect.Parameter.empty for p in given[len(wanted):]), \
            f"{cls.__name__}.{method}: its parameters beyond the protocol's need defaults"
