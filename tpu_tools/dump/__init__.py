"""Support bundles: collectors, redaction, the bundle writer and reader (behind `tpu-dump`).

- `collector`  what a collector is and the context it writes through (redaction on the way in)
- `collectors` the registry, one module per area: system, accelerators, software, logs
- `runner`     every collector in its own forked process with its own deadline
- `redact`     the redaction rules and credential-file exclusion
- `tree`       walking user-named folders without leaving them
- `bundle`     the private, atomic .tar.gz and --max-size fitting
- `manifest`   manifest.json, schema tpu-tools/dump/v1
- `create`     one dump from start to end (`create_bundle`)
- `reader`     reading a bundle safely without extracting it
- `findings`   the summary and warnings of `tpu-dump show`
"""
