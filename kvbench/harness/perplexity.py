"""Live-cache perplexity: long texts teacher-forced through the model with each config's KV cache held at its
budget throughout, as StreamingLLM's `eval_long_ppl` and the sigmoid-gated eviction study measure it and as
KVP's paper plots it against the absolute cache size. The library behind `kvbench perplexity`.

The protocol. A text is fed `every` tokens at a time (1: token by token, StreamingLLM's own scheme) to all
configs as one batch (`decoder.BatchedDecoder`, as the streaming protocol feeds its chunks). After each
chunk, each config's press compresses its cache back to its budget: kvpress's DecodingPress around the press,
one compression per chunk, its buffer of hidden states the last chunk's (so SnapKV-like scorers look at the
last chunk's queries). A token thus attends to the budget plus the tokens of its chunk up to itself: with
`every` 1, to exactly budget + 1 entries. The first chunk is compressed like the others (DecodingPress leaves
a forward over an empty cache alone, as a prefill; one masked entry ahead of the text makes it a step like
the rest). Keys keep their own positions, as everywhere in kvpress (StreamingLLM's paper re-rotates them to
their place in the cache; kvpress's KeyRerotationPress would, and cannot compress while decoding). Each fed
token's logits give the negative log-likelihood (NLL) of the next token: L - 1 predictions for L tokens.

Budgets mean what they mean in the rest of kvbench (`engine.budget_entries`, `target_entries`): `budget` N
keeps N entries per head and layer (all of them until N tokens were fed); a `ratio` keeps int(n x (1 - ratio))
of the n tokens fed so far, so its budget grows with the text read (a prefill of what was seen would keep as
much); a `memory` m is a byte budget, m of the whole text's 16-bit cache, held from the start (nothing is
compressed until the text reaches it): an evictor keeps int(L x m) entries, a codec stores that many 16-bit
entries' bytes. A memory does not grow as a ratio does because a codec cannot store a few tokens in a
fraction of their bytes (QEvict's sinks and local window stay at 16 bits). `none` is the full cache: the
model's NLL over the whole text.

Rows (one per config and text): protocol "perplexity", protocol_args {"every": N}, `score` None, `nll` the
mean NLL per predicted token (perplexity = exp(nll)), and `meta` {"span": S, "span_nll": [...]}: the mean
NLL of each run of S predicted tokens (span k: the tokens at positions kS+1 .. (k+1)S; the first token is
never predicted), for NLL against position. kv_kept and kv_bytes are the cache at the end of the text (the
budget it was held at), against the whole text's; prefill_s is the config's share of the batch's wall time.
A row's key is its config, its text's source (the row's task), length, seed, id and content hash (the token
ids): a rerun computes only the rows the results folder lacks.

Texts (`SOURCES`, or local files): prose (paragraphs of the Python language reference, from a seeded start,
wrapping around), code (the standard library's source, likewise), agent (generated agent traces,
kvbench.tasks.agent, rendered with the chat template, each token's region given to region-aware presses);
`data_dir`: .txt files (a text each) and .jsonl files (a {"text": ...} object a line) in name order, texts
shorter than `length` tokens skipped (e.g. PG-19 books, or OASST2 conversations joined into long texts). A
text is its first `length` tokens, tokenised with the tokenizer's special tokens (a BOS where the model
prepends one).
"""

import dataclasses
import hashlib
import json
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.bridge import models
from kvbench.core import provenance
from kvbench.core.config import Config, budget_label
from kvbench.core.errors import BadInput, DataFileError, KvbenchWarning
from kvbench.core.validation import MAX_COUNT, jsonl_lines, parse_json, read_text
from kvbench.harness.evaluation import run_evaluator
from kvbench.harness.planning import (
    budget_configs,
    check_learned_state,
    drop_unreachable_budgets,
    key_by_learned_state,
    parse_budget,
    parse_memory,
    parse_ratio,
    split,
)
from kvbench.presses import config_press, press_of, resolve_press
from kvbench.store.results import ResultsStore, Row, check_writable, config_id_of

