"""Why VarRate scores below its uniform-rank ablation (issue 28 item 3): at memory 0.5, on one RULER 1k
context (niah_single_1, seed 0) of the embedded model, the ranks each variant gives and the relative
reconstruction error of the keys and values (|restored - cached| / |cached|) at four layers.

    uv run python benchmarks/varrate_variants.py

No score: a cheap look inside before any board is rerun (docs/studies/varrate.md).
"""

import torch
from transformers import DynamicCache

from kvbench import tasks
from kvbench.bridge.models import load_model
from kvbench.presses import build_press
from kvbench.tasks.prompt import tokenize_sample

torch.set_num_threads(1)
model, tok = load_model("smollm2-135m")
sample = tasks.load_samples("niah_single_1", length=1024, samples=1, seed=0, tokenizer=tok)[0]
ids = tokenize_sample(tok, sample).context_ids
seen = {}


def hook(module, args, kwargs, output):
    layer = kwargs["past_key_values"].layers[module.layer_idx]
    seen[module.layer_idx] = dict(
        module=module,
        hidden_states=kwargs["hidden_states"],
        kwargs=dict(kwargs),
        keys=layer.keys.clone(),
        values=layer.values.clone(),
    )


for layer in model.model.layers:
    layer.self_attn.rotary_emb = model.model.rotary_emb
hs = [model.model.layers[i].self_attn.register_forward_hook(hook, with_kwargs=True) for i in (0, 10, 20, 29)]
with torch.no_grad():
    model.model(input_ids=ids, past_key_values=DynamicCache())
for h in hs:
    h.remove()
print("tokens", ids.shape[1])
for i, s in seen.items():
    out = []
    for name, args in (
        ("lowrank", {}),
        ("lowrank", {"basis": "pre-rope"}),
        ("varrate", {}),
        ("varrate", {"basis": "pre-rope"}),
        ("varrate", {"share": "head"}),
        ("varrate", {"min_rank": 16}),
    ):
        p = build_press(name, 0.0, memory=0.5, **args)
        with torch.no_grad():
            layout, rr = p.allocate_rows(s["module"], s["hidden_states"], s["keys"], s["values"], s["kwargs"])
            k, v = p.compress(s["module"], s["hidden_states"], s["keys"], s["values"], None, s["kwargs"])
        r = rr[0].float()
        ke = ((k - s["keys"]).norm() / s["keys"].norm()).item()
        ve = ((v - s["values"]).norm() / s["values"].norm()).item()
        out.append(
            f"{name}{args}: ranks mean {r.mean():.1f} median {r.median():.0f} p90 {r.quantile(0.9):.0f} "
            f"max {r.max():.0f}; key err {ke:.3f} value err {ve:.3f}"
        )
    print("layer", i)
    print("\n".join("  " + o for o in out))
