"""Every number a user gives, on the command line or in a config file: finite, in range, or one usage error."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import click
import pytest
from conftest import assert_one_line_error, clean_env, run_tool
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tpu_tools.cli.monitor_config import load_config
from tpu_tools.errors import UsageError
from tpu_tools.parsing import MAX_NUMBER_TEXT, MIN_PERIOD_S, parse_duration, parse_number, parse_size

NUMBER_TEXT = st.one_of(
    st.text(max_size=60),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers().map(str),
    st.sampled_from(["nan", "inf", "-inf", "1e10", "1e308", "1e309", "9" * 400, "0x10", "1_000", " 5 ", "", "-0"]),
)
ANY_VALUE = st.one_of(NUMBER_TEXT, st.floats(), st.integers(min_value=-(10**500), max_value=10**500), st.booleans(),
                      st.none(), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(value=ANY_VALUE, integer=st.booleans(), bounds=st.tuples(st.none() | st.floats(-1e6, 1e6),
                                                                   st.none() | st.floats(-1e6, 1e6)))
def test_parse_number_gives_a_finite_number_in_range_or_one_value_error(value, integer, bounds):
    minimum, maximum = bounds
    try:
        number = parse_number(value, "--x", minimum=minimum, maximum=maximum, integer=integer)
    except ValueError as error:
        message = str(error)
        assert message.startswith("--x")
        assert "\n" not in message
        assert len(message) < 200
        return
    assert isinstance(number, int if integer else float)
    assert math.isfinite(number)
    assert minimum is None or number >= minimum
    assert maximum is None or number <= maximum


@settings(max_examples=300, deadline=None)
@given(value=ANY_VALUE, floor=st.none() | st.just(MIN_PERIOD_S))
def test_parse_duration_gives_seconds_in_range_or_one_value_error(value, floor):
    try:
        seconds = parse_duration(value, "period", minimum=floor)
    except ValueError as error:
        assert "\n" not in str(error)
        assert len(str(error)) < 200
        return
    assert math.isfinite(seconds)
    assert 0 < seconds <= 86400
    assert floor is None or seconds >= floor


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(NUMBER_TEXT, st.from_regex(r"\A[0-9]{1,30}(\.[0-9]{1,5})?[KMGTkmgt]?(i?[bB])?\Z")))
def test_parse_size_gives_whole_bytes_or_one_value_error(text):
    try:
        size = parse_size(text)
    except ValueError as error:
        assert "\n" not in str(error)
        assert len(str(error)) < 200
        return
    assert isinstance(size, int)
    assert 0 <= size <= 1 << 60


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "9" * 400, "", "1" * (MAX_NUMBER_TEXT + 1)])
def test_non_finite_and_absurd_text_is_refused(value):
    with pytest.raises(ValueError, match=r"^--x (must|.* is not a sensible number)"):
        parse_number(value, "--x")


# --- every command's options (bugs 8, 9, 10, 11, 15) ---------------------------------------------------

@pytest.mark.parametrize(("program", "args", "fragment"), [
    ("tpu-ls", ["--timeout", "inf"], "--timeout must be a finite number"),
    ("tpu-ls", ["--host-devices", "99999999999999999999"], "--host-devices"),
    ("tpu-ls", ["--metrics-timeout", "1e10"], "--metrics-timeout"),
    ("tpu-monitor", ["--metrics-timeout", "inf"], "--metrics-timeout"),
    ("tpu-monitor", ["--period", "1ms"], "shorter than 0.1 s"),
    ("tpu-top", ["--once", "--interval", "nan"], "--interval"),
    ("tpu-bench", ["matmul", "--size", "512", "--min-time", "inf"], "--min-time must be a finite number"),
    ("tpu-bench", ["--seed", "99999999999999999999999"], "--seed"),
    ("tpu-bench", ["train", "--price-per-hour", "nan"], "--price-per-hour must be a finite number"),
    ("tpu-collectives-test", ["-f", "inf"], "--step-factor must be a finite number"),
    ("tpu-collectives-test", ["--min-busbw", "nan"], "--min-busbw must be a finite number"),
    ("tpu-profile", ["run", "--delay", "nan", "--", "x.py"], "--delay must be a finite number"),
    ("tpu-profile", ["run", "--duration", "inf", "--", "x.py"], "--duration must be a finite number"),
    ("tpu-profile", ["capture", "--addr", "127.0.0.1:1", "--duration", "inf"], "--duration"),
    ("tpu-dump", ["--timeout", "inf"], "--timeout must be a finite number"),
    ("tpu-dump", ["--timeout", "1e308"], "absurdly large"),
])
def test_absurd_option_values_are_usage_errors(program, args, fragment):
    result = run_tool(program, *args, env=clean_env(JAX_PLATFORMS="cpu"), timeout=60)
    assert_one_line_error(result, 2, fragment)
    assert "internal error" not in result.stderr


# --- tpu-monitor --config -------------------------------------------------------------------------------

GROUPS = ["host", "devices", "processes", "libtpu"]


@pytest.mark.parametrize(("name", "text", "fragment"), [
    ("big.json", '{"period": ' + "9" * 400 + "}", "period"),
    ("tiny.json", '{"period": 1e-300}', "shorter than 0.1 s"),
    ("nan.json", '{"period": NaN}', "greater than 0"),
    ("inf.toml", "period = inf\n", "longer than a day"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ("group.toml", '[groups.host]\nperiod = "1ms"\n', "groups.host.period"),
    ("timeout.toml", "metrics_timeout = 1e10\n", "metrics_timeout"),
])
def test_hostile_monitor_configs_are_one_usage_error(tmp_path: Path, name, text, fragment):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_config(path, GROUPS)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(min_value=-(10**400), max_value=10**400)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12)
CONFIG_DOCUMENTS = st.dictionaries(
    st.sampled_from(["period", "tag_filter", "agent_timeout", "metrics_addr", "metrics_timeout", "price_per_hour",
                     "groups", "x"]),
    JSON_VALUES | st.dictionaries(st.sampled_from(GROUPS + ["nope"]),
                                  st.none() | st.dictionaries(st.sampled_from(["period", "y"]), JSON_VALUES)),
    max_size=4)


@settings(max_examples=200, deadline=None)
@given(document=CONFIG_DOCUMENTS)
def test_any_monitor_config_is_a_config_or_one_usage_error(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("config") / "monitor.json"
    path.write_text(json.dumps(document))
    try:
        config = load_config(path, GROUPS)
    except UsageError as error:
        assert "\n" not in str(error)
        return
    for seconds in (config.period_s, config.agent_timeout_s, config.metrics_timeout_s):
        assert seconds is None or (math.isfinite(seconds) and seconds > 0)
    assert config.period_s is None or config.period_s >= MIN_PERIOD_S
    assert config.price_per_hour is None or (math.isfinite(config.price_per_hour) and config.price_per_hour > 0)


# --- the other parsers of user text ---------------------------------------------------------------------

SPEC_TEXT = st.one_of(st.text(max_size=40), st.from_regex(r"\A[a-z0-9]{1,5}\[[0-9, ]{0,40}\]\Z"),
                      st.from_regex(r"\A[0-9x ,-]{0,30}\Z"), st.from_regex(r"\Ap[0-9.]{1,8}(,p[0-9.]{1,8})*\Z"))


@settings(max_examples=300, deadline=None)
@given(text=SPEC_TEXT)
@example(text=",".join(["p0"] * 81))  # once echoed whole by parse_arg_spec: a 421-character error
def test_every_other_option_parser_gives_a_value_or_one_error(text):
    from tpu_tools.bench.compare import parse_tolerance
    from tpu_tools.bench.matmul import parse_shape
    from tpu_tools.collectives.mesh import parse_device_ids, parse_mesh_shape
    from tpu_tools.collectives.stats import parse_stats
    from tpu_tools.userfn.specs import parse_arg_spec

    for parser in (parse_tolerance, parse_shape, parse_device_ids, parse_mesh_shape, parse_stats, parse_arg_spec):
        try:
            parser(text)
        except (ValueError, UsageError) as error:
            assert "\n" not in str(error), (parser.__name__, str(error))
            assert len(str(error)) < 400, (parser.__name__, str(error))


def test_a_huge_device_range_is_refused_at_once():
    from tpu_tools.collectives.mesh import parse_device_ids

    with pytest.raises(UsageError, match="more than 65536 device ids"):
        parse_device_ids("0-99999999999")


# --- ASCII digits only ----------------------------------------------------------------------------------
# int() and float() also read "١" (Arabic-Indic), "１" (fullwidth), "1_0" and " 7 "; str.isdigit() takes "²", which
# int() then refuses with a traceback. No documented option or file takes them: every number from outside goes
# through tpu_tools.parsing, which reads ASCII digits and nothing else.

LOOKALIKES = "١٣١２３۵०৫๓²³_ \t\n\u3000\u00a0"
ASCII_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
ASCII_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("0123456789+-.e" + LOOKALIKES), max_size=12), integer=st.booleans())
@example(text=" 7 ", integer=True)
@example(text="7\n", integer=True)
@example(text="１", integer=True)
def test_parse_number_reads_ascii_digits_and_nothing_else(text, integer):
    try:
        number = parse_number(text, "--x", integer=integer)
    except ValueError:
        return
    assert (ASCII_INTEGER if integer else ASCII_DECIMAL).fullmatch(text), text
    assert number == (int(text) if integer else float(text))


@settings(max_examples=200, deadline=None)
@given(text=st.from_regex(r"\A[+-]?[0-9]{1,18}\Z"))
def test_parse_number_reads_every_whole_number_in_ascii_digits(text):
    assert parse_number(text, "--x", integer=True) == int(text)


def _click_commands():
    from tpu_tools.cli.main import cli

    # Each context with its command's own settings: click keeps the help option a command first made, so a context
    # without `-h` would take `-h` from the program for the rest of the process.
    def walk(command: click.Command, ctx: click.Context):
        yield ctx.command_path, command
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                yield from walk(sub, click.Context(sub, parent=ctx, info_name=name, **sub.context_settings))

    return list(walk(cli, click.Context(cli, info_name="tpu-tools", **cli.context_settings)))


def test_no_option_reads_a_number_with_clicks_own_types():
    """click's INT, FLOAT, IntRange and FloatRange take "1_0", "١" and " 7 ": every number option is the project's
    Number, Count, Seconds or Duration."""
    found = []
    for path, command in _click_commands():
        for param in command.params:
            types = param.type.types if isinstance(param.type, click.Tuple) else [param.type]
            if any(isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)) for kind in types):
                found.append(f"{path} {param.opts[0]} ({param.type!r})")
    assert len(_click_commands()) > 20, found
    assert not found, found


@pytest.mark.parametrize(("program", "args", "fragment"), [
    *[("tpu-monitor", ["--arrays", value], "--arrays") for value in ["1_0", "１", "٣", " 7 ", "9" * 20]],
    ("tpu-monitor", ["--prometheus", "²"], "--prometheus"),
    ("tpu-collectives-test", ["--coordinator", "127.0.0.1:²", "--num-processes", "1", "--process-id", "0"],
     "--coordinator"),
    ("tpu-collectives-test", ["--devices", "١"], "--devices"),
    ("tpu-collectives-test", ["--mesh", "２x4"], "--mesh"),
    ("tpu-collectives-test", ["--stats", "p٩٩"], "--stats"),
    ("tpu-profile", ["hlo", "--arg", "f32[²]", "x:y"], "--arg"),
    ("tpu-profile", ["capture", "--addr", "127.0.0.1:٩٩٩٩"], "--addr"),
    ("tpu-bench", ["matmul", "--size", "١٠٢٤"], "matrix size"),
    ("tpu-diag", ["--inject", "kat:０"], "--inject"),  # device 0 exists: it ran, failing on purpose
])
def test_digits_of_other_scripts_are_usage_errors(program, args, fragment):
    result = run_tool(program, *args, env=clean_env(JAX_PLATFORMS="cpu"), timeout=60)
    assert_one_line_error(result, 2, fragment)
    assert "internal error" not in result.stderr


@pytest.mark.parametrize("text", ["kat:１", "kat:٣", "kat:1_0", "kat:²"])
def test_an_injected_device_is_a_device_id_in_ascii_digits(text):
    from tpu_tools.diag.settings import parse_injection

    with pytest.raises(UsageError, match="DEVICE must be a device id"):
        parse_injection(text)


def test_numbers_from_the_environment_are_ascii_digits():
    from tpu_tools.pjrt.tpuvm import slice_info

    info = slice_info({"TPU_WORKER_ID": "٣", "MEGASCALE_SLICE_ID": "1_0", "MEGASCALE_NUM_SLICES": "2"},
                      ask_metadata=False)
    assert (info.worker_id, info.slice_id, info.num_slices) == (None, None, 2)
