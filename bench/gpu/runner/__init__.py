"""The GPU pack's runner: what travels inside the pack and runs where TVM's compiler is not.

Standard library only (torch on the GPU machine). ``run.py`` is its command line; the modules
are the results journal (``journal``), the pack's files and TVM's runtime (``pack_files``), the
checks (``checks``), the worker that loads, checks and times kernels in one process
(``worker``), the parent that runs workers and survives them (``orchestrate``),
compute-sanitizer (``sanitize``) and what is printed when the first launch fails
(``diagnose``).
"""
