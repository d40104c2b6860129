"""``python -m tvm_streamk``: the ``tvm-streamk`` command line."""

from .cli import main

raise SystemExit(main())
