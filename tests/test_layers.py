"""The package's layers: every import of a tpu_tools module points down (or stays in its own package).

Lowest first. A module may import modules of its own package and of lower
layers; imports inside functions count too (they still make a cycle, only a
later one). A new package must be placed in the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tpu_tools

PACKAGE = Path(tpu_tools.__file__).resolve().parent

LAYERS: list[tuple[str, ...]] = [
    # Base modules: records and formatting with no runtime behind them. They may use each other
    # (the only layer where that is allowed: they are single modules, not packages).
    # Checking and writing what comes from or goes outside (records, terminal text, JSON, files, signals).
    ("tpu_tools", "errors", "units", "parsing", "accelerators", "versions",
     "records", "jsonout", "sanitize", "atomic", "signals", "infile"),
    ("pjrt",),  # the PJRT client layer: platform policy, isolation, devices, discovery, probes
    ("metrics",),  # sampling and exposition; reads PJRT device records
    # Libraries below the features: in-process instrumentation shared by the agent and the profiler,
    # and the model workloads shared by bench and profile.
    ("instrument", "workloads"),
    ("inventory", "agent", "bench", "collectives", "profile", "top"),  # features: they return data
    ("render",),  # rich/plain views of the features' data
    # The dump bundles what the other commands show, so it writes their text views (tpu-ls tables)
    # into the bundle: it sits above render.
    ("dump",),
    ("cli",),  # parse options, call the layers below, render, print
    ("__main__",),  # `python -m tpu_tools`
]
_SAME_LAYER_ALLOWED = {0}


def unit_of(module: str) -> str:
    """"tpu_tools.metrics.libtpu.client" -> "metrics"; "tpu_tools" -> "tpu_tools"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(unit: str) -> int | None:
    return next((index for index, units in enumerate(LAYERS) if unit in units), None)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every tpu_tools import in a file, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from tpu_tools import units` imports the module tpu_tools.units, not the package.
            found += [(node.lineno, f"{base}.{alias.name}" if base == "tpu_tools" and alias.name in
                       {u for layer in LAYERS for u in layer} else base) for alias in node.names]
    return [(line, module) for line, module in found if module == "tpu_tools" or module.startswith("tpu_tools.")]


def upward_imports(root: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
            continue
        source = unit_of(module_name(path))
        source_layer = layer_of(source)
        if source_layer is None:
            problems.append(f"{path.relative_to(PACKAGE.parent)}: package {source!r} is in no layer of LAYERS")
            continue
        for line, module in imported_modules(path):
            target = unit_of(module)
            target_layer = layer_of(target)
            if target == source:
                continue
            if target_layer is None:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {module}, in no layer")
            elif target_layer > source_layer or (target_layer == source_layer
                                                  and source_layer not in _SAME_LAYER_ALLOWED):
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {source} (layer {source_layer}) "
                                f"imports {module} (layer {target_layer}): imports must point down")
    return problems


def test_every_import_points_down():
    problems = upward_imports()
    assert not problems, "\n".join(problems)


def test_every_package_is_placed():
    units = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.is_dir() and any(p.glob("*.py"))) or p.suffix == ".py"}
    units = {u for u in units if u != "__init__"} | {"tpu_tools"}
    assert units == {u for layer in LAYERS for u in layer}


def test_the_walk_sees_an_upward_import(tmp_path):
    # The check itself must catch what it is for: a package tree with metrics importing cli, inside a function.
    root = tmp_path / "tpu_tools"
    (root / "metrics").mkdir(parents=True)
    (root / "cli").mkdir()
    for init in (root / "__init__.py", root / "metrics" / "__init__.py", root / "cli" / "__init__.py"):
        init.write_text("")
    (root / "metrics" / "sample.py").write_text("def f():\n    from ..cli import main\n    return main\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, root
    try:
        problems = upward_imports(root)
    finally:
        PACKAGE = saved
    assert problems == ["tpu_tools/metrics/sample.py:2: metrics (layer 2) imports tpu_tools.cli "
                        "(layer 7): imports must point down"]
