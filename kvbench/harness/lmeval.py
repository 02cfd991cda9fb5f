"""lm-eval bridge: the `kvbench` model type, lm-eval runs into the results store, and `kvbench lm-eval`.

Importing this module registers the model type `kvbench` with lm-eval (`lm-eval-kvbench`, kvbench/
lm_eval_cli.py, is lm-eval's own command line with it registered):

    lm_eval.simple_evaluate(model="kvbench", model_args={"pretrained": "smollm2-135m", "press": "snapkv",
                            "compression_ratio": 0.5}, tasks=[...], apply_chat_template=True)

Every request runs under the press: the compressed part of the prompt is prefilled and compressed, the rest
is fed on top of the compressed cache with positions continuing from the uncompressed length. Which part is
compressed is the protocol, recorded in each row and in lm-eval's results config (`protocols`):

- query-agnostic, as `kvbench run`: the prompt is split where its question starts. That is where a doc's
  `kvbench_question` field says (our task YAMLs in tasks/lm_eval), or for lm-eval's own RULER tasks, whose
  prompts are RULER's templates, where RULER's question text starts (kvbench.tasks.ruler.TEMPLATES).
- query-aware, for every other prompt: there is no telling where its question starts, so everything but
  its last token is compressed, the question included. Loglikelihood requests too: the context but its last
  token is compressed, then the last token and the continuation are scored against the compressed cache.
  (A single forward over context + continuation would not feel the press: kvpress compresses only after
  each layer has attended to the full cache.)

Decoding is the engine's (greedy, stops at EOS, then `until` cuts).
"""

import contextlib
import hashlib
import json
import logging
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from kvpress import DecodingPress
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm.auto import tqdm
from transformers import DynamicCache

from kvbench.bridge.adapter import (
    clear_head_masks,
    is_shareable,
    language_model,
    masked_entries,
    moves_positions,
    seed_press,
)
from kvbench.bridge.models import EMBEDDED, cache_dir, load_model, load_tokenizer, model_name
from kvbench.core import provenance
from kvbench.core.config import Config
from kvbench.core.errors import BadInput, UnknownTask
from kvbench.core.resources import lm_eval_tasks_dir
from kvbench.engine.steps import Run, answer_question, cache_entries, kv_counts, prefill_shared, run_alone
from kvbench.harness.planning import check_configs, check_learned_state, check_uncompressed, parse_ratio
from kvbench.presses import config_press, resolve, resolve_press
from kvbench.store.results import ResultsStore, Row, config_id
from kvbench.tasks import ruler
from kvbench.tasks.prompt import Prompt

QUESTION_FIELD = "kvbench_question"  # doc field: the question text, where the uncompressed part starts
TASKS_DIR = lm_eval_tasks_dir()
SPLIT_AT_QUESTION, WHOLE_PROMPT = "query-agnostic", "query-aware"  # the protocols, as rows record them
# lm-eval's own RULER tasks and the RULER template family each prompt comes from.
LM_EVAL_RULER = {
    **{name: "niah" for name in ruler.NIAH},
    "ruler_vt": "vt",
    "ruler_cwe": "cwe",
    "ruler_fwe": "fwe",
    "ruler_qa_squad": "qa",
    "ruler_qa_hotpot": "qa",
}
ROW_STATS = ("context_tokens", "kv_kept", "kv_total", "kv_bytes", "kv_bytes_full", "prefill_s", "decode_s")


