"""What every task produces: samples in the query-agnostic protocol (context, then question)."""

import hashlib
import json
from dataclasses import asdict, dataclass, field

from kvbench.core.errors import TaskUnavailable

__all__ = ["Sample", "TaskUnavailable"]


@dataclass
class Sample:
    """One evaluation item.

    The context is prefilled (and compressed); `question + answer_prefix` is fed on top of the
    compressed cache, then the model decodes greedily up to `max_new_tokens`.
    """

    task: str
    id: str  # unique within the task, stable across runs with the same (length, seed)
    context: str
    question: str
    answer_prefix: str
    references: list[str]
    max_new_tokens: int
    metric: str  # a name in kvbench.tasks.METRICS: fn(prediction, sample) -> score in [0, 100]
    chat_template: bool = True  # LongBench disables it for some datasets
    first_line: bool = False  # LongBench keeps only the first line of the prediction for some datasets
    meta: dict = field(default_factory=dict)  # e.g. {"length": 1024} or LongBench-E's length bucket
    # Chat turns that make up the context (role system/user/assistant/tool, content, optional region such as
    # "scratchpad"), rendered with the model's chat template; `context` then is a transcript for display.
    messages: list[dict] | None = None
    # A context made of several samples' material, each asked in turn (the multi-question and multi-turn
    # protocols): the samples, whose questions, references and metrics score the answers one by one; the
    # fields above are then those of the first one.
    parts: list["Sample"] | None = None

    def questions(self) -> list["Sample"]:
        """The samples whose questions are asked of this context, in order: its parts, or itself."""
        return self.parts or [self]

    def content_hash(self) -> str:
        """A short digest of the sample's content: every field but the task and the id (the prompt, the
        references, the metric and the meta it may read, e.g. LongBench's classes). Part of a results row's
        key, so regenerated task data with the same ids is scored again, never served old rows."""
        content = {name: value for name, value in asdict(self).items() if name not in ("task", "id")}
        if self.parts is None:  # a field added after rows were keyed by this hash: absent, it is not hashed
            del content["parts"]
        return hashlib.sha1(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:12]