PROTOCOL = "perplexity"
SOURCES = ("prose", "code", "agent")
DEFAULT_SOURCE = "prose"
DEFAULT_EVERY = 16  # 1 is StreamingLLM's scheme: a forward per token, for every config of the batch
DEFAULT_SPAN = 128
DEFAULT_LENGTH = 2048
DEFAULT_TEXTS = 4
AGENT_TASK = "agent_tool_value"  # its traces; the question it asks is not fed
AGENT_MARGIN = 256  # tokens a trace is generated beyond `length`: its question and answer are cut off
TEXT_SUFFIXES = (".txt", ".jsonl")


@dataclass(frozen=True)
class Text:
    """One text to read: its source (the rows' task), id, token ids and, for chat traces, each token's
    region (an index in tasks.prompt.REGIONS)."""

    source: str
    id: str
    ids: tuple[int, ...]
    regions: tuple[int, ...] | None = None

    def content_hash(self) -> str:
        content = json.dumps({"ids": self.ids, "regions": self.regions})
        return hashlib.sha1(content.encode()).hexdigest()[:12]


@dataclass
class PerplexityPlan:
    """Every config on every text, and how the texts are read and recorded."""

    configs: list[Config]
    texts: list[Text]
    length: int
    every: int
    span: int
    seed: int = 0
    sources: list[str] = dataclasses.field(default_factory=list)
    data_dir: Path | None = None
    batch_configs: int = 16
    force: bool = False
    model: str = models.EMBEDDED
    device: str = "cpu"
    dtype: str = "float32"
    out: Path = Path("results")


# ---- Configs ----


def perplexity_configs(
    presses: Sequence[str] | str,
    ratios: Sequence[float | str] | str | None = None,
    memory: Sequence[float | str] | str | None = None,
    budgets: Sequence[int | str] | str | None = None,
    every: int = DEFAULT_EVERY,
    press_args: dict | None = None,
) -> list[Config]:
    """No compression, then every press at every ratio, memory or absolute budget (exactly one kind), each
    compressed every `every` tokens. Lists may be comma-separated text, as for `kvbench sweep`."""
    if sum(value is not None for value in (ratios, memory, budgets)) != 1:
        raise BadInput("give one of --ratios, --memory or --budget")
    if not isinstance(every, int) or every < 1:
        raise BadInput(f"--every must be a whole number of at least 1, got {every}")
    names = [resolve_press(name.strip()) for name in split(presses) if name.strip()]  # file.py:Class too
    ratio_values = [parse_ratio(value) for value in split(ratios) if str(value).strip()]
    memory_values = [parse_memory(value) for value in split(memory) if str(value).strip()]
    budget_values = [parse_budget(value) for value in split(budgets) if str(value).strip()]
    if not names or not (ratio_values or memory_values or budget_values):
        raise BadInput("--presses and --ratios (or --memory, --budget) must each name at least one value")
    protocol_args = (("every", every),)
    args = tuple(sorted((press_args or {}).items()))
    configs = [Config("none", 0.0, protocol=PROTOCOL, protocol_args=protocol_args)]
    configs += [
        config
        for name in names
        if name != "none"
        for config in budget_configs(
            name, ratio_values, memory_values, (PROTOCOL, protocol_args), args, budget_values
        )
    ]
    if len(set(configs)) != len(configs):
        raise BadInput("duplicate configs: each press and budget may appear once")
    return drop_unreachable_budgets(configs)


def check_presses(configs: list[Config]) -> list:
    """Fail before any work if a press cannot run here, takes bad arguments, cannot compress a growing
    cache, or scores with the queries of a window longer than a chunk (`engine.checks`); the
    presses, built (None for `none`). The engine (torch, kvpress: 15-20 s to import) comes in here."""
    from kvbench.engine import check_compresses_live

    presses = []
    for config in configs:
        press_of(config).check_runnable()
        presses.append(press_of(config).build(config.ratio, config.memory))  # none with arguments fails
        check_compresses_live(config, presses[-1])
    return presses


# ---- Texts ----


def check_sources(sources: Sequence[str] | str | None, data_dir: Path | None) -> list[str]:
    """The generated sources asked for: `sources`, else prose unless local files are given; `data_dir`
    must be a folder holding .txt or .jsonl files."""
    names = [name.strip() for name in split(sources) if name.strip()]
    if sources is not None and not names:
        raise BadInput("--source must name at least one of " + ", ".join(SOURCES))
    for name in names:
        if name not in SOURCES:
            raise BadInput(f"unknown text source {name!r} (one of {', '.join(SOURCES)}, or --data-dir)")
    if len(set(names)) != len(names):
        raise BadInput("--source names a source twice")
    if data_dir is not None:
        if not data_dir.is_dir():
            raise BadInput(f"--data-dir {str(data_dir)!r} is not a folder")
        if not local_files(data_dir):
            raise BadInput(f"--data-dir {str(data_dir)!r} holds no .txt or .jsonl file")
    return names if sources is not None or data_dir is not None else [DEFAULT_SOURCE]


