"""The batched decoder: many configs' caches of one sample as the rows of one batch, decoded greedily.

Caches are left-padded to a common length and masked, positions continue from the uncompressed context
length, and each stream stops on its own, as kvpress's pipeline does for one. A row may carry a press that
compresses its cache while tokens are fed (kvpress's DecodingPress semantics, run on that row alone by the
adapter): decode-time compression, and the streaming protocol's chunks.
"""

import contextlib

import torch

from kvbench.bridge.adapter import (
    BATCHED_ATTENTION,
    attention_hooks,
    attention_implementation,
    batched_logits,
    compress_rows,
    padded_linears,
    stop_token_ids,
)


class BatchedDecoder:
    """Feeds tokens to every row of a batched cache; rows with a press compress as they go.

    `masks` (layers, batch, entries), True on real entries, or None while nothing is padded;
    `presses` maps a batch row (as given, before any finished stream is dropped) to its DecodingPress;
    `needs_attentions`: the rows whose press scores with attention weights. `attention`: the attention
    implementation to decode with (default: the batched one; None keeps the model's, for a single run
    whose press patches the model's attention).
    """

    def __init__(
        self, model, cache, masks=None, presses=None, needs_attentions=(), attention=BATCHED_ATTENTION
    ):
        self.model, self.cache, self.attention = model, cache, attention
        self.presses = {row: press for row, press in (presses or {}).items() if press is not None}
        self.needs_attentions = set(needs_attentions)
        batch_size = cache.layers[0].keys.shape[0]
        if masks is None and self.presses:  # rows will shrink apart: keep track of what each holds
            length = cache.layers[0].keys.shape[2]
            masks = torch.ones(len(cache.layers), batch_size, length, dtype=torch.bool, device=model.device)
        self.masks = masks
        self.active = torch.arange(batch_size, device=model.device)  # original row of each batch row
        self.attended = False  # within `attending`

    @contextlib.contextmanager
    def attending(self):
        """The decoder's attention implementation and batched linear layers, for a block of feeds
        (switching them walks the model: decode and the streaming protocol hold them throughout)."""
        if self.attended:
            yield
            return
        attention = self.attention or self.model.config._attn_implementation
        self.attended = True
        try:
            with attention_implementation(self.model, attention), padded_linears(self.model):
                yield
        finally:
            self.attended = False

    def feed(self, input_ids: torch.Tensor, position: int | torch.Tensor, **kwargs) -> torch.Tensor:
        """Feed `input_ids` (batch or 1, n) on top of every row at positions from `position` on (one for
        all rows, or one per row); the logits of the last one, per row (of every one with
        `every_position=True`: the perplexity's)."""
        if self.masks is not None:
            new = self.masks.new_ones(*self.masks.shape[:2], input_ids.shape[1])
            self.masks = torch.cat([self.masks, new], dim=2)
        input_ids = input_ids.to(self.model.device).expand(len(self.active), -1)
        rows = [
            (row, self.presses[original], original in self.needs_attentions)
            for row, original in enumerate(self.active.tolist())
            if original in self.presses
        ]
        hooks = (
            attention_hooks(self.model, compress_rows(rows, self.masks), rotary=True)
            if rows
            else contextlib.nullcontext()
        )
        with self.attending(), hooks:
            return batched_logits(self.model, self.cache, input_ids, position, self.masks, **kwargs)

    def keep_rows(self, running: list[bool]) -> torch.Tensor:
        """Drop the finished rows, moving as few rows as possible; the rows kept."""
        order = compaction_order(row_groups(self.masks, len(self.active)), running)
        keep = torch.tensor(order, device=self.model.device)
        self.cache.batch_select_indices(keep)
        self.active = self.active[keep]
        if self.masks is not None:
            self.masks = self.masks[:, keep]
        return keep

    def real_entries(self) -> torch.Tensor:
        """(layers, batch): the entries each row holds per layer."""
        if self.masks is None:
            lengths = torch.tensor([[layer.keys.shape[2]] for layer in self.cache.layers])
            return lengths.expand(-1, len(self.active))
        return self.masks.sum(-1)

    def decode(
        self, question_ids: torch.Tensor, position: int | torch.Tensor, max_new_tokens: int
    ) -> list[list[int]]:
        """Feed the question on top of each row, then decode greedily; one token list per row. `position`:
        the question's first position, for all rows or one per row (rows that have seen different turns).

        As in the pipeline, a stream stops after emitting a stop token from its second token on (the
        pipeline never checks the first one).
        """
        stop_ids = torch.tensor(stop_token_ids(self.model), device=self.model.device)
        with self.attending():
            next_ids = self.feed(question_ids, position, logits_to_keep=1).argmax(-1)
            tokens = [[token] for token in next_ids.tolist()]
            position += question_ids.shape[1]
            for step in range(max_new_tokens - 1):
                if step > 0:
                    running = ~torch.isin(next_ids, stop_ids)
                    if not running.any():
                        break
                    if not running.all():
                        keep = self.keep_rows(running.tolist())
                        next_ids = next_ids[keep]
                        if torch.is_tensor(position):
                            position = position[keep]
                next_ids = self.feed(next_ids.unsqueeze(1), position + step).argmax(-1)
                for row, token in zip(self.active.tolist(), next_ids.tolist(), strict=True):
                    tokens[row].append(token)
        return tokens


def row_groups(masks: torch.Tensor | None, batch_size: int) -> list[int]:
    """A group id per batch row: rows with the same padding in every layer, which the attention serves
    with one call as long as they stay next to each other."""
    if masks is None:
        return [0] * batch_size
    padding = (~masks).sum(-1).T  # (batch, layers)
    return torch.unique(padding, dim=0, return_inverse=True)[1].tolist()


def compaction_order(groups: list[int], running: list[bool]) -> list[int]:
    """The rows that fill the compacted batch, slot by slot: the running rows, each group's rows kept
    together in the groups' current order, moving as few rows as possible (each move copies a row's whole
    cache; shifting every row after a finished one copied about half the batch per finished stream)."""
    order, start = [], 0
    for group in dict.fromkeys(groups):
        rows = [row for row, (g, run) in enumerate(zip(groups, running, strict=True)) if g == group and run]
        slots = range(start, start + len(rows))
        movers = iter(row for row in rows if row not in slots)
        order += [slot if slot in rows else next(movers) for slot in slots]
        start += len(rows)
    return order
