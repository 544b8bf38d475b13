"""JUnit XML of a diagnostic run, written by tpu-bench's JUnit writer: one testcase per check, and an error
testcase for a run that was interrupted (what it did not reach is not a pass)."""

from __future__ import annotations

from tpu_tools.bench.junit import junit_xml as bench_junit_xml
from tpu_tools.bench.records import (
    FAILED,
    NOT_RUN,
    OK,
    BenchDevice,
    BenchEnvironment,
    BenchSettings,
    Case,
    CaseResult,
    RunResult,
)
from tpu_tools.diag.records import FAIL, SKIP, DiagReport

SUITE_NAME = "tpu-diag"


def junit_xml(report: DiagReport) -> str:
    results = []
    for check in report.checks:
        status = {FAIL: FAILED, SKIP: NOT_RUN}.get(check.status, OK)
        result = CaseResult(Case(check.test.split(" ")[0], f"{check.test} {check.target}"), status=status,
                            message=check.why or check.status, duration_s=check.duration_s)
        result.warnings = [f"{check.status}: {check.why}"]
        results.append(result)
    if report.interrupted:
        results.append(CaseResult(Case("run", "interrupted"), status=FAILED,
                                  message=f"the run was interrupted after {len(report.checks)} check(s): the tests "
                                          "after them did not run"))
    device = BenchDevice(kind=report.device_kind, platform=report.platform, count=len(report.device_ids))
    run = RunResult(environment=BenchEnvironment(), device=device,
                    settings=BenchSettings(), results=results, suite=f"-r {report.level}", time=report.time,
                    interrupted=report.interrupted)
    return bench_junit_xml(run, suite_name=SUITE_NAME)
