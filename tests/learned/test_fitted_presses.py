"""Fitted presses (kvbench.learned.fitted): each objective against an independent reference written here
from its paper's definition on a tiny random model, the shapes of the published artefacts, parity with
kvpress's own press class handed the same state through kvpress's own loader, and state made for other
weights refused in one line."""

import math

import pytest
import torch
from click.testing import CliRunner
from kvpress import ExpectedAttentionStatsPress, FastKVzipPress, KVzapPress, QFilterPress
from kvpress.presses import expected_attention_with_stats, fastkvzip_press, kvzap_press
from transformers import DynamicCache

from kvbench.cli import main
from kvbench.core import resources
from kvbench.learned.catalog import FITTED
from kvbench.learned.common import TrainingFileError
from kvbench.learned.fitted import (
    FitConfig,
    card_of,
    check_options,
    expected_attention_stats,
    fastkvzip,
    kvzap,
    qfilter,
    save_fitted,
)
from kvbench.presses import build_press

KVZAP_OPTIONS = {**FITTED["kvzap"].fit.options, "hidden_dim": 8, "epochs": 2, "tokens": 16}
FASTKVZIP_OPTIONS = {**FITTED["fastkvzip"].fit.options, "steps": 3, "batch_size": 32}
SMALL_OPTIONS = {"kvzap": KVZAP_OPTIONS, "fastkvzip": FASTKVZIP_OPTIONS}


@pytest.fixture
def model(tiny_model, one_thread):
    return tiny_model(max_position_embeddings=4096, initializer_range=0.1)


@pytest.fixture
def contexts():
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, 128, (1, n), generator=generator) for n in (24, 31, 40)]


class Tokenizer:
    """What kvzap's fit reads of a tokenizer: KVzip's request to repeat the context, without a template."""

    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 128 for c in text]


