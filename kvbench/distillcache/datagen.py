"""DistillCache training data: per RULER prompt, what training needs to rebuild and score compressed caches.

For every training sample (the RULER generators and seeds KVP's datagen uses: seeds 10000+, never the
evaluation's) one uncompressed run stores
  - the context's keys and values (fp16, (layers, kv_heads, L, head_dim)): training gathers keep-sets from
    them instead of prefilling again,
  - the policy's raw features of every context entry at prefill ((layers, kv_heads, L, 7)), computed by the
    same function the press uses,
  - the question's and the greedy continuation's token ids (the continuation is at most `gen_tokens` long,
    capped by the task's answer length), and
  - the uncompressed model's next-token log-probabilities (fp16, (T + 1, vocab)) at the question's last
    token and at each continuation token: p_full,t of the reward.
One safetensors shard per sample, written atomically; `manifest.json` is rewritten after each, so a rerun
with the same settings continues where the last one stopped.
"""

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import DynamicCache

from kvbench.distillcache.policy import token_features
from kvbench.engine import tokenize_sample
from kvbench.errors import BadInput
from kvbench.tasks import load_samples
from kvbench.training import (
    MANIFEST_FILE,
    manifest_method,
    model_shape,
    read_json,
    write_atomically,
    write_json,
)

METHOD = "distillcache"


@dataclass
class DatagenConfig:
    tasks: list[str]
    length: int  # context tokens, as the task generator understands it
    samples: int  # per task
    seed: int = 10_000  # evaluation uses seeds 0..999
    gen_tokens: int = 32  # cap on the teacher-forced continuation (also capped by the task's max_new_tokens)
    val_fraction: float = 0.1  # the first round(fraction * samples) samples of each task validate


@torch.no_grad()
def capture_prompt(model, context_ids: list[int], question_ids: list[int], gen_tokens: int) -> dict:
    """keys, values, features of the context; continuation ids; log_probs (T + 1, vocab) of the full cache."""
    num_layers = len(model.model.layers)
    features = [None] * num_layers
    cache = DynamicCache()

    def add_features(module, args, kwargs, output):
        layer = cache.layers[module.layer_idx]
        features[module.layer_idx] = token_features(
            module,
            kwargs["hidden_states"],
            layer.keys,
            layer.values,
            model.model.rotary_emb,
            len(context_ids) - 1,
            num_layers,
        )[0]

    hooks = [
        layer.self_attn.register_forward_hook(add_features, with_kwargs=True) for layer in model.model.layers
    ]
    try:
        model(input_ids=torch.tensor([context_ids], device=model.device), past_key_values=cache)
    finally:
        for hook in hooks:
            hook.remove()
    keys = torch.stack([cache.layers[i].keys[0] for i in range(num_layers)]).half().cpu()
    values = torch.stack([cache.layers[i].values[0] for i in range(num_layers)]).half().cpu()

    stops = model.generation_config.eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops])
    input_ids = torch.tensor([question_ids], device=model.device)
    generated, log_probs = [], []
    while True:
        logits = model(input_ids=input_ids, past_key_values=cache, logits_to_keep=1).logits[0, -1]
        log_probs.append(logits.float().log_softmax(-1).half().cpu())
        next_token = logits.argmax().item()
        if next_token in stops or len(generated) == gen_tokens:
            break
        generated.append(next_token)
        input_ids = torch.tensor([[next_token]], device=model.device)
    return {
        "keys": keys,
        "values": values,
        "features": torch.stack(features).float().cpu(),
        "question_ids": torch.tensor(question_ids),
        "continuation_ids": torch.tensor(generated, dtype=torch.long),
        "log_probs": torch.stack(log_probs),
    }


def datagen_hint(name: str, out: str = "DIR") -> str:
    return f"kvbench distillcache datagen --model {name} --out {out}"


def generate_data(model, tokenizer, out: Path, config: DatagenConfig, progress: bool = True) -> dict:
    """Write one shard per (task, sample) into `out` and return the manifest; resumes a stopped run."""
    out = Path(out)
    head = {"model": asdict(model_shape(model)), "config": asdict(config)}
    manifest = {"method": METHOD, **head, "shards": []}
    if (out / MANIFEST_FILE).is_file():
        manifest = read_json(out / MANIFEST_FILE, "DistillCache data", datagen_hint(head["model"]["name"]))
        if manifest_method(manifest) != METHOD or {key: manifest.get(key) for key in head} != head:
            raise BadInput(
                f"{out / MANIFEST_FILE} holds {manifest_method(manifest)} data made with other settings; "
                "use another --out folder"
            )
    out.mkdir(parents=True, exist_ok=True)
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
    planned.sort(key=lambda item: item[0])  # sample-major: a stopped run holds every task, validation first

    todo = [item for item in planned if item[1] not in done]
    for _, file, split, sample in tqdm(todo, desc="distillcache datagen", disable=not progress):
        prompt = tokenize_sample(tokenizer, sample)  # split exactly as evaluation splits it
        context_ids, question_ids = prompt.context_ids[0].tolist(), prompt.question_ids[0].tolist()
        captured = capture_prompt(
            model, context_ids, question_ids, min(config.gen_tokens, sample.max_new_tokens)
        )
        tensors = {name: tensor.contiguous() for name, tensor in captured.items()}
        write_atomically(out / file, lambda path, tensors=tensors: save_file(tensors, path))
        manifest["shards"].append(
            {
                "file": file,
                "split": split,
                "task": sample.task,
                "sample_id": sample.id,
                "prompt_tokens": len(context_ids),
                "question_tokens": len(question_ids),
                "continuation_tokens": len(captured["continuation_ids"]),
            }
        )
        write_json(out / MANIFEST_FILE, manifest)
    return manifest
