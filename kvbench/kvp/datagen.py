"""KVP training data: per prompt and (layer, KV head), the prompt's keys and values and each token's utility.

For every training sample (RULER, seeds disjoint from evaluation's 0..999) we
  1. greedily continue context + question with the uncompressed model (at most `gen_tokens` tokens),
  2. read the attention of that run (eager attention; see capture_prompt), and keep
     - the context's post-RoPE keys and values from the cache (what the press sees at prefill), and
     - the utility u_j of each context token j: for every query after the context, the attention it pays
       to j, max over the query heads of the KV group; then the mean over those queries.
The queries after the context are the question's and the continuation's: in the query-agnostic protocol both
read from the compressed cache, so both need what eviction removes. (The paper uses the generated part only;
the question adds signal where the answer is a few tokens.)

One safetensors shard per sample, written atomically (tmp file + rename); `manifest.json` is rewritten after
each shard, so a rerun with the same settings continues where the last one stopped.
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
from kvbench.tasks import load_samples
from kvbench.training import MANIFEST_FILE, manifest_method, model_shape, write_atomically

METHOD = "kvp"


@dataclass
class DatagenConfig:
    tasks: list[str]
    length: int  # context tokens, as the task generator understands it
    samples: int  # per task
    seed: int = 10_000  # evaluation uses seeds 0..999
    gen_tokens: int = 32  # cap on the greedy continuation (also capped by the task's own max_new_tokens)
    val_fraction: float = 0.1  # the first round(fraction * samples) samples of each task validate


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


def generate_data(model, tokenizer, out: Path, config: DatagenConfig, progress: bool = True) -> dict:
    """Write one shard per (task, sample) into `out` and return the manifest; resumes a stopped run."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    head = {"model": asdict(model_shape(model)), "config": asdict(config)}
    manifest = read_manifest(out) or {"method": METHOD, **head, "shards": []}
    if manifest_method(manifest) != METHOD or {key: manifest.get(key) for key in head} != head:
        raise BadInput(
            f"{out} holds {manifest_method(manifest)} data made with other settings "
            f"({manifest.get('model')}, {manifest.get('config')}); "
            "use another --out folder"
        )
    done = {shard["file"] for shard in manifest["shards"]}
    planned = []
    for task in config.tasks:
        samples = load_samples(
            task, length=config.length, samples=config.samples, seed=config.seed, tokenizer=tokenizer
        )
        n_val = round(config.val_fraction * len(samples))
        for index, sample in enumerate(samples):
            split = "val" if index < n_val else "train"
            planned.append((index, f"{task}-{index:05d}.safetensors", split, sample))
    # Sample-major order (all tasks' sample 0, then 1, ...): a stopped run still holds a mix of every task
    # with its validation prompts first.
    planned.sort(key=lambda item: item[0])

    todo = [item for item in planned if item[1] not in done]
    for _, file, split, sample in tqdm(todo, desc="kvp datagen", disable=not progress):
        prompt = tokenize_sample(tokenizer, sample)  # split exactly as evaluation splits it
        context_ids, question_ids = prompt.context_ids[0].tolist(), prompt.question_ids[0].tolist()
        captured = capture_prompt(
            model, context_ids, question_ids, min(config.gen_tokens, sample.max_new_tokens)
        )
        tensors = {name: captured[name].contiguous() for name in ("keys", "values", "utility")}
        write_atomically(out / file, lambda path, tensors=tensors: save_file(tensors, path))
        manifest["shards"].append(
            {
                "file": file,
                "split": split,
                "task": sample.task,
                "sample_id": sample.id,
                "prompt_tokens": len(context_ids),
                "question_tokens": len(question_ids),
                "generated_tokens": len(captured["generated"]),
            }
        )
        write_atomically(out / MANIFEST_FILE, lambda path: path.write_text(json.dumps(manifest, indent=1)))
    return manifest
