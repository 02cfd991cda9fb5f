"""Compress once, answer K questions: the engine against kvpress's pipeline run per (config, question).

    uv run python benchmarks/multi_question_vs_pipeline.py [--questions 4] [--length 2048] [--threads 1]

Embedded model, one context made of K RULER samples (niah_single_2, each with its own key; as `kvbench
run --protocol multi-question` builds it), 8 presses x 4 ratios. The engine prefills the context once for
every config and decodes each question for all configs as one batch; the naive loop calls kvpress's
pipeline once per (config, question), a prefill each (the loop a user writes without kvbench's protocol).
Prints prefills, both times, the speed-up and the fraction of identical answers. A third timing, kvpress's
pipeline given the list of questions once per config, separates what the shared prefill buys from what
answering many questions per prefill buys.
"""

import argparse
import time

import torch
from kvpress import KVPressTextGenerationPipeline

from kvbench.bridge.adapter import attention_implementation
from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.engine import evaluate_sample
from kvbench.presses import config_press, needs_eager
from kvbench.tasks import load_combined_samples

PRESSES = ("knorm", "snapkv", "tova", "h2o", "streaming_llm", "expected_attention", "random", "keydiff")
RATIOS = (0.25, 0.5, 0.75, 0.9)


class PrefixPerQuestion(KVPressTextGenerationPipeline):
    """kvpress's pipeline given a list of questions, each with its own answer prefix. The pipeline takes one
    prefix for the whole list, and the parts of a multi-question sample each have theirs (the key they ask
    about is in it): this tokenizes each question with its prefix by the pipeline's own `preprocess`."""

    prefixes: list[str] = []

    def preprocess(self, context, questions, answer_prefix, max_context_length, enable_thinking=False):
        asked = [
            super(PrefixPerQuestion, self).preprocess(context, [q], p, max_context_length, enable_thinking)
            for q, p in zip(questions, self.prefixes, strict=True)
        ]
        return {
            "context_ids": asked[0]["context_ids"],
            "questions_ids": [a["questions_ids"][0] for a in asked],
        }


def pipeline_answers(model, tokenizer, sample, configs: list[Config], together: bool) -> list[str]:
    """kvpress's answers, config by config: one call per question, or one call given all of them; each
    question with its own answer prefix."""
    pipeline = PrefixPerQuestion(model=model, tokenizer=tokenizer, device=model.device)
    answers = []
    for config in configs:
        eager = needs_eager(config.press, dict(config.press_args))
        with attention_implementation(model, "eager" if eager else model.config._attn_implementation):
            asks = [sample.parts] if together else [[part] for part in sample.parts]
            for parts in asks:
                pipeline.prefixes = [part.answer_prefix for part in parts]
                output = pipeline(
                    sample.context,
                    questions=[part.question for part in parts],
                    press=config_press(config),
                    max_new_tokens=sample.max_new_tokens,
                )
                answers += output["answers"]
    return answers


def timed(work):
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=4, help="questions per context")
    parser.add_argument("--length", type=int, default=2048, help="tokens of the whole context")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = load_model()
    (sample,) = load_combined_samples(
        ["niah_single_2"],
        length=args.length,
        samples=1,
        questions=args.questions,
        seed=0,
        tokenizer=tokenizer,
    )
    protocol = (("questions", args.questions),)
    configs = [Config(press, ratio) for press in PRESSES for ratio in RATIOS]
    multi = [Config(c.press, c.ratio, protocol="multi-question", protocol_args=protocol) for c in configs]
    k = args.questions
    print(f"1 context of {k} questions x {len(configs)} configs, {args.threads} thread(s)")

    # CPU time too: on a machine shared with other work, wall time says more about the neighbours.
    engine, engine_s, engine_cpu = timed(
        lambda: [r["prediction"] for r in evaluate_sample(model, tokenizer, sample, multi, batch_configs=32)]
    )
    print(f"engine:                 {engine_s:7.1f} s wall, {engine_cpu:7.1f} s CPU, 1 prefill")
    together, together_s, together_cpu = timed(
        lambda: pipeline_answers(model, tokenizer, sample, configs, True)
    )
    print(
        f"pipeline, all questions:{together_s:7.1f} s wall, {together_cpu:7.1f} s CPU, "
        f"{len(configs)} prefills"
    )
    naive, naive_s, naive_cpu = timed(lambda: pipeline_answers(model, tokenizer, sample, configs, False))
    print(
        f"pipeline per question:  {naive_s:7.1f} s wall, {naive_cpu:7.1f} s CPU, {len(configs) * k} prefills"
    )
    print(f"speed-up over per question: {naive_s / engine_s:.1f}x wall, {naive_cpu / engine_cpu:.1f}x CPU")
    print(
        f"speed-up over all questions: {together_s / engine_s:.1f}x wall, "
        f"{together_cpu / engine_cpu:.1f}x CPU"
    )
    same = sum(a == b == c for a, b, c in zip(engine, together, naive, strict=True))
    print(
        f"identical answers (engine = pipeline with the list = pipeline per question): {same}/{len(engine)}"
    )
    # Which side departs: the engine is built to match the per-question loop (one pipeline call each).
    for name, other in (("per question", naive), ("the list", together)):
        agree = sum(a == b for a, b in zip(engine, other, strict=True))
        print(f"  engine = pipeline {name}: {agree}/{len(engine)}")
    pipelines_agree = sum(a == b for a, b in zip(naive, together, strict=True))
    print(f"  per question = the list: {pipelines_agree}/{len(engine)}")


if __name__ == "__main__":
    main()
