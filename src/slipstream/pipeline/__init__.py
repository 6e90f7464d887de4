"""The Pipeline API (``ss.Pipeline``): chain operators instead of wiring vertices.

``p.to_dag()`` compiles a pipeline to a Core API DAG (:mod:`.compiler` says which
choices it makes); ``engine.new_job(p)`` accepts the pipeline itself on both engines.
"""

from slipstream.pipeline.stages import (
    GroupedStage,
    Pipeline,
    PipelineError,
    SinkStage,
    Stage,
    WindowedStage,
)
from slipstream.window import session_window_def, sliding_window_def, tumbling_window_def

__all__ = [
    "GroupedStage",
    "Pipeline",
    "PipelineError",
    "SinkStage",
    "Stage",
    "WindowedStage",
    "session_window_def",
    "sliding_window_def",
    "tumbling_window_def",
]
