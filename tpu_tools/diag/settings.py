"""What a diagnostic run does: its level, the tests it runs, how long level 3 lasts, how much memory it
tests, how many times it repeats, what it injects."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tpu_tools.errors import UsageError
from tpu_tools.parsing import parse_number
from tpu_tools.shorten import quoted

LEVELS = (1, 2, 3, 4)
DEFAULT_DURATION_S = 15 * 60.0
DEFAULT_MEMORY_FRACTION = 0.02  # of each device's free memory: a bounded share by default
LONG_MEMORY_FRACTION = 0.8  # -r 4: most of it (the runtime and the other buffers need the rest)
RATE_THRESHOLD = 0.10  # a device this much slower than its peers' median is an outlier
SEED = 20261124
MAX_ITERATIONS = 10_000
MAX_DEVICE_ID = 999_999_999  # --inject's DEVICE: nine digits, as many as any device id has

GEMM_DTYPES = ("f32", "bf16", "f16", "int8")
MEMORY_PATTERNS = ("address", "walking-ones", "walking-zeros", "random")
# -r 4: the patterns above, their inverses and a checkerboard, each written and checked twice (moving inversions)
LONG_MEMORY_PATTERNS = (*MEMORY_PATTERNS, "inverse-address", "checkerboard", "inverse-random")
COLLECTIVES = ("all-reduce", "all-gather", "ring +1", "ring -1")

# What --inject can corrupt: one bit in one device's result of that test.
INJECT_KINDS = {
    "kat": "known-answer",
    "transfer": "transfer",
    "gemm": "gemm",
    "memory": "memory",
    "collective": "collective",
    "sustained": "sustained",
}
INJECT_LEVEL = {"kat": 1, "transfer": 1, "gemm": 2, "memory": 2, "collective": 2, "sustained": 3}


def test_names(level: int) -> list[str]:
    """Every test a level runs, in order (a test on several devices is one name)."""
    names = ["compile", "known-answer", "transfer"]
    if level >= 2:
        names += [f"gemm {dtype}" for dtype in GEMM_DTYPES] + [f"gemm {dtype} exact" for dtype in GEMM_DTYPES]
        names += ["rate"] + [f"memory {name}" for name in MEMORY_PATTERNS]
        names += [f"collective {name}" for name in COLLECTIVES]
    if level >= 4:
        names += [f"memory long {name}" for name in LONG_MEMORY_PATTERNS]
    if level >= 3:
        names.append("sustained")
    return names


def families() -> list[str]:
    """The words --only and --skip take besides whole test names: a test's first word ("gemm")."""
    return list(dict.fromkeys(name.split(" ")[0] for name in test_names(max(LEVELS))))


def matches(test: str, selector: str) -> bool:
    """`selector` names `test`: the whole name, or the words it starts with ("gemm", "gemm f32", "memory long")."""
    return test == selector or test.startswith(selector + " ")


@dataclass(frozen=True)
class Injection:
    """Flip one bit of `device`'s output of the `kind` test (a collective: its ring-shift input from the left)."""

    kind: str
    device: int

    def text(self) -> str:
        return f"{self.kind}:{self.device}"


def parse_injection(text: str) -> Injection:
    """KIND:DEVICE, e.g. gemm:3 (DEVICE in ASCII digits); a usage error otherwise."""
    kind, separator, device_text = text.strip().partition(":")
    kind = kind.strip().lower()
    kinds = ", ".join(INJECT_KINDS)
    if not separator or kind not in INJECT_KINDS:
        raise UsageError(f"--inject {quoted(text, 40)}: use KIND:DEVICE with KIND one of {kinds} (e.g. gemm:3)")
    try:  # ASCII digits only: int() would take "１" (fullwidth) or "٣" as a device id
        device = parse_number(device_text.strip(), "DEVICE", minimum=0, maximum=MAX_DEVICE_ID, integer=True)
    except ValueError:
        raise UsageError(f"--inject {quoted(text, 40)}: DEVICE must be a device id (a whole number in digits 0-9, "
                         "e.g. gemm:3)") from None
    return Injection(kind, device)


def parse_injections(texts: Any) -> tuple[Injection, ...]:
    """Every --inject given, each applied; a kind given twice is refused (each kind corrupts one device)."""
    if isinstance(texts, str):
        texts = [texts]
    injections = tuple(parse_injection(str(text)) for text in texts or ())
    seen: dict[str, Injection] = {}
    for injection in injections:
        if injection.kind in seen:
            raise UsageError(f"--inject {seen[injection.kind].text()} and --inject {injection.text()}: one device per "
                             "kind (give each kind once; different kinds are all applied)")
        seen[injection.kind] = injection
    return injections


@dataclass(frozen=True)
class DiagSettings:
    level: int = 1
    duration_s: float = DEFAULT_DURATION_S
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    inject: tuple[Injection, ...] = ()
    seed: int = SEED
    rate_threshold: float = RATE_THRESHOLD
    iterations: int = 1  # the selected tests, run this many times in one runtime
    only: tuple[str, ...] = ()  # test names or families to run (empty: all of the level)
    skip: tuple[str, ...] = ()  # test names or families not to run
    # Problem sizes; the defaults fit the level's time budget on a small host.
    kat_size: int = 128
    transfer_bytes: int = 8 << 20
    gemm_size: int = 512
    sustained_size: int = 512
    collective_elements: int = 1 << 16
    memory_bytes: int | None = None  # one pattern buffer's size instead of the share of free memory
    long_memory_fraction: float = LONG_MEMORY_FRACTION

    def validate(self) -> None:
        if self.level not in LEVELS:
            raise UsageError(f"-r {self.level}: the level must be 1, 2, 3 or 4")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise UsageError(f"--memory-fraction {self.memory_fraction:g}: use a share above 0 and at most 1")
        if not self.duration_s > 0:
            raise UsageError(f"--duration {self.duration_s:g}: use a positive duration")
        if not 1 <= self.iterations <= MAX_ITERATIONS:
            raise UsageError(f"--iterations {self.iterations}: use 1 to {MAX_ITERATIONS}")
        for injection in self.inject:
            if INJECT_LEVEL[injection.kind] > self.level:
                raise UsageError(f"--inject {injection.text()}: that test runs from -r {INJECT_LEVEL[injection.kind]} "
                                 f"on; this run is -r {self.level}")
        names = test_names(self.level)
        for option, selectors in (("--only", self.only), ("--skip", self.skip)):
            for selector in selectors:
                if not any(matches(name, selector) for name in names):
                    known = ", ".join(families())
                    raise UsageError(f"{option} {quoted(selector, 40)}: no such test at -r {self.level} (a test's "
                                     f"name, e.g. 'gemm f32', or one of {known})")
        if not self.selected_tests():
            raise UsageError("--only and --skip leave no test to run")
        for injection in self.inject:
            test = INJECT_KINDS[injection.kind]
            if not any(matches(name, test) for name in self.selected_tests()):
                raise UsageError(f"--inject {injection.text()}: its test ({test}) is not selected")

    def selected_tests(self) -> list[str]:
        return [name for name in test_names(self.level) if self.selects(name)]

    def selects(self, test: str) -> bool:
        if self.only and not any(matches(test, selector) for selector in self.only):
            return False
        return not any(matches(test, selector) for selector in self.skip)

    def injected(self, kind: str) -> Injection | None:
        return next((injection for injection in self.inject if injection.kind == kind), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inject"] = [injection.text() for injection in self.inject]
        data["only"], data["skip"] = list(self.only), list(self.skip)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiagSettings:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        inject = values.pop("inject", None)
        for name in ("only", "skip"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values, inject=parse_injections(inject))
