"""Time live-cache perplexity with every config in one batch against one config at a time.

    uv run python benchmarks/perplexity_batching.py [--length 1024] [--every 64] [--texts 1]

Embedded model, prose texts (kvbench.harness.perplexity's generated source), 4 presses x 2 absolute budgets
(SnapKV with a window of half a chunk), read
`--every` tokens at a time with each cache compressed back to its budget after every chunk
(`perplexity.evaluate_text`). The batch reads each text once for all 8 configs; the reference reads it
once per config, through the same code with a batch of one. Both in the same run, batch first. Prints the
tokens per second per config both ways, their ratio, and the largest difference between the NLLs the two
ways measure (they must agree).
"""

import argparse
import time

from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.harness.perplexity import evaluate_text, generated_texts

PRESSES = ("streaming_llm", "knorm", "tova", "snapkv")
BUDGETS = (64, 256)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--length", type=int, default=1024, help="tokens per text")
    parser.add_argument("--every", type=int, default=64, help="tokens fed between compressions")
    parser.add_argument("--texts", type=int, default=1, help="prose texts")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    model, tokenizer = load_model(device=args.device)
    texts = generated_texts(tokenizer, "prose", args.texts, args.length, seed=0)
    protocol = {"protocol": "perplexity", "protocol_args": (("every", args.every),)}
    # SnapKV looks at the queries of the last chunk only: its window must be shorter than a chunk.
    args_of = {"snapkv": (("window_size", args.every // 2),)}
    configs = [
        Config(press, 0.0, args_of.get(press, ()), budget=budget, **protocol)
        for press in PRESSES
        for budget in BUDGETS
    ]
    evaluate_text(model, texts[0], configs[:1], args.every, 128)  # warm-up

    start = time.perf_counter()
    together = [evaluate_text(model, text, configs, args.every, 128) for text in texts]
    batch_s = time.perf_counter() - start
    start = time.perf_counter()
    alone = [
        [evaluate_text(model, text, [config], args.every, 128)[0] for config in configs] for text in texts
    ]
    alone_s = time.perf_counter() - start

    gap = max(
        abs(a["nll"] - b["nll"])
        for rows, ones in zip(together, alone, strict=True)
        for a, b in zip(rows, ones, strict=True)
    )
    rate = args.length * len(texts) * len(configs)  # config-tokens: tokens read x configs
    print(
        f"{len(configs)} configs ({', '.join(PRESSES)} x budgets {BUDGETS}), {len(texts)} text(s) of "
        f"{args.length} tokens, every {args.every}, {model.device}"
    )
    print(f"one batch:          {batch_s:7.1f} s  {rate / batch_s:7.1f} tokens/s per config, summed")
    print(f"a config at a time: {alone_s:7.1f} s  {rate / alone_s:7.1f} tokens/s per config, summed")
    print(f"speed-up: {alone_s / batch_s:.2f}x; largest NLL difference: {gap:.2e}")


if __name__ == "__main__":
    main()
