"""The Pipeline API (``ss.Pipeline``): chain operators instead of wiring vertices.

``p.to_dag()`` compiles a pipeline to a Core API DAG (:mod:`.compiler` says which
choices it makes); ``engine.new_job(p)`` accepts the pipeline itself on both engines.
"""

from slipstream import _lazy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
# imported on first use (slipstream/_lazy.py says why)
_lazy.install(
    __name__,
    {
        "GroupedStage": "slipstream.pipeline.stages:GroupedStage",
        "Pipeline": "slipstream.pipeline.stages:Pipeline",
        "PipelineError": "slipstream.pipeline.stages:PipelineError",
        "SinkStage": "slipstream.pipeline.stages:SinkStage",
        "Stage": "slipstream.pipeline.stages:Stage",
        "WindowedStage": "slipstream.pipeline.stages:WindowedStage",
        "session_window_def": "slipstream.window:session_window_def",
        "sliding_window_def": "slipstream.window:sliding_window_def",
        "tumbling_window_def": "slipstream.window:tumbling_window_def",
    },
)

if TYPE_CHECKING:
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
