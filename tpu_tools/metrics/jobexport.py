"""Metrics a job exports itself on a local Prometheus endpoint: Orbax checkpointing and Grain input pipelines.

Orbax and Grain publish through JAX's monitoring to a Prometheus endpoint in the job (port 9431 unless
`ORBAX_PROMETHEUS_PORT` / `PYGRAIN_PROMETHEUS_PORT` say otherwise). tpu-tools scrapes it with a deadline,
keeps the Orbax and Grain families, and bounds what it keeps: a job's endpoint is outside input.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from tpu_tools.metrics.metricspage import PageTooLarge, read_metrics_page, unreachable_reason
from tpu_tools.metrics.records.jobs import ExportedFamily, ExportedSample, JobEndpoint
from tpu_tools.parsing import port_number
from tpu_tools.shorten import shorten

DEFAULT_PORT = 9431
PORT_VARIABLES = {"orbax": "ORBAX_PROMETHEUS_PORT", "grain": "PYGRAIN_PROMETHEUS_PORT"}
PREFIXES = {"orbax": ("jax_orbax_write_", "jax_checkpoint_write_", "jax_orbax_read_"),
            "grain": ("grain_python_",)}
_MAX_BYTES = 8 << 20
_MAX_SAMPLES = 5000


def endpoints(environ: Mapping[str, str] | None = None) -> dict[int, list[str]]:
    """Port -> the sources configured on it (a port given as a non-number falls back to the default)."""
    env = os.environ if environ is None else environ
    ports: dict[int, list[str]] = {}
    for source, variable in PORT_VARIABLES.items():
        text = (env.get(variable) or "").strip()
        port = port_number(text) or DEFAULT_PORT
        ports.setdefault(port, []).append(source)
    return ports


def _source_of(name: str, sources: list[str]) -> str | None:
    return next((s for s in sources if name.startswith(PREFIXES[s])), None)


def scrape(port: int, sources: list[str], timeout_s: float, host: str = "127.0.0.1") -> JobEndpoint:
    """The Orbax / Grain families the job's endpoint serves now; an endpoint that fails sets `error`."""
    from prometheus_client.parser import text_string_to_metric_families

    endpoint = JobEndpoint(address=f"{host}:{port}", sources=sources)
    try:
        text = read_metrics_page(endpoint.address, timeout_s, _MAX_BYTES)
    except PageTooLarge as error:
        endpoint.error = f"the metrics endpoint at {endpoint.address} answered {error}"
        return endpoint
    except (OSError, ValueError) as error:
        endpoint.error = f"no metrics endpoint at {endpoint.address}: {unreachable_reason(error)}"
        return endpoint
    kept = 0
    try:
        for family in text_string_to_metric_families(text):
            source = _source_of(family.name, sources)
            if source is None:
                continue
            exported = ExportedFamily(source=source, name=family.name, type=family.type,
                                      documentation=shorten(family.documentation, 200))
            for sample in family.samples:
                if kept >= _MAX_SAMPLES:
                    endpoint.notes.append(f"more than {_MAX_SAMPLES} samples: the rest left out")
                    break
                value = float(sample.value)
                exported.samples.append(ExportedSample(name=sample.name, labels=dict(sample.labels),
                                                       value=value if math.isfinite(value) else None))
                kept += 1
            endpoint.families.append(exported)
            if kept >= _MAX_SAMPLES:
                break
    except (ValueError, TypeError, IndexError) as error:
        endpoint.error = shorten(f"the metrics endpoint at {endpoint.address} answered unreadable text: {error}", 300)
        endpoint.families = []
    return endpoint


def read_job_metrics(timeout_s: float, environ: Mapping[str, str] | None = None) -> list[JobEndpoint]:
    return [scrape(port, sources, timeout_s) for port, sources in endpoints(environ).items()]
