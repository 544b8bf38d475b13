"""A stand-in for the `libtpu` package (not on this machine): what a TPU job imports, with its SDK."""

__version__ = "0.0.21.fixture"
