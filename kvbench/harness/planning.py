"""From what a user asks (presses, ratios or memory budgets, a protocol, a suite or tasks, lengths) to the
configs and tasks of a run, every value checked before any model loads.

`kvbench run`/`sweep` and the Python API (`kvbench.run`, `kvbench.sweep`) both plan here, so they score the
same rows. Errors are `BadInput`/`UnknownTask`/`UnknownPress`: one line naming the culprit (and the CLI
option that sets it, which is also the keyword of the Python API).
"""

import dataclasses
import functools
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench import tasks
from kvbench.bridge.models import first_line
from kvbench.core.config import DEFAULT_PROTOCOL, PROTOCOLS, Config, protocol_by_option, protocol_of
from kvbench.core.errors import BadInput, KvbenchError, KvbenchWarning
from kvbench.core.press_hooks import declared
from kvbench.core.validation import as_paths, parse_float, parse_int
from kvbench.presses import check_distinct_presses, config_press, press_of, resolve, resolve_press

DEFAULT_SUITE = "ruler-smoke"
DEFAULT_LENGTH = 1024  # RULER tasks named without a suite or a length


# Ratios and memory budgets are rounded to this many decimal places: budgets closer than that keep the same
# entries of any context a model holds (fewer than 1e10 tokens), so 1e-320 is 0 and 0.50000000000001 is 0.5,
# and a grid that holds both is refused as a duplicate instead of scoring one budget twice.
BUDGET_DIGITS = 10


def parse_ratio(value: float | str) -> float:
    """A compression ratio (fraction of KV entries removed) in [0, 1), from a number or its text, rounded to
    BUDGET_DIGITS decimal places."""
    ratio = round(parse_float(value, "ratio", 0, 1, high_open=True), BUDGET_DIGITS) + 0.0  # -0.0 is 0.0
    if ratio >= 1:
        raise BadInput(f"ratio must be in [0, 1), got {value} (1 at {BUDGET_DIGITS} decimal places)")
    return ratio


def parse_memory(value: float | str) -> float:
    """A memory budget (fraction of the 16-bit full cache) in (0, 1], from a number or its text, rounded to
    BUDGET_DIGITS decimal places."""
    memory = round(parse_float(value, "memory", 0, 1, low_open=True), BUDGET_DIGITS)
    if memory <= 0:
        raise BadInput(f"memory must be in (0, 1], got {value} (0 at {BUDGET_DIGITS} decimal places)")
    return memory


def parse_budget(value: int | str) -> int:
    """An absolute budget: KV entries kept per head (and per layer), a whole number of at least 1 that fits
    in 64 bits, as rows store it (`validation.parse_int`)."""
    try:
        budget = parse_int(value, "budget")
    except BadInput:
        raise BadInput(f"budget must be a whole number of KV entries per head, got {value!r}") from None
    if budget < 1:
        raise BadInput(f"budget must be at least 1 KV entry per head, got {value}")
    return budget


def checked_protocol(protocol: str, **given: int | None) -> tuple[str, tuple]:
    """(protocol, protocol_args) after validation: each argument, given by its option name
    (`config.protocol_by_option`), belongs to its protocol, and takes the protocol's default if not given."""
    if not isinstance(protocol, str) or protocol not in PROTOCOLS:
        raise BadInput(f"unknown protocol {protocol!r} (one of {', '.join(PROTOCOLS)})")
    given = {name: value for name, value in given.items() if value is not None}
    wanted = PROTOCOLS[protocol]
    for name in given:
        if name != wanted.option:
            owner = protocol_by_option()[name].name
            raise BadInput(f"--{name} applies to --protocol {owner}, not {protocol}")
    if wanted.option is None:
        return protocol, ()
    return protocol, (
        (wanted.option, parse_int(given.get(wanted.option, wanted.default), f"--{wanted.option}", 1)),
    )