def local_files(data_dir: Path) -> list[Path]:
    return sorted(path for path in data_dir.iterdir() if path.is_file() and path.suffix in TEXT_SUFFIXES)


def local_texts(data_dir: Path) -> Iterator[tuple[str, str]]:
    """(id, text) of every non-blank text of the folder's files, read lazily: a .txt file is one text (id:
    its name), a .jsonl line one {"text": ...} object (id: name:line)."""
    for path in local_files(data_dir):
        try:
            content = read_text(path, DataFileError)
        except (OSError, UnicodeDecodeError) as error:
            raise DataFileError(f"{path}: cannot read it as UTF-8 text ({error})") from None
        if path.suffix == ".txt":
            if content.strip():
                yield path.name, content
            continue
        for number, line in enumerate(jsonl_lines(content), start=1):
            if not line.strip():
                continue
            try:
                record, reason = parse_json(line), ""
            except ValueError as error:
                record, reason = None, f" ({str(error).splitlines()[0]})"
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataFileError(f'{path}:{number}: not a JSON object with a "text" string{reason}')
            if record["text"].strip():
                yield f"{path.name}:{number}", record["text"]


def tokenize(tokenizer, text: str) -> list[int]:
    return tokenizer(text, verbose=False).input_ids  # (no warning for texts past the model's length)


def texts_from_files(tokenizer, data_dir: Path, count: int, length: int) -> list[Text]:
    """The first `count` texts of the folder with `length` tokens or more, cut to `length`."""
    source = data_dir.resolve().name
    found, short, longest = [], 0, 0
    for text_id, content in local_texts(data_dir):
        ids = tokenize(tokenizer, content[: 16 * length])  # a token rarely spans 16 characters
        if len(ids) < length and len(content) > 16 * length:
            ids = tokenize(tokenizer, content)
        if len(ids) < length:
            short, longest = short + 1, max(longest, len(ids))
            continue
        found.append(Text(source, text_id, tuple(ids[:length])))
        if len(found) == count:
            break
    if not found:
        if not short:
            raise BadInput(f"--data-dir {str(data_dir)!r} holds no text")
        raise BadInput(
            f"no text in --data-dir {str(data_dir)!r} has --length {length} tokens "
            f"(the longest has {longest})"
        )
    if short:
        warnings.warn(
            f"skipped {short} texts shorter than {length} tokens in {data_dir}", KvbenchWarning, stacklevel=2
        )
    if len(found) < count:
        warnings.warn(
            f"{data_dir} holds {len(found)} texts of {length} tokens, not {count}",
            KvbenchWarning,
            stacklevel=2,
        )
    return found


def text_of_units(
    tokenizer, source: str, text_id: str, units: Sequence[str], start: int, separator: str, length: int
) -> Text:
    """`units` joined from `start` on (wrapping around) until they make `length` tokens."""
    count = 8
    while True:
        content = separator.join(units[(start + k) % len(units)] for k in range(count))
        ids = tokenize(tokenizer, content)
        if len(ids) >= length:
            return Text(source, text_id, tuple(ids[:length]))
        count *= 2


def generated_texts(tokenizer, source: str, count: int, length: int, seed: int) -> list[Text]:
    """`count` texts of `length` tokens from a generated source; text k starts where (source, seed, k)
    draws."""
    from kvbench.tasks import agent, generated
    from kvbench.tasks.prompt import tokenize_sample

    if source == "agent":
        samples = agent.make_samples(
            AGENT_TASK, max(agent.MIN_LENGTH, length + AGENT_MARGIN), count, seed, tokenizer, None
        )
        texts = []
        for k, sample in enumerate(samples):
            prompt = tokenize_sample(tokenizer, sample)
            ids, regions = prompt.context_ids[0, :length].tolist(), prompt.regions[:length].tolist()
            assert len(ids) == length, "an agent trace generated shorter than asked"
            texts.append(Text(source, f"{seed}-{k}", tuple(ids), tuple(regions)))
        return texts
    units, separator = (
        (generated.paragraphs(), "\n\n") if source == "prose" else (generated.code_lines(), "\n")
    )
    return [
        text_of_units(
            tokenizer,
            source,
            f"{seed}-{k}",
            units,
            random.Random(f"{source}/{seed}/{k}").randrange(len(units)),
            separator,
            length,
        )
        for k in range(count)
    ]


