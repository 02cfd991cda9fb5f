"""Registries that users extend (presses, task families, metrics), and the user's own objects named by
target (`module:Name`, `path/to/file.py:Name`) with where they come from (`Source`).

A `Registry` maps names to entries. kvbench's built-ins are registered with `register`, the call a user's
code makes too; installed packages add entries through entry points of the group `kvbench.<kind>`
(`[project.entry-points."kvbench.presses"] mine = "my_pkg.press:MyPress"`), which are listed by name
without importing anything and loaded the first time their name is looked up. A plugin that fails to load,
or loads something that is not an entry of its kind, is a `PluginError`: one line naming the plugin.
"""

import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Generic, TypeVar

from kvbench.core.errors import BadInput

T = TypeVar("T")


class PluginError(BadInput):
    """A plugin (an entry point, a `module:Class` or `file.py:Class` target) that cannot be used: it does
    not import, or what it names is not an entry of its kind."""


# What a user's code may raise that kvbench says in one line: any error, and the exits a library never
# means (sys.exit, a stray GeneratorExit); KeyboardInterrupt still stops the run.
USER_CODE_FAILURES = (Exception, SystemExit, GeneratorExit)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class Registry(Mapping[str, T], Generic[T]):
    """Entries of one kind by name, built-ins first, then the entry points of `kvbench.<kind>`.

    `adapt(name, loaded)` turns what an entry point loads into an entry, raising PluginError (or BadInput)
    when it is not one; it is applied to entry points only, `register` takes entries as they are."""

    def __init__(self, kind: str, adapt: Callable[[str, object], T] | None = None):
        self.kind = kind
        self.adapt = adapt
        self.entries: dict[str, T] = {}
        self.points: dict[str, EntryPoint] | None = None  # listed on first use
        # A plugin that failed to load, by name, with its entry point: asked again, it fails again without
        # importing anew (a report asks once per row); an entry point listed anew is tried anew.
        self.failed: dict[str, tuple[EntryPoint, PluginError]] = {}

    @property
    def group(self) -> str:
        return f"kvbench.{self.kind}"

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add `entry` under `name`; BadInput if the name is taken and `replace` is not given."""
        if not replace and name in self.entries:
            raise BadInput(f"{self.kind} {name!r} is registered already")
        self.entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        self.entries.pop(name, None)

    def plugin_points(self) -> dict[str, EntryPoint]:
        """The entry points of the group not yet loaded, by name (a name kvbench registers itself wins)."""
        if self.points is None:
            self.points = {point.name: point for point in entry_points(group=self.group)}
        return {name: point for name, point in self.points.items() if name not in self.entries}

    def load_plugin(self, name: str) -> T:
        """The entry of plugin `name`, loaded and registered; PluginError in one line where it does not
        load or is not an entry of this kind."""
        point = self.plugin_points()[name]
        if name in self.failed and self.failed[name][0] is point:
            raise self.failed[name][1]
        try:
            return self.register(name, self.adapted(name, point))
        except PluginError as error:
            self.failed[name] = (point, error)
            raise

    def adapted(self, name: str, point: EntryPoint) -> T:
        where = f"{self.kind} plugin {name!r} ({point.value}"
        where += f", from {point.dist.name})" if point.dist is not None else ")"
        try:
            loaded = point.load()
        except USER_CODE_FAILURES as error:  # a plugin may fail in any way, sys.exit too
            raise PluginError(f"{where} failed to load: {first_line(error)}") from None
        try:
            return self.adapt(name, loaded) if self.adapt else loaded
        except BadInput as error:
            raise PluginError(f"{where}: {error}") from None

    def loaded(self) -> dict[str, T]:
        """Every entry that loads, by name: a plugin that fails is left out (`broken` says why), so one
        broken plugin does not stop what never uses it."""
        entries = {}
        for name in list(self):
            try:
                entries[name] = self[name]
            except PluginError:
                continue
        return entries

    def broken(self) -> list[PluginError]:
        """Why each plugin that failed to load failed, one line each."""
        return [error for _, error in self.failed.values()]

    def __getitem__(self, name: str) -> T:
        if name in self.entries:
            return self.entries[name]
        if isinstance(name, str) and name in self.plugin_points():
            return self.load_plugin(name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self.entries or (isinstance(name, str) and name in self.plugin_points())

    def __iter__(self) -> Iterator[str]:
        yield from list(self.entries)
        yield from list(self.plugin_points())

    def __len__(self) -> int:
        return len(self.entries) + len(self.plugin_points())


@dataclass(frozen=True)
class Source:
    """Where a user's object comes from, as rows record it: the target that loads it again
    (`file.py:Name` or `module:Name`), its module and qualified name, the file that defines it and that
    file's sha256, the version of the installed package it belongs to (None outside one), the sha256 of the
    user's other files it uses (`uses`: a factory's press class imported from another file), and the
    arguments a `functools.partial` binds (`bound`)."""

    target: str
    module: str
    qualname: str
    file: str | None
    sha256: str | None
    package: str | None = None
    version: str | None = None
    uses: tuple[tuple[str, str], ...] = ()
    bound: str | None = None

    @property
    def digest(self) -> str:
        """A short digest of the defining file's bytes (else of the target), of the files it uses and the
        arguments it binds: what results are keyed by, so an edit to any of them gives new rows."""
        own = self.sha256 or hashlib.sha256(self.target.encode()).hexdigest()
        if not self.uses and self.bound is None:
            return own[:12]  # as rows were keyed before `uses` and `bound` existed
        return hashlib.sha256(repr((own, self.uses, self.bound)).encode()).hexdigest()[:12]

    def as_dict(self) -> dict:
        return {key: value for key, value in dataclasses.asdict(self).items() if value not in (None, ())}


def is_target(text: str) -> bool:
    """Whether `text` names an object by `module:Name` or `path/to/file.py:Name`."""
    module, sep, name = text.rpartition(":")
    return bool(sep and module and name)


def load_target(target: str, kind: str) -> object:
    """The object `target` names (`module:Name`, or `file.py:Name` loaded as a module of its own);
    PluginError in one line if the file or module does not import or lacks the name (`kind`, e.g. "press",
    names what was asked for)."""
    module_name, _, name = target.rpartition(":")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        module = load_file_module(Path(module_name), target, kind)
    else:
        try:
            module = importlib.import_module(module_name)
        except USER_CODE_FAILURES as error:  # any failure, sys.exit too: one line
            raise PluginError(
                f"{kind} {target!r}: cannot import {module_name!r}: {first_line(error)}"
            ) from None
    found = module
    for part in name.split("."):
        if not hasattr(found, part):
            raise PluginError(f"{kind} {target!r}: {module_name!r} has no {name!r}")
        found = getattr(found, part)
    return found


def load_file_module(path: Path, target: str, kind: str) -> types.ModuleType:
    """The Python file at `path` imported as a module named after its path and bytes, so that two files
    (even of one name and content), or an edited file, are modules of their own (kept in sys.modules:
    dataclasses and pickling look classes up there). The module runs the very bytes its name is keyed by;
    asked again after an edit to a user's file it imports (a factory's press class), it runs again, and
    that file is imported anew."""
    if not path.is_file():
        raise PluginError(f"{kind} {target!r}: {str(path)!r} is not a file")
    path = path.resolve()
    text = path.read_bytes()
    digest = hashlib.sha256(str(path).encode() + b"\0" + text).hexdigest()[:12]
    module_name = f"kvbench_user_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    forget_edited_modules()
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{kind} {target!r}: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.modules[module_name] = module
    try:
        exec(compile(text, str(path), "exec"), module.__dict__)
    except USER_CODE_FAILURES as error:
        del sys.modules[module_name]
        raise PluginError(f"{kind} {target!r}: {str(path)!r} fails to import: {first_line(error)}") from None
    imported = [sys.modules[name] for name in set(sys.modules) - before if is_users(sys.modules[name])]
    LOADED[module_name] = {used: file_sha(used) for used in [*user_modules(module), *imported]}
    return module


# The user's modules that each module `load_file_module` ran imports or holds, with the sha256 of their
# files then.
LOADED: dict[str, dict[types.ModuleType, str | None]] = {}


def forget_edited_modules() -> None:
    """Take out of sys.modules each user module whose file was edited since a module of `load_file_module`
    ran it, and that module: asked for again, both run the file's new text. The edited file's bytecode cache
    goes too: Python trusts a cache whose source has the same size and modification second, so an edit
    within that second would import the old code."""
    for name, ran in list(LOADED.items()):
        edited = [module for module, sha in ran.items() if file_sha(module) != sha]
        if edited:
            del LOADED[name]
            sys.modules.pop(name, None)
            for module in edited:
                if sys.modules.get(module.__name__) is module:
                    del sys.modules[module.__name__]
                cached = getattr(module, "__cached__", None)
                if cached:
                    Path(cached).unlink(missing_ok=True)


def source_of(obj: object, target: str | None = None) -> Source:
    """Where `obj` (a class or function, or a `functools.partial` of one) is defined; `target` defaults to
    `module:qualname`, or `file.py:qualname` for a class of a file loaded by `load_target` or of a script
    (`__main__`). PluginError where a user's file that `obj` runs was edited since this process first saw
    `obj`: the code that would run is not the text the rows would be keyed by."""
    bound = None
    while isinstance(obj, functools.partial):
        bound = repr((obj.args, sorted(obj.keywords.items()), bound))
        obj = obj.func
    module_name = getattr(obj, "__module__", "") or ""
    qualname = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    file = defining_file(obj)
    sha = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file else None
    by_file = module_name == "__main__" or module_name.startswith("kvbench_user_")
    if target is None:
        target = f"{file}:{qualname}" if by_file and file else f"{module_name}:{qualname}"
    package = version = None
    top = module_name.partition(".")[0]
    if not by_file:
        distributions = importlib.metadata.packages_distributions().get(top, [])
        if distributions:
            package = distributions[0]
            version = importlib.metadata.version(package)
    uses = tuple(
        (used, hashlib.sha256(Path(used).read_bytes()).hexdigest()) for used in users_files_used(obj, file)
    )
    check_not_edited_since_seen(obj, qualname, ((file, sha), *uses) if file else uses)
    return Source(target, module_name, qualname, file, sha, package, version, uses, bound)


# The sha256 of each user file an object runs, as this process first saw them, by object: an object whose
# file changed since runs the old text (its module is not imported again by an edit).
FIRST_SEEN: "weakref.WeakKeyDictionary[object, tuple]" = weakref.WeakKeyDictionary()


def check_not_edited_since_seen(obj: object, qualname: str, files: tuple[tuple[str, str], ...]) -> None:
    try:
        seen = FIRST_SEEN.setdefault(obj, files)
    except TypeError:  # an object that takes no weak reference: not tracked
        return
    edited = sorted({path for path, _ in seen} - {path for path, sha in files if (path, sha) in seen})
    if edited:
        raise PluginError(
            f"{qualname!r}: {edited[0]} was edited after {qualname!r} was loaded in this process, which "
            "would run the old text under the new text's key; load it again (importlib.reload) or start "
            "a new process"
        )


def defining_file(obj: object) -> str | None:
    """The resolved path of the file that defines `obj`; None where none does (built in, a notebook)."""
    try:
        file = inspect.getsourcefile(obj)
    except TypeError:
        return None
    return str(Path(file).resolve()) if file and Path(file).is_file() else None


def file_sha(module: types.ModuleType) -> str | None:
    """The sha256 of the file `module` was loaded from now (None where it has none any more)."""
    file = getattr(module, "__file__", None)
    return hashlib.sha256(Path(file).read_bytes()).hexdigest() if file and Path(file).is_file() else None


def is_users(module: types.ModuleType | None) -> bool:
    """Whether `module` is the user's: loaded from a file outside Python's, the installed packages' and
    kvbench's folders."""
    file = getattr(module, "__file__", None)
    return bool(file) and not any(Path(file).resolve().is_relative_to(folder) for folder in not_users())


