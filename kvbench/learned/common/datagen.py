"""The learned presses' training data: one store that KVP and DistillCache both train from.

The prompts are a training mixture (kvbench.tasks.mixture): parts of (task, length, samples), any task family
whose samples change with the seed (seeds disjoint from evaluation's 0..999). For every prompt one
uncompressed run (capture_prompt) prefills the context, then feeds the question and greedily continues on
the full cache (at most `gen_tokens` tokens, capped by the task's answer length), and its shard holds
  - keys, values: the context's post-RoPE keys and values, fp16 (layers, kv_heads, P, head_dim), what a
    press sees at prefill (both trainers rebuild caches from them),
  - utility (KVP's target), fp32 (layers, kv_heads, P): for every query after the context (the question's
    and the continuation's), the attention it pays to context token j, max over the query heads of the KV
    group; then the mean over those queries. In the query-agnostic protocol both read from the compressed
    cache, so both need what eviction removes (the KVP paper uses the generated part only; the question
    adds signal where the answer is a few tokens),
  - features (DistillCache's policy input), fp32 (layers, kv_heads, P, 7): token_features at prefill on the
    context, the function the press runs,
  - question_ids, continuation_ids: what DistillCache's reward feeds teacher-forced on compressed caches,
  - log_probs, fp16 (T + 1, vocab): the full cache's next-token log-probabilities at the question's last
    token and at each continuation token (p_full,t of DistillCache's reward),
  - reconstruction (with `--reconstruction`; KVP's other target), fp32 (layers, kv_heads, P): KVZip's
    question-agnostic score. On the context's cache the model reads a request to repeat the context, then
    the whole context again (KVZip's request and its chat template's assistant turn); a token's score is
    the most attention any of those queries pays to it, max over the KV group's query heads too, as
    kvpress's KVzipPress scores (in one chunk: our contexts are shorter than its 2048-token chunks).

With `--target authors` (DatagenConfig.target; the authors' data, KVP's only) a shard holds instead the
keys, values and utility of the whole prompt (context, question, chat template, answer prefix: P is all of
it) and the greedy generation's ids, the utility summed over the generated tokens' queries alone
(capture_whole_prompt).

Seeds: the k-th part of a task (in mixture order) draws its samples with seed `seed + k`, so a task at two
lengths gets two different sets of needles, not the same needles in a longer haystack.

One safetensors shard per prompt, written atomically (tmp file + rename); `manifest.json` (method "shared",
the mixture, the model, the config, the shards) is rewritten after each shard, so a rerun with the same
settings continues where the last one stopped. Stores made before this one by either press alone (method
"kvp" or "distillcache") stay trainable by that press.
"""

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import DynamicCache

from kvbench.bridge.adapter import attention_hooks, attention_implementation, language_model
from kvbench.core.errors import BadInput
from kvbench.learned.common import (
    MANIFEST_FILE,
    SHARED,
    existing_manifest,
    folder_name,
    manifest_method,
    model_shape,
    write_atomically,
    write_json,
)
from kvbench.learned.common.config import DatagenConfig
from kvbench.learned.distillcache.policy import token_features
from kvbench.tasks import Sample, load_samples
from kvbench.tasks.mixture import Part
from kvbench.tasks.prompt import tokenize_sample

EVALUATION_SEED = 0  # evaluation's default seed: a task whose samples there equal ours cannot train


@dataclass
class PlannedShard:
    order: int  # the sample's index within its part: shards are written sample-major
    file: str
    split: str
    part: Part
    sample: Sample


RECONSTRUCTION_REQUEST = "\n\nRepeat the previous context exactly."  # KVZip's (its first chunk's)


