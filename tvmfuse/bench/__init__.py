"""Benchmarking: the timing loop (:mod:`.measure`), the report (:mod:`.report`), the machine's
peak (:mod:`.peak`), the engines compared, one module per family registering into one table
(:mod:`.engines`), and one `tvmfuse bench` run over them (:mod:`.session`).

Importing this package and :mod:`.engines` is cheap (the CLI lists the engines' names); the
engines import their frameworks when they are prepared.
"""
