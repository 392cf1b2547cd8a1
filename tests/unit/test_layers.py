"""The packages of mpips and the one way their imports point (docs/architecture.md): a
package imports only packages of lower tiers, never one beside it or above it, counting
imports inside functions too; every package says in its docstring what it holds."""
import ast
from pathlib import Path

import pytest

MPIPS = Path(__file__).resolve().parents[2] / "mpips"

# Lowest first; packages in one tier never import each other.
TIERS = [
    ["kernels"],
    ["base"],
    ["wire"],
    ["ranks"],
    ["data"],
    ["storage"],
    ["models"],
    ["pipeline", "worker", "recovery", "membership"],
    ["server"],
    ["run"],
    ["job"],
    ["cli"],
    ["(face)"],   # mpips/__init__.py, __main__.py, api.py
]
TIER = {package: i for i, tier in enumerate(TIERS) for package in tier}


def package_of(module: str) -> str:
    """'mpips.server.loop' -> 'server'; the modules at the top are the face."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in TIER) else "(face)"


def module_name(path: Path) -> str:
    parts = path.relative_to(MPIPS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list:
    """(line, imported module) for every import in the file, at any depth."""
    here = module_name(path)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("mpips")]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("mpips"):
                    found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
                continue
            base = here.split(".")
            base = base[:len(base) - node.level + (1 if is_package else 0)]
            prefix = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, f"{prefix}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, node.args[0].value))
    return found


def sources() -> list:
    return sorted(MPIPS.rglob("*.py"))


def findings() -> list:
    wrong = []
    for path in sources():
        source = package_of(module_name(path))
        for line, target in imports(path):
            if target.startswith("."):    # import_module(".x", __package__)
                continue
            to = package_of(target)
            if to == source or to not in TIER:
                continue
            if TIER[to] > TIER[source] or TIER[to] == TIER[source]:
                wrong.append(f"{path.relative_to(MPIPS.parent)}:{line}: {source} imports "
                             f"{target} ({to}, {'above' if TIER[to] > TIER[source] else 'beside'})")
    return wrong


def test_imports_point_down_the_declared_order():
    assert findings() == []


def test_every_package_is_in_the_order_and_says_what_it_holds_and_may_import():
    packages = {p.parent.name for p in MPIPS.glob("*/__init__.py")}
    assert packages == set(TIER) - {"(face)"}
    for name in packages - {"kernels"}:
        init = MPIPS / name / "__init__.py"
        tree = ast.parse(init.read_text())
        doc = ast.get_docstring(tree)
        assert doc and "May import" in doc, f"{init}: no docstring saying what it may import"
        assert [type(n) for n in tree.body] == [ast.Expr], f"{init}: holds more than its docstring"


@pytest.mark.parametrize("source, expected", [
    ("from ..wire import protocol", "mpips.wire.protocol"),
    ("from .store import KVStore", "mpips.server.store.KVStore"),
    ("from .. import kernels", "mpips.kernels"),
])
def test_relative_imports_resolve_to_their_package(tmp_path, monkeypatch, source, expected):
    fake = MPIPS / "server" / "loop.py"
    monkeypatch.setattr(Path, "read_text", lambda self: source)
    assert [t for _, t in imports(fake)] == [expected]


def test_an_import_from_above_is_found(monkeypatch):
    """The check can fail: an import of the job from the wire is reported."""
    real = Path.read_text
    fake = MPIPS / "wire" / "protocol.py"
    monkeypatch.setattr(Path, "read_text", lambda self: (
        "from ..job.training import run\n" if self == fake else real(self)))
    assert any("wire imports mpips.job.training.run (job, above)" in f for f in findings())


# The namedtuple API and the standard library's deliberate exit are not private state.
PUBLIC_UNDERSCORED = {"_replace", "_fields", "_asdict", "_make", "_field_defaults", "_exit"}


def private_attributes_touched() -> list:
    """Every `obj._name` in mpips where obj is not self, cls or super() (an override calling
    the implementation it extends)."""
    touched = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.attr not in PUBLIC_UNDERSCORED
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))
                    and not (isinstance(node.value, ast.Call)
                             and isinstance(node.value.func, ast.Name)
                             and node.value.func.id == "super")):
                touched.append(f"{path.relative_to(MPIPS.parent)}:{node.lineno}: "
                               f"{ast.unparse(node)}")
    return touched


def test_no_module_touches_another_objects_private_attributes():
    """Objects reach each other through public names only: `obj._name` only on self or
    cls."""
    assert private_attributes_touched() == []


def test_a_touch_of_private_state_is_found(monkeypatch):
    real = Path.read_text
    fake = MPIPS / "server" / "loop.py"
    monkeypatch.setattr(Path, "read_text", lambda self: (
        "def f(server):\n    return server._stop_asked\n" if self == fake else real(self)))
    assert any("server._stop_asked" in t for t in private_attributes_touched())
