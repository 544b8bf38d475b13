"""The typed records a monitor report is made of, from where a figure is read to every view.

One record type per thing reported (a device, a process, an agent's job, a libtpu metric, a GPU, a diagnostics
result, a fleet host), one name per figure with its unit in the name, None where a source does not say.
Collectors fill them; tpu-top, the renderers, the Prometheus exposition, tpu-dump and the fleet view read their
attributes. They are msgspec Structs: what comes from another process or a file is decoded straight into them,
checked against their types and bounds, and they encode to the documented JSON without a copy through dicts.
This package holds records only (no sampling, no I/O), so every layer above `metrics` can import it cheaply.
"""
