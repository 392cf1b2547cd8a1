"""The version of mpips, recorded in every summary.json."""
__version__ = "0.1.0"
