"""The libtpu stand-in's decoders of stall and crash files: each one crashes, hangs or answers as
FAKE_TPU_DIAGNOSTICS says ("stall_summary=abort,core_dump=hang"), so a reader must survive each."""

import os
import time


def _behave(kind, path):
    wanted = dict(item.split("=", 1) for item in os.environ.get("FAKE_TPU_DIAGNOSTICS", "").split(",") if "=" in item)
    if wanted.get(kind) == "abort":
        os.abort()
    if wanted.get(kind) == "hang":
        time.sleep(3600)
    return {"kind": kind, "size_bytes": os.path.getsize(path)}


def read_stall_summaries(path):
    return _behave("stall_summary", path)


def read_core_dump(path):
    return _behave("core_dump", path)


def read_compiler_metadata(path):
    return _behave("compiler_metadata", path)
