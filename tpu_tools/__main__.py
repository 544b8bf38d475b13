"""`python -m tpu_tools` runs the `tpu-tools` command group."""

from tpu_tools.cli.main import main

if __name__ == "__main__":
    main()