def budget_configs(
    press: str,
    ratios: Sequence[float],
    memories: Sequence[float],
    protocol: tuple[str, tuple] = (DEFAULT_PROTOCOL, ()),
    press_args: tuple = (),
    budgets: Sequence[int] = (),
) -> list[Config]:
    """The configs of one press: one per ratio, per memory budget (evictors at ratio 1 - memory, codecs
    solving their own knobs for it), or per absolute budget (each sample's ratio set from its length). An
    unknown press name fails here, before anything heavy."""
    resolved = resolve(press, press_args)  # the press, resolved once: every config carries it
    name, protocol_args = protocol
    common = dict(press_args=press_args, protocol=name, protocol_args=protocol_args, resolved=resolved)
    if budgets:
        return [Config(press, 0.0, budget=b, **common) for b in budgets]
    if memories:
        codec = resolved.spec.codec
        return [Config(press, 0.0 if codec else round(1 - m, 10), memory=m, **common) for m in memories]
    return [Config(press, r, **common) for r in ratios]


def check_uncompressed(press: str, ratio: float | None, option: str) -> None:
    """BadInput when the uncompressed press `none` is given a budget: a ratio other than 0 (None: a memory
    or absolute budget) under `option`, the name the caller's user gave it."""
    if press == "none" and ratio != 0:
        raise BadInput(f"press 'none' compresses nothing: its {option} must be 0 (or name a press)")


def press_args_for(name: str, press_args: dict | None, names: Sequence[str]) -> tuple:
    """The press arguments of press `name` among the presses `names` of a run or sweep, as a config holds
    them: the unprefixed ones (every press's) and those given as `name.key`; a prefix that names none of
    `names` is refused."""
    if press_args is not None and not isinstance(press_args, Mapping):
        raise BadInput(f"press_args: a dict of argument -> value, got {press_args!r}")
    own = {}
    for key, value in (press_args or {}).items():
        prefix, dot, arg = str(key).rpartition(".")
        if not dot:
            own.setdefault(key, value)
            continue
        if prefix not in names:
            raise BadInput(
                f"press argument {key!r} names press {prefix!r}, which is not among {', '.join(names)}"
            )
        if prefix == name:
            own[arg] = value
    return tuple(sorted(own.items()))


def press_names(presses) -> list[str]:
    """The registry's names of the presses asked for: names, targets (`module:Class`, `file.py:Class`,
    `name=target`) or objects, as a sequence, comma-separated text, or a mapping name -> press (the
    Python API's `{"mine": MyPress, "snapkv": "snapkv"}`); users' presses are registered here."""
    if isinstance(presses, Mapping):
        return [resolve_press(press, str(name)) for name, press in presses.items()]
    if isinstance(presses, str) or not isinstance(presses, Sequence):
        presses = split(presses) if isinstance(presses, str) else [presses]
    return [resolve_press(press) for press in presses if not (isinstance(press, str) and not press.strip())]


def configs_for_run(
    press,
    ratio: float | str | None = None,
    memory: float | str | None = None,
    press_args: dict | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    budget: int | str | None = None,
    **protocol_args: int | None,
) -> list[Config]:
    """The one config of `kvbench run`: a press at a ratio, a memory budget or an absolute budget.
    `protocol_args`: the protocol's argument by its option name (`config.protocol_by_option`)."""
    if sum(value is not None for value in (ratio, memory, budget)) != 1:
        raise BadInput("give exactly one of --ratio, --memory or --budget")
    press = resolve_press(press)
    check_uncompressed(press, parse_ratio(ratio) if ratio is not None else None, "--ratio")
    args = press_args_for(press, press_args, [press])
    ratios = [parse_ratio(ratio)] if ratio is not None else []
    memories = [parse_memory(memory)] if memory is not None else []
    budgets = [parse_budget(budget)] if budget is not None else []
    return budget_configs(press, ratios, memories, checked_protocol(protocol, **protocol_args), args, budgets)


