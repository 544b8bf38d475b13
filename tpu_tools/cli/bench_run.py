"""Running a `tpu-bench` selection and reporting it: files, tables, the gate, the progress bar."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from tpu_tools import jsonout, signals
from tpu_tools.cli.bench_options import RunArgs
from tpu_tools.cli.output import Output, console_on, note, resolve_format
from tpu_tools.errors import EXIT_OK, GateFailed, RuntimeFailure


def execute(selections: list, args: RunArgs) -> int:
    from tpu_tools.bench.compare import check_environments, load_result
    from tpu_tools.bench.environment import environment_record
    from tpu_tools.bench.runner import RunRequest, run_benchmarks
    from tpu_tools.bench.suites import MIN_TIME_S
    from tpu_tools.bench.timing import TimingSettings
    from tpu_tools.pjrt.runtime import check_xla_flags

    baseline = load_result(args.baseline_path, "baseline") if args.baseline_path else None
    check_outputs(args.json_path, args.junit_path, args.force)
    check_xla_flags(args.policy)  # before the compile benchmark's children hit XLA's abort

    def check_baseline(run: Any) -> None:
        """Refuse a baseline from other devices before the benchmarks run, not after."""
        if baseline is not None:
            check_environments(baseline, run.to_dict(), args.allow_mismatch)

    timing = TimingSettings(min_time_s=args.min_time_s or MIN_TIME_S[args.suite], warmup=args.warmup)
    request = RunRequest(selections, args.policy, args.timeout_s, timing, seed=args.seed, suite=args.suite,
                         environment=environment_record(args.policy.environment()), on_device=check_baseline)
    with _progress() as progress:
        run = run_benchmarks(request, progress)
    # After an interruption, a second Ctrl-C or SIGTERM must not cut the partial results short.
    with signals.deferred() if run.interrupted else contextlib.nullcontext():
        return _report(run, selections, baseline, args)


def _report(run: Any, selections: list, baseline: dict[str, Any] | None, args: RunArgs) -> int:
    from tpu_tools.bench.compare import compare

    run.settings.benchmarks = [s.benchmark for s in selections]
    comparison = None
    if baseline is not None and run.device:
        comparison = compare(baseline, run.to_dict(), args.tolerance, args.allow_mismatch, args.allow_missing)
        run.comparison = comparison.to_dict()
    document = run.to_dict()

    out = Output(resolve_format(args.output_format, args.json_path == "-", sys.stdout))
    written = []
    if args.json_path and args.json_path != "-":
        write_file(args.json_path, json_text(document), args.force, "--json")
        written.append(args.json_path)
    if args.junit_path:
        from tpu_tools.bench.junit import junit_xml

        write_file(args.junit_path, junit_xml(run, comparison), args.force, "--junit")
        written.append(args.junit_path)
    if out.is_json:
        out.json(document)
    else:
        _render_run(run, out)
        if comparison is not None:
            out.text("")
            render_comparison(comparison, out)
    if run.interrupted:
        where = f"written to {', '.join(written)}" if written else "shown above"
        note(f"tpu-bench: interrupted: partial results {where}")
        return signals.interrupted_exit_code()
    if comparison is not None:
        gate(comparison)
    if run.failed:
        ids = ", ".join(r.case.id for r in run.failed)
        raise RuntimeFailure(f"{len(run.failed)} benchmark case{'s' if len(run.failed) > 1 else ''} failed: {ids}")
    return EXIT_OK


def gate(comparison: Any) -> int:
    from tpu_tools.bench.compare import INVALID

    invalid = [c for c in comparison.regressions if c.verdict == INVALID]
    if invalid:
        shown = ", ".join(f"{c.case_id} {c.figure}" for c in invalid[:3])
        more = f" and {len(invalid) - 3} more" if len(invalid) > 3 else ""
        raise GateFailed(f"{len(invalid)} figure{'s are' if len(invalid) > 1 else ' is'} not a finite number "
                         f"(NaN or infinite), so the comparison fails: {shown}{more}")
    regressions = comparison.regressions
    if regressions:
        shown = ", ".join(f"{c.case_id} {c.figure}" for c in regressions[:3])
        more = f" and {len(regressions) - 3} more" if len(regressions) > 3 else ""
        raise GateFailed(f"{len(regressions)} figure{'s' if len(regressions) > 1 else ''} regressed beyond "
                         f"{comparison.tolerance * 100:g}%: {shown}{more}")
    if comparison.incomplete:
        raise GateFailed(comparison.incomplete)
    return EXIT_OK


def json_text(document: dict[str, Any]) -> str:
    return jsonout.dumps(document) + "\n"


def check_outputs(json_path: str | None, junit_path: str | None, force: bool) -> None:
    """Refuse, before anything runs, an output file that exists (without --force) or cannot be written."""
    from tpu_tools.atomic import check_writable

    for path, option in ((json_path, "--json"), (junit_path, "--junit")):
        if path and path != "-":
            check_writable(path, force, what=option, option=option)


def write_file(path: str, text: str, force: bool, option: str) -> None:
    """Written whole and renamed into place (tpu_tools.atomic): never over a file without --force, no links."""
    from tpu_tools.atomic import write_file as write_atomic

    write_atomic(path, text, force, what=option, option=option)


def _render_run(run: Any, out: Output) -> None:
    from tpu_tools.render.bench_view import header_lines, notes, results_table

    if run.device:
        for line in header_lines(run):
            out.text(line)
    out.table(results_table(run))
    for line in notes(run):
        out.text(line)


def render_comparison(comparison: Any, out: Output) -> None:
    from tpu_tools.render.bench_view import comparison_summary, comparison_table

    out.table(comparison_table(comparison))
    for line in comparison_summary(comparison):
        out.text(line)


class _ProgressBar:
    """Progress on stderr while cases run (terminals only); it disappears when the run ends."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console_on(sys.stderr), transient=True)
        self._task = self._progress.add_task("starting", total=None)

    def __enter__(self) -> _ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def planned(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def started(self, case: Any) -> None:
        self._progress.update(self._task, description=f"{case.benchmark} {case.name}")

    def finished(self, result: Any) -> None:
        self._progress.advance(self._task)


def _progress() -> Any:
    from tpu_tools.bench.runner import NoProgress

    return _ProgressBar() if sys.stderr.isatty() else contextlib.nullcontext(NoProgress())