def reconstruction_prompt_ids(tokenizer) -> list[int]:
    """What follows the context in KVZip's reconstruction pass, before the context again: the request to
    repeat it, then the chat template's end of the user turn and start of the assistant's (a bare newline
    for a model without a template), as kvpress's KVzipPress builds it."""
    request = tokenizer.encode(RECONSTRUCTION_REQUEST, add_special_tokens=False)
    if tokenizer.chat_template is None:
        return request + tokenizer.encode("\n", add_special_tokens=False)
    marker = "\n" + "#" * 8  # text no template writes, so the split finds where the user's content ends
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "context" + marker}], add_generation_prompt=True, tokenize=False
    )
    return request + tokenizer.encode(rendered.split(marker)[1], add_special_tokens=False)


@torch.no_grad()
def capture_prompt(
    model,
    context_ids: list[int],
    question_ids: list[int],
    gen_tokens: int,
    reconstruction_ids: list[int] | None = None,
) -> dict:
    """Everything both trainers read of one prompt (the module docstring lists it); `continuation_ids` are
    the greedy tokens. `reconstruction_ids` (reconstruction_prompt_ids) adds the reconstruction score.

    The context is prefilled with the model's own attention implementation, exactly as the press sees it
    at evaluation (so keys, values and features are the press's); the question and the continuation then run
    under eager attention, whose weights give the utility, on the same cache: the teacher-forced pass over
    context + question + continuation, computed once. The reconstruction pass then runs, also eager, on the
    cache cropped back to the context.
    """
    length = len(context_ids)
    num_layers = len(language_model(model).layers)
    num_kv_heads = model.config.num_key_value_heads
    cache = DynamicCache()
    features = [torch.empty(0)] * num_layers
    utility_sum = [torch.zeros(num_kv_heads, length)] * num_layers
    queries = [0] * num_layers

    def add_features(module, args, kwargs, output):
        layer = cache.layers[module.layer_idx]
        features[module.layer_idx] = token_features(
            module,
            kwargs["hidden_states"],
            layer.keys,
            layer.values,
            language_model(model).rotary_emb,
            length - 1,
            num_layers,
        )[0]

    def add_utility(module, args, kwargs, output):
        weights = output[1][0, :, :, :length]  # (query heads, new queries, context)
        grouped = weights.reshape(num_kv_heads, -1, *weights.shape[1:]).amax(dim=1)  # max over the group
        utility_sum[module.layer_idx] = utility_sum[module.layer_idx] + grouped.float().sum(dim=1).cpu()
        queries[module.layer_idx] += weights.shape[1]

    with attention_hooks(model, add_features):
        language_model(model)(
            input_ids=torch.tensor([context_ids], device=model.device), past_key_values=cache
        )
    layers = range(num_layers)
    keys = torch.stack([cache.layers[i].keys[0] for i in layers]).half().cpu()
    values = torch.stack([cache.layers[i].values[0] for i in layers]).half().cpu()

    stops = model.generation_config.eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops])
    input_ids = torch.tensor([question_ids], device=model.device)
    continuation, log_probs = [], []
    with attention_hooks(model, add_utility), attention_implementation(model, "eager"):
        while True:
            logits = model(input_ids=input_ids, past_key_values=cache, logits_to_keep=1).logits[0, -1]
            log_probs.append(logits.float().log_softmax(-1).half().cpu())
            next_token = logits.argmax().item()
            if next_token in stops or len(continuation) == gen_tokens:
                break  # the stop token, or a token past the cap, is never fed back: its query reads nothing
            continuation.append(next_token)
            input_ids = torch.tensor([[next_token]], device=model.device)
    captured = {
        "keys": keys,
        "values": values,
        "utility": torch.stack([utility_sum[i] / queries[i] for i in layers]),
        "features": torch.stack(features).float().cpu(),
        "question_ids": torch.tensor(question_ids, dtype=torch.long),
        "continuation_ids": torch.tensor(continuation, dtype=torch.long),
        "log_probs": torch.stack(log_probs),
    }
    if reconstruction_ids is not None:
        cache.crop(length)
        captured["reconstruction"] = reconstruction_score(model, cache, reconstruction_ids + context_ids)
    return captured


