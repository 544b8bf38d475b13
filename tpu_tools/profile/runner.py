"""Run a Python program in this process with its frontend's profiler and compile recording switched on.

The program runs as `python script.py` or `python -m module` would run it:
`__main__`, its own argv and sys.path[0], its stdout and stderr untouched.
jax is NOT imported before the program imports it, so the program's own
set-up (environment variables, `jax.config.update` before first use) still
applies. When the program imports jax, the compile recorder hooks in; when the
PJRT backends come up, the trace window controller may open the trace. A PyTorch/XLA program is traced by
torch_xla's own profiler from its import on, with its compiles read from torch_xla (`profile.torchxla`); the
frontend that comes up first owns the trace.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tpu_tools import signals
from tpu_tools.errors import UsageError
from tpu_tools.instrument.compiles import CompileLog, CompileRecorder
from tpu_tools.instrument.jaxhook import call_when_imported
from tpu_tools.instrument.steps import process_steps
from tpu_tools.profile.window import TraceController, WindowResult, WindowSpec


@dataclass(frozen=True)
class ProgramTarget:
    """`script.py args...` or `-m module args...`."""

    script: Path | None = None
    module: str | None = None
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.script is None) == (self.module is None):
            raise UsageError("give a script to run (tpu-profile run -- script.py args...) or -m MODULE, not both")

    def validate(self) -> None:
        """Fail before anything runs when the program cannot be found."""
        if self.script is not None:
            if not self.script.exists():
                raise UsageError(f"cannot run {self.script}: no such file")
            if not self.script.is_file():
                raise UsageError(f"cannot run {self.script}: it is not a file")
            return
        assert self.module is not None
        sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.find_spec(self.module)
        except Exception as error:  # the parent package failed to import
            raise UsageError(f"cannot run module {self.module!r}: {type(error).__name__}: {error}") from error
        finally:
            sys.path.pop(0)
        if spec is None:
            raise UsageError(f"cannot run module {self.module!r}: no module of that name "
                             "(is it on PYTHONPATH, or in the current folder?)")

    @property
    def display(self) -> str:
        head = str(self.script) if self.script is not None else f"-m {self.module}"
        return " ".join([head, *self.args])


@dataclass
class RunOutcome:
    status: str  # "exited", "raised" or "interrupted"
    exit_code: int
    error: str | None  # "ValueError: ..." for a program that raised
    traceback_text: str | None  # what Python would have printed for the uncaught exception
    exit_message: str | None  # sys.exit("text") prints this
    wall_time_s: float
    window: WindowResult
    compile_log: CompileLog
    user_files: frozenset[str] = frozenset()
    notes: list[str] = field(default_factory=list)
    frontend: str = "jax"  # whose compiles and trace were recorded: jax or torch_xla

    def program_dict(self, target: ProgramTarget) -> dict:
        return {
            "argv": [str(target.script) if target.script else target.module, *target.args],
            "module": target.module,
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "wall_time_s": round(self.wall_time_s, 3),
        }


class JaxTracer:
    """The device trace: jax.profiler writing an XSpace and a Perfetto JSON under `log_dir`."""

    def __init__(self, log_dir: Path, python_trace: bool = True):
        self.log_dir = log_dir
        self.python_trace = python_trace

    def start(self) -> None:
        import jax

        options = jax.profiler.ProfileOptions()
        options.host_tracer_level = 2
        options.python_tracer_level = 1 if self.python_trace else 0
        jax.profiler.start_trace(str(self.log_dir), create_perfetto_trace=True, profiler_options=options)

    def stop(self) -> None:
        import jax

        jax.profiler.stop_trace()


class FrontendTracer:
    """The tracer of the frontend that brought the runtime up (JAX's until torch_xla's is chosen)."""

    def __init__(self, tracer: Any):
        self.tracer = tracer

    def start(self) -> None:
        self.tracer.start()

    def stop(self) -> None:
        self.tracer.stop()


class _ProgramExit(BaseException):
    """The program called os._exit(code) in the main thread."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class ProgramRunner:
    """One profiled run: hooks, the program, and what was recorded."""

    def __init__(self, target: ProgramTarget, trace_dir: Path, window: WindowSpec, python_trace: bool = True):
        self.target = target
        self.recorder = CompileRecorder()
        self.trace_dir = trace_dir
        self.tracer = FrontendTracer(JaxTracer(trace_dir, python_trace))
        self.controller = TraceController(window, self.tracer)
        self.notes: list[str] = []
        self._jax_ready = False
        self._torch_xla: Any = None  # profile.torchxla.TorchXlaCompiles once the program imports torch_xla

    def run(self) -> RunOutcome:
        cancel_hook = call_when_imported(self._on_jax_imported)
        cancel_torch_hook = call_when_imported(self._on_torch_xla_imported, "torch_xla")
        started = time.monotonic()
        self.controller.begin()
        remove_step_hook = self._watch_steps()
        real_exit = os._exit
        os._exit = self._os_exit(real_exit)  # type: ignore[assignment]
        try:
            status, code, error, trace_text, message = self._execute()
        finally:
            cancel_hook()
            cancel_torch_hook()
            if self._torch_xla is not None:
                self._detach_torch_xla()
            os._exit = real_exit
            remove_step_hook()
            self.recorder.detach()
        wall = time.monotonic() - started
        # The trace so far is written even when Ctrl-C or SIGTERM comes again meanwhile.
        with signals.deferred():
            window = self.controller.finish()
        from tpu_tools.profile.frames import loaded_user_file_names

        user_files = loaded_user_file_names() | self._target_files()
        return RunOutcome(status, code, error, trace_text, message, wall, window, self.recorder.snapshot(),
                          user_files, self.notes, "torch_xla" if self._torch_xla is not None else "jax")

    def _os_exit(self, real_exit: Callable[[int], Any]) -> Callable[[int], Any]:
        """os._exit for the program: its end is the end of the profile, not a silent exit with nothing kept.

        In this process's main thread it unwinds to the runner (as sys.exit would; the program's finally
        blocks run) and the profile is written. From another thread, or in a forked child (multiprocessing),
        it is the real os._exit; from another thread of this process the trace is closed first and one
        line says why there is no report.
        """
        pid = os.getpid()

        def exit_now(code: int) -> Any:
            if os.getpid() != pid:
                return real_exit(code)
            if threading.current_thread() is threading.main_thread():
                raise _ProgramExit(code)
            try:
                self.controller.finish()
                kept = "the trace so far is kept, with no summary"
            except Exception as error:  # noqa: BLE001 the process ends now whatever happens
                kept = f"the trace could not be closed ({type(error).__name__})"
            sys.stderr.write(f"tpu-profile: the program called os._exit({code}) from a thread: {kept}\n")
            sys.stderr.flush()
            return real_exit(code)

        return exit_now

    def _target_files(self) -> frozenset[str]:
        if self.target.script is not None:
            return frozenset({self.target.script.name})
        return frozenset()

    # --- hooks --------------------------------------------------------------------------------------

    def _watch_steps(self) -> Callable[[], None]:
        """Feed the program's step markers (tpu_tools.agent.step) to a step window."""
        if self.controller.spec.mode != "steps":
            return lambda: None
        return process_steps().on_step(self.controller.step)

    def _on_jax_imported(self, jax_module: ModuleType) -> None:
        # Never let the tool break the program's `import jax`: a failure here costs the profile only.
        try:
            self.recorder.install(jax_module)
        except Exception as error:  # noqa: BLE001 never break the program's import: a failure costs the profile only
            self.notes.append(f"compile events could not be recorded: {type(error).__name__}: {error}")
        try:
            self._watch_backends()
        except Exception as error:  # noqa: BLE001 never break the program's import: a failure costs the profile only
            self.notes.append(f"the device trace could not be hooked to runtime start-up: {error}")

    def _on_torch_xla_imported(self, torch_xla: ModuleType) -> None:
        # As for jax: a failure here costs the profile only, never the program's `import torch_xla`.
        try:
            from tpu_tools.profile.torchxla import TorchXlaCompiles, TorchXlaTracer

            self._torch_xla = TorchXlaCompiles(torch_xla, self.recorder)
            if not self._jax_ready:  # torch_xla's profiler session needs no runtime: it may trace from here
                self.tracer.tracer = TorchXlaTracer(self.trace_dir)
                self.controller.runtime_ready()
        except Exception as error:  # noqa: BLE001 never break the program's import: a failure costs the profile only
            self.notes.append(f"torch_xla's compiles or trace could not be recorded: {type(error).__name__}: {error}")

    def _detach_torch_xla(self) -> None:
        try:
            self._torch_xla.detach()
        except Exception as error:  # noqa: BLE001 the program has ended: a failure costs the profile only
            self.notes.append(f"torch_xla's last compiles could not be read: {type(error).__name__}: {error}")

    def _watch_backends(self) -> None:
        """Open the trace right after jax's PJRT backends are up (jax.profiler needs them first)."""
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            self._jax_ready = True
            self.controller.runtime_ready()
            return
        original = xla_bridge.backends
        controller = self.controller

        def backends():  # noqa: ANN202
            result = original()
            if xla_bridge.backends is backends:
                xla_bridge.backends = original
                self._jax_ready = True
                controller.runtime_ready()
            return result

        xla_bridge.backends = backends

    # --- the program --------------------------------------------------------------------------------

    def _execute(self) -> tuple[str, int, str | None, str | None, str | None]:
        target = self.target
        saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else ""
        try:
            if target.script is not None:
                sys.argv = [str(target.script), *target.args]
                sys.path[0] = str(target.script.resolve().parent)
                runpy.run_path(str(target.script), run_name="__main__")
            else:
                sys.argv = [target.module or "", *target.args]
                sys.path[0] = os.getcwd()
                runpy.run_module(target.module or "", run_name="__main__", alter_sys=True)
            return "exited", 0, None, None, None
        except SystemExit as exit_:
            code, message = _exit_status(exit_.code)
            return "exited", code, None, None, message
        except _ProgramExit as exit_:
            self.notes.append(f"the program ended with os._exit({exit_.code}); the profile covers the run until then")
            return "exited", exit_.code, None, None, None
        except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM (tpu_tools.signals)
            signals.note_interrupt(error)
            return "interrupted", signals.interrupted_exit_code(), None, None, None
        except BaseException as error:  # noqa: BLE001 the program's own failure, shown as Python would show it
            return "raised", 1, f"{type(error).__name__}: {error}", _program_traceback(error), None
        finally:
            sys.argv = saved_argv
            if sys.path:
                sys.path[0] = saved_path0


def _exit_status(code: object) -> tuple[int, str | None]:
    """sys.exit's argument as the process would report it."""
    if code is None:
        return 0, None
    if isinstance(code, bool):
        return int(code), None
    if isinstance(code, int):
        return code, None
    return 1, str(code)


_RUNNER_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}


def _program_traceback(error: BaseException) -> str:
    """The traceback from the program's first frame on, without this runner's frames."""
    tb = error.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in _RUNNER_FILES
                              or os.path.abspath(tb.tb_frame.f_code.co_filename) in _RUNNER_FILES):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))
