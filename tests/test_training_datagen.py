import torch

from kvbench.distillcache import datagen as distillcache_datagen
from kvbench.kvp import datagen as kvp_datagen
from kvbench.training.datagen import capture_prompt


def test_the_shared_capture_equals_both_presses_own_captures(tiny_model):
    """Utility as KVP's joint eager prefill computed it; features, log_probs and ids as DistillCache's."""
    model = tiny_model(vocab_size=97, eos_token_id=1)
    context, question = list(range(3, 43)), [50, 51, 52]
    shared = capture_prompt(model, context, question, gen_tokens=5)
    kvp = kvp_datagen.capture_prompt(model, context, question, gen_tokens=5)
    distillcache = distillcache_datagen.capture_prompt(model, context, question, gen_tokens=5)
    assert shared["continuation_ids"].tolist() == kvp["generated"] and len(kvp["generated"]) == 5
    torch.testing.assert_close(shared["utility"], kvp["utility"])
    for name in ("keys", "values"):
        torch.testing.assert_close(shared[name], kvp[name])
    for name in ("keys", "values", "features", "question_ids", "continuation_ids", "log_probs"):
        torch.testing.assert_close(shared[name], distillcache[name])
