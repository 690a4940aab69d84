"""``python -m moe_cpu``: the moe-cpu command line (see moe_cpu.cli)."""
from .cli import main

raise SystemExit(main())
