"""The package's layers: every import of a tpu_tools module points down (or stays in its own package).

Lowest first. A module may import modules of its own package and of lower
layers; imports inside functions count too (they still make a cycle, only a
later one). A new package must be placed in the table. Two more rules hold
for every module: no import circle between modules (inside a package too),
and no private name (`_name`) of one module used by another.
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
    ("tpu_tools", "errors", "units", "parsing", "accelerators", "versions", "shorten",
     "outside", "jsonout", "sanitize", "atomic", "signals", "infile", "background", "environment"),
    ("pjrt",),  # the PJRT client layer: platform policy, isolation, devices, discovery, probes
    ("metrics",),  # sampling and exposition; reads PJRT device records
    # Libraries below the features: in-process instrumentation shared by the agent and the profiler,
    # and the model workloads shared by bench and profile.
    # A user's own function (target, --arg specs, roofline), shared by tpu-profile hlo and tpu-bench fn.
    ("instrument", "workloads", "userfn"),
    ("inventory", "agent", "bench", "collectives", "profile", "top"),  # features: they return data
    ("exporter",),  # Prometheus exposition of metrics' reports and the /metrics server, apart from the sampling
    ("api",),  # tpu-tools from Python: the features' reads as typed records, for readers outside the job
    ("diag",),  # diagnostics, built on the collectives' exact checks and the probes
    ("render",),  # rich/plain views of the features' data
    # The dump bundles what the other commands show, so it writes their text views (tpu-ls tables)
    # into the bundle: it sits above render.
    ("dump",),
    ("cli",),  # parse options, call the layers below, render, print
    ("__main__",),  # `python -m tpu_tools`
]
_SAME_LAYER_ALLOWED = {0}

# What each layer is for, by its first unit: docs/development.md's layer table is written from LAYERS and these
# (tools/gen_docs.py; tests/test_docs.py fails when the table is stale), so a new layer needs its line here.
LAYER_JOBS: dict[str, str] = {
    "tpu_tools": "errors and exit codes, formatting quantities, parsing sizes and durations, PCI ids and chip peaks, "
                 "versions, outside text cut to a bound, records from outside decoded and bounded (msgspec), JSON, "
                 "terminal text, atomic "
                 "files, signals, reading files from outside (regular, capped), calls run ahead on daemon threads, "
                 "the TPU_TOOLS_* variables",
    "pjrt": "runtime policy before `import jax`, the isolated child, device records, passive discovery, probes, chip "
            "pairing",
    "metrics": "host and process sampling, agent client, libtpu's metrics client, report groups "
               "and the typed records a monitor report is made of",
    "instrument": "in-process instrumentation shared by the agent and the profiler (compile events, steps, the jax "
                  "import hook); the reference transformer; a user's own function (MODULE:FUNCTION target, `--arg` "
                  "specs, roofline), shared by `tpu-profile hlo` and `tpu-bench fn`",
    "inventory": "the features: they return data, never print",
    "exporter": "the Prometheus exposition of a monitor report and its serving (HTTP, TLS, basic auth), above the "
                "features whose records it exposes, as an exporter is apart from the library it reads",
    "api": "tpu-tools from Python for readers outside the job: the features' reads (devices, free chips, libtpu's "
           "metrics, the jobs' agents) as typed records, never importing jax",
    "diag": "the diagnostics (levels, known answers, digests, memory patterns, collective checksums); built on the "
            "collectives' exact checks, hence above the features",
    "render": "rich or plain tables and reports from the features' data",
    "dump": "support bundles; it writes the text views of the other commands into the bundle, hence above `render`",
    "cli": "options, calls into the layers below, rendering, printing, exit codes",
    "__main__": "`python -m tpu_tools`",
}


def _unit_file(unit: str) -> str:
    if unit == "tpu_tools":
        return "`__init__.py`"
    return f"`{unit}/`" if (PACKAGE / unit).is_dir() else f"`{unit}.py`"


def layer_table() -> str:
    """docs/development.md's layer table: highest layer first, each with its units and its job."""
    rows = [f"| {index} | {', '.join(_unit_file(unit) for unit in units)} | {LAYER_JOBS.get(units[0], '')} |"
            for index, units in reversed(list(enumerate(LAYERS)))]
    return "\n".join(["| layer | modules | job |", "| --- | --- | --- |", *rows])