@functools.cache
def not_users() -> tuple[Path, ...]:
    """The folders of Python's and the installed packages' files, and kvbench's."""
    folders = {Path(path).resolve() for path in sysconfig.get_paths().values()}
    return (*folders, Path(__file__).resolve().parents[1])


def user_modules(obj: object) -> list[types.ModuleType]:
    """The module of `obj`, then the user's modules it imported when `load_file_module` ran it or holds
    classes, functions or modules of, and those that they hold, in turn."""
    start = inspect.getmodule(obj)
    found = [start] if start is not None else []
    if start is not None:
        found += [module for module in LOADED.get(start.__name__, {}) if module is not start]
    looked = {id(module) for module in found}
    for module in found:
        for value in list(vars(module).values()):
            held = value if inspect.ismodule(value) else None
            if inspect.isclass(value) or inspect.isfunction(value):
                held = inspect.getmodule(value)
            if held is not None and id(held) not in looked:
                looked.add(id(held))
                if is_users(held):
                    found.append(held)
    return found


def users_files_used(obj: object, own: str | None) -> list[str]:
    """The user's files other than `own` that define what the module of `obj` holds, in turn: a factory's
    press class, a press's helpers, from other files."""
    files = {defining_file(module) for module in user_modules(obj)[1:]}
    return sorted(file for file in files if file and file != own)