def configs_for_sweep(
    presses,
    ratios: Sequence[float | str] | str | None = None,
    memory: Sequence[float | str] | str | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    press_args: dict | None = None,
    budget: Sequence[int | str] | str | int | None = None,
    **protocol_args: int | None,
) -> list[Config]:
    """The grid of `kvbench sweep`: no compression, then every press at every ratio (or memory budget, or
    absolute budget). `presses`: names, users' presses (`press_names`). `press_args` go to every press of the
    grid but `none`, those given as `press.key` to that press alone (`kvp.agents`). `protocol_args`: the
    protocol's argument by its option name (`config.protocol_by_option`).

    Each list may also be given as comma-separated text ("knorm,snapkv", "0.25,0.5"). A codec asked for a
    memory it cannot reach (2-bit codes still cost more than 10 %) is left out of the grid with a
    KvbenchWarning; `configs_for_run` refuses such a budget instead.
    """
    if sum(value is not None for value in (ratios, memory, budget)) != 1:
        raise BadInput("give exactly one of --ratios, --memory or --budget")
    names = press_names(presses)
    ratio_values = [parse_ratio(value) for value in split(ratios) if str(value).strip()]
    memory_values = [parse_memory(value) for value in split(memory) if str(value).strip()]
    budget_values = [parse_budget(value) for value in split(budget) if str(value).strip()]
    if not names or not (ratio_values or memory_values or budget_values):
        raise BadInput("--presses and --ratios (or --memory, or --budget) must each name at least one value")
    protocol_ = checked_protocol(protocol, **protocol_args)
    none = Config("none", 0.0, protocol=protocol_[0], protocol_args=protocol_[1], resolved=resolve("none"))
    configs = [none] + [
        config
        for name in names
        if name != "none"
        for config in budget_configs(
            name,
            ratio_values,
            memory_values,
            protocol_,
            press_args_for(name, press_args, names),
            budget_values,
        )
    ]
    if len(set(configs)) != len(configs):
        raise BadInput("duplicate configs: each press and ratio may appear once")
    return drop_unreachable_budgets(configs)


def split(values: Sequence | str | float | None) -> Sequence:
    """A list given as a sequence, as comma-separated text, or as one value (`sweep("knorm", 0.5)`)."""
    if values is None:
        return ()
    if isinstance(values, str):
        return values.split(",")
    if isinstance(values, numbers.Number):
        return [values]
    try:
        return list(values)
    except TypeError:  # not a list at all: refused by the parser of its values
        return [values]


def drop_unreachable_budgets(configs: list[Config]) -> list[Config]:
    """The configs but those of codecs at a memory they cannot reach, each said in a KvbenchWarning."""
    kept = []
    for config in configs:
        if press_of(config).spec.codec:
            try:
                config_press(config)
            except BadInput as error:
                message = f"skipped {config.press} at memory {config.memory}: {error}"
                warnings.warn(message, KvbenchWarning, stacklevel=3)
                continue
        kept.append(config)
    return kept


def check_configs(configs: list[Config], length: int | None = None) -> list:
    """Fail before any work if a press cannot run here, takes bad arguments, or does not fit its protocol;
    the presses, built (None for `none`). Configs given press arguments are also run on a tiny model at
    the context `length` (`check_press_args_run`): arguments that build a press but break its prefill (a
    zero window) fail here too; so are users' presses, with or without arguments. Imports the engine,
    so kvpress and torch: the checks of names, numbers and paths come before it."""
    from kvbench.engine import check_protocol

    presses = []
    for config in configs:
        press_of(config).check_runnable()
        presses.append(press_of(config).build(config.ratio, config.memory))  # none with arguments fails
        check_protocol(config, presses[-1])
    check_distinct_presses(configs, presses)
    tried = set()  # one trial per press, arguments and protocol: at its highest ratio, where presses break
    for config in sorted(configs, key=lambda config: -config.ratio):
        group = (config.press, config.press_args, config.protocol, config.protocol_args)
        # Presses that download per model cannot run on the trial model (and were refused if the hub is
        # unreachable): their arguments are left to the real run.
        resolved = press_of(config)
        tries = config.press_args or resolved.spec.source is not None
        if tries and group not in tried and "hub" not in resolved.spec.needs:
            tried.add(group)
            check_press_args_run(config, min(length or TRIAL_TOKENS, TRIAL_TOKENS))
    return presses


# The longest trial context: arguments that fail only past it (a window of 3000 tokens on a 1500-token
# context) are left to the real run; 2048 tokens keep the eager attention of the trial model under 70 MB.
TRIAL_TOKENS = 2048


