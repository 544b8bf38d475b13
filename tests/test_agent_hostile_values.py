"""Nothing the job hands the agent raises into the job: every public function of `tpu_tools.agent`, called
with hostile values (ints of 400 digits, NaN, objects whose `__float__`, `__index__`, `__str__`, `__eq__` or
`__bool__` raise or return junk, text, bytes, bool), returns, and the agent keeps counting and serving."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from agentjobs import make_rundir, remove_rundir
from conftest import clean_env

# Runs in a job of its own: the agent's step tracker, ledger and server are the process's.
JOB = textwrap.dedent(r'''
    import contextlib, decimal, fractions, inspect, json, math, os, sys
    import numpy as np
    from hypothesis import HealthCheck, given, settings, strategies as st
    import tpu_tools.agent as agent
    from tpu_tools.metrics.agent_client import query_agent

    class Sulky(Exception):
        def __str__(self):
            raise RuntimeError("no text either")

    class RaisingFloat:
        def __float__(self):
            raise Sulky()

    class JunkFloat:
        def __float__(self):
            return "1.0"

    class FloatSubclass(float):
        pass

    class SubclassFloat:
        def __float__(self):
            return FloatSubclass(2.0)

    class RaisingIndex:
        def __index__(self):
            raise ValueError("no index")

    class HugeIndex:
        def __index__(self):
            return 10**400

    class Everything:  # raises from every operation it can be asked
        def __float__(self): raise OverflowError("float")
        def __index__(self): raise TypeError("index")
        def __bool__(self): raise RuntimeError("bool")
        def __repr__(self): raise RuntimeError("repr")
        def __str__(self): raise RuntimeError("str")
        def __eq__(self, other): raise RuntimeError("eq")
        def __hash__(self): raise RuntimeError("hash")
        def __len__(self): raise RuntimeError("len")
        def __call__(self, *args): raise Sulky()

    class SulkyText(str):
        def __hash__(self): raise RuntimeError("hash")
        def __eq__(self, other): raise RuntimeError("eq")
        def __lt__(self, other): raise RuntimeError("lt")
        def __str__(self): raise RuntimeError("str")

    class AlwaysEqual(str):
        def __eq__(self, other): return True
        def __hash__(self): return 0

    class BrokenProgram:
        def cost_analysis(self): raise Sulky()

    objects = [RaisingFloat(), JunkFloat(), SubclassFloat(), RaisingIndex(), HugeIndex(), Everything(),
               SulkyText("loss"), SulkyText("global"), AlwaysEqual("global"), BrokenProgram(), Sulky(),
               decimal.Decimal("1e400"), decimal.Decimal("-1e400"), decimal.Decimal("sNaN"),
               fractions.Fraction(10**400), np.float64("nan"), np.float32("inf"), np.arange(3.0),
               np.array([[1.0]]), [1.0], {"flops": 1}, b"1e3", "1e3", "\x1b[31mred", "", print]
    hostile = st.one_of(
        st.sampled_from([10**400, -10**400, 2**1024, -(2**1024), 10**5000]),
        st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
        st.text(max_size=60), st.binary(max_size=8),
        st.integers(0, len(objects) - 1).map(lambda index: objects[index]))  # hypothesis hashes sampled values

    public = [name for name in agent.__all__ if inspect.isfunction(getattr(agent, name))]

    def call(name, values):
        function = getattr(agent, name)
        parameters = list(inspect.signature(function).parameters.values())
        args, kwargs = [], {}
        for parameter, value in zip(parameters, values):
            if parameter.kind is parameter.KEYWORD_ONLY:
                kwargs[parameter.name] = value
            else:
                args.append(value)
        result = function(*args, **kwargs)
        if isinstance(result, contextlib.AbstractContextManager):
            with result:
                pass
        elif name == "on_step" and callable(result):
            result()

    called = set()

    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(public), values=st.lists(hostile, min_size=4, max_size=4))
    def sweep(name, values):
        called.add(name)
        call(name, values)

    sweep()
    # Afterwards the agent still counts, keeps good values and answers the monitors.
    agent.stop()
    info = agent.start(tag="after")
    before = agent.step_count()
    index = agent.step(flops=1e9, samples=8)
    with agent.step_context(flops=2e9, samples=8):
        pass
    kept = agent.metric("loss", 0.5, scope="global")
    figures = agent.goodput()
    json.dumps(figures, allow_nan=False)
    snapshot = query_agent(info.pid, 10.0)
    loss = [value for value in snapshot["metrics"]["values"] if value["name"] == "loss"]
    print(json.dumps({"public": public, "called": sorted(called), "stepped": [before, index, agent.step_count()],
                      "kept": kept, "tag": snapshot["tag"], "loss": loss, "served_steps": snapshot["steps"]["count"],
                      "rejected": snapshot["goodput"]["rejected"]}))
''')


def test_hostile_values_never_raise_into_the_job_and_the_agent_keeps_working():
    rundir = make_rundir()
    try:
        result = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=300,
                                env=clean_env(TPU_TOOLS_RUNTIME_DIR=str(rundir)))
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert set(report["called"]) == set(report["public"]) >= {
            "step", "step_context", "step_flops", "metric", "phase", "start", "stop", "on_step", "goodput"}
        before, index, after = report["stepped"]
        assert index == before
        assert after == before + 2
        assert report["kept"] is True
        assert report["tag"] == "after"
        assert report["served_steps"] == after
        assert [(value["value"], value["scope"], value["kind"]) for value in report["loss"]] == [
            (0.5, "global", "host")]
        assert report["rejected"]["flops"] > 0
        assert report["rejected"]["samples"] > 0
    finally:
        remove_rundir(rundir)
