"""The checks a config passes before any work: its protocol known and given its arguments, and its press
able to run under it (compress a growing cache, a long enough step for its query window)."""

from kvpress import BasePress, SnapKVPress

from kvbench.bridge.adapter import compresses_decoding, decoding_press, is_shareable
from kvbench.core.config import PROTOCOLS, Config, protocol_of
from kvbench.core.errors import BadInput
from kvbench.engine.evaluate import protocol_run
from kvbench.engine.steps import pressed_tree
from kvbench.presses import config_press, press_of

_UNBUILT = object()  # a check given no built press builds the config's own


def check_protocol(config: Config, press=_UNBUILT) -> None:
    """Fail before any work if a protocol is unknown, lacks its arguments, or cannot run the press
    (`press`: the config's, built; built here where not given)."""
    if config.protocol not in PROTOCOLS:
        raise BadInput(f"unknown protocol {config.protocol!r} (one of {', '.join(PROTOCOLS)})")
    protocol_run(PROTOCOLS[config.protocol])  # a plugin's run that does not import fails here, in one line
    args = dict(config.protocol_args)
    if sorted(args) != sorted(PROTOCOLS[config.protocol].arguments):
        wanted = ", ".join(PROTOCOLS[config.protocol].arguments) or "no arguments"
        raise BadInput(f"protocol {config.protocol!r} takes {wanted}, got {sorted(args) or 'none'}")
    for name, value in args.items():
        if not isinstance(value, int) or value < 1:
            raise BadInput(f"--{name} must be a whole number of at least 1, got {value}")
    if config.budget is not None and press_of(config).spec.codec:
        raise BadInput(
            f"press {config.press!r} is a codec: it stores every entry in fewer bits, so it takes --memory, "
            "not an absolute --budget of kept entries"
        )
    if protocol_of(config).several_questions or protocol_of(config).compresses_again:
        check_compresses_live(config, press)


def check_compresses_live(config: Config, press=_UNBUILT) -> None:
    """Fail before any work if the config's press cannot compress a cache as it grows (kvpress's
    DecodingPress around it), which every protocol but query-agnostic and query-aware asks (multi-question
    only shares the prefill), live-cache perplexity too (its configs' protocol is none of the engine's).
    `press`: the config's, built; built here where not given."""
    if config.press == "none":
        return
    again = config.protocol not in PROTOCOLS or protocol_of(config).compresses_again
    press = config_press(config) if press is _UNBUILT else press
    if compresses_decoding(press) or not is_shareable(press):
        raise BadInput(
            f"press {config.press!r} cannot run under the {config.protocol} protocol: it changes the "
            "forward or compresses while decoding by itself"
            + ("; kvpress's DecodingPress takes scorers" if again else "")
        )
    if again:
        if press_of(config).spec.prefill_only:
            raise BadInput(
                f"press {config.press!r} scores a whole prefill only (kvpress asserts it): it cannot "
                f"compress the cache again under the {config.protocol} protocol"
            )
        decoding_press(press, 1, 1)  # a press kvpress's DecodingPress does not take fails here
        _check_query_window(config, press)


# A turn's feed holds at least its question; 8 tokens is what the shortest questions of kvbench's tasks hold.
_SHORTEST_TURN = 8


def _check_query_window(config: Config, press: BasePress) -> None:
    """SnapKV (and its kin) scores with its last `window_size` queries and asserts it has more: after the
    prefill it sees only the tokens of one compression step (decode-time: `interval` tokens; streaming: a
    chunk; multi-turn: a turn). Fail before any work where the step is too short for the window."""
    windows = [p.window_size for p in pressed_tree(press) if isinstance(p, SnapKVPress)]
    if not windows:
        return
    turns = config.protocol in PROTOCOLS and protocol_of(config).answers_stay
    steps = {"turns": _SHORTEST_TURN} if turns else dict(config.protocol_args)
    if not steps:
        return  # a protocol without an option: its step is its own, unknown here
    name = next(iter(steps))
    if max(windows) >= steps[name]:
        fixes = [f"--press-arg window_size=N with N below {steps[name]}"] if steps[name] > 1 else []
        fixes += [] if name == "turns" else [f"a larger --{name}"]
        tokens = f"{'as few as ' if name == 'turns' else ''}{steps[name]} token{'s' * (steps[name] != 1)}"
        raise BadInput(
            f"press {config.press!r} scores with its last {max(windows)} queries, but a {config.protocol} "
            f"step feeds {tokens}: give " + ", or ".join(fixes)
        )