# ---- Planning and running ----


def prepare_plan(
    configs: list[Config],
    *,
    sources: Sequence[str] | str | None = None,
    data_dir: Path | str | None = None,
    texts: int = DEFAULT_TEXTS,
    length: int = DEFAULT_LENGTH,
    span: int = DEFAULT_SPAN,
    seed: int = 0,
    out: Path | str = "results",
    force: bool = False,
    batch_configs: int = 16,
    model: str = models.EMBEDDED,
    device: str = "cpu",
    dtype: str = "float32",
):
    """(plan, model): every value checked before the model loads (numbers, sources and files, the results
    folder, the device, the length against the model's context, then the presses, whose checks import
    torch), then the texts made with the model's tokenizer, then the model loaded and the configs keyed by
    their presses' learned state."""
    for name, value, least in (("--texts", texts, 1), ("--length", length, 2), ("--span", span, 1)):
        if not isinstance(value, int) or value < least:
            raise BadInput(f"{name} must be a whole number of at least {least}, got {value}")
    if texts > MAX_COUNT:  # texts are made one by one: 10**20 of them would run until killed
        raise BadInput(f"--texts must be at most {MAX_COUNT}, got {texts}")
    if batch_configs < 1:
        raise BadInput(f"--batch-configs must be at least 1, got {batch_configs}")
    if dtype not in models.DTYPES:
        raise BadInput(f"unknown dtype {dtype!r}: choose one of {', '.join(models.DTYPES)}")
    every = dict(configs[0].protocol_args)["every"]
    held = every * ((length - 1) // every)  # the cache before the last chunk: what later predictions read
    if held == 0:
        raise BadInput(
            f"--every {every} feeds the {length}-token texts in one chunk: no token would be predicted from "
            "a compressed cache (give --every below --length)"
        )
    for config in configs:
        if config.budget is not None and config.budget >= held:
            raise BadInput(
                f"budget {config.budget}: at --length {length} and --every {every} the cache holds at most "
                f"{held} entries before a prediction, so nothing would be evicted"
            )
    data_dir = Path(data_dir) if data_dir is not None else None
    names = check_sources(sources, data_dir)
    check_writable(Path(out))
    models.check_device(device)
    models.resolve(model)
    limit = models.context_limit(model)
    if limit is not None and length > limit:
        raise BadInput(f"--length {length} exceeds the {limit}-token context of model {model!r}")
    presses = check_presses(configs)
    check_learned_state(presses, model)
    tokenizer = models.load_tokenizer(model)
    made = [text for name in names for text in generated_texts(tokenizer, name, texts, length, seed)]
    if data_dir is not None:
        made += texts_from_files(tokenizer, data_dir, texts, length)
    llm, _ = models.load_model(model, device=device, dtype=dtype)
    plan = PerplexityPlan(
        configs=key_by_learned_state(llm, configs, presses),
        texts=made,
        length=length,
        every=dict(configs[0].protocol_args)["every"],
        span=span,
        seed=seed,
        sources=names,
        data_dir=data_dir,
        batch_configs=batch_configs,
        force=force,
        model=model,
        device=device,
        dtype=dtype,
        out=Path(out),
    )
    return plan, llm


def perplexity(
    presses: Sequence[str] | str,
    ratios: Sequence[float | str] | str | None = None,
    *,
    memory: Sequence[float | str] | str | None = None,
    budgets: Sequence[int | str] | str | None = None,
    every: int = DEFAULT_EVERY,
    press_args: dict | None = None,
    progress: bool = True,
    **setup,
):
    """The perplexity of every text under no compression and every press at every ratio, memory or budget,
    each config's cache compressed back to its budget every `every` tokens; the rows of this run (computed
    now, or found in `out`). `setup`: the keywords of `prepare_plan` (sources, data_dir, texts, length,
    span, seed, out, force, batch_configs, model, device, dtype)."""
    configs = perplexity_configs(presses, ratios, memory, budgets, every, press_args)
    plan, model = prepare_plan(configs, **setup)
    with ResultsStore(plan.out) as store:
        return run_plan(model, plan, store, progress)


def text_rows(plan: PerplexityPlan, text: Text, configs: Sequence[Config] | None = None) -> list[Row]:
    """The rows of one text before measuring, one per config (default: the plan's)."""
    return [
        Row(
            config_id=config_id_of(plan.model, config),
            model=plan.model,
            press=config.press,
            ratio=config.ratio,
            task=text.source,
            length=plan.length,
            seed=plan.seed,
            sample_id=text.id,
            press_args=dict(config.press_args),
            press_state=config.press_state,
            memory=config.memory,
            budget=config.budget,
            protocol=config.protocol,
            protocol_args=dict(config.protocol_args),
            content_hash=text.content_hash(),
        )
        for config in (plan.configs if configs is None else configs)
    ]


def run_plan(model, plan: PerplexityPlan, store: ResultsStore, progress: bool = True):
    """Measure what `store` lacks, text by text, `batch_configs` configs at a time, appending each row once
    measured; all rows of this plan (`evaluation.run_evaluator`, with `PerplexityEvaluator`)."""
    return run_evaluator(PerplexityEvaluator(model, plan), store, progress)


@dataclass(frozen=True)
class TextUnit:
    """One text under some of the plan's configs."""

    text: Text
    configs: tuple[Config, ...]


@dataclass
class PerplexityEvaluator:
    """Live-cache perplexity (`evaluation.Evaluator`): a unit is one text read under some configs, each
    config's cache compressed back to its budget every `every` tokens; a row holds its NLLs."""

    model: object
    plan: PerplexityPlan
    all_at_once = False

    @property
    def force(self) -> bool:
        return self.plan.force

    def units(self) -> list[TextUnit]:
        return [TextUnit(text, tuple(self.plan.configs)) for text in self.plan.texts]

    def unit_rows(self, unit: TextUnit) -> list[Row]:
        return text_rows(self.plan, unit.text, unit.configs)

    def claimed_part(self, unit: TextUnit, claimed: set[tuple]) -> TextUnit | None:
        rows = self.unit_rows(unit)
        configs = tuple(c for c, row in zip(unit.configs, rows, strict=True) if row.key in claimed)
        return TextUnit(unit.text, configs) if configs else None

    def evaluate(self, units: list[TextUnit]) -> Iterator[list[Row]]:
        """Each unit's rows, its configs measured `batch_configs` at a time."""
        step = self.plan.batch_configs
        for unit in units:
            rows = []
            for start in range(0, len(unit.configs), step):
                configs = list(unit.configs[start : start + step])
                measured = evaluate_text(self.model, unit.text, configs, self.plan.every, self.plan.span)
                rows += [
                    dataclasses.replace(row, **result)
                    for row, result in zip(text_rows(self.plan, unit.text, configs), measured, strict=True)
                ]
            yield rows

    def run_record(self, frame, started: str) -> dict:
        return run_record(self.plan, frame, started)


def target_entries(config: Config, fed: int, length: int) -> int:
    """The entries per head a config's cache is compressed back to once `fed` tokens of a text of `length`
    were read: a ratio's share of what was read, a memory's or a budget's of the whole text (at most what
    was read)."""
    from kvbench.engine.steps import budget_entries

    if config.memory is None and config.budget is None:
        return budget_entries(config, fed)
    return min(budget_entries(config, length), fed)


def evaluate_text(
    model,
    text: Text,
    configs: list[Config],
    every: int,
    span: int,
) -> list[dict]:
    """Read `text` under every config as one batch; one dict of Row fields per config, in order: nll, meta
    (span, span_nll), the kept entries and bytes at the end, prefill_s."""
    import torch
    import torch.nn.functional as F

    from kvbench.bridge.adapter import clock, empty_batch, seed_press
    from kvbench.engine.decoder import BatchedDecoder
    from kvbench.engine.steps import Run, attention_rows, budget_entries, kv_counts, stepwise_presses
    from kvbench.tasks.prompt import Prompt

    ids = torch.tensor([text.ids], device=model.device)
    length = ids.shape[1]
    regions = None if text.regions is None else torch.tensor(text.regions)
    prompt = Prompt(ids, ids[:, :0], regions)
    # Rows of one budget next to each other: the batched attention serves rows of equal padding in one call.
    order = sorted(range(len(configs)), key=lambda index: -budget_entries(configs[index], length))
    runs = [
        Run(
            config,
            seed_press(config_press(config), f"{text.source}/{text.id}/{config!r}"),
            press_of(config).needs_eager,
            prompt,
        )
        for config in (configs[index] for index in order)
    ]
    presses = stepwise_presses(model, runs, prompt, length)
    with torch.no_grad():
        # One masked entry ahead of the text, so that DecodingPress takes the first chunk for a step too.
        cache = empty_batch(model, len(runs), length + 1, held=1)
        masks = torch.zeros(len(cache.layers), len(runs), 1, dtype=torch.bool, device=model.device)
        decoder = BatchedDecoder(model, cache, masks, presses, attention_rows(runs, presses))
        nll = torch.empty(len(runs), length - 1, dtype=torch.float64, device=model.device)
        start = clock(model)
        with decoder.attending():
            for position in range(0, length, every):
                chunk = ids[:, position : position + every]
                seen = position + chunk.shape[1]
                for row, press in presses.items():
                    press.target_size = target_entries(runs[row].config, seen, length)
                logits = decoder.feed(chunk, position, every_position=True)
                targets = ids[0, position + 1 : seen + 1]
                predicted = logits[:, : len(targets)].flatten(0, 1)
                losses = F.cross_entropy(
                    predicted.to(torch.promote_types(predicted.dtype, torch.float32)),
                    targets.repeat(len(runs)),
                    reduction="none",
                )
                nll[:, position : position + len(targets)] = losses.view(len(runs), -1)
        seconds = (clock(model) - start) / len(runs)
        kept = decoder.real_entries().sum(0) * model.config.get_text_config().num_key_value_heads
    spans = torch.arange(length - 1, device=model.device) // span  # span k: the tokens kS+1 .. (k+1)S
    span_sums = torch.zeros(len(runs), int(spans[-1]) + 1, dtype=torch.float64, device=model.device)
    span_nll = span_sums.index_add_(1, spans, nll) / torch.bincount(spans)
    results = [
        {
            "nll": float(nll[row].mean()),
            "meta": {"span": span, "span_nll": span_nll[row].tolist()},
            **kv_counts(model, length, (int(kept[row]), None), run.press),
            "prefill_s": seconds,
        }
        for row, run in enumerate(runs)
    ]
    in_order = [{}] * len(configs)
    for row, index in enumerate(order):
        in_order[index] = results[row]
    return in_order


# ---- Summaries ----


def summarize(frame):
    """Perplexity (exp of the mean NLL over texts) per task (columns) for each (press, budget)."""
    import numpy as np
    import pandas as pd

    if frame.empty:
        return pd.DataFrame()
    labels = [
        budget_label(r, m, b)
        for r, m, b in zip(frame["ratio"], frame["memory"], frame["budget"], strict=True)
    ]
    table = frame.assign(budget_label=labels).pivot_table(
        index=["press", "budget_label"], columns="task", values="nll", aggfunc="mean", sort=False
    )
    return np.exp(table)


def run_record(plan: PerplexityPlan, frame, started: str) -> dict:
    """The run's full config, versions and commit; with `frame`, its perplexities and finish time too."""
    config = {
        "model": plan.model,
        "configs": [config.as_record() for config in plan.configs],
        "protocol": PROTOCOL,
        "protocol_args": {"every": plan.every},
        "tasks": sorted({text.source for text in plan.texts}),
        "sources": plan.sources,
        "data_dir": str(plan.data_dir) if plan.data_dir else None,
        "texts": [text.id for text in plan.texts],
        "length": plan.length,
        "span": plan.span,
        "seed": plan.seed,
        "device": plan.device,
        "dtype": plan.dtype,
    }
    table = summarize(frame) if frame is not None else None
    summary = (
        {
            f"{press}@{label}": {task: round(float(value), 3) for task, value in values.items()}
            for (press, label), values in table.iterrows()
        }
        if table is not None and not table.empty
        else {}
    )
    return provenance.run_record(config, summary, plan.device, started, finished=frame is not None)
