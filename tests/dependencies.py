"""Print the project's dependencies and those of the extras named, one per line, as
pyproject.toml lists them: what the Makefile installs into the MPICH venv beside the test
venv's install, before mpips itself (whose editable install must wait for the other's).

    python3 tests/dependencies.py mpich smoke
"""
import os
import sys
import tomllib


def main(extras: list[str]) -> None:
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        sys.exit(f"tests/dependencies.py: no extra {', '.join(unknown)} in pyproject.toml "
                 f"(it has {', '.join(sorted(optional))})")
    for requirement in project["dependencies"] + [r for e in extras for r in optional[e]]:
        print(requirement)


if __name__ == "__main__":
    main(sys.argv[1:])
