"""A user's own function, shared by `tpu-profile hlo` (what XLA makes of it) and `tpu-bench fn` (how fast it runs).

Below the features: the MODULE:FUNCTION target and how it is imported (`target`), the --arg specs and the
abstract or concrete arguments they make (`specs`), and the roofline a program is judged against (`roofline`).
"""
