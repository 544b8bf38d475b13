"""JUnit XML for CI systems: one testcase per benchmark case, failures for regressions.

ok -> passed (figures in properties and system-out); unsupported, out of memory,
not run, interrupted -> skipped with the reason; failed -> error; a regression
against the baseline -> failure naming the figures.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections import defaultdict

from tpu_tools.bench.compare import Comparison, FigureChange
from tpu_tools.bench.records import FAILED, OK, BenchDevice, CaseResult, RunResult

SUITE_NAME = "tpu-bench"


def junit_xml(run: RunResult, comparison: Comparison | None = None, suite_name: str = SUITE_NAME) -> str:
    regressions: dict[str, list[FigureChange]] = defaultdict(list)
    for change in comparison.regressions if comparison else []:
        regressions[change.case_id].append(change)
    suite = ElementTree.Element("testsuite", name=suite_name, timestamp=run.time or "")  # absent in a hand-made file
    properties = ElementTree.SubElement(suite, "properties")
    device = run.device or BenchDevice()
    for name, value in (("device_kind", device.kind), ("platform", device.platform),
                        ("device_count", device.count), ("suite", run.suite),
                        ("interrupted", run.interrupted)):
        ElementTree.SubElement(properties, "property", name=name, value=str(value))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for result in run.results:
        element = _testcase(result, regressions.get(result.case.id, []), suite_name)
        suite.append(element)
        counts["tests"] += 1
        for tag, key in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            if element.find(tag) is not None:
                counts[key] += 1
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("time", f"{sum(r.duration_s for r in run.results):.3f}")
    if comparison and comparison.warnings:
        ElementTree.SubElement(suite, "system-err").text = "\n".join(comparison.warnings)
    ElementTree.indent(suite)
    return ElementTree.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _testcase(result: CaseResult, regressions: list[FigureChange], suite_name: str) -> ElementTree.Element:
    element = ElementTree.Element("testcase", classname=f"{suite_name}.{result.case.benchmark}",
                                  name=result.case.name, time=f"{result.duration_s:.3f}")
    if result.status == OK:
        properties = ElementTree.SubElement(element, "properties")
        for name, summary in result.stats.items():
            ElementTree.SubElement(properties, "property", name=f"{name}_median", value=f"{summary.median:.6g}")
        lines = [f"{name}: median {s.median:.6g} (p25 {s.p25:.6g}, p75 {s.p75:.6g}, n={s.count})"
                 for name, s in result.stats.items()]
        ElementTree.SubElement(element, "system-out").text = "\n".join(lines + result.warnings)
    elif result.status == FAILED:
        ElementTree.SubElement(element, "error", message=result.message or "failed", type="failed")
    else:
        ElementTree.SubElement(element, "skipped", message=result.message or result.status)
    if regressions:
        message = "; ".join(_regression_text(change) for change in regressions)
        ElementTree.SubElement(element, "failure", message=message, type="regression").text = message
    return element


def _regression_text(change: FigureChange) -> str:
    if change.note:
        return f"{change.figure}: {change.note}"
    return (f"{change.figure}: {change.baseline_median:.6g} -> {change.current_median:.6g} "
            f"({change.change_percent:+.1f}%)")