def check_press_args_run(config: Config, tokens: int = TRIAL_TOKENS) -> None:
    """Refuse press arguments that build a press that then fails when it runs (window_size=0, a seed torch
    cannot take): the config is run on a tiny random-init model (`trial_run`). A failure is blamed on the
    arguments only when the same press runs there without them: some presses cannot run on a nameless random
    model at all (KVzip loads the model's tokenizer, learned presses their state for the model), and what
    the trial cannot judge is left to the real run."""
    where = f"a {tokens}-token prefill of a tiny model"
    try:
        trial_run(config, tokens)
    except Exception as error:
        try:
            trial_run(dataclasses.replace(config, press_args=()), tokens)
        except Exception as bare:
            if press_of(config).spec.source is None:
                return
            if isinstance(bare, KvbenchError):  # what the engine refuses of it, as the engine says it
                raise bare from None
            # A user's press that fails on its own: its bug, said before any model loads.
            raise BadInput(
                f"press {config.press!r} fails on {where}: {type(bare).__name__}: {first_line(bare)}"
            ) from None
        if isinstance(error, KvbenchError):
            raise error from None
        args = ", ".join(f"{key}={value!r}" for key, value in config.press_args)
        raise BadInput(f"press {config.press!r} fails with {args} on {where}: {first_line(error)}") from None


def trial_run(config: Config, tokens: int) -> None:
    """The config through the engine itself (`engine.evaluate_sample`: prefill, compression, decoding, as
    its protocol runs them) on a sample of `tokens` random words, with `trial_model`."""
    import random

    from kvbench import engine
    from kvbench.tasks.base import Sample

    model, tokenizer = trial_model()
    words = random.Random(0).choices(TRIAL_WORDS, k=tokens)
    sample = Sample("trial", "0", " ".join(words), "w1 w2 w3", "w5", ["w4"], 2, "string_match_all")
    if protocol_of(config).several_questions:
        count = dict(config.protocol_args)[protocol_of(config).option]
        sample.parts = [dataclasses.replace(sample, question=f"w{i} w2") for i in range(count)]
    engine.evaluate_sample(model, tokenizer, sample, [config], batch_configs=1)


TRIAL_WORDS = [f"w{i}" for i in range(60)]