@register_model("kvbench")
class KVBenchLM(HFLM):
    """lm-eval's HF model with every request answered under a kvpress press; one request at a time.

    From lm-eval's command line every argument comes in `--model_args`: `pretrained` (embedded alias, hub id
    or folder), `tokenizer` (another tokenizer's name or folder, as for lm-eval's `hf` model; lm-eval's RULER
    tasks size their samples with it too), `press`, `compression_ratio`, and any other key is an argument
    of the press, e.g. `press=snapkv,compression_ratio=0.5,window_size=32`. A `device` this machine lacks
    (lm-eval's default is cuda:0) falls back to the CPU, as lm-eval's `hf` model does.
    """

    def __init__(
        self,
        pretrained: str = EMBEDDED,
        press: str | None = "none",
        compression_ratio: float = 0.0,
        press_args: dict | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int | str = 1,
        max_batch_size: int | None = None,  # lm-eval passes it to every model; we never batch
        max_length: int | None = None,
        tokenizer: str | None = None,
        **more_press_args,
    ):
        if str(batch_size) != "1":
            raise BadInput(
                f"the kvbench model answers one request at a time: batch_size must be 1, not {batch_size}"
            )
        # lm-eval's parser reads press=none as None; a user's press may be given by its target (file.py:Class)
        self.press_name = "none" if press is None else resolve_press(press)
        self.compression_ratio = parse_ratio(compression_ratio)
        check_uncompressed(self.press_name, self.compression_ratio, "compression_ratio")
        self.press_args = {**(press_args or {}), **more_press_args}
        # Presses that score with attention weights get an eager model, as `kvbench run` gives them.
        self.resolved = resolve(self.press_name, self.press_args)  # the press, resolved once
        self.eager = self.resolved.needs_eager
        check_configs([self.new_run().config])  # unknown press or bad arguments fail before the model loads
        probe = self.new_run().press
        check_learned_state([probe], pretrained)  # so do agents missing or made for another model
        model, model_tokenizer = load_model(
            pretrained,
            device=available_device(device),
            dtype=dtype,
            attn_implementation="eager" if self.eager else None,
        )
        if tokenizer is not None:
            model_tokenizer = load_tokenizer(tokenizer)
        super().__init__(pretrained=model, tokenizer=model_tokenizer, batch_size=1, max_length=max_length)
        if probe is not None:
            probe.post_init_from_model(model)  # e.g. KVP agents made for another model fail here
        self.press_state = self.resolved.state(probe)  # a user's files' digest too
        self.stats: dict[tuple[str, int], dict] = {}  # (task, doc_id) -> measurements of its requests
        self.protocols: dict[str, str] = {}  # task -> the protocol its requests ran under

    def new_run(self, prompt: Prompt | None = None) -> Run:
        """A fresh press per request, as `kvbench run` builds one per sample (stateful presses start over)."""
        args = tuple(sorted(self.press_args.items()))
        config = Config(self.press_name, self.compression_ratio, args, resolved=self.resolved)
        return Run(config, seed_press(config_press(config), f"lm-eval/{config!r}"), self.eager, prompt)

    @property
    def run_config(self) -> dict:
        """model, press, ratio, press_args, press_state: what identifies this model's results (and its
        request cache)."""
        return {
            "model": model_name(self.model),
            "press": self.press_name,
            "ratio": self.compression_ratio,
            "press_args": self.press_args,
            "press_state": self.press_state,
        }

    def get_model_info(self) -> dict:
        # lm-eval asks once every request has run; HFLM's version asks the hub for a commit hash.
        return {**self.run_config, "protocols": dict(sorted(self.protocols.items()))}

    def record(self, request, measurements: dict, protocol: str) -> None:
        """Keep a request's measurements under its doc: times add up over the doc's requests, KV counts are
        the first request's (later ones may be unconditional, e.g. for acc_mutual_info)."""
        self.protocols[request.task_name] = protocol
        stats = self.stats.setdefault((request.task_name, request.doc_id), {})
        for key in ROW_STATS:
            if key in measurements:
                if key.endswith("_s"):
                    stats[key] = stats.get(key, 0.0) + measurements[key]
                else:
                    stats.setdefault(key, measurements[key])

    # ---- generate_until ----

    def split_prompt(self, text: str, task: str, doc: dict | None) -> tuple[Prompt, str]:
        """Context (compressed) and question (fed after) token ids of a generation prompt, and the protocol
        that split gives."""
        cut = question_start(text, task, doc)
        if cut is not None:
            # Tokenized apart and without special tokens, as the engine tokenizes a sample.
            context_ids = self.tokenizer.encode(text[:cut], add_special_tokens=False)
            question_ids = self.tokenizer.encode(text[cut:], add_special_tokens=False)
            protocol = SPLIT_AT_QUESTION
        else:
            ids = self.tok_encode(text)
            context_ids, question_ids, protocol = ids[:-1], ids[-1:], WHOLE_PROMPT
        return Prompt(torch.tensor([context_ids]), torch.tensor([question_ids])), protocol

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        answers = []
        for request in tqdm(requests, desc="kvbench generate_until", disable=disable_tqdm):
            text, gen_kwargs = request.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            if kwargs["do_sample"]:
                raise BadInput("the kvbench model decodes greedily; this task asks for sampling (do_sample)")
            prompt, protocol = self.split_prompt(text, request.task_name, request.doc)
            result = generate(self.model, self.new_run(prompt), kwargs["max_gen_toks"])
            # The engine stops at EOS only; other stop strings cut the text afterwards.
            answer = self.tok_decode(result.pop("tokens"))
            answers.append(
                postprocess_generated_text(answer, handle_stop_sequences(kwargs["until"], None), None)
            )
            self.record(request, result, protocol)
        return answers

    # ---- loglikelihood ----

    def encode_request(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation ids exactly as lm-eval's HF model encodes them."""
        if context:
            return self._encode_pair(context, continuation)
        continuation_ids = self.tok_encode(continuation, add_special_tokens=False)
        if continuation_ids[0] == self.prefix_token_id:
            return continuation_ids[:1], continuation_ids[1:]
        return [self.prefix_token_id], continuation_ids

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results, state = [], None
        for request in tqdm(requests, desc="kvbench loglikelihood", disable=disable_tqdm):
            context_ids, continuation_ids = self.encode_request(*request.args)
            # Choices of a multiple-choice doc come one after the other: one prefill serves them all.
            if state is None or state.context_ids != context_ids:
                if state is not None:
                    state.close()
                state = CompressedContext(self.model, self.new_run().press, context_ids)
            start = time.perf_counter()
            results.append(state.score(continuation_ids))
            measurements = {**state.measurements, "decode_s": time.perf_counter() - start}
            self.record(request, measurements, WHOLE_PROMPT)
            state.measurements["prefill_s"] = 0.0  # one prefill serves every choice: count it once
        if state is not None:
            state.close()
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise BadInput(
            "the kvbench model does not score perplexity tasks (loglikelihood_rolling): a document scored "
            "from its first token has no context to compress"
        )


def question_start(text: str, task: str, doc: dict | None) -> int | None:
    """Where the question starts in a generation prompt: the last occurrence of the doc's `kvbench_question`,
    or for lm-eval's own RULER tasks of RULER's question text up to its first field, in its plural or its
    singular wording (RULER rewords a one-value needle question; few-shot examples come before the question,
    so the last occurrence); None for a prompt of any other task."""
    question = (doc or {}).get(QUESTION_FIELD)
    if question:
        if question not in text:
            raise BadInput(f"the prompt does not contain the doc's {QUESTION_FIELD} text")
        return text.rindex(question)
    if task in LM_EVAL_RULER:
        question = ruler.TEMPLATES[LM_EVAL_RULER[task]].question.split("{")[0]
        starts = [text.rfind(marker) for marker in (question, ruler.singular(question))]
        if max(starts) < 0:
            raise BadInput(f"the prompt of lm-eval's RULER task {task!r} does not hold RULER's question")
        return max(starts)
    return None


def available_device(device: str) -> str:
    """`device`, or the CPU when it names an accelerator this machine lacks (lm-eval's default is cuda:0)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        logging.getLogger(__name__).warning("no CUDA device here: the kvbench model runs on the CPU")
        return "cpu"
    return device


def generate(model, run: Run, max_new_tokens: int) -> dict:
    """Greedy tokens and measurements for the run's prompt under its press, along the engine's path."""
    with torch.no_grad():
        if is_shareable(run.press):
            prefill_shared(model, [run])
            answer_question(model, [run], max_new_tokens)
        else:
            run_alone(model, run, max_new_tokens)
    return {**run.result, **run.answers[0]}


class CompressedContext:
    """All but the last token of a context, prefilled under a press; scores continuations on that cache."""

    def __init__(self, model, press, context_ids: list[int]):
        if isinstance(press, DecodingPress):
            raise BadInput("decoding presses compress while generating; loglikelihood needs a prefill press")
        self.model, self.context_ids = model, context_ids
        self.cache = DynamicCache()
        prefix = torch.tensor([context_ids[:-1]], device=model.device)
        start = time.perf_counter()
        if prefix.shape[1]:
            with torch.no_grad(), press(model) if press is not None else contextlib.nullcontext():
                language_model(model)(input_ids=prefix, past_key_values=self.cache)
        self.measurements = {
            "prefill_s": time.perf_counter() - start,
            **kv_counts(model, prefix.shape[1], cache_entries(self.cache, masked_entries(model)), press),
        }
        self.layer_lengths = [layer.keys.shape[2] for layer in self.cache.layers]
        self.position = prefix.shape[1]
        # Presses that move kept keys to new positions continue from the compressed length (as run_alone).
        if moves_positions(press):
            self.position = self.cache.get_seq_length()

    def score(self, continuation_ids: list[int]) -> tuple[float, bool]:
        """(log-probability of the continuation, whether greedy decoding would produce it)."""
        fed = self.context_ids[-1:] + continuation_ids[:-1]
        positions = torch.arange(self.position, self.position + len(fed), device=self.model.device)
        with torch.no_grad():
            logits = self.model(
                input_ids=torch.tensor([fed], device=self.model.device),
                past_key_values=self.cache,
                position_ids=positions.unsqueeze(0),
            ).logits[0]
        # Back to the compressed context for the next continuation (layers that held nothing hold nothing).
        for index, layer in enumerate(self.cache.layers):
            layer.crop(self.layer_lengths[index] if index < len(self.layer_lengths) else 0)  # ty: ignore[missing-attribute]
        logprobs = F.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(continuation_ids, device=logprobs.device)
        return logprobs.gather(1, targets[:, None]).sum().item(), bool((logprobs.argmax(-1) == targets).all())

    def close(self) -> None:
        clear_head_masks(self.model)


# ---- lm-eval runs into the results store ----


def tokenizer_folder(model: str) -> Path:
    """Where the model's tokenizer is saved for tasks that load one by path (lm-eval's RULER sizes its
    samples with it; our embedded alias means nothing to AutoTokenizer)."""
    return cache_dir() / "lm_eval" / "tokenizers" / model.strip("/").replace("/", "--")


def task_metadata(model: str, *, limit: int | None = None, length: int | None = None) -> dict:
    """What tasks are built with: the tokenizer, RULER's target length, and how many samples to generate."""
    metadata = {"tokenizer": str(tokenizer_folder(model))}
    if length is not None:
        metadata["max_seq_lengths"] = [length]
    if limit is not None:
        metadata["samples"] = limit  # our RULER tasks then generate only the samples that will be used
    return metadata


