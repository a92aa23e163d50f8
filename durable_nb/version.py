"""durable_nb's version, at the bottom of the package so that any layer may name it (the
traces' instrumentation scope does) without importing the package root. Kept equal to
``version`` in pyproject.toml."""

__all__ = ["__version__"]

__version__ = "0.1.0"
