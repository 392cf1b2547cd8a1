"""Makes this checkout's mpips the one a bench imports, and the one the ranks it starts run
(PYTHONPATH): a bench run from another checkout side by side (a worktree of an older commit)
would otherwise import the installed one, whatever the directory it is run from. Every bench
imports it before anything of mpips."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)
_paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
if _paths[:1] != [ROOT]:
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in _paths if p])