@torch.no_grad()
def capture_whole_prompt(model, prompt_ids: list[int], gen_tokens: int) -> dict:
    """The authors' data of one prompt (DatagenConfig's target "authors"): keys and values of every prompt
    token, fp16 (layers, kv_heads, P, head_dim), prefilled with the model's own attention; the greedy
    generation (`continuation_ids`: up to `gen_tokens` tokens, the last one a stop token if one came), each
    token fed back under eager attention; and `utility`, fp32 (layers, kv_heads, P): for prompt token l, the
    sum over the generated tokens' queries of the most attention any query head of the KV group pays to l.
    """
    length = len(prompt_ids)
    num_layers = len(language_model(model).layers)
    num_kv_heads = model.config.num_key_value_heads
    utility = [torch.zeros(num_kv_heads, length)] * num_layers

    def add_utility(module, args, kwargs, output):
        weights = output[1][0, :, :, :length]  # (query heads, new queries, prompt)
        grouped = weights.reshape(num_kv_heads, -1, *weights.shape[1:]).amax(dim=1)  # max over the group
        utility[module.layer_idx] = utility[module.layer_idx] + grouped.float().sum(dim=1).cpu()

    cache = DynamicCache()
    logits = model(
        input_ids=torch.tensor([prompt_ids], device=model.device), past_key_values=cache, logits_to_keep=1
    ).logits
    layers = range(num_layers)
    keys = torch.stack([cache.layers[i].keys[0] for i in layers]).half().cpu()
    values = torch.stack([cache.layers[i].values[0] for i in layers]).half().cpu()
    stops = model.generation_config.eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops])
    generated = []
    with attention_hooks(model, add_utility), attention_implementation(model, "eager"):
        while len(generated) < gen_tokens:
            generated.append(int(logits[0, -1].argmax()))
            input_ids = torch.tensor([[generated[-1]]], device=model.device)
            logits = model(input_ids=input_ids, past_key_values=cache, logits_to_keep=1).logits
            if generated[-1] in stops:
                break
    return {
        "keys": keys,
        "values": values,
        "utility": torch.stack(utility),
        "continuation_ids": torch.tensor(generated, dtype=torch.long),
    }


def reconstruction_score(model, cache: DynamicCache, repeat_ids: list[int]) -> torch.Tensor:
    """KVZip's score of the cached context's tokens: (layers, kv_heads, P), the most attention any query of
    `repeat_ids` (fed after the context) pays to the token, over the KV group's query heads too."""
    length = cache.get_seq_length()
    num_kv_heads = model.config.num_key_value_heads
    scores = [torch.empty(0)] * len(language_model(model).layers)

    def keep_max(module, args, kwargs, output):
        weights = output[1][0, :, :, :length]  # (query heads, repeat queries, context)
        grouped = weights.reshape(num_kv_heads, -1, *weights.shape[1:])
        scores[module.layer_idx] = grouped.amax(dim=(1, 2)).float().cpu()

    with attention_hooks(model, keep_max), attention_implementation(model, "eager"):
        model(
            input_ids=torch.tensor([repeat_ids], device=model.device), past_key_values=cache, logits_to_keep=1
        )
    return torch.stack(scores)


def check_seed_changes_samples(task: str, length: int, seed: int, tokenizer) -> None:
    """Refuse a task whose first sample at `seed` is its first sample at evaluation's seed: its samples do
    not change with the seed (a fixed dataset read in order), so training on them would train on the test."""
    ours, theirs = (
        load_samples(task, length=length, samples=1, seed=s, tokenizer=tokenizer)[0]
        for s in (seed, EVALUATION_SEED)
    )
    if (ours.context, ours.question, ours.messages) == (theirs.context, theirs.question, theirs.messages):
        raise BadInput(f"{task} samples do not change with the seed: they would overlap evaluation")