@functools.cache
def trial_model():
    """(model, tokenizer) built in memory, nothing downloaded: a 1-layer Llama of random weights (seed 0),
    4 query heads over 2 KV heads of 8 dims, and a word-level tokenizer of TRIAL_WORDS (one token a word)
    with a chat template of its own."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {word: index for index, word in enumerate(specials + TRIAL_WORDS)}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    # Turns as words between <s> and </s>: what the multi-turn protocol feeds between a question and the next.
    turn = "<s> {{ m['content'] }} </s> "
    tokenizer.chat_template = (
        "{% for m in messages %}" + turn + "{% endfor %}{% if add_generation_prompt %}<s> {% endif %}"
    )
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    shape.update(num_key_value_heads=2, head_dim=8, vocab_size=len(vocab), eos_token_id=2)
    shape.update(max_position_embeddings=2 * TRIAL_TOKENS)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(**shape)).eval(), tokenizer


def check_learned_state(presses: list, model_name: str) -> None:
    """Fail before the model loads if a learned press (or a press it wraps) has no state for `model_name`
    or state made for another model: each such press checks its own files (`check_for_model`)."""
    import kvpress

    for press in filter(None, presses):
        if declared(press, "check_for_model"):
            press.check_for_model(model_name)
        check_learned_state([p for p in vars(press).values() if isinstance(p, kvpress.BasePress)], model_name)


def key_by_learned_state(model, configs: list[Config], presses: list) -> list[Config]:
    """The configs with `press_state` set: the digest of the learned state (KVP's agents, DistillCache's
    policy, MemDecay's calibration) each press loads for `model`. Rows are keyed by it, so retrained agents
    get new rows. Presses made for another model fail here, before any work."""
    for press in filter(None, presses):
        press.post_init_from_model(model)
    return [
        dataclasses.replace(config, press_state=press_of(config).state(press))
        for config, press in zip(configs, presses, strict=True)
    ]


@dataclass
class TaskPlan:
    """The tasks of a run after validation: the suite named (if any), task names, length, samples, and the
    tokenizer that sizes the samples."""

    suite: str | None
    tasks: list[str]
    length: int | None  # None: each task's default for the model (`task_lengths`)
    samples: int
    tokenizer: str | None = None  # None: the model's


def plan_tasks(
    suite: str | None = None,
    task_list: Sequence[str] = (),
    length: int | None = None,
    samples: int | None = None,
    data: Sequence[str] | str = (),
    metric: str | None = None,
    include_path: Sequence[str] | str = (),
    tokenizer: str | None = None,
) -> TaskPlan:
    """The suite's tasks (the default suite without tasks, data or suite), or the tasks named and the
    user's data files (`data`, scored by `metric`, default qa_f1; a `metric` given as code is also what a
    task YAML may name); the suite's length, samples and tokenizer
    unless given. `include_path`: folders whose task YAMLs are registered first (a suite given by its path
    includes its own folder). Checked against the registry and each task's minimum length."""
    tokenizer = str(tokenizer) if isinstance(tokenizer, Path) else tokenizer
    if tokenizer is not None and (not isinstance(tokenizer, str) or not tokenizer.strip()):
        raise BadInput(f"--tokenizer must name a tokenizer, got {tokenizer!r}")
    task_list = [task_list] if isinstance(task_list, str) else list(task_list)
    data = [str(path) for path in as_paths(data, "data")]
    given_metric = metric is not None
    metric = tasks.resolve_metric(metric) if given_metric else "qa_f1"  # `--metric ''` names none
    for folder in as_paths(include_path, "include_path"):
        tasks.include_path(folder)
    task_list += [tasks.register_data_task(tasks.jsonl.data_task(path, metric)) for path in data]
    suite_spec = None
    if suite or not task_list:
        name = suite or DEFAULT_SUITE
        if not tasks.is_suite_path(name) and name not in tasks.suite_names():
            raise tasks.unknown_suite(name)
        suite_spec = tasks.load_suite(name)
    names = list(task_list) or suite_spec.tasks
    for name in names:
        if name not in tasks.task_names():
            raise tasks.unknown_task(name)
    scored_by = {tasks.jsonl.DATA_TASKS[name].metric for name in names if name in tasks.jsonl.DATA_TASKS}
    if given_metric and metric not in scored_by:
        raise BadInput(
            f"--metric {metric} scores no task of the run: it applies to --data files, and allows the code "
            "a task YAML names as its metric"
        )
    length = parse_int(length, "--length", 1) if length is not None else None
    length = length if length is not None else (suite_spec.length if suite_spec else None)
    samples = samples if samples is not None else (suite_spec.samples if suite_spec else 5)
    samples = parse_int(samples, "--samples", 1)
    for name in names:
        minimum = tasks.family_of(name).min_length(name)
        if length is not None and length < minimum:
            raise BadInput(f"--length {length} is below the minimum of task {name!r} ({minimum})")
    tokenizer = tokenizer if tokenizer is not None else (suite_spec.tokenizer if suite_spec else None)
    return TaskPlan(suite_spec.name if suite_spec else None, names, length, samples, tokenizer)


def task_lengths(names: list[str], length: int | None, limit: int | None, model: str) -> dict[str, int]:
    """Each task's context length, checked against the model's context (`limit`) before any work: the
    one asked for; without one, LongBench's official per-model limit (the user's data too) and RULER's
    1024."""
    lengths = {}
    for name in names:
        if length is not None:
            lengths[name] = length
        elif name in tasks.longbench.TASKS or name in tasks.jsonl.DATA_TASKS:
            if limit is None:
                raise BadInput(f"give --length: the context length of model {model!r} is unknown")
            lengths[name] = tasks.longbench.official_length(limit)
        else:
            lengths[name] = DEFAULT_LENGTH
        minimum = tasks.family_of(name).min_length(name)
        if lengths[name] < minimum:
            raise BadInput(
                f"length {lengths[name]} is below the minimum of task {name!r} ({minimum})"
                + ("" if length is not None else f", from the {limit}-token context of model {model!r}")
            )
        if limit is not None and lengths[name] > limit:
            raise BadInput(f"--length {lengths[name]} exceeds the {limit}-token context of model {model!r}")
    return lengths
