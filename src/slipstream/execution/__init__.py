"""The kernel both engines run: the tasklet that drives one processor, its inbound edge
streams (watermark coalescing, barrier alignment), the outbound collectors, the queues
between processors, and the plan that turns a DAG into processors, queues and tasklets.

The embedded engine (:mod:`slipstream.engine`) and the Spark engine (:mod:`slipstream.spark`)
both build their processors and tasklets here; nothing here imports either engine
(``tests/test_layers.py`` checks it)."""
