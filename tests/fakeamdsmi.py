"""The fake libamd_smi.so (tests/fake_amdsmi/fake_amdsmi.c), built once per test run with gcc, for the real
amdsmi Python package (the `amd` extra) to load from $ROCM_PATH/lib.

The bindings bind every library symbol when they are imported, and read structures whose layout this
package version defines. So the build has three steps: weak stubs for every symbol the bindings name
(answering NOT_SUPPORTED), a first library of those alone, then, with the bindings loaded on it, a C
header written from their own ctypes structures (with the sizes asserted), and the fake compiled
against that header. Fault switches are environment variables (see the C file). `amdsmi_env` gives the
environment of a program on the sysfs fixture of the same two GPUs (tests/sysroot.py: amd_host).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

SOURCE = Path(__file__).resolve().parent / "fake_amdsmi" / "fake_amdsmi.c"
STRUCTS = ["amdsmi_asic_info_t", "amdsmi_vram_usage_t", "amdsmi_engine_usage_t", "amdsmi_power_info_t",
           "amdsmi_power_cap_info_t", "amdsmi_clk_info_t", "amdsmi_error_count_t", "amdsmi_pcie_info_t",
           "amdsmi_proc_info_t", "amdsmi_driver_info_t"]

# Writes C typedefs of the named ctypes structures of amdsmi_wrapper (run with the stub library loadable).
_HEADER_SCRIPT = r'''
import ctypes, sys
from amdsmi import amdsmi_wrapper as w
C = {"B": "uint8_t", "b": "int8_t", "H": "uint16_t", "h": "int16_t", "I": "uint32_t", "i": "int32_t",
     "L": "uint64_t", "l": "int64_t", "Q": "uint64_t", "q": "int64_t", "f": "float", "d": "double",
     "c": "char", "?": "_Bool", "P": "void *", "z": "char *"}
done, out = set(), []
def ctype(t):
    if isinstance(t, type) and issubclass(t, (ctypes.Structure, ctypes.Union)):
        emit(t, t.__name__)
        return t.__name__
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return "void *"
    return C[t._type_]
def member(name, t, bits=None):
    dims = ""
    while isinstance(t, type) and issubclass(t, ctypes.Array):
        dims += f"[{t._length_}]"
        t = t._type_
    return f"    {ctype(t)} {name}{dims}" + (f" : {bits}" if bits else "") + ";"
def emit(t, name):
    if name in done:
        return
    done.add(name)
    kind = "union" if issubclass(t, ctypes.Union) else "struct"
    body = [member(*f) for f in t._fields_]
    packed = " __attribute__((packed))" if getattr(t, "_pack_", 0) == 1 else ""
    out.append(f"typedef {kind}{packed} {{\n" + "\n".join(body) + f"\n}} {name};\n"
               f"_Static_assert(sizeof({name}) == {ctypes.sizeof(t)}, \"{name} layout\");\n")
for alias in sys.argv[1:]:
    emit(getattr(w, alias), alias)
print("#include <stdint.h>\n\n" + "\n".join(out))
'''


def _bindings_dir() -> Path:
    spec = importlib.util.find_spec("amdsmi")
    assert spec, "the amdsmi package is needed (pip install -e '.[test]')"
    assert spec.submodule_search_locations, "the amdsmi package is needed (pip install -e '.[test]')"
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def fake_amdsmi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ROCm-like directory whose lib/ holds the fake libamd_smi.so (point ROCM_PATH at it)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler, "gcc is needed to build the fake amdsmi library (apt-get install gcc)"
    root = tmp_path_factory.mktemp("fake-rocm")
    work, lib = root / "build", root / "lib"
    work.mkdir()
    lib.mkdir()
    wrapper = (_bindings_dir() / "amdsmi_wrapper.py").read_text()
    symbols = sorted(set(re.findall(r"_libraries\['libamd_smi\.so'\]\.(\w+)", wrapper)))
    stubs = work / "amdsmi_stubs.c"
    stubs.write_text("".join(f"__attribute__((weak)) int {name}(void) {{ return 2; }}\n" for name in symbols))
    flags = ["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libamd_smi.so"]
    subprocess.run([compiler, *flags, "-o", str(lib / "libamd_smi.so"), str(stubs)], check=True)
    env = clean_env(ROCM_PATH=str(root))
    header = subprocess.run([sys.executable, "-c", _HEADER_SCRIPT, *STRUCTS], env=env, capture_output=True,
                            text=True, check=True).stdout
    (work / "amdsmi_types.h").write_text(header)
    subprocess.run([compiler, *flags, "-I", str(work), "-o", str(lib / "libamd_smi.so"), str(SOURCE), str(stubs)],
                   check=True)
    return root


def amdsmi_env(rocm: Path, root: Path | None = None, **switches: str | None) -> dict[str, str]:
    """The environment of a program that finds the fake amdsmi library (and the fixture host at `root`)."""
    env = clean_env(**{"TPU_TOOLS_AMDSMI": None, "TPU_TOOLS_NVML": "0", "ROCM_PATH": str(rocm), **switches})
    if root is not None:
        env["TPU_TOOLS_SYSROOT"] = str(root)
    return env