def task_manager(include_paths=(), metadata: dict | None = None):
    """lm-eval's tasks plus ours (tasks/lm_eval) and any extra folders."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(TASKS_DIR), *map(str, include_paths)], metadata=metadata)


def check_tasks(manager, names: list[str]) -> None:
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            raise UnknownTask(f"unknown lm-eval task {name!r} (see `lm_eval ls tasks`, or tasks/lm_eval)")


HUB_MODULES = ("huggingface_hub", "datasets", "requests", "urllib3", "httpx", "fsspec", "aiohttp")


def needs_hub(error: BaseException | None) -> bool:
    """Whether an error (or one it came from) is a failed download: a task whose data is on the hub."""
    while error is not None:
        if isinstance(error, ConnectionError) or type(error).__module__.split(".")[0] in HUB_MODULES:
            return True
        error = error.__cause__ or error.__context__
    return False


def evaluate(lm: KVBenchLM, manager, names: list[str], *, limit: int | None = None) -> dict:
    """Run lm-eval tasks (or groups) on `lm`; lm-eval's results, with every sample logged.

    The chat template is applied whenever the tokenizer has one, as `kvbench run` does. Responses are cached
    per config under the kvbench cache, so a rerun only computes what is missing.
    """
    from unittest import mock

    import lm_eval
    import lm_eval.evaluator

    lm.tokenizer.save_pretrained(tokenizer_folder(model_name(lm.model)))
    # lm-eval's own lookup lets git print "fatal: not a git repository" outside a checkout.
    quiet = mock.patch.object(lm_eval.evaluator, "get_git_commit_hash", provenance.working_folder_commit)
    with quiet:
        return lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            limit=limit,
            task_manager=manager,
            use_cache=str(cache_dir() / "lm_eval" / "requests" / config_id(**lm.run_config)),
            apply_chat_template=lm.tokenizer.chat_template is not None,
            log_samples=True,
            bootstrap_iters=0,
        )


def protocol_of(task: str, sample: dict) -> str:
    """The protocol a logged sample ran under, by the model's rule (so rows of cached responses say it too):
    generated answers of docs that name their question and of lm-eval's RULER split at the question."""
    generated = isinstance(sample["filtered_resps"][0], str)
    named = bool(sample["doc"].get(QUESTION_FIELD)) or task in LM_EVAL_RULER
    return SPLIT_AT_QUESTION if generated and named else WHOLE_PROMPT


