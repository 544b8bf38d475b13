"""Runtime metrics: sources (libtpu's metrics service, ...) and the records they produce."""
