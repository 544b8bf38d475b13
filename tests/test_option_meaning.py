"""Values checked for what they mean, not only their type: one ASCII number parser with documented bounds,
empty and unknown values refused, and result files and web configs whose fields make no sense together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_tools.parsing import ascii_digits, parse_duration, parse_number, parse_size

# digits of other scripts that str.isdigit(), int() or float() take: Arabic-Indic, Devanagari, fullwidth, superscript
FOREIGN_DIGITS = st.sampled_from(["\u0661", "\u0966", "\uff11", "\u00b2", "\u2081", "\u0e51"])
# no deadline and no speed health check: a busy CI machine makes both fail for reasons of its own
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1))
def test_ascii_integers_parse_exactly(number):
    assert parse_number(str(number), "--n", integer=True) == number


@FAST
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_ascii_decimals_parse_exactly(number):
    assert parse_number(repr(number), "--x") == number + 0.0


@FAST
@given(prefix=st.text("0123456789", max_size=5), foreign=FOREIGN_DIGITS, suffix=st.text("0123456789", max_size=5),
       integer=st.booleans())
def test_digits_of_other_scripts_are_refused_everywhere(prefix, foreign, suffix, integer):
    text = prefix + foreign + suffix
    assert not ascii_digits(text)
    with pytest.raises(ValueError, match=r"^--n '.*' is not a (whole )?number$"):
        parse_number(text, "--n", integer=integer)
    with pytest.raises(ValueError, match=r"^period '.*' is not a duration"):
        parse_duration(text + "s")
    with pytest.raises(ValueError, match=r"^'.*' is not a size"):
        parse_size(text + "K")


@FAST
@given(st.integers(min_value=1, max_value=10**6).map(lambda n: f"{n // 10}_{n % 10}"))
def test_underscores_are_refused(text):
    with pytest.raises(ValueError, match="is not a"):
        parse_number(text, "--n")
    with pytest.raises(ValueError, match="is not a"):
        parse_number(text, "--n", integer=True)


@FAST
@given(st.integers(min_value=330, max_value=9999), st.integers(min_value=1, max_value=9))
def test_a_value_that_underflows_to_zero_is_refused(exponent, digit):
    with pytest.raises(ValueError, match="too small"):
        parse_number(f"{digit}e-{exponent}", "--min-time", minimum=0.0)


def test_zero_and_signs():
    assert str(parse_number("-0", "--x", minimum=0.0)) == "0.0"
    for text in ("0", "-0", "0e-400", "1e-400"):
        with pytest.raises(ValueError, match=r"^--min-time (must be greater than 0|.* is too small to be told from 0)"):
            parse_number(text, "--min-time", above=0.0)
    with pytest.raises(ValueError, match="must not be empty"):
        parse_number("  ", "--x")


BENCH = ("dispatch", "--mode", "compiled")
REFUSED = [
    (("tpu-top", "--once", "--pid", "1" * 45), "--pid"),
    (("tpu-top", "--once", "--pid", "9223372036854775808"), "--pid"),
    (("tpu-top", "--once", "--pid", "\u0661"), "--pid"),
    (("tpu-top", "--once", "--device", "bogus"), "is not a device"),
    (("tpu-top", "--once", "--device", ""), "is not a device"),
    (("tpu-bench", *BENCH, "--min-time", "0"), "--min-time"),
    (("tpu-bench", *BENCH, "--min-time", "-0"), "--min-time"),
    (("tpu-bench", *BENCH, "--min-time", "1e-400"), "--min-time"),
    (("tpu-bench", *BENCH, "--min-time", "1_0"), "--min-time"),
    (("tpu-bench", *BENCH, "--min-time", "\u0661"), "--min-time"),
    (("tpu-bench", *BENCH, "--timeout", "0.001"), "--timeout"),
    (("tpu-bench", *BENCH, "--tolerance", "1_0"), "is not a percentage"),
    (("tpu-bench", *BENCH, "--baseline", ""), "--baseline must not be empty"),
    (("tpu-bench", "matmul", "--dtype", ""), "an empty value"),
    (("tpu-bench", "matmul", "--dtype", "f32,,bf16"), "an empty value"),
    (("tpu-bench", "infer", "--batch-sizes", "\u0661"), "is not a batch size"),
    (("tpu-collectives-test", "--dtype", ""), "unknown dtype"),
    (("tpu-collectives-test", "-b", "\u0661K"), "-b"),
    (("tpu-collectives-test", "-n", "1_0"), "-n"),
    (("tpu-dump", "--only", ""), "--only must not be empty"),
    (("tpu-dump", "--only", "system,,logs"), "an empty name"),
    (("tpu-dump", "--skip", ","), "an empty name"),
    (("tpu-monitor", "--count", "1", "--config", ""), "--config must not be empty"),
    (("tpu-monitor", "--count", "1", "--web-config", ""), "--web-config must not be empty"),
    (("tpu-monitor", "--count", "\u0661"), "--count"),
    (("tpu-monitor", "--count", "1", "--period", "\u0661s"), "--period"),
    (("tpu-ls", "--timeout", "0.5"), "--timeout"),
]


@pytest.mark.parametrize(("args", "fragment"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_every_absurd_empty_or_unknown_option_value_is_one_line(args, fragment):
    assert_one_line_error(run_tool(*args, env=clean_env(JAX_PLATFORMS="cpu"), timeout=60), 2, fragment)


CASE = {"id": "x/a", "benchmark": "x", "name": "a", "status": "ok", "params": {}, "values": {}, "stats": {
    "time_us": {"median": 2.0, "p25": 1.0, "p75": 3.0, "p90": 3.0, "p99": 3.0, "min": 1.0, "max": 3.0,
                "mean": 2.0, "stdev": 1.0, "count": 5, "higher_is_better": False}}}
RESULT = {"schema": "tpu-tools/bench/v1", "device": {"platform": "cpu", "kind": "cpu"}, "results": [CASE]}
DAMAGED = [
    ('"count": 5', '"count": ' + "9" * 5000, "a number too long to read"),
    ('"median": 2.0', '"median": 1' + "0" * 400, "Number out of range - at `$.results[0].stats[...].median`"),
    ('"count": 5', '"count": 1' + "0" * 30, "Expected `int` <= 9223372036854775807"),
    ('"median": 2.0', '"median": -2.0', "median: -2 is not above 0"),
    ('"p25": 1.0', '"p25": 0', "p25: 0 is not above 0"),
    ('"higher_is_better": false', '"higher_is_better": "no"', "Expected `bool`, got `str` - at "
                                                              "`$.results[0].stats[...].higher_is_better`"),
]


@pytest.mark.parametrize(("old", "new", "fragment"), DAMAGED, ids=[f for _, _, f in DAMAGED])
def test_result_files_that_make_no_sense_are_damaged_records(tmp_path, old, new, fragment):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RESULT))
    bad = tmp_path / "bad.json"
    text = json.dumps(RESULT)
    assert old in text
    bad.write_text(text.replace(old, new))
    for args in (("compare", str(bad), str(good)), ("compare", str(good), str(bad))):
        assert_one_line_error(run_tool("tpu-bench", *args, timeout=60), 2, "is a damaged tpu-bench result", fragment)
    assert_one_line_error(run_tool("tpu-bench", *BENCH, "--baseline", str(bad), timeout=60), 2, fragment)


def _web(tmp_path: Path, text: str) -> list[str]:
    config = tmp_path / "web.yml"
    config.write_text(text)
    return ["tpu-monitor", "--count", "1", "--prometheus", "127.0.0.1:1", "--web-config", str(config)]


@pytest.mark.parametrize("cost", ["03", "17", "31", "99"])
def test_a_bcrypt_cost_out_of_bounds_is_refused(tmp_path, cost):
    args = _web(tmp_path, f"basic_auth_users:\n  prometheus: $2b${cost}${'a' * 53}\n")
    assert_one_line_error(run_tool(*args, timeout=60), 2, f"bcrypt cost of user 'prometheus' is {int(cost)}")


def test_web_config_paths_and_numbers_are_said_as_they_are(tmp_path):
    (tmp_path / "certs").mkdir()
    args = _web(tmp_path, "tls_server_config:\n  cert_file: certs\n  key_file: certs\n")
    assert_one_line_error(run_tool(*args, timeout=60), 2, "cert_file", "is a directory, not a regular file")
    args = _web(tmp_path, "basic_auth_users: " + "9" * 5000 + "\n")
    assert_one_line_error(run_tool(*args, timeout=60), 2, "is not a usable web config")