def prediction_of(sample: dict) -> str:
    """The generated text, or for loglikelihood requests the index of the most likely choice."""
    response = sample["filtered_resps"][0]
    if isinstance(response, str):
        return response
    loglikelihoods = [
        resp[0] if isinstance(resp, (list, tuple)) else resp for resp in sample["filtered_resps"]
    ]
    return str(max(range(len(loglikelihoods)), key=loglikelihoods.__getitem__))


def main_metric(sample: dict, length) -> str:
    """The task's first metric, or for RULER-style tasks (one metric per length) the sample's length's."""
    return str(length) if str(length) in sample["metrics"] else sample["metrics"][0]


def rows_from_results(results: dict, lm: KVBenchLM) -> list[Row]:
    """One results-store row per (task, doc): task = "lm-eval/<task>", score = the main metric on 0-100.

    A task with several filters (e.g. strict and flexible answer extraction) logs a doc once per filter;
    the row takes the first, the task's main one. The row's content hash is that of the request's arguments
    (the prompt) and the target: a changed task is scored again. Its protocol (`protocol_of`) enters its
    config_id as in `kvbench run`'s rows: a query-aware row never shares an id with a query-agnostic one.
    """
    config = lm.run_config
    rows = []
    for task, samples in results["samples"].items():
        task_rows, seen = [], set()
        for sample in samples:
            if sample["doc_id"] in seen:
                continue
            seen.add(sample["doc_id"])
            doc = sample["doc"]
            length = doc.get("max_length")
            target = sample["target"]
            value = sample[main_metric(sample, length)]
            content = json.dumps([sample.get("arguments"), target], sort_keys=True, default=str)
            protocol = protocol_of(task, sample)
            task_rows.append(
                Row(
                    config_id=config_id(**config, protocol=protocol),
                    **config,
                    protocol=protocol,
                    task=f"lm-eval/{task}",
                    length=length,
                    seed=doc.get("seed", 0),
                    sample_id=str(doc.get("sample_id", sample["doc_id"])),
                    content_hash=hashlib.sha1(content.encode()).hexdigest()[:12],
                    prediction=prediction_of(sample),
                    references=[str(t) for t in target] if isinstance(target, list) else [str(target)],
                    # A metric that is not a finite number (lm-eval's nan for an empty group) is no score.
                    score=float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None,
                    **lm.stats.get((task, sample["doc_id"]), {}),
                )
            )
        # Metrics in [0, 1] (accuracy, RULER's string match) go to kvbench's 0-100 scale.
        scores = [row.score for row in task_rows if row.score is not None]
        if scores and all(0 <= score <= 1 for score in scores):
            for row in task_rows:
                row.score = None if row.score is None else 100 * row.score
        rows.extend(task_rows)
    return rows


def store_rows(rows: list[Row], store: ResultsStore) -> int:
    """Append the rows the store does not hold yet; how many were new."""
    return sum(store.append(row) for row in rows)


def run_record(lm: KVBenchLM, rows: list[Row], *, limit, length, started: str) -> dict:

    config = lm.run_config
    tasks = sorted({row.task for row in rows})
    scores = {
        task: [row.score for row in rows if row.task == task and row.score is not None] for task in tasks
    }
    config_record = {
        "model": config["model"],
        "configs": [{key: config[key] for key in ("press", "ratio", "press_args")}],
        "tasks": tasks,
        "samples": limit,
        "length": length,
        "device": str(lm.model.device),
    }
    summary = {
        f"{config['press']}@{config['ratio']}": {
            task: round(sum(values) / len(values), 2) for task, values in scores.items() if values
        }
    }
    return provenance.run_record(config_record, summary, str(lm.model.device), started)
