"""A profiling session end to end: the output folder, the run, the summary and the report on disk.

Output folder layout:
    OUT/trace/plugins/profile/<run>/<host>.xplane.pb   the trace as JAX wrote it (TensorBoard, xprof)
    OUT/trace/plugins/profile/<run>/perfetto_trace.json.gz   the same for ui.perfetto.dev
    OUT/summary.json   tpu-tools/profile/v1
    OUT/report.txt     the text report
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tools.errors import ToolError, UsageError
from tpu_tools.profile.document import ProfileSummary
from tpu_tools.profile.summary import REPORT_FILE, SUMMARY_FILE, build_summary, load_summary, write_summary

if TYPE_CHECKING:
    from tpu_tools.profile.runner import ProgramTarget, RunOutcome
    from tpu_tools.profile.window import WindowSpec

TRACE_FOLDER = "trace"
_OWN_ENTRIES = (TRACE_FOLDER, SUMMARY_FILE, REPORT_FILE)


@dataclass(frozen=True)
class OutputDir:
    path: Path

    @property
    def trace_dir(self) -> Path:
        return self.path / TRACE_FOLDER


def choose_output_dir(requested: Path | None, force: bool, prefix: str = "tpu-profile") -> OutputDir:
    """The output folder, checked but not created: an existing one is refused unless `force`."""
    if requested is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path.cwd() / f"{prefix}-{stamp}"
        suffix = 2
        while path.exists():  # two runs within one second
            path = Path.cwd() / f"{prefix}-{stamp}-{suffix}"
            suffix += 1
        return OutputDir(path)
    path = requested.absolute()
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{path} exists and is not a folder; choose another --out")
        if not force:
            raise UsageError(f"{path} already exists; choose another --out, or add --force to overwrite it")
    return OutputDir(path)


def make_output_dir(out: OutputDir) -> OutputDir:
    """Create the folder chosen by `choose_output_dir`; in a forced one, our own earlier files are removed."""
    for name in _OWN_ENTRIES:
        entry = out.path / name
        if entry.is_dir():
            shutil.rmtree(entry)
        elif entry.exists():
            entry.unlink()
    try:
        out.path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create the output folder {out.path}: {error.strerror or error}") from error
    return out


def prepare_output_dir(requested: Path | None, force: bool, prefix: str = "tpu-profile") -> OutputDir:
    """Choose and create the output folder."""
    return make_output_dir(choose_output_dir(requested, force, prefix))


@dataclass
class RunReport:
    outcome: RunOutcome
    out: OutputDir
    summary: ProfileSummary | None
    summary_error: str | None = None


def profile_program(target: ProgramTarget, out: OutputDir, window: WindowSpec, python_trace: bool = True,
                    top: int = 15) -> RunReport:
    """Run the program with the profiler; then summarise what was recorded into `out`.

    Summarising never costs the program its exit status: a failure here is reported in `summary_error`.
    """
    from tpu_tools.profile.runner import ProgramRunner

    outcome = ProgramRunner(target, out.trace_dir, window, python_trace).run()
    report = RunReport(outcome, out, None)
    try:
        report.summary = summarise_run(outcome, target, out, top)
    except ToolError as error:
        report.summary_error = str(error)
    except Exception as error:  # noqa: BLE001 a bug in the summary must not replace the program's exit status
        report.summary_error = f"internal error: {type(error).__name__}: {error}"
    return report


def summarise_run(outcome: RunOutcome, target: ProgramTarget, out: OutputDir, top: int) -> ProfileSummary:
    """summary.json for a run; what was recorded is kept even when the trace cannot be read."""
    from tpu_tools.profile.frames import FrameClassifier
    from tpu_tools.profile.trace import read_trace

    notes = list(outcome.notes)
    if outcome.window.note:
        notes.append(outcome.window.note)
    trace = None
    if outcome.window.opened:
        try:
            trace = read_trace(out.trace_dir, FrameClassifier(outcome.user_files))
        except ToolError as error:
            notes.append(f"the trace could not be read: {error}")
    if outcome.status == "interrupted":
        from tpu_tools.signals import interrupt_word

        notes.append(f"the program was {interrupt_word()}; the trace covers the run until then")
    document = build_summary(source="run", trace=trace, compile_log=outcome.compile_log,
                             program=outcome.program_dict(target), window=outcome.window.to_dict(),
                             trace_dir=out.trace_dir if trace is not None else None, top=top,
                             base_dir=os.getcwd(), notes=notes,
                             compile_source="torch_xla" if outcome.frontend == "torch_xla" else "monitoring")
    write_summary(document, out.path)
    return document


def summarise_path(path: Path, top: int = 15) -> ProfileSummary:
    """The summary of a folder: tpu-profile's own summary.json when there is one, else the trace alone."""
    if path.is_dir():
        document = load_summary(path)
        if document is not None:
            return document
    from tpu_tools.profile.trace import read_trace

    trace = read_trace(path)
    return build_summary(source="trace", trace=trace, trace_dir=path, top=top, base_dir=os.getcwd())


def write_report(text: str, out: OutputDir) -> Path:
    from tpu_tools.atomic import write_file

    return write_file(out.path / REPORT_FILE, text if text.endswith("\n") else text + "\n", force=True,
                      what=REPORT_FILE)


def summarise_capture(out: OutputDir, address: str, duration_s: float, top: int = 15) -> ProfileSummary:
    """The summary of a trace captured from another process, written into its folder."""
    from tpu_tools.profile.trace import read_trace

    trace = read_trace(out.trace_dir)
    document = build_summary(source="capture", trace=trace, trace_dir=out.trace_dir, top=top, base_dir=os.getcwd(),
                             notes=[f"captured {duration_s:g} s from the profiler server at {address}"])
    write_summary(document, out.path)
    return document