def unit_of(module: str) -> str:
    """"tpu_tools.metrics.libtpu.client" -> "metrics"; "tpu_tools" -> "tpu_tools"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(unit: str) -> int | None:
    return next((index for index, units in enumerate(LAYERS) if unit in units), None)


def module_name(path: Path, root: Path | None = None) -> str:
    parts = list(path.relative_to((root or PACKAGE).parent).with_suffix("").parts)
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


def source_files(root: Path) -> list[Path]:
    return [path for path in sorted(root.rglob("*.py"))
            if not (path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"))]


def module_imports(path: Path, modules: set[str], root: Path) -> tuple[set[str], list[tuple[int, str]]]:
    """The tpu_tools modules a file imports (`from package import module` is that module), and the
    (line, text) of each private name it takes from another module, by import or by attribute."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported: set[str] = set()
    private: list[tuple[int, str]] = []
    module_aliases: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    imported.add(alias.name)
                    if alias.asname:
                        module_aliases.add(alias.asname)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base not in modules:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    imported.add(full)
                    module_aliases.add(alias.asname or alias.name)
                    continue
                imported.add(base)
                if _is_private(alias.name) and base != name:
                    private.append((node.lineno, f"imports {alias.name} from {base}"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases and _is_private(node.attr)):
            private.append((node.lineno, f"uses {node.value.id}.{node.attr}"))
    return imported - {name}, private


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names(root: Path = PACKAGE) -> list[str]:
    files = source_files(root)
    modules = {module_name(path, root) for path in files}
    return [f"{path.relative_to(root.parent)}:{line}: {what}: a private name is its own module's alone"
            for path in files for line, what in module_imports(path, modules, root)[1]]


def import_circles(root: Path = PACKAGE) -> list[list[str]]:
    """Every set of modules that import each other round a circle (strongly connected, more than one)."""
    files = source_files(root)
    modules = {module_name(path, root) for path in files}
    graph = {}
    for path in files:
        name = module_name(path, root)
        imported = module_imports(path, modules, root)[0]
        # Importing a.b.c runs a/b/__init__.py first: a package's own __init__ is part of the path, except the
        # packages this module itself lives in (they are already being imported when it runs).
        own = {".".join(name.split(".")[:depth]) for depth in range(1, name.count(".") + 1)}
        implied = {".".join(module.split(".")[:depth])
                   for module in imported for depth in range(2, module.count(".") + 1)}
        graph[name] = sorted((imported | (implied & modules)) - own - {name})
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in order:
            continue
        # Tarjan's algorithm without recursion: (module, index of the next neighbour to visit)
        work = [(start, 0)]
        while work:
            module, next_index = work.pop()
            if next_index == 0:
                order[module] = low[module] = len(order)
                stack.append(module)
            neighbours = graph[module]
            if next_index < len(neighbours):
                work.append((module, next_index + 1))
                target = neighbours[next_index]
                if target not in order:
                    work.append((target, 0))
                elif target in stack:
                    low[module] = min(low[module], order[target])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == order[module]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


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


def test_no_module_takes_another_modules_private_names():
    problems = private_names()
    assert not problems, "\n".join(problems)


def test_no_import_circle():
    circles = import_circles()
    assert not circles, "\n".join(" <-> ".join(circle) for circle in circles)


def _package_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tpu_tools"
    for relative, text in {"__init__.py": "", **files}.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


def test_the_walk_sees_a_circle_through_a_function_level_import(tmp_path):
    root = _package_tree(tmp_path, {
        "top/__init__.py": "",
        "top/frame.py": "def render():\n    from tpu_tools.top.panel import lines\n    return lines\n",
        "top/panel.py": "from tpu_tools.top.frame import render\n",
        "top/other.py": "from tpu_tools.top import frame\n",
    })
    assert import_circles(root) == [["tpu_tools.top.frame", "tpu_tools.top.panel"]]


def test_the_walk_sees_a_circle_through_a_package_init(tmp_path):
    # gpu.py imports nvml.records, which runs nvml/__init__.py, which imports nvml.reader, which imports gpu.py.
    root = _package_tree(tmp_path, {
        "metrics/__init__.py": "",
        "metrics/gpu.py": "from tpu_tools.metrics.nvml.records import Record\n",
        "metrics/nvml/__init__.py": "from tpu_tools.metrics.nvml.reader import read\n",
        "metrics/nvml/records.py": "class Record:\n    pass\n",
        "metrics/nvml/reader.py": "from tpu_tools.metrics.gpu import Record\n",
    })
    assert import_circles(root) == [
        ["tpu_tools.metrics.gpu", "tpu_tools.metrics.nvml", "tpu_tools.metrics.nvml.reader"]]


def test_the_walk_sees_private_names_taken_across_modules(tmp_path):
    root = _package_tree(tmp_path, {
        "metrics/__init__.py": "",
        "metrics/a.py": "def _ident():\n    pass\n\ndef own():\n    return _ident()\n",
        "metrics/b.py": "from tpu_tools.metrics.a import _ident\n",
        "metrics/c.py": "from tpu_tools.metrics import a\n\ndef f():\n    return a._ident(), a.__name__\n",
    })
    assert private_names(root) == [
        "tpu_tools/metrics/b.py:1: imports _ident from tpu_tools.metrics.a: a private name is its own module's alone",
        "tpu_tools/metrics/c.py:4: uses a._ident: a private name is its own module's alone",
    ]


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
                        "(layer 10): imports must point down"]


def test_every_layer_says_what_it_is_for():
    assert set(LAYER_JOBS) == {units[0] for units in LAYERS}
    assert all(job.strip() for job in LAYER_JOBS.values())
    for units in LAYERS:
        for unit in units:
            assert unit == "tpu_tools" or (PACKAGE / unit).is_dir() or (PACKAGE / f"{unit}.py").is_file(), unit