def plan_shards(config: DatagenConfig, tokenizer) -> list[PlannedShard]:
    """Every shard the config makes, sample-major (all parts' sample 0, then 1, ...), so a stopped run
    still holds a mix of every part with the validation prompts first. Needs the tokenizer, not the model:
    a task that cannot make its samples fails before the model loads."""
    planned = []
    checked = set()
    for part, seed in zip(config.parts, config.part_seeds(), strict=True):
        if part.task not in checked:
            check_seed_changes_samples(part.task, part.length, seed, tokenizer)
            checked.add(part.task)
        samples = load_samples(
            part.task, length=part.length, samples=part.samples, seed=seed, tokenizer=tokenizer
        )
        n_val = config.validation_count(len(samples))
        for index, sample in enumerate(samples):
            file = f"{folder_name(part.task)}-{part.length}-{index:05d}.safetensors"
            split = "val" if index < n_val else "train"
            planned.append(PlannedShard(index, file, split, part, sample))
    return sorted(planned, key=lambda shard: shard.order)


def generate_data(
    model,
    tokenizer,
    out: Path,
    config: DatagenConfig,
    progress: bool = True,
    mixture: str | None = None,
    planned: list[PlannedShard] | None = None,
) -> dict:
    """Write one shard per (part, sample) into `out` and return the manifest; resumes a stopped run.

    mixture: the mixture's name, recorded in the manifest (its parts are in the config).
    planned: `plan_shards(config, tokenizer)` when the caller already made it.
    """
    out = Path(out)
    head = {"model": asdict(model_shape(model)), "config": asdict(config)}
    method = SHARED if config.target == "kvbench" else "kvp"  # the authors' data trains KVP only
    dtype = str(model.dtype).removeprefix("torch.")
    made: dict[str, Any] = {"method": method, "mixture": mixture, "dtype": dtype, **head, "shards": []}
    manifest = existing_manifest(out) or made
    made_in = manifest.setdefault("dtype", "float32")  # made before the option: float32, the only one then
    if made_in != dtype:
        raise BadInput(f"{out} holds data made in {made_in}: resume it with --dtype {made_in}")
    if isinstance(manifest["config"], dict):  # made before these options: a resumed run keeps them off
        manifest["config"].setdefault("reconstruction", False)
        manifest["config"].setdefault("target", "kvbench")
    if manifest_method(manifest) != method or {key: manifest.get(key) for key in head} != head:
        raise BadInput(
            f"{out} holds {manifest_method(manifest)} data made with other settings "
            f"({manifest.get('model')}, {manifest.get('config')}); "
            "use another --out folder"
        )
    planned = planned if planned is not None else plan_shards(config, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    done = {shard["file"] for shard in manifest["shards"]}
    todo = [shard for shard in planned if shard.file not in done]
    repeat_prompt = reconstruction_prompt_ids(tokenizer) if config.reconstruction else None
    for shard in tqdm(todo, desc="datagen", disable=not progress):
        sample = shard.sample
        prompt = tokenize_sample(tokenizer, sample)  # split exactly as evaluation splits it
        context_ids, question_ids = prompt.context_ids[0].tolist(), prompt.question_ids[0].tolist()
        if config.target == "authors":
            captured = capture_whole_prompt(model, context_ids + question_ids, config.gen_tokens)
            context_ids, question_ids = context_ids + question_ids, []  # all of it is ranked
        else:
            gen_tokens = min(config.gen_tokens, sample.max_new_tokens)
            captured = capture_prompt(model, context_ids, question_ids, gen_tokens, repeat_prompt)
        tensors = {name: tensor.contiguous() for name, tensor in captured.items()}
        write_atomically(out / shard.file, lambda path, tensors=tensors: save_file(tensors, path))
        manifest["shards"].append(
            {
                "file": shard.file,
                "split": shard.split,
                "task": sample.task,
                "length": shard.part.length,
                "sample_id": sample.id,
                "prompt_tokens": len(context_ids),
                "question_tokens": len(question_ids),
                "continuation_tokens": len(captured["continuation_ids"]),
            }
        )
        write_json(out / MANIFEST_FILE, manifest)
    return manifest
