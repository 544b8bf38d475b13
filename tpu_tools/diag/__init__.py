"""`tpu-diag`: levelled diagnostics that prove every device computes, moves and stores data correctly."""
