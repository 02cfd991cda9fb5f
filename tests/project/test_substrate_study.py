"""The substrate study's model and live-cache evaluation (benchmarks.substrate): sigmoid attention
against a plain float64 loop, softmax against torch's SDPA, gates of 1 and 0, the live cache against the
parallel
forward, eviction holding the budget, and training lowering the loss."""

import math

import pytest
import torch
import torch.nn.functional as F

from benchmarks.substrate import study
from benchmarks.substrate.model import SubstrateConfig, SubstrateLM, attend

TINY = dict(d_model=16, n_layer=2, n_head=2, context=12)


def tiny(**kw) -> SubstrateLM:
    torch.manual_seed(0)
    model = SubstrateLM(SubstrateConfig(**{**TINY, **kw})).eval()
    # Random gate weights, so the gates differ per token (they start constant).
    for block in model.blocks:
        if hasattr(block, "gate"):
            torch.nn.init.normal_(block.gate.weight, std=1.0)
            torch.nn.init.normal_(block.gate.bias, std=1.0)
    return model


def test_sigmoid_attention_matches_float64_loop():
    torch.manual_seed(1)
    b, h, t, d = 2, 3, 5, 4
    q, k, v = (torch.randn(b, h, t, d, dtype=torch.float64) for _ in range(3))
    lg = F.logsigmoid(torch.randn(b, h, t, dtype=torch.float64))
    bias = -math.log(t)
    visible = torch.ones(t, t, dtype=torch.bool).tril()
    out, _ = attend(q, k, v, "sigmoid", visible, lg, bias)
    ref = torch.zeros_like(out)
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                for j in range(i + 1):
                    s = sum(q[bi, hi, i, x].item() * k[bi, hi, j, x].item() for x in range(d)) / math.sqrt(d)
                    w = 1 / (1 + math.exp(-(s + lg[bi, hi, j].item() + bias)))
                    ref[bi, hi, i] += w * v[bi, hi, j]
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_softmax_attention_matches_sdpa():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    out, _ = attend(q, k, v, "softmax", torch.ones(7, 7, dtype=torch.bool).tril())
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("attention", ["softmax", "sigmoid"])
def test_gate_of_one_is_the_ungated_model(attention):
    gated = tiny(attention=attention, gate=True)
    plain = SubstrateLM(SubstrateConfig(**TINY, attention=attention, gate=False)).eval()
    missing, unexpected = plain.load_state_dict(gated.state_dict(), strict=False)
    assert not missing and all(".gate." in u for u in unexpected)
    ids = torch.randint(0, 256, (2, 10))
    ones = [torch.zeros(1, 1, 1)] * gated.cfg.n_layer
    with torch.no_grad():
        assert torch.equal(gated(ids, log_gate_override=ones)[0], plain(ids)[0])
        # and the learned gates do change the model (the test above is not vacuous)
        assert not torch.allclose(gated(ids)[0], plain(ids)[0])


@pytest.mark.parametrize("attention", ["softmax", "sigmoid"])
@pytest.mark.parametrize("rope", [True, False])
def test_gate_of_zero_removes_the_token(attention, rope):
    model = tiny(attention=attention, gate=True, rope=rope)
    ids = torch.randint(0, 256, (1, 10))
    j = 4
    overrides = []
    with torch.no_grad():
        # the learned gates of the full sequence, with token j's forced to 0 in every layer and head
        h = model.embed(ids)
        for block in model.blocks:
            x = block.ln1(h)
            lg = block.log_gate(x).clone()
            lg[..., j] = float("-inf")
            overrides.append(lg)
            q, k, v = block.heads(x, torch.arange(10))
            out, _ = attend(
                q, k, v, attention, torch.ones(10, 10, dtype=torch.bool).tril(), lg, model.cfg.sigmoid_bias
            )
            h = block.mix(h, out)
        gated_out = model(ids, log_gate_override=overrides)[0]
        keep = [i for i in range(10) if i != j]
        removed_out = model(ids[:, keep], positions=torch.tensor(keep))[0]
    torch.testing.assert_close(gated_out[:, keep], removed_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("attention", ["softmax", "sigmoid"])
def test_live_cache_without_eviction_is_the_parallel_forward(attention, gate):
    model = tiny(attention=attention, gate=gate)
    ids = torch.randint(0, 256, (3, 12))
    nll = study.live_cache_nll(model, ids, "none", 12)
    with torch.no_grad():
        logits = model(ids)[0]
    ref = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)


def test_batched_plans_equal_one_pass_each():
    model = tiny(attention="sigmoid", gate=True)
    ids = torch.randint(0, 256, (2, 12))
    plans = [("gate", 3), ("h2o", 4), ("keydiff", 5), ("window", 3), ("none", 12)]
    many = study.live_cache_nll_many(model, ids, plans)
    for (method, budget), got in zip(plans, many, strict=True):
        torch.testing.assert_close(got, study.live_cache_nll(model, ids, method, budget))


@pytest.mark.parametrize("method", ["gate", "h2o", "keydiff", "window"])
def test_eviction_holds_the_budget_and_changes_the_result(method):
    model = tiny(attention="softmax", gate=True)
    c = {
        "k": torch.randn(2, 2, 10, 8),
        "v": torch.randn(2, 2, 10, 8),
        "lg": F.logsigmoid(torch.randn(2, 2, 10)),
        "alive": torch.zeros(2, 2, 10, dtype=torch.bool),
        "acc": torch.rand(2, 2, 10),
    }
    budget = 4
    for t in range(10):
        c["alive"][..., t] = True
        if t + 1 > budget:
            before = c["lg"].masked_fill(~c["alive"], float("inf")).argmin(-1)
            study.evict_rows(c, [method, method], torch.tensor([budget, budget]), t)
            if method == "gate":  # the lowest live gate is the one that went
                assert not c["alive"].gather(-1, before.unsqueeze(-1)).any()
        assert (c["alive"].sum(-1) == min(t + 1, budget)).all()
    if method == "window":
        assert c["alive"][..., -budget:].all()
    ids = torch.randint(0, 256, (2, 12))
    assert not torch.allclose(
        study.live_cache_nll(model, ids, method, 3), study.live_cache_nll(model, ids, "none", 12)
    )


def test_gate_eviction_needs_a_gated_model():
    with pytest.raises(ValueError, match="gated"):
        study.live_cache_nll(tiny(gate=False), torch.randint(0, 256, (1, 12)), "gate", 4)


@pytest.mark.parametrize("attention", ["softmax", "sigmoid"])
def test_training_lowers_the_loss(attention):
    data = torch.tensor(list(b"abcdefgh" * 200))
    cfg = SubstrateConfig(**TINY, attention=attention, gate=True)
    settings = study.TrainSettings(steps=40, batch=4, lr=1e-2, warmup=2)
    torch.manual_seed(0)
    fresh = SubstrateLM(cfg).eval()
    windows = data[:48].view(4, 12)
    before = study.live_cache_nll(fresh, windows, "none", 12).mean()
    model, record = study.train_model(cfg, data, settings, seed=0)
    after = study.live_cache_nll(model, windows, "none", 12).mean()
    assert after < before - 1.0
    assert record["gate_mean_last20"] is not None
