"""Every hook kvbench reads from a press beyond kvpress's own API (`BasePress.post_init_from_model`,
`compress`, `forward_hook`; `ScorerPress.score` and `compression_ratio`), each with its contract.

A press declares a hook by defining the attribute or method; none is required, and a press that declares
none is run as kvpress's pipeline runs it. kvbench reads them through `declared` only, so this table is the
whole interface a press author needs (docs/extending.md lists it, and a test holds the two together).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    name: str
    signature: str
    contract: str


HOOKS = {
    hook.name: hook
    for hook in (
        Hook(
            "shares_prefill",
            "shares_prefill: ClassVar[bool]",
            "True for a press that is no ScorerPress yet compresses only inside kvpress's forward hook "
            "from the keys and values it is given (a codec): one prefill then serves it beside others.",
        ),
        Hook(
            "ratio_free_scores",
            "ratio_free_scores: ClassVar[bool]",
            "True where `score` does not read `compression_ratio`: configs of the press at several ratios "
            "share one score per layer.",
        ),
        Hook(
            "layer_bytes",
            "layer_bytes: dict[int, int]",
            "Set by `compress`: per layer, the bytes a real store of the compressed layer holds (codes, "
            "scales, metadata); rows record their sum as kv_bytes. Evictors leave it out (16 bits a value).",
        ),
        Hook(
            "state_digest",
            "state_digest: str",
            "Set by `post_init_from_model`: the digest of the learned or fitted state the press loaded; rows "
            "are keyed by it, so new state is scored again.",
        ),
        Hook(
            "check_for_model",
            "check_for_model(self, model_name: str) -> None",
            "Called before the model loads: raise a KvbenchError (one line) if the press has no state for "
            "that model, or state made for another.",
        ),
        Hook(
            "use_regions",
            "use_regions(self, regions: torch.LongTensor) -> None",
            "Called before each prefill with every prompt token's region (kvbench.tasks.prompt.REGIONS: "
            "system, user, assistant, ...), for presses that treat regions differently.",
        ),
    )
}


def declared(press, name: str, default=None):
    """What `press` declares for hook `name` (a bound method for a method hook), or `default` where it
    declares nothing. KeyError for a name that is no hook: every read goes through this table."""
    if name not in HOOKS:
        raise KeyError(f"{name!r} is no hook of kvbench.core.press_hooks")
    return getattr(press, name, default)
