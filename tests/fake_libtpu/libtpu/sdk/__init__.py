"""The SDK part of the libtpu stand-in: `libtpu.sdk.tpumonitoring`, as current libtpu releases have it."""

from libtpu.sdk import tpumonitoring  # noqa: F401
