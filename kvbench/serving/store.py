"""The prefix store: a tree of cached entries under a byte budget, and the eviction orders of the policies.

Every policy keeps a tree. A node is one cached entry, labelled under its parent: a block of token ids (the
radix tree of exact-prefix caching), a chunk id under the chunks before it (a Pegasus state: the KV of a chunk
as it is after that path), or a chunk id straight under the root (stateless chunk reuse: one entry per chunk
whatever precedes it). A node is usable only when every node above it is, so entries are evicted from the
tips (leaves) up, and dropping an entry drops what hangs below it (recursive path pruning).

Eviction picks, among the leaves that the request in flight does not use (pinned), the one of least priority:

- `lru`: the least recently used (vLLM's and SGLang's prefix caches);
- `rppc`: the least value = access frequency x latency saved / bytes (the abstract's three factors), ties by
  least recent use. Latency saved is what recomputing the entry would cost where it sits (a cost model of
  tokens and their offset: the later a chunk, the more it costs to recompute, the asymmetry the abstract
  names), less what recovering it costs when it is a transition.

A Pegasus state evicted from the store may be *demoted* instead of dropped: when the replay can express it as
a sparse transition from another held state of the same chunk (`demote` returns the transition's payload and
bytes), the node stays, smaller, and depends on that base; evicting the base drops its dependants too.

The store holds payloads it does not look into (tensors, in the replay); tests drive it with plain values.
"""

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

from kvbench.core.errors import BadInput

POLICIES = ("lru", "rppc")


@dataclasses.dataclass(eq=False)
class Node:
    label: Hashable
    parent: "Node | None"
    payload: Any = None
    nbytes: int = 0
    saved: float = 0.0  # latency saved by a hit (cost model units)
    hits: int = 1  # accesses: the insertion and every hit
    last: int = 0  # tick of the last access
    children: dict = dataclasses.field(default_factory=dict)
    base: "Node | None" = None  # a transition's base state
    dependants: list = dataclasses.field(default_factory=list)

    @property
    def is_transition(self) -> bool:
        return self.base is not None

    def path(self) -> tuple:
        labels, node = [], self
        while node is not None and node.parent is not None:
            labels.append(node.label)
            node = node.parent
        return tuple(reversed(labels))


class Store:
    """A tree of entries whose bytes never exceed `budget` (checked after every insert)."""

    def __init__(self, budget: int, eviction: str = "lru", demote: Callable[[Node], tuple] | None = None):
        if eviction not in POLICIES:
            raise BadInput(f"unknown eviction {eviction!r}: choose one of {', '.join(POLICIES)}")
        self.budget, self.eviction, self.demote = int(budget), eviction, demote
        self.root = Node(label=None, parent=None)
        self.held = 0
        self.tick = 0
        self.evicted: list[tuple] = []  # paths in eviction order (demotions included, tagged)
        self.pinned: set[int] = set()

    # ---- queries ----

    def match(self, labels) -> list[Node]:
        """The held nodes along `labels` from the root, as far as they go; each one touched (a hit)."""
        self.tick += 1
        found, node = [], self.root
        for label in labels:
            node = node.children.get(label)
            if node is None:
                break
            node.hits += 1
            node.last = self.tick
            found.append(node)
        return found

    def nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def priority(self, node: Node) -> tuple:
        if self.eviction == "lru":
            return (node.last,)
        return (node.hits * node.saved / max(node.nbytes, 1), node.last)

    # ---- changes ----

    def pin(self, nodes) -> None:
        self.pinned = {id(n) for n in nodes}

    def insert(self, parent: Node, label, payload, nbytes: int, saved: float) -> Node | None:
        """A new entry under `parent` (which must be held), after evicting what it takes to fit; None when it
        cannot fit (larger than the budget, or everything else is pinned)."""
        if label in parent.children:
            return parent.children[label]
        if not self.make_room(nbytes):
            return None
        self.tick += 1
        node = Node(label, parent, payload, int(nbytes), float(saved), last=self.tick)
        parent.children[label] = node
        self.held += node.nbytes
        self.pinned.add(id(node))  # what this request just made is what it goes on to use
        assert self.held <= self.budget
        return node

    def make_room(self, nbytes: int) -> bool:
        if nbytes > self.budget:
            return False
        while self.held + nbytes > self.budget:
            leaves = [n for n in self.nodes() if not n.children and id(n) not in self.pinned]
            if not leaves:
                return False
            self.evict(min(leaves, key=self.priority))
        return True

    def evict(self, node: Node) -> None:
        demoted = None
        if self.demote is not None and not node.is_transition:
            demoted = self.demote(node)
        if demoted is not None:
            payload, nbytes, base, saved = demoted
            if nbytes < node.nbytes:
                self.held += nbytes - node.nbytes
                node.payload, node.nbytes, node.base, node.saved = payload, int(nbytes), base, float(saved)
                base.dependants.append(node)
                self.evicted.append(("demoted", node.path()))
                return
        self.drop(node)

    def drop(self, node: Node) -> None:
        """`node`, what hangs below it and the transitions that depend on any of them, out of the store."""
        if node.parent is None or node.parent.children.get(node.label) is not node:
            return  # already dropped
        for child in list(node.children.values()):
            self.drop(child)
        for dependant in list(node.dependants):
            self.drop(dependant)
        if node.base is not None and node in node.base.dependants:
            node.base.dependants.remove(node)
        del node.parent.children[node.label]
        self.held -= node.nbytes
        self.evicted.append(("dropped", node.path()))
