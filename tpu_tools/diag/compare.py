"""Cross-device judgement of digests and rates: who disagrees with the majority, who is slow.

Pure functions over what the devices reported, so that every process's devices can be judged together.
A device whose two runs differ is nondeterministic (a warning: the platform may reorder reductions);
a device that repeats itself but disagrees with the majority computed wrong: the suspect.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from tpu_tools.diag.records import FAIL, PASS, SKIP, WARN


@dataclass
class Judgement:
    device: int
    status: str
    why: str


def judge_digests(runs: dict[int, list[str]], what: str = "result") -> list[Judgement]:
    """`runs`: device -> its digests of the same program on the same inputs (two runs each)."""
    judgements: list[Judgement] = []
    firsts = {device: digests[0] for device, digests in runs.items() if digests}
    counts = Counter(firsts.values())
    majority, votes = counts.most_common(1)[0] if counts else ("", 0)
    clear = votes * 2 > len(firsts)  # a strict majority names the reference
    for device in sorted(runs):
        digests = runs[device]
        if len(set(digests)) > 1:
            judgements.append(Judgement(device, WARN, f"nondeterministic: two runs gave {digests[0]} and "
                                                      f"{digests[1]}"))
        elif len(firsts) < 2:
            # repeatable proves nothing about the bits: the exact GEMM, --reference or the fleet judge them
            judgements.append(Judgement(device, SKIP, "repeatable, not compared: one device, no peer"))
        elif firsts[device] == majority and clear:
            judgements.append(Judgement(device, PASS, f"{what} digest {majority} matches {votes - 1} peer(s)"))
        elif clear:
            judgements.append(Judgement(device, FAIL, f"{what} digest {firsts[device]} differs from {majority} of "
                                                      f"{votes} other device(s), on both runs"))
        else:
            judgements.append(Judgement(device, FAIL, f"{what} digests disagree with no majority "
                                                      f"({len(counts)} different among {len(firsts)} devices)"))
    return judgements


def rate_outliers(times_s: dict[int, float], threshold: float, judged: bool = True) -> list[Judgement]:
    """A device `threshold` (0.10: 10 %) or more slower than the median of its peers is an outlier."""
    judgements: list[Judgement] = []
    for device in sorted(times_s):
        peers = [t for d, t in times_s.items() if d != device]
        if not peers:
            judgements.append(Judgement(device, SKIP, "one device: no peer to compare with"))
            continue
        reference = statistics.median(peers)
        slower = times_s[device] / reference - 1.0 if reference > 0 else 0.0
        text = f"{slower * 100:+.1f} % against the median of {len(peers)} peer(s)"
        if not judged:
            judgements.append(Judgement(device, PASS, f"{text}; not judged: CPU devices share the host's cores"))
        elif slower >= threshold:
            judgements.append(Judgement(device, WARN, f"slow: {text} (threshold {threshold * 100:g} %)"))
        else:
            judgements.append(Judgement(device, PASS, text))
    return judgements
