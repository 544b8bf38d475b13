"""A stand-in for an older `libtpu` package: no SDK monitoring API (`libtpu.sdk` does not exist)."""

__version__ = "0.0.9.fixture"