def reference_attention(model, layer: int, x: torch.Tensor):
    """The layer's causal attention weights (heads, T, T) and values (kv_heads, T, d) from its input x (T,
    hidden), computed from the weights: q, k, v projections, RoPE, softmax(q k / sqrt(d))."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attention = model.model.layers[layer].self_attn
    config, length = model.config, x.shape[0]
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = attention.q_proj(x).view(length, heads, d).transpose(0, 1)
    k = attention.k_proj(x).view(length, kv_heads, d).transpose(0, 1)
    v = attention.v_proj(x).view(length, kv_heads, d).transpose(0, 1)
    cos, sin = model.model.rotary_emb(x[None], torch.arange(length)[None])
    q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    k = k[0].repeat_interleave(heads // kv_heads, dim=0)
    logits = q[0] @ k.transpose(1, 2) / math.sqrt(d)
    logits = logits.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    return logits.softmax(dim=-1), v, q[0]


def attention_inputs(model, ids):
    """Each layer's attention input (T, hidden) in one forward."""
    inputs = {}
    hooks = [
        layer.self_attn.register_forward_pre_hook(
            lambda module, args, kwargs: inputs.__setitem__(module.layer_idx, kwargs["hidden_states"][0]),
            with_kwargs=True,
        )
        for layer in model.model.layers
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return inputs


def test_the_q_filter_is_the_signed_principal_direction_of_the_groups_queries(model, contexts):
    tensors, _ = qfilter.fit(model, None, contexts, {})
    config = model.config
    layers, kv_heads, d = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    assert tensors["q_filters"].shape == (layers, kv_heads, d)  # nthngdy/<model>_qfilt's shape
    group = config.num_attention_heads // kv_heads
    for layer in range(layers):
        queries = []
        with torch.no_grad():
            for ids in contexts:
                _, _, q = reference_attention(model, layer, attention_inputs(model, ids)[layer])
                queries.append(q)
        queries = torch.cat(queries, dim=1).double()  # (heads, tokens, d)
        for head in range(kv_heads):
            stacked = queries[head * group : (head + 1) * group].reshape(-1, d)
            u, _, vh = torch.linalg.svd(stacked, full_matrices=False)
            positive = torch.sign(u[:, 0].sum()) * vh[0]  # the paper's v+: queries project positively
            assert (stacked @ positive).mean() > 0
            # kvpress scores -(filter . k): the filter is -v+, so keys of high <k, v+> are kept
            torch.testing.assert_close(
                tensors["q_filters"][layer, head].double(), -positive, atol=1e-4, rtol=0
            )


def test_the_kvzap_target_is_kvzip_plus_computed_from_the_weights(model, contexts):
    repeat = [5, 6, 7]
    ids = contexts[0]
    length = ids.shape[1]
    hidden, targets = kvzap.kvzip_plus_targets(model, ids, repeat)
    config = model.config
    assert hidden.shape == (config.num_hidden_layers, length, config.hidden_size)
    assert targets.shape == (config.num_hidden_layers, length, config.num_key_value_heads)
    full = torch.cat([ids[0], torch.tensor(repeat), ids[0]])[None]
    start = length + len(repeat)
    inputs = attention_inputs(model, full)
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    for layer in range(config.num_hidden_layers):
        x = inputs[layer]
        with torch.no_grad():
            weights, values, _ = reference_attention(model, layer, x)
            w_o = model.model.layers[layer].self_attn.o_proj.weight  # (hidden, heads * d)
            expected = torch.empty(length, kv_heads)
            for j in range(length):
                for kv in range(kv_heads):
                    best = 0.0
                    for h in range(kv * heads // kv_heads, (kv + 1) * heads // kv_heads):
                        written = (w_o[:, h * d : (h + 1) * d] @ values[kv, j]).norm()
                        for t in range(start, full.shape[1]):
                            best = max(best, float(weights[h, t, j] * written / x[t].norm()))
                    expected[j, kv] = math.log(best)
        torch.testing.assert_close(hidden[layer], x[:length].float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(targets[layer], expected, atol=1e-4, rtol=1e-4)


def test_the_fastkvzip_target_is_kvzips_score_computed_from_the_weights(model, contexts):
    """KVzip's score of context token j in a KV head: the most attention any query of the repeat request and
    the repeated context pays it, over the group's query heads; the gate reads j's attention input."""
    repeat = [5, 6, 7]
    ids = contexts[1]
    length = ids.shape[1]
    hidden, scores = fastkvzip.kvzip_targets(model, ids, repeat)
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    assert hidden.shape == (config.num_hidden_layers, length, config.hidden_size)
    assert scores.shape == (config.num_hidden_layers, kv_heads, length)
    full = torch.cat([ids[0], torch.tensor(repeat), ids[0]])[None]
    inputs = attention_inputs(model, full)
    for layer in range(config.num_hidden_layers):
        with torch.no_grad():
            weights, _, _ = reference_attention(model, layer, inputs[layer])
        expected = torch.empty(kv_heads, length)
        for kv in range(kv_heads):
            group = weights[kv * heads // kv_heads : (kv + 1) * heads // kv_heads]
            for j in range(length):
                expected[kv, j] = max(
                    float(group[h, t, j]) for h in range(len(group)) for t in range(length, full.shape[1])
                )
        torch.testing.assert_close(hidden[layer], inputs[layer][:length].float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(scores[layer], expected, atol=1e-5, rtol=1e-5)


def reference_gate(state: dict, x: torch.Tensor) -> torch.Tensor:
    """The paper's low-rank sink attention gate on x (N, hidden): for each KV head and each of its group's
    queries q_g(x_j), exp(q_g.k_j / sqrt(d) + b_g) over itself plus the sink keys' exp(q_g.k_s / sqrt(d)),
    averaged over the group; q and k RMS-normalised per head (eps 1e-6) and scaled by their norm weights."""
    kv_heads, _, sink, d = state["k_base"].shape
    group = state["b"].shape[-1]

    def rms(v, weight):
        return v / (v.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * weight

    q = rms(
        (x @ state["q_proj.weight"].T + state["q_proj.bias"]).view(-1, kv_heads, group, d),
        state["q_norm.weight"],
    )
    k = rms((x @ state["k_proj.weight"].T).view(-1, kv_heads, d), state["k_norm.weight"])
    scores = torch.empty(kv_heads, x.shape[0])
    for head in range(kv_heads):
        for j in range(x.shape[0]):
            total = 0.0
            for g in range(group):
                own = math.exp(
                    float(q[j, head, g] @ k[j, head]) / math.sqrt(d) + float(state["b"][head, 0, g])
                )
                sinks = sum(
                    math.exp(float(q[j, head, g] @ state["k_base"][head, 0, s]) / math.sqrt(d))
                    for s in range(sink)
                )
                total += own / (own + sinks)
            scores[head, j] = total / group
    return scores


def test_the_fastkvzip_objective_is_the_binary_cross_entropy_of_the_papers_gate(model, contexts):
    """The published gate's shapes, and the loss the fit minimises: each layer's gate output against the
    KVzip score, binary cross-entropy, mean over tokens, summed over KV heads."""
    tensors, validation = fastkvzip.fit(model, Tokenizer(), contexts, FASTKVZIP_OPTIONS)
    config = model.config
    kv_heads, group = config.num_key_value_heads, config.num_attention_heads // config.num_key_value_heads
    states = fastkvzip.gate_states(tensors)
    assert len(states) == config.num_hidden_layers
    assert {key: tuple(value.shape) for key, value in states[0].items()} == {  # q<group>_dim16_sink16
        "q_proj.weight": (kv_heads * group * 16, config.hidden_size),
        "q_proj.bias": (kv_heads * group * 16,),
        "k_proj.weight": (kv_heads * 16, config.hidden_size),
        "q_norm.weight": (16,),
        "k_norm.weight": (16,),
        "k_base": (kv_heads, 1, 16, 16),
        "b": (kv_heads, 1, group),
    }
    assert validation["train_tokens"] == sum(ids.shape[1] for ids in contexts)  # under 100: none held out
    generator = torch.Generator().manual_seed(11)
    state = {
        key: value + 0.1 * torch.randn(value.shape, generator=generator) for key, value in states[0].items()
    }
    gate = fastkvzip.gates_for(1, config.hidden_size, kv_heads, group, 16, 16, torch.float32)[0]
    gate.load_state_dict(state)
    x = torch.randn(12, config.hidden_size, generator=generator)
    y = torch.rand(kv_heads, 12, generator=generator)
    p = reference_gate(state, x)
    expected = -(y * p.log() + (1 - y) * (1 - p).log()).mean(dim=1).sum()
    with torch.no_grad():
        torch.testing.assert_close(gate(x[None])[0], p, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fastkvzip.gate_loss(gate, x, y), expected, atol=1e-5, rtol=1e-5)


def test_fastkvzip_keeps_what_kvpress_keeps_with_the_same_gates(model, contexts, tmp_path, monkeypatch):
    """The fitted gates handed to kvpress's own loader (as the published file's "module" list, its sink read
    from the file's name) and through kvbench's press evict the same entries."""
    tensors = write_state(model, contexts, tmp_path, "fastkvzip")
    monkeypatch.setattr(model.config, "_name_or_path", "tiny")  # kvpress's loader needs a name
    monkeypatch.setattr(
        fastkvzip_press,
        "get_gate_weight",
        lambda name: (fastkvzip.gate_states(tensors), "tiny/q2_dim16_sink16.pt"),
    )
    ids = torch.randint(0, 128, (1, 60), generator=torch.Generator().manual_seed(12))
    evicted = []
    for press in (
        build_press("fastkvzip", 0.5, weights=str(tmp_path)),
        FastKVzipPress(compression_ratio=0.5),
    ):
        compressed(model, press, ids)
        evicted.append([layer.self_attn.masked_key_indices for layer in model.model.layers])
        assert sum(len(indices[0]) for indices in evicted[-1]) == int(0.5 * press.score_val.numel())
    for ours, theirs in zip(*evicted, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_the_linear_surrogate_is_sklearns_ridge():
    sklearn = pytest.importorskip("sklearn.linear_model")
    generator = torch.Generator().manual_seed(4)
    x, y = torch.randn(50, 6, generator=generator), torch.randn(50, 3, generator=generator)
    weight, bias = kvzap.ridge(x, y, alpha=1.0)
    reference = sklearn.Ridge(alpha=1.0).fit(x.numpy(), y.numpy())
    torch.testing.assert_close(
        weight, torch.tensor(reference.coef_, dtype=weight.dtype), atol=1e-6, rtol=1e-6
    )
    torch.testing.assert_close(
        bias, torch.tensor(reference.intercept_, dtype=bias.dtype), atol=1e-6, rtol=1e-6
    )


def test_the_query_statistics_are_kvpress_collectors(model, contexts):
    """kvpress's own capture (patch_rotary_embedding: the queries before RoPE), then its mean and
    covariance as collect_queries computes them."""
    n_sink = 4
    tensors, validation = expected_attention_stats.fit(model, None, contexts, {"n_sink": n_sink})
    collected = []
    for ids in contexts:
        with torch.no_grad(), expected_attention_with_stats.patch_rotary_embedding(model) as captured:
            model(input_ids=ids)
        collected.append(torch.cat(captured, dim=0)[:, :, n_sink:, :])
    queries = torch.cat(collected, dim=-2).double()
    mean = queries.mean(dim=-2)
    centred = queries - mean.unsqueeze(-2)
    cov = centred.transpose(-2, -1) @ centred / (queries.shape[-2] - 1)
    assert validation["queries"] == queries.shape[-2]
    torch.testing.assert_close(tensors["query_mean"].double(), mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tensors["query_cov"].double(), cov, atol=1e-4, rtol=1e-4)
    halved, _ = expected_attention_stats.fit(model, None, contexts, {"n_sink": n_sink, "bfloat16": True})
    assert all(halved[key].dtype == torch.bfloat16 for key in tensors)
    assert all(torch.equal(halved[key], tensors[key].to(torch.bfloat16)) for key in tensors)


def write_state(model, contexts, directory, name: str) -> dict:
    fit = {
        "qfilter": qfilter.fit,
        "kvzap": kvzap.fit,
        "fastkvzip": fastkvzip.fit,
        "expected_attention_stats": expected_attention_stats.fit,
    }[name]
    options = check_options(name, SMALL_OPTIONS.get(name, {}))
    tensors, validation = fit(model, Tokenizer(), contexts, options)
    save_fitted(
        directory, name, tensors, card_of(model, FitConfig(options=options), contexts, 0.0, validation)
    )
    return tensors


def compressed(model, press, ids) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=cache)
    return cache


def assert_same_caches(first: DynamicCache, second: DynamicCache):
    for a, b in zip(first.layers, second.layers, strict=True):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(a.keys, b.keys, atol=0, rtol=0)
        torch.testing.assert_close(a.values, b.values, atol=0, rtol=0)


def test_qfilter_keeps_what_kvpress_keeps_with_the_same_filters(model, contexts, tmp_path, monkeypatch):
    tensors = write_state(model, contexts, tmp_path, "qfilter")
    monkeypatch.setattr(QFilterPress, "load_q_filters", staticmethod(lambda name: tensors["q_filters"]))
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(5))
    ours = compressed(model, build_press("qfilter", 0.5, weights=str(tmp_path)), ids)
    theirs = compressed(model, QFilterPress(compression_ratio=0.5), ids)
    assert ours.layers[0].keys.shape[2] == 15
    assert_same_caches(ours, theirs)


@pytest.mark.parametrize("kind", kvzap.TYPES)
def test_kvzap_keeps_what_kvpress_keeps_with_the_same_surrogate(model, contexts, tmp_path, monkeypatch, kind):
    tensors = write_state(model, contexts, tmp_path, "kvzap")
    config = model.config
    published = kvzap.surrogate(
        kind, config.num_hidden_layers, config.hidden_size, config.num_key_value_heads, 8
    )
    state = {key.split(".", 1)[1]: value for key, value in tensors.items() if key.startswith(f"{kind}.")}
    published.load_state_dict(state)  # the published artefact's module names and shapes, exactly
    sizes = {key: tuple(value.shape) for key, value in state.items() if key.startswith("layers.0.")}
    hidden, heads = config.hidden_size, config.num_key_value_heads
    if kind == "linear":
        assert sizes == {"layers.0.weight": (heads, hidden), "layers.0.bias": (heads,)}
    else:
        assert sizes["layers.0.0.weight"] == (8, hidden) and sizes["layers.0.2.weight"] == (heads, 8)
    monkeypatch.setattr(kvzap_press.KVzapModel, "from_pretrained", classmethod(lambda cls, name: published))
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(6))
    ours = compressed(model, build_press("kvzap", 0.5, weights=str(tmp_path), model_type=kind), ids)
    theirs = compressed(model, KVzapPress(compression_ratio=0.5, model_type=kind), ids)
    assert_same_caches(ours, theirs)


def test_expected_attention_stats_keeps_what_kvpress_keeps_with_the_same_statistics(
    model, contexts, tmp_path
):
    tensors = write_state(model, contexts, tmp_path, "expected_attention_stats")
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(7))
    ours = compressed(model, build_press("expected_attention_stats", 0.5, weights=str(tmp_path)), ids)
    theirs = ExpectedAttentionStatsPress(compression_ratio=0.5)
    theirs.mu, theirs.cov = tensors["query_mean"], tensors["query_cov"]  # its loader then loads nothing
    assert_same_caches(ours, compressed(model, theirs, ids))


def test_the_kvzap_fit_predicts_held_out_prompts_better_than_their_mean(model):
    generator = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 128, (1, 40), generator=generator) for _ in range(10)]  # the tenth held out
    _, validation = kvzap.fit(model, Tokenizer(), prompts, {**KVZAP_OPTIONS, "tokens": 40, "epochs": 30})
    assert validation["held_out_tokens"] == 40 and validation["train_tokens"] == 9 * 40
    assert validation["r2_linear"] > 0  # better than predicting the held-out mean


@pytest.mark.parametrize("name", ["qfilter", "kvzap", "fastkvzip", "expected_attention_stats"])
def test_state_fitted_for_other_weights_is_refused_in_one_line(
    tiny_model, contexts, tmp_path, name, one_thread
):
    fitted_for = tiny_model(max_position_embeddings=4096, initializer_range=0.1)
    write_state(fitted_for, contexts, tmp_path, name)
    other = tiny_model(max_position_embeddings=4096, initializer_range=0.2)  # same shape, other weights
    press = build_press(name, 0.5, weights=str(tmp_path))
    with pytest.raises(TrainingFileError) as error:
        press.post_init_from_model(other)
    message = str(error.value)
    assert "\n" not in message and f"{name} state at {tmp_path} were made for" in message
    assert f"kvbench fit {name}" in message


def test_fit_refuses_bad_options_in_one_line(tmp_path):
    for args, expected in [
        (["kvzap", "--option", "depth=3"], "fit kvzap takes no option 'depth'"),
        (["kvzap", "--option", "epochs=many"], "epochs='many' is not int"),
        (["qfilter", "--seed", "5"], "must be at least 1000, got 5"),
        (["fastkvzip", "--option", "dim=-1"], "dim='-1' must be a finite number above 0"),
        (["fastkvzip", "--option", "dim=0"], "dim='0' must be a finite number above 0"),
        (["fastkvzip", "--option", "lr=nan"], "lr='nan' must be a finite number above 0"),
        (["kvzap", "--option", "lr=inf"], "lr='inf' must be a finite number above 0"),
        (["expected_attention_stats", "--option", "bfloat16=yess"], "bfloat16='yess' is not true or false"),
        (["expected_attention_stats", "--option", "bfloat16=yes"], "bfloat16='yes' is not true or false"),
        (["expected_attention_stats", "--option", "bfloat16=1"], "bfloat16='1' is not true or false"),
        (["expected_attention_stats", "--option", "bfloat16=nan"], "bfloat16='nan' is not true or false"),
    ]:
        result = CliRunner().invoke(main, ["fit", *args, "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and expected in result.output, result.output
        assert not (tmp_path / "out").exists()


def run_cli(model_dir, out, *press_args):
    args = ["run", "--press", "qfilter", "--ratio", "0.5", "--model", model_dir, "--task", "niah_single_1"]
    args += ["--length", "512", "--samples", "1", "--out", str(out)]
    for pair in press_args:
        args += ["--press-arg", pair]
    return CliRunner().invoke(main, args)


def test_the_shipped_state_on_another_model_is_one_line_exit_2(tiny_llama_dir, tmp_path):
    """The embedded model's shipped filters refused on the tiny model (its weights differ), and a model
    without fitted state told the command that makes it; nothing written."""
    shipped = resources.learned_state_dir("qfilter", "smollm2-135m")
    cases = {
        "shipped": (
            (f"weights={shipped}",),
            "were made for smollm2-135m (30 layers x 3 KV heads x 64, weights",
        ),
        "none": ((), "make it with: kvbench fit qfilter --model"),
    }
    for case, (press_args, message) in cases.items():
        result = run_cli(tiny_llama_dir, tmp_path / case, *press_args)
        assert result.exit_code == 2, (case, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert not (tmp_path / case / "rows.jsonl").exists()


def test_weights_hub_keeps_kvpress_own_download(model, monkeypatch):
    """`weights=hub`: kvpress's loader runs as it is (here given filters), and an unreachable hub is one
    line that names the fit command."""
    from kvbench.bridge import models
    from kvbench.core.errors import UnknownPress

    filters = torch.randn(2, 2, 16, generator=torch.Generator().manual_seed(9))
    monkeypatch.setattr(QFilterPress, "load_q_filters", staticmethod(lambda name: filters))
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(10))
    ours = compressed(model, build_press("qfilter", 0.5, weights="hub"), ids)
    assert_same_caches(ours, compressed(model, QFilterPress(compression_ratio=0.5), ids))
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UnknownPress, match="not reachable; fit it instead: kvbench fit qfilter --model tiny"):
        build_press("qfilter", 0.5, weights="hub").check_for_model("tiny")


def test_duo_attention_scores_are_kvpress_on_the_fly_calibration(tiny_model, embedded_tokenizer, monkeypatch):
    """kvpress's own calibration (duo_attention_on_the_fly), its dataset and tokenizer replaced by our texts,
    gives the head scores the fit gives; kvpress's press then builds its streaming mask from them."""
    import pandas
    from kvpress.presses import duo_attention_press

    from kvbench.learned.fitted import duo_attention

    model = tiny_model(
        vocab_size=len(embedded_tokenizer), max_position_embeddings=4096, initializer_range=0.1
    )
    texts = ["The river runs north past the stone hill.", "Three cats and one dog sleep by the east wall."]
    table = pandas.DataFrame({"chapter": texts})
    monkeypatch.setattr(
        duo_attention_press, "load_dataset", lambda *a, **k: type("D", (), {"to_pandas": lambda s: table})()
    )
    monkeypatch.setattr(duo_attention_press.AutoTokenizer, "from_pretrained", lambda name: embedded_tokenizer)
    expected = duo_attention_press.duo_attention_on_the_fly.__wrapped__(model, num_samples=2, q_len=500)
    contexts = [embedded_tokenizer(text, return_tensors="pt").input_ids for text in texts]
    tensors, _ = duo_attention.fit(model, embedded_tokenizer, contexts, {"q_len": 500})
    assert tensors["head_scores"].shape == (model.config.num_hidden_layers, model.config.num_key_value_heads)
    torch.testing.assert_close(tensors["head_scores"], torch.tensor(expected), atol=1e-5, rtol=1e-5)
    press = duo_attention.FittedDuoAttentionPress(head_compression_ratio=0.5)
    press.install(tensors, model)
    lowest = tensors["head_scores"].flatten().argsort()[:2]
    assert press.streaming_mask.flatten()[lowest].all() and int(press.streaming_mask.sum()) == 2
    assert (press.sink_size, press.recent_size) == (128, 256)


SHIPPED_FITS = sorted(
    (card.parent.parent.name, card.parent.name)
    for name in FITTED
    for card in resources.shipped("presses", name).glob("*/card.json")
)


@pytest.mark.parametrize(("name", "model"), SHIPPED_FITS, ids=["/".join(fit) for fit in SHIPPED_FITS])
def test_each_shipped_fitted_state_is_of_its_model_and_its_card_holds_its_digest(name, model):
    """Every shipped fitted state (presses/NAME/MODEL/): its card names its method and a built-in model with
    that model's pinned shape, and the sha256 it records is its state file's, so a copy that changed or a
    state fitted for another shape is caught here rather than refused at a user's run."""
    import hashlib
    import json

    from kvbench.bridge import builtin

    folder = resources.learned_state_dir(name, model)
    card = json.loads((folder / "card.json").read_text())
    pinned = builtin.BUILTIN[model]
    assert card["method"] == name and card["model"]["name"] == model
    shape = (card["model"]["num_layers"], card["model"]["num_kv_heads"], card["model"]["head_dim"])
    assert shape == (pinned.layers, pinned.kv_heads, pinned.head_dim)
    state = (folder / FITTED[name].state_file).read_bytes()
    assert card["state_sha256"] == hashlib.sha256(state).hexdigest()
