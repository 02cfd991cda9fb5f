"""KVP training data: per prompt and (layer, KV head), the prompt's keys and values and each token's utility.

The prompts are a training mixture (kvbench.tasks.mixture): parts of (task, length, samples), any task family
whose samples change with the seed (seeds disjoint from evaluation's 0..999). For every prompt we
  1. greedily continue context + question with the uncompressed model (at most `gen_tokens` tokens),
  2. read the attention of that run (eager attention; see capture_prompt), and keep
     - the context's post-RoPE keys and values from the cache (what the press sees at prefill), and
     - the utility u_j of each context token j: for every query after the context, the attention it pays
       to j, max over the query heads of the KV group; then the mean over those queries.
The queries after the context are the question's and the continuation's: in the query-agnostic protocol both
read from the compressed cache, so both need what eviction removes. (The paper uses the generated part only;
the question adds signal where the answer is a few tokens.)

Seeds: the k-th part of a task (in mixture order) draws its samples with seed `seed + k`, so a task at two
lengths gets two different sets of needles, not the same needles in a longer haystack.

One safetensors shard per prompt, written atomically (tmp file + rename); `manifest.json` (the parts, the
config, the shards) is rewritten after each shard, so a rerun with the same settings continues where the
last one stopped.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import DynamicCache

from kvbench.engine import tokenize_sample
from kvbench.errors import BadInput, DataFileError
from kvbench.tasks import Sample, load_samples
from kvbench.tasks.mixture import Part
from kvbench.training import MANIFEST_FILE, folder_name, manifest_method, model_shape, write_atomically

METHOD = "kvp"
EVALUATION_SEED = 0  # evaluation's default seed: a task whose samples there equal ours cannot train


@dataclass
class DatagenConfig:
    parts: list[Part]  # (task, length, samples) in the order they were given
    seed: int = 10_000  # evaluation uses seeds 0..999
    gen_tokens: int = 32  # cap on the greedy continuation (also capped by the task's own max_new_tokens)
    val_fraction: float = 0.1  # the first round(fraction * samples) samples of each part validate

    def __post_init__(self):
        self.parts = [Part(**part) if isinstance(part, dict) else part for part in self.parts]
        pairs = [(part.task, part.length) for part in self.parts]
        duplicate = next((pair for pair in pairs if pairs.count(pair) > 1), None)
        if duplicate:
            raise BadInput(f"the mixture holds task {duplicate[0]!r} at length {duplicate[1]} twice")

    def part_seeds(self) -> list[int]:
        """Each part's sample seed: `seed` for a task's first part, seed + k for its k-th after that."""
        tasks = [part.task for part in self.parts]
        return [self.seed + tasks[:index].count(part.task) for index, part in enumerate(self.parts)]


@dataclass
class PlannedShard:
    order: int  # the sample's index within its part: shards are written sample-major
    file: str
    split: str
    part: Part
    sample: Sample


@torch.no_grad()
def capture_prompt(model, context_ids: list[int], question_ids: list[int], gen_tokens: int) -> dict:
    """Keys, values (layers, kv_heads, P, head_dim), utility (layers, kv_heads, P) and generated token ids.

    One eager prefill of context + question, then greedy decoding on the uncompressed cache; hooks on the
    attention layers read every query after the context as it goes. That is the teacher-forced pass over
    context + question + continuation, computed once instead of twice.
    """
    prompt_length = len(context_ids)
    num_kv_heads = model.config.num_key_value_heads
    num_layers = len(model.model.layers)
    utility_sum = [0.0] * num_layers
    queries = [0] * num_layers

    def add_utility(module, args, kwargs, output):
        weights = output[1][0]  # (query heads, new queries, all keys so far)
        first_after_prompt = max(0, prompt_length - (weights.shape[2] - weights.shape[1]))
        later = weights[:, first_after_prompt:, :prompt_length]
        grouped = later.reshape(num_kv_heads, -1, *later.shape[1:]).amax(dim=1)  # max over the group
        utility_sum[module.layer_idx] = utility_sum[module.layer_idx] + grouped.float().sum(dim=1)
        queries[module.layer_idx] += later.shape[1]

    stops = model.generation_config.eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops])
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the only implementation that returns attention weights
    hooks = [
        layer.self_attn.register_forward_hook(add_utility, with_kwargs=True) for layer in model.model.layers
    ]
    try:
        cache = DynamicCache()
        input_ids = torch.tensor([context_ids + question_ids], device=model.device)
        generated = []
        while True:
            logits = model(input_ids=input_ids, past_key_values=cache, logits_to_keep=1).logits
            next_token = logits[0, -1].argmax().item()
            if next_token in stops or len(generated) == gen_tokens:
                break  # the stop token, or a token past the cap, is never fed back: its query reads nothing
            generated.append(next_token)
            input_ids = torch.tensor([[next_token]], device=model.device)
    finally:
        for hook in hooks:
            hook.remove()
        model.set_attn_implementation(previous)
    layers = range(num_layers)
    return {
        "keys": torch.stack([cache.layers[i].keys[0, :, :prompt_length] for i in layers]).half().cpu(),
        "values": torch.stack([cache.layers[i].values[0, :, :prompt_length] for i in layers]).half().cpu(),
        "utility": torch.stack([utility_sum[i] / queries[i] for i in layers]).cpu(),
        "generated": generated,
    }


def read_manifest(directory: Path) -> dict | None:
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest, dict) or not {"model", "config", "shards"} <= manifest.keys():
            raise ValueError("it lacks model, config and shards")
    except (ValueError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: not a KVP datagen manifest ({str(error).splitlines()[0]})") from None
    return manifest


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
        n_val = round(config.val_fraction * len(samples))
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
    manifest = read_manifest(out) or {"method": METHOD, "mixture": mixture, **head, "shards": []}
    if manifest_method(manifest) != METHOD or {key: manifest.get(key) for key in head} != head:
        raise BadInput(
            f"{out} holds {manifest_method(manifest)} data made with other settings "
            f"({manifest.get('model')}, {manifest.get('config')}); "
            "use another --out folder"
        )
    planned = planned if planned is not None else plan_shards(config, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    done = {shard["file"] for shard in manifest["shards"]}
    todo = [shard for shard in planned if shard.file not in done]
    for shard in tqdm(todo, desc="kvp datagen", disable=not progress):
        sample = shard.sample
        prompt = tokenize_sample(tokenizer, sample)  # split exactly as evaluation splits it
        context_ids, question_ids = prompt.context_ids[0].tolist(), prompt.question_ids[0].tolist()
        captured = capture_prompt(
            model, context_ids, question_ids, min(config.gen_tokens, sample.max_new_tokens)
        )
        tensors = {name: captured[name].contiguous() for name in ("keys", "values", "utility")}
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
                "generated_tokens": len(captured["generated"]),
            }
        )
        write_atomically(out / MANIFEST_FILE, lambda path: path.write_text(json.dumps(manifest, indent=1)))
    return manifest
